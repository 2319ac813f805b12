"""Weak and strong scaling, the way the Frontier paper defines them.

The plan fixes every degree but data parallelism; each GPU count gets
dp = gpus / (gx gy gz pp).

- weak: the global batch grows with dp (the first count's batch per replica
  kept); efficiency = per-GPU throughput relative to the smallest run.
- strong: the global batch is fixed; efficiency = speedup over ideal,
  (t_0 N_0) / (t_N N).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from topologies.machine import Machine
from twin.errors import TwinError
from twin.micro_batches import simulate_step
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.report import Summary

MODES = ("weak", "strong")


@dataclass(frozen=True)
class ScalePoint:
    gpus: int
    plan: str
    global_batch: int
    step_time_s: float
    tflops_per_gpu: float
    pflops_total: float
    efficiency: float


Stepper = Callable[[ModelSpec, ParallelPlan, Machine, int], Summary]


def scaling(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpu_counts: list[int], mode: str,
            progress=None, step: Stepper = simulate_step) -> list[ScalePoint]:
    """Simulate each GPU count; `plan.global_batch` is the batch at the first count.

    `step` simulates one point (twin validate passes one that caches points
    shared with its other rows)."""
    if mode not in MODES:
        raise TwinError(f"--mode {mode!r} is unknown; use weak or strong")
    if not gpu_counts or any(n <= 0 for n in gpu_counts):
        raise TwinError("--gpus must be a comma-separated list of positive GPU counts, e.g. 128,256,512")
    replica = plan.gx * plan.gy * plan.gz * plan.pp
    for n in gpu_counts:
        if n % replica:
            raise TwinError(f"--gpus {n} is not a multiple of gx*gy*gz*pp = {replica}; dp must be a whole number")
    base_dp = gpu_counts[0] // replica
    points: list[ScalePoint] = []
    for n in gpu_counts:
        dp = n // replica
        batch = plan.global_batch * dp // base_dp if mode == "weak" else plan.global_batch
        if mode == "weak" and (plan.global_batch * dp) % base_dp:
            raise TwinError(f"weak scaling to {n} GPUs needs a batch of {plan.global_batch} x {dp}/{base_dp} sequences; "
                            "choose counts that are multiples of the first")
        trial = replace(plan, gdata=dp, global_batch=batch, ga=0 if plan.mbs else plan.ga)
        s = step(model, trial, machine, n)
        if points:
            first = points[0]
            eff = (s.tflops_per_gpu / first.tflops_per_gpu if mode == "weak"
                   else first.step_time_s * first.gpus / (s.step_time_s * n))
        else:
            eff = 1.0
        points.append(ScalePoint(n, s.plan, batch, s.step_time_s, s.tflops_per_gpu, s.pflops_total, eff))
        if progress is not None:
            progress(points[-1])
    return points
