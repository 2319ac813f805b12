"""The scattered bound of a time-sliced host (twin.sim.phases; NodeCores' `others_duty`).

With 4 ranks on 2 cores and each other rank computing with probability u, independently, the number of
others computing beside a rank is binomial(3, u); the rank gets min(1, 2 / (1 + k)) of a core, the
calibrated share is half a core, and it lags while 1 + k >= 2 (every core held). Worked out by hand at
u = 0, 1/2 and 1, then on hand-made schedules: a GEMM with every other rank idle for good (u = 0) runs twice
as fast as in step, and the fixed point's duty is the one its step gives.
"""

from __future__ import annotations

import pytest

from helpers import quad_machine
from test_sim import REFERENCE, _gemm_alone_s, all_reduce, schedule
from twin.ir import Gemm, Op
from twin.sim.compute_unit import NodeCores
from twin.sim.engine import simulate
from twin.sim.phases import compute_duty, moving_duty, simulate_scattered


@pytest.mark.parametrize("duty, factor, crowded", [
    (0.0, 2.0, 0.0),  # alone: a whole core, twice the calibrated half
    (1.0, 1.0, 1.0),  # all four always: the calibrated share, always lagging
    # k = 0..3 with chances 1/8, 3/8, 3/8, 1/8: shares 1, 1, 2/3, 1/2 -> 0.8125 of a core; 1 + k >= 2 7/8 of the time
    (0.5, 2 * 0.8125, 7 / 8),
])
def test_a_rank_gets_the_expected_share_over_the_others_it_meets(duty, factor, crowded):
    cores = NodeCores(2, 4, skew=0.2, others_duty=duty)
    assert cores.factor() == pytest.approx(factor)
    assert cores.crowding() == pytest.approx(crowded)
    cores.busy = 4  # the simulated ranks in step do not change it
    assert cores.factor() == pytest.approx(factor)


def test_in_step_the_lag_runs_only_while_the_ranks_hold_every_core():
    """One rank computing leaves a core free; two hold both; one computing beside two ranks moving bytes at
    half a core each holds them too (load 2); no rank computing, nothing lags."""
    cores = NodeCores(2, 4, skew=0.2, mover_share=0.5)
    cores.busy = 1
    assert cores.crowding() == 0.0
    cores.movers = 2
    assert cores.crowding() == 1.0
    cores.busy, cores.movers = 2, 0
    assert cores.crowding() == 1.0
    cores.busy, cores.movers = 0, 4
    assert cores.crowding() == 0.0


@pytest.mark.parametrize("duty", [-0.1, 1.5])
def test_a_duty_outside_zero_to_one_is_refused(duty):
    with pytest.raises(ValueError, match="others_duty"):
        NodeCores(2, 4, others_duty=duty)


def _gemm(op_id: int, deps=()) -> Op:
    return Op(op_id, f"gemm{op_id}", "compute", Gemm(REFERENCE, REFERENCE, REFERENCE), tuple(deps))


def test_four_ranks_in_step_compute_at_the_calibrated_share_and_scattered_faster(tmp_path):
    """Each of 4 ranks runs a GEMM then an all-reduce: in step at the calibrated rate; with the others' duty 0
    (which the step cannot give: it is mostly GEMM) twice as fast; the fixed point between the two, its duty the
    one its own step gives."""
    machine = quad_machine(tmp_path, shared_cores=2)
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), [_gemm(0), all_reduce(1, 4, deps=(0,))])])
    in_step = simulate(sched, machine)
    assert in_step.timelines[0].end_s[0] == pytest.approx(_gemm_alone_s(), rel=1e-6)
    alone = simulate(sched, machine, others_duty=0.0)
    assert alone.timelines[0].end_s[0] == pytest.approx(_gemm_alone_s() / 2, rel=1e-6)
    bounds = simulate_scattered(sched, machine)
    assert bounds.in_step.step_time_s == pytest.approx(in_step.step_time_s)
    assert alone.step_time_s < bounds.run.step_time_s < in_step.step_time_s
    assert compute_duty(bounds.run) == pytest.approx(bounds.duty)
    assert bounds.duty == pytest.approx(compute_duty(simulate(sched, machine, others_duty=bounds.duty)), abs=2e-3)
    assert 0.9 < bounds.duty < 1.0


