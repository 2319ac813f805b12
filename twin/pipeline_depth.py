"""A deep pipeline's step, simulated from short pipelines of the same stages and continued in depth.

Simulating a 1F1B pipeline of `pp` stages and `ga` micro-batches costs
stages x micro-batches: twin.micro_batches already replaces the `ga`
micro-batches by two steps of pp + 1 and pp + 2, but those still hold
pp x (pp + 1) stage-micro-batches, which is what made pp = 128 take minutes.

Every interior stage runs the same layers (the end stages may hold fewer,
where the embedding and the loss count as layers: twin.pipeline_split; the
short pipelines keep them); what can differ between stages is what
their communication costs: the links a boundary's transfers cross (within a
switch, between switches, between dragonfly groups) and what else loads
them. Stages whose communication ops cost the same, with the same shares of
the links that could limit them, are of one kind. A stage added to the
middle of the pipeline adds the time of its kind to the step, just as a
micro-batch added to the steady state does, so with at least as many
micro-batches as stages (each stage's warm-up is then pp - s - 1 forwards)
the step is linear in the micro-batches and in the interior stages of each
kind: the first stage's forward ramp, the bottleneck stage's period per
micro-batch, the backward ramp (a sum over the stages it crosses) and the
last stage's gradient reduction. Uniform stages are one kind, and the step
a plane in (depth, micro-batches).

So the step is simulated for short pipelines of the same stages, from SHORT
stages upward, each kept where it tells the fit something new, until the
full pipeline's counts of each kind are a combination of theirs, and one
more that must lie on the fit (to 1e-9 relative) or the shortcut is not
used. Kinds that only ever occur together (a slow boundary is one stage's
send and its neighbour's receive) need not be told apart. A short
pipeline's stage s is the full pipeline's stage s, on the same nodes (the
job's first); its last ENDS stages are either next on the first nodes, or,
where the end stages' own traffic (the tied embedding's sum between the
first and the last stage) would cross the machine differently there, on
the full pipeline's last stages' nodes ("seamed"; the boundary at the seam
is new and must cost what the full pipeline's boundary in its place does).
The FLOPs every rank executes grow with stages x micro-batches, exactly,
and are continued as such. The critical rank's exposed communication and
busy time per op class are not exactly linear in depth (its blocking sends
wait longer in a deeper pipeline's warm-up, and compute slows while they
are in flight); they are continued the same way all the same, within a
fraction of a percent in the tests, and the Summary says they are
approximate (`continued`).

The machine condition is checked, not assumed. Each stage must sit on whole
nodes. The full-depth step is built with one micro-batch (cheap), and each
stage's sequence of communication ops, as the simulator will see them
(twin.sim.flowtypes: latency, seconds per byte alone with every concurrent
instance on the links, and the shares of the link classes it loads that
could ever limit it), is its kind. A short pipeline is used only where each
of its stages costs alone what the full pipeline's stage in its place does
(its interior stages by position, its ENDS stages at each end against the
full pipeline's: the last stage's neighbour sends over links that the last
stage's own end-of-step traffic also crosses). Link shares are not compared
across jobs (which links merge into one class, and which can never saturate
first, depends on the whole job), so kinds that differ only in their shares
are refused: a short pipeline could not say which it holds, and such stages'
contributions interact (fitted one per kind, 40 stages of three nodes on
Frontier came out 2.9e-4 off the full simulation, and what one such stage
adds to the step changes with the depth: benchmarks/depth_increments.py;
`share_kinds` lifts the refusal for benchmarks/depth_share_kinds.py, which
measures what it costs: 2.35e-4 on frontier-1t-3072).
Where no short pipelines qualify within 1 / SAVING of the stage-micro-batches
they stand for, twin.micro_batches' continuation in micro-batches alone is
used. What the check cannot see is a link that saturates only under the full
job's mix of concurrent transfers and not in the short jobs'; nor does the
extra point check every coefficient: it adds one interior stage (of the
kind next in line) and one micro-batch, so a kind first met deep in the
pipeline has its coefficient from one point (SHORT's comment has a case
where that mattered). The fit's extra point, tests/test_pipeline_depth.py
(the shortcut against the full simulation, with data-parallel collectives
sharing the NICs with pipeline transfers, on a fat tree and on Frontier's
and Perlmutter's dragonflies, uniform stages and stages of several kinds,
seamed) and benchmarks/depth_shortcut_sweep.py (21 cases on four machines)
are the guard there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from topologies.fabric import Fabric
from topologies.machine import Machine
from topologies.placement import place_ranks
from twin.build import build_step
from twin.ir import Collective, P2P
from twin.model import ModelSpec
from twin.pipeline_split import extra_slots, slots
from twin.plan import ParallelPlan
from twin.report import Summary, summarize, with_step
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate
from twin.sim.flowtypes import FlowTypes
from twin.sim.symmetry import classify

# The shortest of the short pipelines (stages): past the ramps' own transients. From 4 or 5 stages one case of
# benchmarks/depth_shortcut_sweep.py (Alps, stages of three nodes) passes the extra point 8.1e-4 off the full
# simulation; from 6 its extra point fails and it is refused (docs/speed.md "Shorter short pipelines, tried").
SHORT = 6
MIN_DEPTH = 2 * SHORT  # below this the short pipelines save little
PLANAR = 1e-9  # relative distance of the extra point from the fit of the others
ENDS = 2  # stages at each end that may differ from the interior ones (matched against the short pipelines')
SAVING = 2  # the short pipelines may hold at most 1 / SAVING of the stage-micro-batches they stand for


def applies(plan: ParallelPlan) -> bool:
    """Whether `plan` (mbs and ga resolved) is deep enough, with every stage's full warm-up (ga >= pp), for the
    shortcut; not with dpouter's placement, whose stages do not sit on consecutive GPUs as the short pipelines'."""
    return plan.vpp == 1 and plan.pp >= MIN_DEPTH and plan.ga >= plan.pp and not plan.dpouter


def short_step(model: ModelSpec, plan: ParallelPlan, gpus: int, depth: int, ga: int
               ) -> tuple[ModelSpec, ParallelPlan, int]:
    """The same stages (layers per stage, ranks per stage, micro-batch) in a pipeline of `depth` stages and `ga`
    micro-batches: (model, plan, gpus)."""
    per_stage = slots(model.layers, plan) // plan.pp  # layers, the embedding and the loss counted where they are
    short_plan = replace(plan, pp=depth, ga=ga, global_batch=plan.mbs * ga * plan.batch_split)
    return replace(model, layers=per_stage * depth - extra_slots(plan)), short_plan, gpus // plan.pp * depth


def _stage_signatures(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                      collectives: CollectiveModel, gpu_of: list[int] | None = None) -> list[tuple]:
    """Per stage, what its communication costs in the simulator: for each class of ranks on the stage, its
    communication ops in order as (kind, bytes, peer, latency, per phase: seconds per byte alone and the distinct
    shares of the link classes it loads that could ever limit it; distinct, since how links merge into classes
    depends on the whole job's other transfers). Built with one micro-batch: the costs do not depend on how
    many. `gpu_of`: each rank's GPU, where the job is not the machine's first GPUs (seamed short pipelines)."""
    schedule = build_step(model, replace(plan, ga=1, global_batch=plan.mbs * plan.batch_split), machine,
                          gpus).schedule
    sym = classify(schedule, full=False)
    types = FlowTypes.build(schedule, sym, collectives, gpu_of or place_ranks(gpus, machine))
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


def _same_stages(full: list[tuple], short: list[tuple]) -> bool:
    """Whether every stage of the short pipeline costs alone what the full pipeline's stage in its place does:
    interior stages by position (the same nodes), the ENDS stages at each end against the full pipeline's."""
    depth = len(short)
    places = [*range(depth - ENDS), *range(len(full) - ENDS, len(full))]
    return bool(short) and all(_alone(s) == _alone(full[i]) for s, i in zip(short, places))


@dataclass(frozen=True)
class ShortPipeline:
    """One short pipeline to simulate: `depth` stages, `ga` micro-batches, and whether it is seamed (its last
    ENDS stages on the full pipeline's last ENDS stages' nodes, the others on the full pipeline's first ones)."""

    depth: int
    ga: int
    seamed: bool


@dataclass(frozen=True)
class ShortPipelines:
    """The short pipelines to simulate and the linear model they fit: each one's features (1, micro-batches,
    interior stages of each kind) and the full pipeline's."""

    points: list[ShortPipeline]
    features: np.ndarray
    target: np.ndarray


def seamed_gpus(plan: ParallelPlan, gpus: int, depth: int) -> list[int]:
    """Each rank's GPU in a seamed short pipeline of `depth` stages of `plan` (on `gpus`): the first depth - ENDS
    stages where the full pipeline's first stages are, the last ENDS where its last ones are. Where the end
    stages' own traffic (the tied embedding's sum between the first and last stage) crosses the machine
    differently in a short job on the first nodes (a dragonfly group the full job spans), a seamed one keeps it
    as the full job has it; only the seam (one boundary) is new, and it must cost what the full pipeline's
    boundaries in its place do."""
    per_stage = gpus // plan.pp
    cut, shift = (depth - ENDS) * per_stage, (plan.pp - depth) * per_stage
    return [r if r < cut else r + shift for r in range(depth * per_stage)]


def short_gpus_of(plan: ParallelPlan, gpus: int, depth: int, seamed: bool) -> list[int]:
    """Each rank's GPU in a short pipeline of `depth` stages, seamed or on the first nodes. Short pipelines run on
    the full job's fabric and CollectiveModel: their collective families are the full job's own (the same GPU
    sets), lowered once for the signatures and every short simulation."""
    return seamed_gpus(plan, gpus, depth) if seamed else list(range(gpus // plan.pp * depth))


def _rank(rows: list[np.ndarray]) -> int:
    return int(np.linalg.matrix_rank(np.array(rows))) if rows else 0


def _spans(rows: list[np.ndarray], target: np.ndarray) -> bool:
    """Whether `target` is a combination of `rows` (so the fit's value there does not depend on what the rows
    leave undetermined)."""
    return bool(rows) and _rank(rows) == _rank([*rows, target])


def _replaced_cost(plan: ParallelPlan) -> int:
    """Stage-micro-batches of what the shortcut replaces: twin.micro_batches' two full-depth steps, or the step."""
    return plan.pp * min(plan.ga, 2 * plan.pp + 3)


def short_pipelines(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                    collectives: CollectiveModel | None = None, share_kinds: bool = False) -> ShortPipelines | None:
    """The short pipelines that continue `plan` (mbs and ga resolved) in depth, or None where none qualify
    within SAVING (module docstring): from SHORT stages up, each depth whose stages match the full pipeline's,
    kept where it tells the fit something new, until the full pipeline's kinds are spanned, and one more.
    `share_kinds` accepts kinds that differ only in their links' shares, each told apart by the full
    pipeline's stage in its place: not exact (module docstring), never the default; it exists so that
    benchmarks/depth_share_kinds.py can measure what allowing it would cost and save."""
    offset = 1 if plan.ga > plan.pp else 0  # the short pipelines in the full one's regime: ga = depth (+ 1)
    budget = _replaced_cost(plan) / SAVING
    fewest = [(SHORT, SHORT + offset), (SHORT, SHORT + offset + 1), (SHORT + 1, SHORT + 1 + offset),
              (SHORT + 2, SHORT + 2 + offset)]  # uniform stages' four
    if (gpus // plan.pp) % machine.node.gpus_per_node or sum(d * ga for d, ga in fewest) > budget:
        return None
    collectives = collectives or CollectiveModel(Fabric(machine, gpus))
    full = _stage_signatures(model, plan, machine, gpus, collectives)
    if not full:
        return None
    kinds: dict[tuple, int] = {}
    for s in full[ENDS:-ENDS]:
        kinds.setdefault(s, len(kinds))
    if len({_alone(s) for s in kinds}) != len(kinds) and not share_kinds:
        return None  # kinds that differ only in their links' shares (module docstring)

    def features(depth: int, ga: int) -> np.ndarray:
        counts = np.bincount([kinds[s] for s in full[ENDS:depth - ENDS]], minlength=len(kinds))
        return np.array([1.0, ga, *counts])

    target, cost, seamed = features(plan.pp, plan.ga), 0, False
    points: list[ShortPipeline] = []
    rows: list[np.ndarray] = []
    for depth in range(SHORT, plan.pp - ENDS):
        if cost + depth * (depth + offset) > budget:
            return None
        matched = _layout(full, model, plan, machine, gpus, depth, collectives, seamed_first=seamed)
        if matched is None:
            continue
        seamed = matched
        for ga in (depth + offset, depth + offset + 1)[:1 if points else 2]:
            row, spanned = features(depth, ga), _spans(rows, target)
            if spanned or _rank([*rows, row]) > _rank(rows):
                points.append(ShortPipeline(depth, ga, seamed))
                rows.append(row)
                cost += depth * ga
            if spanned:
                return ShortPipelines(points, np.array(rows), target) if cost <= budget else None
    return None


def _layout(full: list[tuple], model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int, depth: int,
            collectives: CollectiveModel, seamed_first: bool = False) -> bool | None:
    """Whether the short pipeline of `depth` stages whose stages match the full pipeline's is seamed (True) or on
    the first nodes (False), or None where neither matches. The first nodes are tried first, unless
    `seamed_first` (the last depth that matched was seamed)."""
    short_model, short_plan, short_gpus = short_step(model, plan, gpus, depth, 1)
    for seamed in (seamed_first, not seamed_first):
        signatures = _stage_signatures(short_model, short_plan, machine, short_gpus, collectives,
                                       short_gpus_of(plan, gpus, depth, seamed))
        if _same_stages(full, signatures):
            return seamed
    return None


def _diagnostics(s: Summary, keys: list[str], passes: list[str]) -> np.ndarray:
    return np.array([s.exposed_comm_s, *(s.time_by_class_s.get(k, 0.0) for k in keys),
                     *(s.exposed_comm_by_pass_s.get(k, 0.0) for k in passes)])


def simulate_deep(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                  flops_formula: str = "hardware", collectives: CollectiveModel | None = None,
                  share_kinds: bool = False) -> Summary | None:
    """The Summary of `plan`'s step (mbs and ga resolved) from short pipelines, or None where the shortcut
    does not apply or the step times do not fit (the caller then simulates the full depth).

    The step time is linear in the micro-batches and the interior stages of each kind, checked on an extra
    point; the FLOPs every rank executes grow with stages x micro-batches, exactly, so the points give them;
    throughput follows from both. The critical rank's exposed communication and busy time per op class are
    continued the same way, but they are not exactly linear in depth (the first stage's blocking sends wait
    longer the deeper the pipeline, and the compute they overlap slows), so the Summary says so in
    `continued`. `share_kinds`: as short_pipelines' (not exact; never the default)."""
    if not applies(plan):
        return None
    collectives = collectives or CollectiveModel(Fabric(machine, gpus))
    short = short_pipelines(model, plan, machine, gpus, collectives, share_kinds)
    if short is None:
        return None
    summaries = []
    for point in short.points:
        m, p, g = short_step(model, plan, gpus, point.depth, point.ga)
        run = simulate(build_step(m, p, machine, g).schedule, machine, collectives=collectives,
                       gpus=short_gpus_of(plan, gpus, point.depth, point.seamed))
        summaries.append(summarize(run, flops_formula))
    steps = np.array([s.step_time_s for s in summaries])
    fit = np.linalg.lstsq(short.features, steps, rcond=None)[0]
    if np.any(np.abs(short.features @ fit - steps) > PLANAR * steps):
        return None
    bilinear = np.array([[1.0, p.depth, p.ga, p.depth * p.ga] for p in short.points])
    if np.linalg.matrix_rank(bilinear) < 4:
        return None
    flops = np.linalg.lstsq(bilinear, np.array([s.flops_executed for s in summaries]), rcond=None)[0]
    executed = float(np.array([1.0, plan.pp, plan.ga, plan.pp * plan.ga]) @ flops)
    keys = sorted({k for s in summaries for k in s.time_by_class_s})
    passes = sorted({k for s in summaries for k in s.exposed_comm_by_pass_s})
    diagnostics = short.target @ np.linalg.lstsq(
        short.features, np.array([_diagnostics(s, keys, passes) for s in summaries]), rcond=None)[0]
    depths = [p.depth for p in short.points]
    return replace(
        with_step(replace(summaries[-1], gpus=gpus), float(short.target @ fit), executed,
                  model.flops_per_step(plan.global_batch, flops_formula), machine.device),
        plan=plan.describe(), global_batch=plan.global_batch, exposed_comm_s=max(float(diagnostics[0]), 0.0),
        time_by_class_s={k: max(float(v), 0.0) for k, v in zip(keys, diagnostics[1:1 + len(keys)])},
        exposed_comm_by_pass_s={k: max(float(v), 0.0) for k, v in zip(passes, diagnostics[1 + len(keys):])},
        simulated_ranks=sum(s.simulated_ranks for s in summaries), sim_wall_s=sum(s.sim_wall_s for s in summaries),
        continued=(f"continued from pipelines of {min(depths)}-{max(depths)} stages (twin.pipeline_depth): step "
                   "time and throughput exact, exposed communication and time by op class approximate"))
