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
no gaps between ops), and gloo's collectives take some of a core too:
`comm_share` of one (benchmarks/compute_beside_comm.py measures it) counts
each other rank as holding a core for that share of its time out of compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topologies.machine import Machine
from twin.ir import Schedule
from twin.report import compute_busy_s
from twin.sim.engine import SimRun, simulate


@dataclass(frozen=True)
class ScatteredRun:
    """The step with scattered phases and the duty that gives it, beside the step in step."""

    run: SimRun  # with each other rank computing `duty` of the time, independently
    duty: float  # the fraction of the step a rank computes in `run`: the fixed point
    comm_share: float  # the share of a core a rank takes while it does not compute
    in_step: SimRun  # the simulator's own: the ranks of a program compute together
    rounds: int  # simulations after the one in step


def compute_duty(run: SimRun) -> float:
    """The fraction of the step a rank computes (any compute op running on it: twin.report.compute_busy_s), the
    mean over the ranks: each simulated class weighs as many ranks as it stands for."""
    weights = np.bincount(list(run.symmetry.class_of.values()), minlength=len(run.symmetry.representatives))
    step = run.step_time_s
    duties = [compute_busy_s(run.schedule.programs[t.program], t) / step if step > 0 else 0.0 for t in run.timelines]
    class_of = run.symmetry.class_of
    return float(np.average(duties, weights=[weights[class_of[t.rank]] for t in run.timelines]))


def simulate_scattered(schedule: Schedule, machine: Machine, comm_share: float = 0.0, tolerance: float = 1e-3,
                       max_rounds: int = 30) -> ScatteredRun:
    """The step with the ranks' phases scattered (module docstring): from the duty in step, each round
    simulates with each other rank holding a core for the present duty plus `comm_share` of the rest, and
    moves the duty halfway to the one that step gives, until it moves less than `tolerance`. On a machine
    whose ranks do not share cores the phases change nothing and the run in step is returned."""
    if not 0.0 <= comm_share <= 1.0:
        raise ValueError(f"comm_share {comm_share}: a share of one core, from 0 to 1")
    in_step = simulate(schedule, machine)
    duty = compute_duty(in_step)
    if machine.node.shared_cores <= 0:
        return ScatteredRun(in_step, duty, comm_share, in_step, 0)
    run, given, rounds = in_step, duty, 0
    while rounds < max_rounds:
        run = simulate(schedule, machine, others_duty=duty + comm_share * (1.0 - duty))
        rounds += 1
        given = compute_duty(run)
        if abs(given - duty) < tolerance:
            break
        duty = 0.5 * (duty + given)
    return ScatteredRun(run, given, comm_share, in_step, rounds)
