"""A simulated run reduced to what `twin fit` varies: its critical path's compute ops and the rest.

To first order a step is its critical path (twin.sim.critical_path): the
compute ops on it, each stretched by how much concurrent communication slowed
it, and communication, which device parameters do not change. So a step at
other device parameters is, until the path itself moves,

    step(theta) = constant + sum over compute ops w on the path: stretch_w * duration_w(theta)

(`PathCosts.step_s`). Evaluating that takes the unique ops' durations, not a
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
from twin.micro_batches import evaluation_points, shortened
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
    constant_s: float  # communication on the path
    works: tuple[Work, ...]  # the compute ops on the path, each once
    stretch: tuple[float, ...]  # per work: how many durations of it the path holds
    launches: float = 0.0  # host issue intervals on the path (twin.sim.engine's host thread)

    def at(self, durations: dict[Work, float], launch_interval_s: float = 0.0) -> float:
        """The step with each work taking `durations[work]` and the host `launch_interval_s` per op."""
        return (self.constant_s + self.launches * launch_interval_s
                + sum(s * durations[w] for w, s in zip(self.works, self.stretch)))


def path_costs(run: SimRun) -> PathCosts:
    """The critical path of a simulated step, as PathCosts."""
    compute = ComputeModel(run.machine.device)
    alone_s: dict[Work, float] = {}  # a path holds the same few works many times
    stretch: dict[Work, float] = defaultdict(float)
    constant, launches = 0.0, 0
    for step in critical_path(run):
        if step.kind == "host":
            launches += step.launches
            continue
        if step.kind == "comm":
            constant += step.elapsed_s
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
    return PathCosts(run.step_time_s, constant, works, tuple(stretch[w] for w in works), float(launches))


def _continued(a: PathCosts, b: PathCosts, extra: int) -> PathCosts:
    """b continued `extra` micro-batches past itself along the line through a and b."""
    weights: dict[Work, float] = defaultdict(float)
    for w, s in zip(b.works, b.stretch):
        weights[w] += (1 + extra) * s
    for w, s in zip(a.works, a.stretch):
        weights[w] -= extra * s
    works = tuple(w for w, s in weights.items() if s != 0.0)
    def line(x: float, y: float) -> float:
        return y + extra * (y - x)

    return PathCosts(line(a.step_s, b.step_s), line(a.constant_s, b.constant_s), works,
                     tuple(weights[w] for w in works), line(a.launches, b.launches))


def step_plans(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int
               ) -> tuple[tuple[ParallelPlan, ...], int]:
    """The plans to simulate for a measured run's step (itself, or two short ones) and how far to continue the
    second. It ran, so its memory is checked against the whole HBM (twin.build.resolve_step)."""
    resolved, _ = resolve_step(model, plan, machine, gpus, measured=True)
    points = evaluation_points(resolved)
    if points is None:
        return (resolved,), 0
    return tuple(shortened(resolved, ga) for ga in points), resolved.ga - points[1]


def simulate_plan(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                  collectives: CollectiveModel | None = None) -> PathCosts:
    """PathCosts of exactly this measured run's plan (mbs and ga resolved); `collectives` as
    twin.sim.engine.simulate."""
    schedule = build_step(model, plan, machine, gpus, measured=True).schedule
    return path_costs(simulate(schedule, machine, collectives=collectives))


def combined(costs: tuple[PathCosts, ...], extra: int) -> PathCosts:
    """The step's PathCosts from step_plans' simulations: the one, or the second continued past the first."""
    return costs[0] if len(costs) == 1 else _continued(costs[0], costs[1], extra)


def simulate_path_costs(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int) -> PathCosts:
    """Simulate one measured run's step (from two short steps when it has many micro-batches), as PathCosts."""
    plans, extra = step_plans(model, plan, machine, gpus)
    return combined(tuple(simulate_plan(model, p, machine, gpus) for p in plans), extra)
