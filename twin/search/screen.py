"""A screening bound: a plan's transformer-layer compute, in microseconds of CPU per plan.

The full bound (twin.search.bound) builds and walks a short schedule of the
plan and lowers its collectives: about 0.1-0.3 s a plan, which at 32,768
GPUs and every axis (12,672 plans) is most of a search. This one is weaker
but thousands of times cheaper, and `twin search` computes the full bound
only for plans this one cannot rule out.

Why it bounds the simulated step. Every rank runs, for each micro-batch,
the compute ops of each of its layers (forward, recompute, backward), one
after another on its compute stream, and the simulator never runs a compute
op faster than ComputeModel.duration_s (communication only slows it). Those
ops are decided by the tensor-parallel grid (gx, gy, gz), the micro-batch
size, sequence parallelism, recompute and GEMM tuning; not by gdata, ZeRO
(which move only weights and gradients) or the pipeline (which decides only
which layers a rank holds). So one layer of one micro-batch, built on the
grid alone (pp = gdata = 1), gives W, the compute of a layer and a
micro-batch on a rank (the smallest over the grid's programs). With L
layers, pp stages and m micro-batches:

- without a pipeline, or interleaved: step >= m (L / pp) W, a rank's own work;
- 1F1B: step >= (pp - 1 + m) (L / pp) W, the chain BoundModel.pipeline_terms_s
  describes with every stage's work at least its layers'.

Embedding, logits, loss and optimizer work only add to the step and are left
out. tests/test_search.py checks W against the layers of real schedules and
the bound against simulated steps.
"""

from __future__ import annotations

import re
from dataclasses import replace

from twin.builders.axonn import build_axonn
from twin.builders.program import COMPUTE_STREAM
from twin.ir import Schedule
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.sim.compute import ComputeModel

_LAYER_OP = re.compile(r"\.L\d+\.")  # builder op names: mb<i>[.c<j>].<pass>.L<layer>.<op>


def grid_plan(plan: ParallelPlan) -> ParallelPlan:
    """The plan reduced to what decides a layer's compute: its tensor-parallel grid, one micro-batch, no pipeline."""
    return replace(plan, pp=1, vpp=1, gdata=1, zero=0, ga=1, global_batch=plan.mbs * plan.gz)


def layer_compute_s(schedule: Schedule, compute: ComputeModel) -> float:
    """The compute of one layer and one micro-batch on the least loaded program of a one-layer, one-micro-batch
    schedule."""
    return min(sum(compute.duration_s(op.work) for op in program.ops
                   if op.stream == COMPUTE_STREAM and not op.is_comm and _LAYER_OP.search(op.name))
               for program in schedule.programs)


class ScreenModel:
    """Screening bounds for one model on one device type; W is memoised per grid plan."""

    def __init__(self, model: ModelSpec, compute: ComputeModel) -> None:
        self.model = model
        self.compute = compute
        self._layer: dict[ParallelPlan, float] = {}

    def layer_s(self, plan: ParallelPlan) -> float:
        """W: one layer and one micro-batch of `plan` on one rank (forward, recompute, backward)."""
        grid = grid_plan(plan)
        if grid not in self._layer:
            schedule = build_axonn(replace(self.model, layers=1), grid)
            self._layer[grid] = layer_compute_s(schedule, self.compute)
        return self._layer[grid]

    def bound_s(self, plan: ParallelPlan) -> float:
        """The screening bound of a plan with mbs and ga resolved."""
        return screen_bound_s(self.model, plan, self.layer_s(plan))


def screen_bound_s(model: ModelSpec, plan: ParallelPlan, layer_s: float) -> float:
    """The bound from W (module docstring): a rank's own layers, and a 1F1B pipeline's fill and drain."""
    per_stage = model.layers // (plan.pp * plan.vpp) * plan.vpp
    micro_batches = plan.ga
    if plan.pp > 1 and plan.vpp == 1:
        return (plan.pp - 1 + micro_batches) * per_stage * layer_s
    return micro_batches * per_stage * layer_s
