"""A step of many micro-batches, simulated from two short steps and continued linearly.

Past a warm-up, every further micro-batch repeats the same ops on every rank,
so the simulated step grows by the same time per micro-batch:

- without a pipeline, every micro-batch after the first is a forward and a
  backward with their tensor-parallel collectives; the first carries the
  prefetch start and the last the gradient reduction. Steps of 2 and 3
  micro-batches give the slope.
- with a 1F1B pipeline (vpp = 1), stage s runs pp - s - 1 warm-up forwards
  once there are at least pp micro-batches; each further one adds one
  forward-backward pair to every stage's steady state. Steps of pp + 1 and
  pp + 2 micro-batches give the slope.
- with an interleaved pipeline (vpp > 1) the micro-batch count is a multiple
  of pp (Megatron's rule, twin.plan), and the schedule's steady state repeats
  every pp micro-batches (pp x vpp virtual ones: twin.builders.pipeline):
  from 2 pp on, every stage's warm-up of 2 (pp - s - 1) + (vpp - 1) pp
  virtual steps is complete, and each further pp micro-batches add the same
  round to every stage. Steps of 2 pp and 3 pp micro-batches give the slope
  per round; the step is continued by whole rounds.

tests/test_micro_batches.py checks the continuation against the full
simulation, without a pipeline, with 1F1B and interleaved ones, with data
parallelism across nodes sharing the NICs with the pipeline's transfers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from topologies.fabric import Fabric
from topologies.machine import Machine
from twin.build import build_step, resolve_step
from twin.forked import Forked
from twin.model import ModelSpec
from twin.pipeline_depth import simulate_deep
from twin.plan import ParallelPlan
from twin.report import Summary, rank_time_by_class, summarize, with_step
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate

SLACK = 2  # simulate in full unless it saves more than this many periods (micro-batches; rounds when interleaved)


def evaluation_points(plan: ParallelPlan) -> tuple[int, int] | None:
    """The two micro-batch counts to simulate for `plan` (mbs and ga resolved), one period of the steady state
    apart (one micro-batch; pp of them for an interleaved pipeline), or None for all of them."""
    if plan.vpp > 1:
        if plan.ga % plan.pp:
            return None  # not a whole number of rounds (twin.plan refuses such a plan; a caller may not have asked it)
        first, period = 2 * plan.pp, plan.pp
    else:
        first, period = (2 if plan.pp == 1 else plan.pp + 1), 1
    if plan.ga <= first + SLACK * period:
        return None
    return first, first + period


def periods_past(plan: ParallelPlan, points: tuple[int, int]) -> float:
    """How many periods (points[1] - points[0] micro-batches) `plan`'s micro-batches lie past the second point:
    how far the line through the two short steps is continued."""
    first, second = points
    return (plan.ga - second) / (second - first)


def shortened(plan: ParallelPlan, ga: int) -> ParallelPlan:
    """The plan with `ga` micro-batches of the same size: the batch shrinks, every per-micro-batch op stays."""
    return replace(plan, ga=ga, global_batch=plan.mbs * ga * plan.batch_split)


def extended(at_a: tuple[float, ...], at_b: tuple[float, ...], steps: float) -> tuple[float, ...]:
    """Values on the lines through `at_a` and `at_b` (one unit apart), `steps` units past `at_b`."""
    return tuple(y + steps * (y - x) for x, y in zip(at_a, at_b, strict=True))  # both hold the same terms


def continued(plan: ParallelPlan, evaluate: Callable[[ParallelPlan], tuple[float, ...]]) -> tuple[float, ...]:
    """`evaluate` (values linear in the micro-batch count) for `plan`, from two short plans where that is cheaper:
    evaluated one after the other, they cost their micro-batches together, so a plan with no more micro-batches
    than both hold (2 pp + 3 with a pipeline, 5 without) is evaluated as it is. An interleaved plan is too: the
    search's bound terms (its one caller) are tested linear over 1F1B's micro-batches, not over rounds."""
    if plan.vpp > 1:
        return evaluate(plan)
    points = evaluation_points(plan)
    if points is None or sum(points) >= plan.ga:
        return evaluate(plan)
    a, b = points
    return extended(evaluate(shortened(plan, a)), evaluate(shortened(plan, b)), periods_past(plan, points))


def simulate_step(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                  collectives: CollectiveModel | None = None, flops_formula: str = "hardware",
                  jobs: int = 1) -> Summary:
    """The Summary of `plan`'s step, simulated from two short steps when it has many micro-batches.

    Times (step, exposed communication, busy time per op class) and the FLOPs
    executed are continued linearly; throughput is the full batch's FLOPs (executed,
    and by formula) over the continued step;
    plan, batch and memory are the full plan's. With `jobs` > 1 the two short
    steps are simulated at once, one in a forked process (twin.forked): the same
    Summary, in about half the time, holding both in memory.
    """
    resolved, memory = resolve_step(model, plan, machine, gpus)
    deep = simulate_deep(model, resolved, machine, gpus, flops_formula, collectives)
    if deep is not None:
        return replace(deep, memory_per_gpu_gb=memory.total / 1e9)
    points = evaluation_points(resolved)
    if points is None:
        return summarize(simulate(build_step(model, resolved, machine, gpus).schedule, machine,
                                  collectives=collectives), flops_formula)

    # the two short steps lower the same collectives: one model, whose lowerings the second reuses (in turn)
    collectives = collectives or CollectiveModel(Fabric(machine, gpus))

    def short(ga: int) -> Summary:
        return summarize(simulate(build_step(model, shortened(resolved, ga), machine, gpus).schedule, machine,
                                  collectives=collectives), flops_formula)

    first = Forked(lambda: short(points[0])) if jobs > 1 else None
    try:
        b = short(points[1])
        a = first.result() if first else short(points[0])
    finally:
        if first:
            first.close()
    extra = periods_past(resolved, points)

    def line(x: float, y: float) -> float:
        return y + extra * (y - x)

    step_s = line(a.step_time_s, b.step_time_s)
    executed = line(a.flops_executed, b.flops_executed)  # every micro-batch runs the same ops
    by_formula = model.flops_per_step(resolved.global_batch, flops_formula)
    return replace(
        with_step(b, step_s, executed, by_formula, machine.device),
        plan=resolved.describe(),
        global_batch=resolved.global_batch,
        exposed_comm_s=line(a.exposed_comm_s, b.exposed_comm_s),
        exposed_comm_by_pass_s={k: line(a.exposed_comm_by_pass_s.get(k, 0.0), b.exposed_comm_by_pass_s.get(k, 0.0))
                                for k in sorted({*a.exposed_comm_by_pass_s, *b.exposed_comm_by_pass_s})},
        memory_per_gpu_gb=memory.total / 1e9,
        time_by_class_s={k: line(a.time_by_class_s.get(k, 0.0), v) for k, v in b.time_by_class_s.items()},
        sim_wall_s=max(a.sim_wall_s, b.sim_wall_s) if first else a.sim_wall_s + b.sim_wall_s,  # at once or in turn
    )


def rank_busy_by_class(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                       rank: int | None) -> tuple[float, dict[str, float]]:
    """(step time, busy time per op class of `rank`, or of the critical rank when None), continued from two short
    steps as simulate_step does."""
    resolved, _ = resolve_step(model, plan, machine, gpus)

    def evaluate(p: ParallelPlan) -> tuple[float, dict[str, float]]:
        run = simulate(build_step(model, p, machine, gpus).schedule, machine)
        return run.step_time_s, rank_time_by_class(run, rank)

    points = evaluation_points(resolved)
    if points is None:
        return evaluate(resolved)
    (step_a, by_a), (step_b, by_b) = (evaluate(shortened(resolved, ga)) for ga in points)
    keys = sorted(by_b)
    values = extended((step_a, *(by_a.get(k, 0.0) for k in keys)), (step_b, *(by_b[k] for k in keys)),
                      periods_past(resolved, points))
    return values[0], dict(zip(keys, values[1:]))
