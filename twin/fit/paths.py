"""A simulated run reduced to what `twin fit` varies: its critical path's compute ops and the rest.

To first order a step is its critical path (twin.sim.critical_path): the
compute ops on it, each stretched by how much concurrent communication slowed
it, and communication, which device parameters do not change and link
efficiencies do. So a step at other parameters is, until the path itself
moves,

    step(theta) = constant + sum over compute ops w on the path: stretch_w * duration_w(theta)
                           + sum over link levels l: link_work_l / efficiency_l(theta)

(`PathCosts.step_s`). A communication op on the path is its latency, which
stays in the constant, and its phases' time, each phase's share charged to
the level of its slowest link alone (Fabric.efficiency_key: NVLink, the NIC,
the network), as link work: seconds times that level's achieved fraction of
peak (`[node.link_efficiency]`), so that fitting the fraction scales it as
1 / fraction. Evaluating that takes the unique ops' durations, not a
simulation, which is what makes fitting 1,440 runs take a minute: the runs
are simulated once per pass, the fit then moves the parameters along these
sums, and the next pass re-simulates to let the path move.

A run with many micro-batches is simulated at two short micro-batch counts
and continued linearly (twin.micro_batches); its path costs are continued the
same way.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from topologies.machine import Machine
from twin.build import build_step, resolve_step
from twin.ir import Work
from twin.micro_batches import evaluation_points, periods_past, shortened
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.sim.collectives import CollectiveModel
from twin.sim.compute import ComputeModel
from twin.sim.critical_path import critical_path
from twin.sim.engine import SimRun, simulate


@dataclass(frozen=True)
class PathCosts:
    """One run's step as a function of compute-op durations (module docstring)."""

    step_s: float  # as simulated
    constant_s: float  # communication latencies on the path (and anything no parameter moves)
    works: tuple[Work, ...]  # the compute ops on the path, each once
    stretch: tuple[float, ...]  # per work: how many durations of it the path holds
    launches: float = 0.0  # host issue intervals on the path (twin.sim.engine's host thread)
    link_work: tuple[tuple[str, float], ...] = ()  # per level: communication seconds x its link efficiency

    def at(self, durations: dict[Work, float], launch_interval_s: float = 0.0,
           link_efficiency: dict[str, float] | None = None) -> float:
        """The step with each work taking `durations[work]`, the host `launch_interval_s` per op and each level's
        links at `link_efficiency[level]` of their peak (a machine's `node.link_efficiency`; needed when the
        path holds communication phases)."""
        efficiency = link_efficiency or {}
        return (self.constant_s + self.launches * launch_interval_s
                + sum(s * durations[w] for w, s in zip(self.works, self.stretch))
                + sum(work / efficiency[level] for level, work in self.link_work))


def path_costs(run: SimRun) -> PathCosts:
    """The critical path of a simulated step, as PathCosts."""
    compute = ComputeModel(run.machine.device)
    alone_s: dict[Work, float] = {}  # a path holds the same few works many times
    stretch: dict[Work, float] = defaultdict(float)
    constant, launches = 0.0, 0
    link_work: dict[str, float] = defaultdict(float)
    for step in critical_path(run):
        if step.kind == "host":
            launches += step.launches
            continue
        if step.kind == "comm":
            latency, shares = _comm_split(run, step.cls, step.op_id, step.elapsed_s)
            constant += latency
            for level, seconds in shares:
                link_work[level] += seconds * run.machine.node.link_efficiency[level]
            continue
        work = run.schedule.programs[run.timelines[step.cls].program].ops[step.op_id].work
        alone = alone_s.get(work)
        if alone is None:
            alone = alone_s[work] = compute.duration_s(work)
        if alone > 0:
            stretch[work] += step.elapsed_s / alone
        else:
            constant += step.elapsed_s
    works = tuple(stretch)
    return PathCosts(run.step_time_s, constant, works, tuple(stretch[w] for w in works), float(launches),
                     tuple(link_work.items()))


def _comm_split(run: SimRun, cls: int, op_id: int, elapsed_s: float) -> tuple[float, list[tuple[str, float]]]:
    """A communication op's time on the path: (its latency, [(level, seconds)] for its phases). The phases' time
    (contention included) is shared among them as their times alone are, each charged to its slowest link's
    level; time no phase accounts for (none loads a link) stays with the latency."""
    types = run.flow_types
    call = types.per_op[cls].get(op_id) if types is not None else None
    if call is None:
        return elapsed_s, []
    latency = min(types.latency_s[call.type_id], elapsed_s)
    rows = [r for r in types.phase_rows[call.type_id] if types.bottleneck[r]]
    alone = [float(types.s_per_byte[r]) for r in rows]
    total = sum(alone)
    if total <= 0 or elapsed_s <= latency:
        return elapsed_s, []
    moving = elapsed_s - latency
    return latency, [(types.bottleneck[r], moving * a / total) for r, a in zip(rows, alone)]


def _continued(a: PathCosts, b: PathCosts, extra: float) -> PathCosts:
    """b continued `extra` periods (of the steady state: twin.micro_batches) past itself along the line through a
    and b."""
    weights: dict[Work, float] = defaultdict(float)
    for w, s in zip(b.works, b.stretch):
        weights[w] += (1 + extra) * s
    for w, s in zip(a.works, a.stretch):
        weights[w] -= extra * s
    works = tuple(w for w, s in weights.items() if s != 0.0)
    def line(x: float, y: float) -> float:
        return y + extra * (y - x)

    levels = dict.fromkeys(level for p in (a, b) for level, _ in p.link_work)
    work_a, work_b = dict(a.link_work), dict(b.link_work)
    link_work = tuple((level, line(work_a.get(level, 0.0), work_b.get(level, 0.0))) for level in levels)
    return PathCosts(line(a.step_s, b.step_s), line(a.constant_s, b.constant_s), works,
                     tuple(weights[w] for w in works), line(a.launches, b.launches), link_work)


def step_plans(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int
               ) -> tuple[tuple[ParallelPlan, ...], float]:
    """The plans to simulate for a measured run's step (itself, or two short ones) and how far to continue the
    second. It ran, so its memory is checked against the whole HBM (twin.build.resolve_step)."""
    resolved, _ = resolve_step(model, plan, machine, gpus, measured=True)
    points = evaluation_points(resolved)
    if points is None:
        return (resolved,), 0
    return tuple(shortened(resolved, ga) for ga in points), periods_past(resolved, points)


def simulate_plan(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                  collectives: CollectiveModel | None = None, built: dict | None = None) -> PathCosts:
    """PathCosts of exactly this measured run's plan (mbs and ga resolved); `collectives` as
    twin.sim.engine.simulate, `built` (schedules built before) as twin.build.build_step."""
    schedule = build_step(model, plan, machine, gpus, measured=True, built=built).schedule
    return path_costs(simulate(schedule, machine, collectives=collectives))


def combined(costs: tuple[PathCosts, ...], extra: float) -> PathCosts:
    """The step's PathCosts from step_plans' simulations: the one, or the second continued past the first."""
    return costs[0] if len(costs) == 1 else _continued(costs[0], costs[1], extra)


def simulate_path_costs(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int) -> PathCosts:
    """Simulate one measured run's step (from two short steps when it has many micro-batches), as PathCosts."""
    plans, extra = step_plans(model, plan, machine, gpus)
    return combined(tuple(simulate_plan(model, p, machine, gpus) for p in plans), extra)
