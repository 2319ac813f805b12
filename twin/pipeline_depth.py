"""A deep pipeline's step, simulated from short pipelines of the same stages and continued in depth.

Simulating a 1F1B pipeline of `pp` stages and `ga` micro-batches costs
stages x micro-batches: twin.micro_batches already replaces the `ga`
micro-batches by two steps of pp + 1 and pp + 2, but those still hold
pp x (pp + 1) stage-micro-batches, which is what made pp = 128 take minutes.

When every stage between the first and the last runs the same program on a
machine that looks the same from every stage (each stage on whole nodes,
every boundary's transfer and every stage's collectives of the same cost and
the same links' shares), a stage added to the middle of the pipeline adds
the same time to the step however deep the pipeline is, just as a
micro-batch added to the steady state does. In the steady-state regime
(ga >= pp + 1) the step is then a plane in (pp, ga): the first stage's
forward ramp, the bottleneck stage's period per micro-batch, the backward
ramp and the last stage's gradient reduction. So the step is simulated at
four short pipelines of the same stages (depths d, d, d + 1 and d + 2, with
d = SHORT), the plane is solved from three, and the fourth must lie on it
(to 1e-9) or the shortcut is not used. The FLOPs every rank executes grow
with stages x micro-batches, exactly, and are continued as such. The
critical rank's exposed communication and busy time per op class are not
planar in depth (its blocking sends wait longer in a deeper pipeline's
warm-up, and compute slows while they are in flight); they are continued
along the plane all the same, within a fraction of a percent in the tests,
and the Summary says they are approximate (`continued`).

The machine condition is checked, not assumed. Each stage must sit on whole
nodes. The full-depth step is built with one micro-batch (cheap), and each
stage's sequence of communication ops, as the simulator will see them
(twin.sim.flowtypes: latency, seconds per byte alone with every concurrent
instance on the links, and the shares of the link classes it loads), must be
the same for every interior stage; the short pipelines' end stages (the
first two and the last two: the last stage's neighbour sends over links that
the last stage's own end-of-step traffic, the tied embedding's gradient sum,
also crosses) and interior stages must cost alone what the full pipeline's
do (link shares are not compared across the two jobs: which links merge
into one class, and which can never saturate first, depends on the whole
job). Where either fails (a
boundary that crosses a leaf switch or a dragonfly group that others do not,
a bottleneck shared by more stages in the full job), twin.micro_batches'
continuation in micro-batches alone is used. What the check cannot see is a
link that saturates only under the full job's mix of concurrent transfers
and not in the short jobs'; the planarity of the four points and
tests/test_pipeline_depth.py (the shortcut against the full simulation,
with data-parallel collectives sharing the NICs with pipeline transfers, on
a fat tree and on Frontier's dragonfly) are the guard there.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from topologies.fabric import Fabric
from topologies.machine import Machine
from topologies.placement import place_ranks
from twin.build import build_step
from twin.ir import Collective, P2P
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.report import Summary, summarize, with_step
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate
from twin.sim.flowtypes import FlowTypes
from twin.sim.symmetry import classify

SHORT = 6  # the shortest of the short pipelines (stages): past the ramps' own transients
MIN_DEPTH = 2 * SHORT  # below this the short pipelines save little
PLANAR = 1e-9  # relative distance of the fourth point from the plane of the first three
ENDS = 2  # stages at each end that may differ from the interior ones (matched against the short pipelines')


def applies(plan: ParallelPlan) -> bool:
    """Whether `plan` (mbs and ga resolved) is deep enough, and in the steady-state regime, for the shortcut."""
    return plan.vpp == 1 and plan.pp >= MIN_DEPTH and plan.ga >= plan.pp + 1


def short_step(model: ModelSpec, plan: ParallelPlan, gpus: int, depth: int, ga: int
               ) -> tuple[ModelSpec, ParallelPlan, int]:
    """The same stages (layers per stage, ranks per stage, micro-batch) in a pipeline of `depth` stages and `ga`
    micro-batches: (model, plan, gpus)."""
    per_stage = model.layers // plan.pp
    short_plan = replace(plan, pp=depth, ga=ga, global_batch=plan.mbs * ga * plan.batch_split)
    return replace(model, layers=per_stage * depth), short_plan, gpus // plan.pp * depth


def _stage_signatures(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                      collectives: CollectiveModel) -> list[tuple]:
    """Per stage, what its communication costs in the simulator: for each class of ranks on the stage, its
    communication ops in order as (kind, bytes, peer, latency, per phase: seconds per byte alone and the distinct
    shares of the link classes it loads that could ever limit it; distinct, since how links merge into classes
    depends on the whole job's other transfers). Built with one micro-batch: the costs do not depend on how
    many."""
    schedule = build_step(model, replace(plan, ga=1, global_batch=plan.mbs * plan.batch_split), machine,
                          gpus).schedule
    sym = classify(schedule, full=False)
    types = FlowTypes.build(schedule, sym, collectives, place_ranks(gpus, machine))
    # A link class can only ever limit a transfer where the shares of everything that crosses it add up to a
    # whole link: each flow runs at most at its own bottleneck's pace, so below that the class never binds.
    bindable = types.loads.sum(axis=0) >= 1 - 1e-9
    per_stage = gpus // plan.pp
    stages: list[list[tuple]] = [[] for _ in range(plan.pp)]
    for cls, rank in enumerate(sym.representatives):
        program = schedule.programs[sym.programs[cls]]
        if any(r // per_stage != rank // per_stage for r in program.ranks):
            return []  # one program on two stages: not a pipeline of distinct stages
        calls, signature = types.per_op[cls], []
        for op in program.ops:
            if op.id not in calls:
                continue
            latency, phases = types.cost(calls[op.id].type_id)
            work = op.work
            peer = work.peer if isinstance(work, P2P) else 0
            kind = work.kind if isinstance(work, (Collective, P2P)) else ""
            signature.append((kind, work.nbytes, peer, round(latency, 15),
                              tuple((round(s, 21), tuple(np.unique(np.round(loads[bindable[index]], 12))))
                                    for index, loads, s in phases)))
        stages[rank // per_stage].append(tuple(signature))
    return [tuple(sorted(s)) for s in stages]


def _alone(signature: tuple) -> tuple:
    """A stage's signature without the link shares: what a transfer costs alone (its bottleneck, with every
    concurrent instance of its family on the links), comparable between jobs of different sizes, whose links
    merge into classes differently."""
    return tuple(tuple((kind, nbytes, peer, latency, tuple(s for s, _ in phases))
                       for kind, nbytes, peer, latency, phases in cls) for cls in signature)


def uniform_stages(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                   models: _Models | None = None) -> bool:
    """Whether every interior stage of `plan` (all but ENDS at each end) sees the same communication costs and
    link shares as every other, and the short pipelines' end stages and an interior one cost alone what the
    full pipeline's do (module docstring)."""
    if (gpus // plan.pp) % machine.node.gpus_per_node:
        return False
    models = models or _Models(machine)
    full = _stage_signatures(model, plan, machine, gpus, models.of(gpus))
    short_model, short_plan, short_gpus = short_step(model, plan, gpus, SHORT + 1, 1)
    short = _stage_signatures(short_model, short_plan, machine, short_gpus, models.of(short_gpus))
    inner = slice(ENDS, -ENDS)
    if not full or not short or len(set(full[inner])) != 1 or len({_alone(s) for s in short[inner]}) != 1:
        return False
    compared = [*range(ENDS + 1), *range(-ENDS, 0)]  # the end stages and one interior stage
    return [_alone(full[i]) for i in compared] == [_alone(short[i]) for i in compared]


class _Models:
    """One CollectiveModel per job size (the full job's may be given), so the short pipelines of one depth and
    the uniformity check share their lowerings and flow types' routes."""

    def __init__(self, machine: Machine, full: CollectiveModel | None = None) -> None:
        self.machine = machine
        self.by_gpus = {full.fabric.n_gpus: full} if full is not None else {}

    def of(self, gpus: int) -> CollectiveModel:
        if gpus not in self.by_gpus:
            self.by_gpus[gpus] = CollectiveModel(Fabric(self.machine, gpus))
        return self.by_gpus[gpus]


def _diagnostics(s: Summary, keys: list[str]) -> np.ndarray:
    return np.array([s.exposed_comm_s, *(s.time_by_class_s.get(k, 0.0) for k in keys)])


def simulate_deep(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                  flops_formula: str = "hardware", collectives: CollectiveModel | None = None) -> Summary | None:
    """The Summary of `plan`'s step (mbs and ga resolved) from four short pipelines, or None where the shortcut
    does not apply or the step times are not on one plane (the caller then simulates the full depth).

    The step time is a plane in (stages, micro-batches), checked on the fourth point; the FLOPs every rank
    executes grow with stages x micro-batches, exactly, so the four points give them; throughput follows from
    both. The critical rank's exposed communication and busy time per op class are continued along the same
    plane, but they are not exactly planar in depth (the first stage's blocking sends wait longer the deeper
    the pipeline, and the compute they overlap slows), so the Summary says so in `continued`."""
    if not applies(plan):
        return None
    models = _Models(machine, collectives)
    if not uniform_stages(model, plan, machine, gpus, models):
        return None
    points = [(SHORT, SHORT + 1), (SHORT, SHORT + 2), (SHORT + 1, SHORT + 2), (SHORT + 2, SHORT + 3)]
    summaries = []
    for depth, ga in points:
        m, p, g = short_step(model, plan, gpus, depth, ga)
        summaries.append(summarize(simulate(build_step(m, p, machine, g).schedule, machine,
                                            collectives=models.of(g)), flops_formula))
    basis = np.array([[1.0, d, ga] for d, ga in points])
    steps = np.array([s.step_time_s for s in summaries])
    plane = np.linalg.solve(basis[:3], steps[:3])
    if abs(basis[3] @ plane - steps[3]) > PLANAR * steps[3]:
        return None
    target = np.array([1.0, plan.pp, plan.ga])
    bilinear = np.array([[1.0, d, ga, d * ga] for d, ga in points])
    flops = np.linalg.solve(bilinear, np.array([s.flops_executed for s in summaries]))
    executed = float(np.array([1.0, plan.pp, plan.ga, plan.pp * plan.ga]) @ flops)
    keys = sorted({k for s in summaries for k in s.time_by_class_s})
    diagnostics = target @ np.linalg.solve(basis[:3], np.array([_diagnostics(s, keys) for s in summaries[:3]]))
    last = summaries[-1]
    return replace(
        with_step(replace(last, gpus=gpus), float(target @ plane), executed,
                  model.flops_per_step(plan.global_batch, flops_formula), machine.device),
        plan=plan.describe(), global_batch=plan.global_batch, exposed_comm_s=max(float(diagnostics[0]), 0.0),
        time_by_class_s={k: max(float(v), 0.0) for k, v in zip(keys, diagnostics[1:])},
        sim_wall_s=sum(s.sim_wall_s for s in summaries),
        continued=(f"continued from pipelines of {SHORT}-{SHORT + 2} stages (twin.pipeline_depth): step time and "
                   "throughput exact, exposed communication and time by op class approximate"))