def test_the_duty_counts_each_class_by_its_ranks(tmp_path):
    """Rank 0 computes the whole step, the other three never: the mean duty is 1/4, in the reduced simulation
    (two classes) and the per-rank one alike."""
    machine = quad_machine(tmp_path)
    sched = schedule(4, {}, [((0,), [_gemm(0)]), ((1, 2, 3), [])])
    for full in (False, True):
        assert compute_duty(simulate(sched, machine, full=full)) == pytest.approx(0.25)


def test_without_shared_cores_the_bound_is_the_step_in_step(tmp_path):
    machine = quad_machine(tmp_path)
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), [_gemm(0), all_reduce(1, 4, deps=(0,))])])
    bounds = simulate_scattered(sched, machine)
    assert bounds.run is bounds.in_step and bounds.rounds == 0


def test_ranks_that_hold_a_whole_core_in_collectives_give_the_step_in_step(tmp_path):
    """comm_share 1: every other rank holds a core whether it computes or not, so a GEMM gets the calibrated
    share, as in step; a share of 0.5 lies between that and none."""
    machine = quad_machine(tmp_path, shared_cores=2)
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), [_gemm(0), all_reduce(1, 4e8, deps=(0,))])])
    in_step = simulate(sched, machine).step_time_s
    steps = [simulate_scattered(sched, machine, comm_share=share).run.step_time_s for share in (0.0, 0.5, 1.0)]
    assert steps[0] < steps[1] < steps[2] == pytest.approx(in_step)
    with pytest.raises(ValueError, match="comm_share"):
        simulate_scattered(sched, machine, comm_share=1.5)


def _ranks_waiting_for_rank_0():
    """Rank 0 runs a GEMM and then an all-reduce of all four, which ranks 1-3 issue at once."""
    return schedule(4, {"x": ((0, 1, 2, 3),)}, [((0,), [_gemm(0), all_reduce(1, 4e8, deps=(0,))]),
                                                 ((1, 2, 3), [all_reduce(0, 4e8)])])


def test_a_rank_moves_bytes_only_after_the_last_member_issued_the_transfer(tmp_path):
    """Rank 0 runs a GEMM, then an all-reduce that ranks 1-3 issued at once: they wait at the rendezvous until
    the GEMM ends, and every rank moves bytes only from then to the transfer's end. So the moving fraction is
    the transfer over the step on every rank, where all time out of compute counts the waits too."""
    machine = quad_machine(tmp_path)
    sched = _ranks_waiting_for_rank_0()
    for full in (False, True):
        run = simulate(sched, machine, full=full)
        gemm_s = run.timelines[0].end_s[0]
        transfer_s = run.step_time_s - gemm_s
        assert gemm_s == pytest.approx(_gemm_alone_s(), rel=1e-6) and transfer_s > 0
        assert moving_duty(run) == pytest.approx(transfer_s / run.step_time_s)
        assert compute_duty(run) == pytest.approx(gemm_s / run.step_time_s / 4)


def test_a_share_charged_while_moving_bytes_lies_between_none_and_all_time_out_of_compute(tmp_path):
    """The same step scattered on 2 shared cores: ranks 1-3 wait most of it, so a share held only while they
    move bytes slows rank 0's GEMM less than one held all their time out of compute."""
    machine = quad_machine(tmp_path, shared_cores=2)
    sched = _ranks_waiting_for_rank_0()
    none, moving, out = (simulate_scattered(sched, machine, comm_share=share, share_while=where)
                         for share, where in ((0.0, "moving"), (0.8, "moving"), (0.8, "out_of_compute")))
    assert none.run.step_time_s < moving.run.step_time_s < out.run.step_time_s
    assert moving.held == pytest.approx(moving.duty + 0.8 * moving.moving)
    assert out.held == pytest.approx(out.duty + 0.8 * (1 - out.duty))
    with pytest.raises(ValueError, match="share_while"):
        simulate_scattered(sched, machine, share_while="waiting")
