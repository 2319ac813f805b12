"""A screening bound: a plan's transformer layers on its tensor-parallel grid, milliseconds of CPU per grid.

The full bound (twin.search.bound) builds and walks a short schedule of the
plan and lowers its collectives: about 0.1-0.3 s a plan, which at 32,768
GPUs and every axis (12,672 plans) is most of a search. This one is weaker
but far cheaper (plans share grids), and `twin search` computes the full
bound only for plans this one cannot rule out.

What a layer costs does not depend on gdata, ZeRO below stage 3 (which move
only weights, gradients and optimizer state, outside the layers) or the
pipeline (which decides only which layers a rank holds): a layer's ops are
decided by the tensor-parallel grid (gx, gy, gz), the micro-batch size,
sequence parallelism, recompute, overlap and GEMM tuning. So layers of one
micro-batch are built on the grid alone (pp = gdata = 1), and numbers are
taken from them, each per kind of pass the least over the layers:

- W, a layer's compute (forward, recompute, backward) on the least loaded rank.
  The simulator never runs a compute op faster than ComputeModel.duration_s
  alone (communication only slows it), and every rank runs its layers'
  compute ops one after another. Where a layer sits changes only its
  collectives (below), not its compute, so one layer gives W, and only its
  block's passes are built (twin.builders.schedule.build_layer_passes: no
  embedding, loss or optimizer, about 40% of the ops); the least of three
  layers of a whole step gives the same: tests/test_search.py checks every
  grid of four search spaces, and W against real schedules' layers.

The others come from three layers (a stage's first layer gathers its
weights within its own passes, later ones had them prefetched by the layer
before, and the last prefetches for what follows; three show each kind):

- C, on rank 0, the chain through each pass of a layer (forward, recompute,
  backward): its compute ops in stream order, and the collectives between
  them (issued after one of the pass's compute ops and waited for by a later
  one), each at the full bound's duration (its instance with the fabric to
  itself, which the grid's rank 0 shares with the plan's rank 0: ranks are
  numbered x, y, z innermost). A pass's ops sit together on the compute
  stream, so in the plan's rank 0 every pass of every layer and micro-batch
  adds at least its chain.

- K, on rank 0, the busiest communication stream's share of a layer
  (twin.search.passes.busiest_stream_s): each of the grid's collectives at
  the full bound's duration, as in C, summed per stream over a layer's
  passes, the least layer. A stream runs its ops one after another, and
  every pass of every layer and micro-batch of the plan's rank 0 issues at
  least the grid's least: with weights sharded over Z, the weight
  all-gathers and gradient reduce-scatters that C leaves out (a prefetched
  all-gather is waited for by the next linear, not between one pass's
  compute ops) can take longer than the compute they overlap.

- S, C again with each collective at what the full bound gives it on any
  pipeline stage (BoundModel.stage_op_durations_s: its latency and its bytes
  over the busiest of the nodes' own links, which it shares with its axis's
  other instances on the node; no network link). Where a stage holds whole
  nodes, every stage's ranks are the grid's shifted by whole nodes, whose own
  links and instances on them are the same, so every stage's passes add at
  least S, as rank 0's add C. (With dpouter's order a pipeline's next stage
  sits one grid further on, not one stage's ranks: twin.mesh.stage_stride.)

With L layers, pp stages and m micro-batches (a rank holds L / pp layers):

- a rank's own work: step >= m (L / pp) W, and for rank 0 >= m (L / pp) C
  and >= m (L / pp) K;
- 1F1B: step >= (L / pp) max(W, S, C) + (pp - 2 + m) (L / pp) max(W, S),
  the chain BoundModel.pipeline_terms_s describes (the first micro-batch's
  forward and backward on stages 0 to pp - 2, then the last stage's m) with
  every stage's forward and backward of a micro-batch at least its layers'
  compute, and at least their chains (S; W alone where a stage does not
  hold whole nodes); stage 0's are rank 0's, at least its chains C.

Embedding, logits, loss and optimizer work only add to the step and are left
out; C and S also leave out weight all-gathers prefetched in an earlier layer
(OAG; K counts them) and gradient collectives waited for after the layers.
With ZeRO-3 weights are gathered over z and gdata, which the grid alone does
not have: those plans get W only. tests/test_search.py checks W, C, S and K
against the layers of real schedules and the bound against simulated steps.

W is the cheap part of a grid (one layer's blocks, no lowering) and C, S and K the
rest (they lower the grid's collectives onto the fabric), so `twin search`
first bounds every plan by W alone and computes C, S and K only for the
grids of plans that bound cannot rule out: for GPT-320B on 32,768 GCDs over
every axis, 1,385 of 4,013.
"""

from __future__ import annotations

from dataclasses import replace

from twin.builders.schedule import build_layer_passes, build_schedule
from twin.ir import Program, Schedule
from twin.mesh import stage_stride
from twin.model import ModelSpec
from twin.pipeline_split import fewest_and_most
from twin.plan import ParallelPlan
from twin.search.bound import BoundModel
from twin.search.passes import busiest_stream_s, least_per_layer_s, pass_chains_s, pass_compute_s


