"""What a simulated (or measured) step amounts to: the numbers a user asks for.

Throughput uses the FLOP formula named in `flops_formula` (default the
recompute, "hardware", form of Narayanan et al., as the AxoNN and Frontier
papers report). Exposed communication is the time on the critical rank when a
communication op is in flight and no compute op is: what overlap did not hide.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from topologies.overrides import describe_overrides
from twin.errors import TwinError
from twin.ir import Program, op_class
from twin.sim.engine import RankTimeline, SimRun


@dataclass(frozen=True)
class Summary:
    machine: str
    model: str
    plan: str
    gpus: int
    global_batch: int
    seq: int
    step_time_s: float
    flops_formula: str
    pflops_total: float
    tflops_per_gpu: float
    pct_peak_advertised: float
    pct_peak_empirical: float
    exposed_comm_s: float
    memory_per_gpu_gb: float
    time_by_class_s: dict[str, float]
    simulated_ranks: int
    sim_wall_s: float
    machine_overrides: dict[str, float] = field(default_factory=dict)  # --set FIELD=VALUE over the machine file

    def to_json_dict(self) -> dict:
        return asdict(self)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -np.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def _intervals(program: Program, timeline: RankTimeline, comm: bool) -> list[tuple[float, float]]:
    return [
        (float(timeline.start_s[op.id]), float(timeline.end_s[op.id]))
        for op in program.ops
        if op.is_comm == comm
    ]


def exposed_comm_s(program: Program, timeline: RankTimeline) -> float:
    """Time with communication in flight and the compute stream idle."""
    comm = _intervals(program, timeline, comm=True)
    compute = _intervals(program, timeline, comm=False)
    return _union_length(comm + compute) - _union_length(compute)


def time_by_class(program: Program, timeline: RankTimeline) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    durations = timeline.end_s - timeline.start_s
    for op in program.ops:
        totals[op_class(op.work)] += float(durations[op.id])
    return dict(sorted(totals.items()))


def rank_time_by_class(run: SimRun, rank: int | None) -> dict[str, float]:
    """Busy time per op class of `rank` (the timeline of the rank simulated for its class), or of the critical
    rank when `rank` is None."""
    if rank is None:
        timeline = critical_timeline(run)
    elif not 0 <= rank < run.schedule.world_size:
        raise TwinError(f"--rank {rank}: the step has ranks 0..{run.schedule.world_size - 1}")
    else:
        timeline = run.timelines[run.symmetry.class_of[rank]]
    return time_by_class(run.schedule.programs[timeline.program], timeline)


def critical_timeline(run: SimRun) -> RankTimeline:
    """The simulated rank that finishes last."""
    return _last_to_finish(run.timelines)


def _last_to_finish(timelines) -> RankTimeline:
    return max(timelines, key=lambda t: float(np.nanmax(t.end_s)) if len(t.end_s) else 0.0)


def summarize(run: SimRun, flops_formula: str = "hardware") -> Summary:
    summary = summarize_timelines(run.schedule, list(run.timelines), run.step_time_s, run.machine.name,
                                  run.machine.device, run.wall_s, flops_formula)
    return replace(summary, machine_overrides=dict(run.machine.overrides))


def format_summary(s: Summary) -> str:
    """A human-readable block; the same numbers as to_json_dict."""
    lines = [
        f"{s.model} on {s.gpus} x {s.machine} GPUs, plan {s.plan}",
        f"  global batch {s.global_batch} sequences x {s.seq} tokens",
        *([f"  {describe_overrides(s.machine_overrides)}"] if s.machine_overrides else []),
        f"  step time              {s.step_time_s:10.3f} s",
        f"  throughput             {s.pflops_total:10.1f} PF/s total, {s.tflops_per_gpu:.1f} TF/s per GPU "
        f"({s.flops_formula} FLOPs)",
        f"  % of peak              {s.pct_peak_advertised:10.1f} % advertised, {s.pct_peak_empirical:.1f} % empirical",
        f"  exposed communication  {s.exposed_comm_s:10.3f} s ({100 * s.exposed_comm_s / s.step_time_s:.1f} % of step)"
        if s.step_time_s > 0 else "  exposed communication  0",
        f"  memory per GPU         {s.memory_per_gpu_gb:10.1f} GB",
        "  time by op class (critical rank, busy time per stream, overlapping):",
    ]
    for name, seconds in sorted(s.time_by_class_s.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {name:<16} {seconds:10.3f} s")
    lines.append(f"  simulated {s.simulated_ranks} rank(s) in {s.sim_wall_s:.2f} s of wall time")
    return "\n".join(lines)


def summarize_timelines(schedule, timelines: list[RankTimeline], step_time_s: float, machine_name: str,
                        device=None, wall_s: float = 0.0, flops_formula: str = "hardware") -> Summary:
    """The Summary of a step from its timelines, simulated (`summarize`) or measured (the executor).

    The critical timeline is the rank that finishes last. `device` (a
    topologies DeviceSpec) gives the peaks the percentages are of; without one
    they are 0. `simulated_ranks` counts the timelines, `sim_wall_s` is the
    wall time of the simulation or measurement.
    """
    info = schedule.info
    flops = info.flops_hardware if flops_formula == "hardware" else info.flops_model
    timeline = _last_to_finish(timelines)
    program = schedule.programs[timeline.program]
    per_gpu = flops / step_time_s / schedule.world_size if step_time_s > 0 else 0.0
    peak = device.peak_flop_per_s if device is not None else 0.0
    empirical = device.empirical_gemm_flop_per_s if device is not None else 0.0
    return Summary(
        machine=machine_name,
        model=info.model,
        plan=info.plan,
        gpus=schedule.world_size,
        global_batch=info.global_batch,
        seq=info.seq,
        step_time_s=step_time_s,
        flops_formula=flops_formula,
        pflops_total=per_gpu * schedule.world_size / 1e15,
        tflops_per_gpu=per_gpu / 1e12,
        pct_peak_advertised=100 * per_gpu / peak if peak else 0.0,
        pct_peak_empirical=100 * per_gpu / empirical if empirical else 0.0,
        exposed_comm_s=exposed_comm_s(program, timeline),
        memory_per_gpu_gb=info.memory_per_gpu_bytes / 1e9,
        time_by_class_s=time_by_class(program, timeline),
        simulated_ranks=len(timelines),
        sim_wall_s=wall_s,
    )
