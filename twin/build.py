"""From user inputs to a validated, memory-checked schedule.

The one path every command takes (simulate, export, later search and run), so
a plan is checked the same way wherever it comes from: divisibility and
world size first (twin.plan), then the micro-batch is resolved and the memory
fit checked against the device (twin.memory), then the builder runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from topologies.machine import Machine
from twin.builders.schedule import build_schedule, build_stage_programs
from twin.collector import paused
from twin.errors import TwinError
from twin.ir import Schedule
from twin.memory import MemoryBreakdown, check_fit, resolve_micro_batch
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.plan_checks import validate_plan


@dataclass(frozen=True)
class BuiltStep:
    schedule: Schedule
    plan: ParallelPlan  # with mbs and ga resolved
    memory: MemoryBreakdown


def check_fp8_rate(machine: Machine, asked_by: str, instead: str) -> None:
    """A one-line TwinError where FP8 linears (`asked_by`) meet a machine file that gives no FP8 GEMM rate."""
    if not machine.device.empirical_gemm_fp8_flop_per_s:
        raise TwinError(f"{asked_by} needs the device's FP8 GEMM rate, which {machine.name}'s file does not give "
                        f"(device.peak_fp8_tflop_per_s and empirical_gemm_fp8_tflop_per_s); {instead} or add them")


def resolve_step(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int, measured: bool = False
                 ) -> tuple[ParallelPlan, MemoryBreakdown]:
    """The checked plan with mbs and ga resolved, and its memory per GPU; no schedule built. `measured`: the plan
    of a measured run, which did fit, so it is checked against the whole HBM, not the usable part."""
    if gpus > machine.max_gpus:
        raise TwinError(f"--gpus {gpus} exceeds {machine.name}'s {machine.max_gpus} GPUs; use at most that many")
    validate_plan(plan, model, gpus)
    if plan.fp8:
        check_fp8_rate(machine, "--plan: fp8=1", "use fp8=0")
    resolved = resolve_micro_batch(model, plan, machine.device.hbm_bytes)
    return resolved, check_fit(model, resolved, machine.device.hbm_bytes, reserve=not measured)


def build_step(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int, measured: bool = False,
               built: dict[tuple[ModelSpec, ParallelPlan], Schedule] | None = None) -> BuiltStep:
    """The checked step and its schedule; `measured` as resolve_step. `built`: schedules built before, by model
    and resolved plan, reused (the schedule reads no machine number: only the checks do) and added to."""
    resolved, memory = resolve_step(model, plan, machine, gpus, measured)
    schedule = built.get((model, resolved)) if built is not None else None
    if schedule is None:
        with paused():
            schedule = build_schedule(model, resolved)
        if built is not None:
            built[(model, resolved)] = schedule
    return BuiltStep(schedule, resolved, memory)


def build_stages(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int, stages: tuple[int, ...]
                 ) -> BuiltStep:
    """The checked step with only pipeline stages `stages` built: the search's partial build for its bounds
    (twin.builders.schedule.build_stage_programs), which cannot be simulated."""
    resolved, memory = resolve_step(model, plan, machine, gpus)
    with paused():
        return BuiltStep(build_stage_programs(model, resolved, stages), resolved, memory)
