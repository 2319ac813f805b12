"""The other bound of a time-sliced host: the ranks' phases scattered, not in step.

On a host whose ranks share too few cores (node.shared_cores) the simulator
runs the ranks of one program in step, so while one computes they all do,
at the share of a core `twin calibrate` measured with every rank computing.
The measured runs of benchmarks/fit_local.py say otherwise: while rank 0
runs a GEMM, about (ranks - 1) x the fraction of the step a rank computes
of the others compute too, as if their phases were independent
(benchmarks/rank_phases.py). This module gives that bound: the step
simulated with every other rank computing, independently, a fraction of the
time equal to the duty that step itself gives (twin.sim.compute_unit.NodeCores'
`others_duty`), found by damped iteration. The measured steps lie between
the two bounds; neither is the machine file's model (docs/fit.md).

A rank that does not compute is in a collective (the executor's ranks leave
no gaps between ops), and gloo's collectives take some of a core too, but
only while they move bytes: a rank waiting at a rendezvous takes none
(benchmarks/compute_beside_comm.py). `comm_share` of one core counts each
other rank as holding a core for that share of the time it moves bytes and
does not compute (`moving_duty`: from when the last member issued each of
its transfers to its end), or, with `share_while="out_of_compute"` (the
forty-fourth session's cruder bound), of all its time out of compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topologies.machine import Machine
from twin.ir import Schedule
from twin.report import compute_busy_s, exposed_s
from twin.sim.engine import SimRun, simulate


@dataclass(frozen=True)
class ScatteredRun:
    """The step with scattered phases and the duty that gives it, beside the step in step."""

    run: SimRun  # with each other rank holding a core `held` of the time, independently
    duty: float  # the fraction of the step a rank computes in `run`
    comm_share: float  # the share of a core a rank takes while it moves bytes (or, below, does not compute)
    in_step: SimRun  # the simulator's own: the ranks of a program compute together
    rounds: int  # simulations after the one in step
    moving: float = 0.0  # the fraction of the step a rank moves bytes and does not compute, in `run`
    share_while: str = "moving"  # when a rank holds comm_share of a core: "moving" or "out_of_compute"

    @property
    def held(self) -> float:
        """The fraction of the time a rank holds a core that `run` gives: the fixed point."""
        return _held(self.duty, self.moving, self.comm_share, self.share_while)


SHARE_WHILE = ("moving", "out_of_compute")


def _held(duty: float, moving: float, comm_share: float, share_while: str) -> float:
    return min(1.0, duty + comm_share * (moving if share_while == "moving" else 1.0 - duty))  # min: round-off


def compute_duty(run: SimRun) -> float:
    """The fraction of the step a rank computes (any compute op running on it: twin.report.compute_busy_s), the
    mean over the ranks: each simulated class weighs as many ranks as it stands for."""
    return _mean_fraction(run, [compute_busy_s(run.schedule.programs[t.program], t) for t in run.timelines])


def moving_duty(run: SimRun) -> float:
    """The fraction of the step a rank moves bytes and computes nothing, the mean over the ranks: each
    transfer from when the last member issued it (SimRun.started_by; before, the rank waits at the rendezvous)
    to its end, less the time compute runs beside it (twin.report.exposed_s)."""
    seconds = []
    for c, t in enumerate(run.timelines):
        program = run.schedule.programs[t.program]
        spans = []
        for op in program.ops:
            if op.is_comm:
                starter_class, starter_op = run.started_by.get((c, op.id), (c, op.id))
                spans.append((float(run.timelines[starter_class].start_s[starter_op]), float(t.end_s[op.id])))
        seconds.append(exposed_s(program, t, spans))
    return _mean_fraction(run, seconds)


def _mean_fraction(run: SimRun, seconds: list[float]) -> float:
    """Per simulated class, `seconds` over the step, averaged with each class weighing its ranks."""
    weights = np.bincount(list(run.symmetry.class_of.values()), minlength=len(run.symmetry.representatives))
    step = run.step_time_s
    class_of = run.symmetry.class_of
    return float(np.average([x / step if step > 0 else 0.0 for x in seconds],
                            weights=[weights[class_of[t.rank]] for t in run.timelines]))


def simulate_scattered(schedule: Schedule, machine: Machine, comm_share: float = 0.0, tolerance: float = 1e-3,
                       max_rounds: int = 30, share_while: str = "moving") -> ScatteredRun:
    """The step with the ranks' phases scattered (module docstring): from the step in step, each round
    simulates with each other rank holding a core the present fraction of the time (its duty, plus
    `comm_share` of the time it moves bytes, or of all its time out of compute: `share_while`), and moves
    that fraction halfway to the one that step gives, until it moves less than `tolerance`. On a machine
    whose ranks do not share cores the phases change nothing and the run in step is returned."""
    if not 0.0 <= comm_share <= 1.0:
        raise ValueError(f"comm_share {comm_share}: a share of one core, from 0 to 1")
    if share_while not in SHARE_WHILE:
        raise ValueError(f"share_while {share_while!r}: one of {', '.join(SHARE_WHILE)}")

    def measured(run: SimRun) -> ScatteredRun:
        return ScatteredRun(run, compute_duty(run), comm_share, in_step, rounds, moving_duty(run), share_while)

    rounds = 0
    in_step = simulate(schedule, machine)
    given = measured(in_step)
    if machine.node.shared_cores <= 0:
        return given
    held = given.held
    while rounds < max_rounds:
        rounds += 1
        given = measured(simulate(schedule, machine, others_duty=held))
        if abs(given.held - held) < tolerance:
            break
        held = 0.5 * (held + given.held)
    return given