def grid_plan(plan: ParallelPlan) -> ParallelPlan:
    """The plan reduced to what decides a layer's ops: its tensor-parallel grid, one micro-batch, no pipeline.
    Where only some layers recompute (rcl), the least layer is one that does not: the grid's layers recompute
    nothing (each number takes the least over the plan's layers)."""
    partial = {"recompute": "none", "rcl": 0} if plan.rcl else {}
    return replace(plan, pp=1, vpp=1, pemb=False, ploss=False, dpouter=False, gdata=1, zero=0, ga=1,
                   global_batch=plan.mbs * plan.gz, **partial)


class ScreenModel:
    """Screening bounds for one model on one machine and GPU count; W, and C, S and K, are memoised per grid plan.

    W alone (`work_s`) is the cheaper part: C, S and K lower every collective of the grid onto the fabric, a
    search asks for them (`chains_s`) only for grids with a plan that W alone cannot rule out.
    """

    # Layers of the grid schedule for C, S and K: a stage's first layer gathers its weights inside its own pass,
    # later ones had them prefetched by the layer before, and the last prefetches for what follows; three layers
    # show each kind, and each number takes the least of them. W needs one: a layer's compute is the same
    # wherever it sits.
    LAYERS = 3
    WORK_LAYERS = 1

    def __init__(self, model: ModelSpec, bounds: BoundModel) -> None:
        self.model = model
        self.bounds = bounds
        self._work: dict[ParallelPlan, float] = {}
        self._chains: dict[ParallelPlan, tuple[float, float, float]] = {}

    def _schedule(self, grid: ParallelPlan, layers: int) -> Schedule:
        return build_schedule(replace(self.model, layers=layers), grid)

    def work_s(self, plan: ParallelPlan) -> float:
        """W of `plan`'s layers (module docstring)."""
        grid = grid_plan(plan)
        if grid not in self._work:
            layers = replace(self.model, layers=self.WORK_LAYERS)
            self._work[grid] = self.least_layer_work_s((build_layer_passes(layers, grid),))
        return self._work[grid]

    def least_layer_work_s(self, programs: tuple[Program, ...]) -> float:
        """A layer's compute on the least loaded of `programs`, each kind of pass the least over its layers."""
        compute = self.bounds.compute
        return min(least_per_layer_s(pass_compute_s(p, compute.op_durations_s(p.ops))) for p in programs)

    def chains_s(self, plan: ParallelPlan) -> tuple[float, float, float]:
        """(C, S, K) of `plan`'s layers (module docstring)."""
        grid = grid_plan(plan)
        if grid not in self._chains:
            schedule = self._schedule(grid, self.LAYERS)
            rank0 = next(p for p in schedule.programs if p.ranks[0] == 0)
            durations = self.bounds.op_durations_s(schedule, rank0)
            c = least_per_layer_s(pass_chains_s(rank0, durations))
            s = least_per_layer_s(pass_chains_s(rank0, self.bounds.stage_op_durations_s(schedule, rank0)))
            self._chains[grid] = (c, s, busiest_stream_s(rank0, durations))
        return self._chains[grid]

    def layer_s(self, plan: ParallelPlan) -> tuple[float, float, float, float]:
        """(W, C, S, K) of `plan`'s layers (module docstring)."""
        return (self.work_s(plan), *self.chains_s(plan))

    def bound_s(self, plan: ParallelPlan) -> float:
        """The screening bound of a plan with mbs and ga resolved."""
        return screen_bound_s(self.model, plan, self.layer_s(plan), self.bounds.machine.node.gpus_per_node)


def screen_bound_s(model: ModelSpec, plan: ParallelPlan, layer: tuple[float, float, float, float],
                   gpus_per_node: int) -> float:
    """The bound from (W, C, S, K) (module docstring): a rank's own layers, and a 1F1B pipeline's fill and drain.
    With C, S and K at 0 it is the bound from W alone: weaker, and free of the collectives' lowering. None (0) for a
    plan with AxoNN's weights cache (cache): its cached layers' later passes gather nothing and copy nothing, less
    than any layer of the grid's one micro-batch, so only the full bound (twin.search.bound) holds for it."""
    if plan.cache:
        return 0.0
    w, c, s, k = layer
    fewest, most = fewest_and_most(model.layers, plan)  # the end stages hold fewer with pemb or ploss
    m = plan.ga
    own = m * most * (w if plan.zero == 3 else max(w, c, k))
    if plan.pp > 1 and plan.vpp == 1:
        whole_nodes = stage_stride(plan) % gpus_per_node == 0 and plan.zero != 3  # each stage of rank 0's pipeline
        stage = max(w, s) if whole_nodes else w  # any stage's forward and backward of a micro-batch
        first = max(stage, w if plan.zero == 3 else c)  # stage 0's, which holds rank 0
        return max(own, fewest * first + (plan.pp - 2 + m) * fewest * stage)
    return own
