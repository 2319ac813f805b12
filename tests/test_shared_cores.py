"""Ranks that share a CPU host's cores (node.shared_cores; twin.sim.compute_unit.NodeCores).

A calibrated rate is each rank's with every rank of the node computing at once. On 2 cores shared by 4
ranks that is half a core; a rank computing alone gets a whole core, twice the calibrated rate; three at
once get 2/3 of a core each, 4/3 of it (and with the ranks holding every core, the last of them reaches
the transfer that follows late: node.timeslice_skew). Worked out by hand here, on hand-made schedules, in
the reduced and the per-rank simulation; then a pipeline, whose stages idle in turn, must run faster than without
sharing and a data-parallel plan, whose ranks compute in lockstep, exactly as fast.
"""

from __future__ import annotations

import pytest

from helpers import SMALL_SPEC, quad_machine
from test_sim import REFERENCE, _gemm_alone_s, all_reduce, schedule
from twin.build import build_step
from twin.ir import Gemm, Op
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.sim.engine import simulate


def _gemm(op_id: int, deps=()) -> Op:
    return Op(op_id, f"gemm{op_id}", "compute", Gemm(REFERENCE, REFERENCE, REFERENCE), tuple(deps))


@pytest.mark.parametrize("busy, factor", [(1, 2.0), (2, 2.0), (3, 4 / 3), (4, 1.0)])
def test_a_rank_runs_at_its_share_of_the_cores(tmp_path, busy, factor):
    machine = quad_machine(tmp_path, shared_cores=2)
    sched = schedule(4, {}, [((r,), [_gemm(0)]) for r in range(busy)] +
                     [((r,), []) for r in range(busy, 4)])
    t_gemm = _gemm_alone_s()
    for full in (False, True):
        run = simulate(sched, machine, full=full)
        by_rank = {t.rank: t for t in run.timelines}
        assert by_rank[0].end_s[0] == pytest.approx(t_gemm / factor, rel=1e-6)


def _lagged_and_in_step(tmp_path, skew: float = 0.25, cores: int = 2):
    """The same 4-rank machine on `cores` cores with its ranks lagging by `skew` when oversubscribed, and
    without."""
    (tmp_path / "lag").mkdir()
    (tmp_path / "step").mkdir()
    return (quad_machine(tmp_path / "lag", shared_cores=cores, timeslice_skew=skew),
            quad_machine(tmp_path / "step", shared_cores=cores))


@pytest.mark.parametrize("busy, factor", [(1, 2.0), (2, 2.0), (3, 4 / 3), (4, 1.0)])
def test_time_slicing_delays_the_transfer_that_waits_for_the_last_rank(tmp_path, busy, factor):
    """node.timeslice_skew 0.25: with two, three or four ranks computing on two cores, every core held, the
    last of them reaches the collective after their GEMM a quarter of its time late; one leaves a core free for
    the other threads and does not lag. The GEMMs themselves run at their share of the cores either way. Two
    rounds: a transfer takes the lag of the compute since the last one (0.5 of a GEMM in all, not 0.75)."""
    lagged, in_step = _lagged_and_in_step(tmp_path)
    gemm_s = _gemm_alone_s() / factor
    lag_s = 0.25 * gemm_s if busy >= 2 else 0.0
    rounds = [_gemm(0), all_reduce(1, 4, deps=(0,)), _gemm(2, deps=(1,)), all_reduce(3, 4, deps=(2,))]
    idle = [all_reduce(0, 4), all_reduce(1, 4, deps=(0,))]
    sched = schedule(4, {"x": ((0, 1, 2, 3),)},
                     [(tuple(range(busy)), rounds)] + ([(tuple(range(busy, 4)), idle)] if busy < 4 else []))
    for full in (False, True):
        lags, steps = simulate(sched, lagged, full=full), simulate(sched, in_step, full=full)
        assert lags.timelines[0].end_s[0] == pytest.approx(gemm_s, rel=1e-6)  # compute is not slowed
        assert lags.step_time_s - steps.step_time_s == pytest.approx(2 * lag_s, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("busy, after_gemms, ramp", [(4, 0.5, 1.0), (4, 1.1, 1 / 1.1), (3, 1.1, 0.75 / 1.1),
                                                    (2, 1.1, 0.5 / 1.1), (1, 0.5, 0.0)])
def test_the_lag_that_does_not_grow_with_the_compute_builds_up_to_its_floor(tmp_path, busy, after_gemms, ramp):
    """node.timeslice_lag_us: beyond the skew's quarter of the compute, the last rank lags a fixed tenth of a
    GEMM once ranks holding every core have computed `after_gemms` GEMMs' time, linearly from none below it: a
    whole tenth after a GEMM where half of one suffices; 1 / 1.1 of it where 1.1 are needed; with three ranks
    on two cores, whose GEMM takes 3/4 of the calibrated time, 0.75 / 1.1; with two, a core each, half the
    time: 0.5 / 1.1; with one, which leaves a core free, none."""
    gemm_s = _gemm_alone_s()
    (tmp_path / "floor").mkdir()
    floored = quad_machine(tmp_path / "floor", shared_cores=2, timeslice_skew=0.25,
                           timeslice_lag_us=0.1 * gemm_s * 1e6, timeslice_lag_after_us=after_gemms * gemm_s * 1e6)
    lagged, _ = _lagged_and_in_step(tmp_path)
    ops = [_gemm(0), all_reduce(1, 4, deps=(0,))]
    sched = schedule(4, {"x": ((0, 1, 2, 3),)},
                     [(tuple(range(busy)), ops)] + ([(tuple(range(busy, 4)), [all_reduce(0, 4)])] if busy < 4 else []))
    for full in (False, True):
        floors, lags = simulate(sched, floored, full=full), simulate(sched, lagged, full=full)
        assert floors.step_time_s - lags.step_time_s == pytest.approx(0.1 * gemm_s * ramp, rel=1e-6, abs=1e-12)


def test_ranks_drift_on_through_an_asynchronous_transfer_until_one_is_waited_for(tmp_path):
    """node.timeslice_skew 0.25, four ranks on two cores: a GEMM, an all-reduce issued beside the next GEMM
    (nothing waits for it), that GEMM, a second all-reduce, which the third GEMM waits for, then a third
    all-reduce after it. The first transfer does not bring the ranks back in step, so the last rank issues the
    second half a GEMM late (a quarter of each GEMM since the start), the wait for it does, and the third is a
    quarter of a GEMM late: the step is 0.75 of a GEMM longer than in step, where lags taken at each issue and
    from zero again would give 0.5."""
    lagged, in_step = _lagged_and_in_step(tmp_path)
    ops = [_gemm(0), all_reduce(1, 4, deps=(0,)), _gemm(2, deps=(0,)), all_reduce(3, 4, deps=(1, 2)),
           _gemm(4, deps=(2, 3)), all_reduce(5, 4, deps=(4,))]
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), ops)])
    gemm_s = _gemm_alone_s()
    for full in (False, True):
        lags, steps = simulate(sched, lagged, full=full), simulate(sched, in_step, full=full)
        waited = lags.timelines[0].start_s[4] - steps.timelines[0].start_s[4]
        assert waited == pytest.approx(0.5 * gemm_s, rel=1e-6)
        assert lags.step_time_s - steps.step_time_s == pytest.approx(0.75 * gemm_s, rel=1e-6)


def test_a_transfers_begin_is_recorded_after_its_lag_and_its_last_member(tmp_path):
    """SimRun.transfer_begin_s, which benchmarks/collective_split.py sets beside the measured waits: in the
    drifting ranks' step above the all-reduces begin a quarter, a half and a quarter of a GEMM after their
    ops start (the lag), and at their start without it; where two classes meet, each member's begin is the
    same moment, when the later class arrived (ranks 2 and 3, after a 20 GB all-reduce of their own)."""
    lagged, in_step = _lagged_and_in_step(tmp_path)
    ops = [_gemm(0), all_reduce(1, 4, deps=(0,)), _gemm(2, deps=(0,)), all_reduce(3, 4, deps=(1, 2)),
           _gemm(4, deps=(2, 3)), all_reduce(5, 4, deps=(4,))]
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), ops)])
    gemm_s = _gemm_alone_s()
    for machine, lags in ((lagged, (0.25, 0.5, 0.25)), (in_step, (0.0, 0.0, 0.0))):
        run = simulate(sched, machine)
        waited = [run.transfer_begin_s[(0, i)] - run.timelines[0].start_s[i] for i in (1, 3, 5)]
        assert waited == pytest.approx([lag * gemm_s for lag in lags], rel=1e-6, abs=1e-12)
    two = schedule(4, {"x": ((0, 1, 2, 3),), "p": ((0, 1), (2, 3))},
                   [((0, 1), [_gemm(0), all_reduce(1, 4, deps=(0,))]),
                    ((2, 3), [all_reduce(0, 20e9, group="p", stream="comm:p"), all_reduce(1, 4, deps=(0,))])])
    run = simulate(two, in_step)
    begins = {run.transfer_begin_s[(c, 1)] for c in range(len(run.timelines))}
    assert len({t.start_s[1] for t in run.timelines}) == 2  # the two classes reach it at different times
    assert begins == {max(t.start_s[1] for t in run.timelines)}


@pytest.mark.parametrize("beyond, lag_gemms", [(None, 0.125), (0.05, 0.125 + 0.05 * 0.5)])
def test_past_its_calibrated_span_the_lag_grows_at_its_own_slope(tmp_path, beyond, lag_gemms):
    """node.timeslice_lag_span_us half a GEMM: a GEMM of four ranks on two cores before an all-reduce lags
    0.25 x 0.5 GEMMs on the line, and past the span node.timeslice_skew_beyond_span per second of the other
    half (nothing where it is not given: the lag is held), not 0.25 x 1."""
    gemm_s = _gemm_alone_s()
    (tmp_path / "span").mkdir()
    spanned = quad_machine(tmp_path / "span", shared_cores=2, timeslice_skew=0.25,
                           timeslice_lag_span_us=0.5 * gemm_s * 1e6, timeslice_skew_beyond_span=beyond)
    _, in_step = _lagged_and_in_step(tmp_path)
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), [_gemm(0), all_reduce(1, 4, deps=(0,))])])
    for full in (False, True):
        spans, steps = simulate(sched, spanned, full=full), simulate(sched, in_step, full=full)
        assert spans.step_time_s - steps.step_time_s == pytest.approx(lag_gemms * gemm_s, rel=1e-6)


def test_a_lag_is_hidden_where_compute_goes_on_beside_the_transfer(tmp_path):
    """All four ranks compute a GEMM, start a small all-reduce and compute a second GEMM beside it: the
    all-reduce starts a quarter of a GEMM late and still ends inside the second GEMM, so the step does not
    move: a lag costs only what waits for the last rank."""
    lagged, in_step = _lagged_and_in_step(tmp_path)
    ops = [_gemm(0), all_reduce(1, 4, deps=(0,)), _gemm(2, deps=(0,))]
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), ops)])
    for full in (False, True):
        lags, steps = simulate(sched, lagged, full=full), simulate(sched, in_step, full=full)
        assert lags.timelines[0].start_s[1] == steps.timelines[0].start_s[1]
        assert lags.timelines[0].end_s[1] > steps.timelines[0].end_s[1] + 0.2 * _gemm_alone_s()
        assert lags.step_time_s == pytest.approx(steps.step_time_s, rel=1e-9)


def test_a_lag_that_ends_while_its_ranks_wait_for_others_costs_nothing(tmp_path):
    """One core: ranks 0 and 1 compute a GEMM (two ranks on one core: oversubscribed, so their last rank
    lags an eighth of a GEMM) and then wait at an all-reduce of all four for ranks 2 and 3, whose own 20 GB
    all-reduce, without compute and so without lag, ends later than that: the lag is over before the last
    member arrives, and the step is the same as without it."""
    lagged, in_step = _lagged_and_in_step(tmp_path, cores=1)
    sched = schedule(4, {"x": ((0, 1, 2, 3),), "p": ((0, 1), (2, 3))},
                     [((0, 1), [_gemm(0), all_reduce(1, 4, deps=(0,))]),
                      ((2, 3), [all_reduce(0, 20e9, group="p", stream="comm:p"), all_reduce(1, 4, deps=(0,))])])
    for full in (False, True):
        lags, steps = simulate(sched, lagged, full=full), simulate(sched, in_step, full=full)
        first_waits = {t.rank: t for t in steps.timelines}[0]
        assert first_waits.start_s[1] + 0.25 * first_waits.end_s[0] < steps.step_time_s  # others come later
        assert lags.step_time_s == pytest.approx(steps.step_time_s, rel=1e-12)


@pytest.mark.parametrize("others, factor", [("moving", 2 / 3 / 0.5), ("waiting", 2.0), ("computing", 1.0)])
def test_a_rank_moving_bytes_takes_its_share_of_the_cores_from_the_ranks_computing_beside_it(tmp_path, others,
                                                                                            factor):
    """node.comm_core_share 0.5, 2 cores: ranks 0 and 1 compute a GEMM while ranks 2 and 3 run a 20 GB
    all-reduce in their pair (moving bytes all along): the load is 2 + 2 x 0.5 = 3 cores' worth, so each GEMM
    gets 2/3 of a core where calibration gave it half, 4/3 of the calibrated rate. Ranks 2 and 3 waiting at an
    all-reduce of all four, which 0 and 1 join after their GEMM, take nothing: a core each, twice the rate;
    computing themselves, the calibrated rate."""
    machine = quad_machine(tmp_path, slowdown=0.0, shared_cores=2, comm_core_share=0.5)
    beside = {"moving": [all_reduce(0, 20e9, group="p", stream="comm:p")], "waiting": [all_reduce(0, 4)],
              "computing": [_gemm(0)]}[others]
    sched = schedule(4, {"x": ((0, 1, 2, 3),), "p": ((0, 1), (2, 3))},
                     [((0, 1), [_gemm(0), all_reduce(1, 4, deps=(0,))] if others == "waiting" else [_gemm(0)]),
                      ((2, 3), beside)])
    for full in (False, True):
        run = simulate(sched, machine, full=full)
        assert run.timelines[0].end_s[0] == pytest.approx(_gemm_alone_s() / factor, rel=1e-6)


def test_a_rank_that_computes_beside_its_own_transfer_is_not_counted_twice(tmp_path):
    """The share counts a rank that moves bytes and computes nothing: all four ranks computing a GEMM beside
    their own all-reduce load the cores with the four GEMMs alone (its own transfer slows a rank by the
    device's comm_compute_slowdown, 0 here), so the GEMM runs at the calibrated rate."""
    machine = quad_machine(tmp_path, slowdown=0.0, shared_cores=2, comm_core_share=0.5)
    sched = schedule(4, {"x": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), [all_reduce(0, 20e9), _gemm(1)])])
    run = simulate(sched, machine, full=True)
    assert run.timelines[0].end_s[1] == pytest.approx(_gemm_alone_s(), rel=1e-6)


def test_a_rank_speeds_up_when_the_others_stop(tmp_path):
    """Rank 0 computes two GEMMs, ranks 1-3 one each: all four share the cores (calibrated rate) until the
    first GEMMs end together, then rank 0 has a core to itself for its second: twice as fast."""
    machine = quad_machine(tmp_path, shared_cores=2)
    sched = schedule(4, {}, [((0,), [_gemm(0), _gemm(1)])] + [((r,), [_gemm(0)]) for r in (1, 2, 3)])
    t_gemm = _gemm_alone_s()
    run = simulate(sched, machine, full=True)
    assert run.timelines[0].end_s[0] == pytest.approx(t_gemm, rel=1e-9)
    assert run.step_time_s == pytest.approx(t_gemm + t_gemm / 2, rel=1e-9)


def _latency_s(run, rank_class: int, op_id: int) -> float:
    types = run.flow_types
    return float(types.latency_s[types.per_op[rank_class][op_id].type_id])


def test_comm_compute_slowdown_still_applies_on_shared_cores(tmp_path):
    """Ranks 0 and 1 all-reduce while they compute (slowed by the comm-compute factor while it moves bytes,
    not during its latency); ranks 2 and 3 idle, so 2 ranks share the 2 cores: a core each, twice the
    calibrated rate, times (1 - slowdown) while the bytes move."""
    slowdown, nbytes = 0.2, 20e9
    machine = quad_machine(tmp_path, slowdown=slowdown, shared_cores=2)
    sched = schedule(4, {"x": ((0, 1),)}, [((0, 1), [all_reduce(0, nbytes), _gemm(1)]),
                                           ((2, 3), [])])
    run = simulate(sched, machine, full=True)
    # the all-reduce (20 GB over a 10 GB/s pair) outlasts the GEMM: slowed from the end of its latency on, which
    # passes at twice its calibrated pace (two of the four ranks communicate: NodeCores.comm_factor)
    latency, alone = _latency_s(run, 0, 0) / 2, _gemm_alone_s() / 2
    assert 0 < latency < alone / 100
    assert run.timelines[0].end_s[1] == pytest.approx(latency + (alone - latency) / (1 - slowdown), rel=1e-9)


def test_a_collective_waiting_out_its_latency_does_not_slow_compute_on_shared_cores(tmp_path):
    """A CPU host's collective library takes the cores while it copies and reduces bytes; while it waits for
    its peers (the latency) it does not, so a GEMM beside a 4-byte all-reduce runs at its full share there.
    A GPU's collective kernels hold their SMs from launch to end: there it is slowed all along."""
    slowdown = 0.5
    sched = schedule(4, {"x": ((0, 1),)}, [((0, 1), [all_reduce(0, 4), _gemm(1)]), ((2, 3), [])])
    (tmp_path / "cpu").mkdir()
    (tmp_path / "gpu").mkdir()
    cpu = simulate(sched, quad_machine(tmp_path / "cpu", slowdown=slowdown, shared_cores=2), full=True)
    assert cpu.timelines[0].end_s[1] == pytest.approx(_gemm_alone_s() / 2, rel=1e-6)
    gpu = simulate(sched, quad_machine(tmp_path / "gpu", slowdown=slowdown), full=True)
    latency = _latency_s(gpu, 0, 0)
    assert latency > 0
    # the GEMM runs at 1 - slowdown through the latency (the 4 bytes take no time), then at full rate
    assert gpu.timelines[0].end_s[1] == pytest.approx(_gemm_alone_s() + latency * slowdown, rel=1e-9)


def _shared_and_alone(tmp_path):
    """The same 4-rank machine with its ranks sharing 2 cores, and without sharing."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    return quad_machine(tmp_path / "a", shared_cores=2), quad_machine(tmp_path / "b")


@pytest.mark.parametrize("both_pairs, factor", [(False, 2.0), (True, 1.0)])
def test_a_transfer_runs_at_its_ranks_share_of_the_cores(tmp_path, both_pairs, factor):
    """The calibrated latency and bandwidth are each rank's with every rank in a collective at once: two of four
    ranks all-reducing on 2 cores while the others idle take half the time, latency and bytes alike; all four
    (two pairs) the calibrated time. Both against the same schedule where the ranks do not share cores."""
    nbytes = 2e9
    shared, alone = _shared_and_alone(tmp_path)
    sched = schedule(4, {"x": ((0, 1), (2, 3))}, [((0, 1), [all_reduce(0, nbytes)]),
                                                  ((2, 3), [all_reduce(0, nbytes)] if both_pairs else [])])
    for full in (False, True):
        t_shared = simulate(sched, shared, full=full).step_time_s
        assert t_shared == pytest.approx(simulate(sched, alone, full=full).step_time_s / factor, rel=1e-9)


@pytest.mark.parametrize("nbytes, inside", [(1e8, True), (2e10, False)])
def test_a_transfer_while_every_rank_computes_takes_the_stretch_longer(tmp_path, nbytes, inside):
    """Ranks 0 and 1 all-reduce while all four compute a GEMM (more ranks computing than the 2 cores): the
    transfer runs at a third of its pace (node.comm_stretch_under_compute 3), latency and bytes alike. A short
    one ends inside the GEMM, three times later; a long one is re-rated when the GEMMs end and finishes the
    rest at full pace."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    stretched = quad_machine(tmp_path / "a", slowdown=0.0, shared_cores=2, comm_stretch=3)
    plain = quad_machine(tmp_path / "b", slowdown=0.0, shared_cores=2)
    sched = schedule(4, {"x": ((0, 1), (2, 3))}, [((0, 1), [all_reduce(0, nbytes), _gemm(1)]),
                                                  ((2, 3), [_gemm(0)])])
    t_gemm = _gemm_alone_s()  # four computing on two cores: the calibrated rate
    for full in (False, True):
        alone = simulate(sched, plain, full=full).timelines[0].end_s[0]
        ends = simulate(sched, stretched, full=full).timelines[0].end_s
        assert ends[1] == pytest.approx(t_gemm, rel=1e-9)
        assert (3 * alone < t_gemm) == inside
        expected = 3 * alone if inside else t_gemm + (alone - t_gemm / 3)  # a third of the pace until the GEMMs end
        assert ends[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("computing, stretched", [(1, False), (2, True)])
def test_the_stretch_applies_once_computing_ranks_hold_every_core(tmp_path, computing, stretched):
    """Ranks 0 and 1 all-reduce while `computing` of ranks 0-3 run a GEMM on the 2 cores: one leaves a core to
    gloo's threads, two hold both (the condition the calibration measured with one rank per core)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    machines = [quad_machine(tmp_path / d, slowdown=0.0, shared_cores=2, comm_stretch=s)
                for d, s in (("a", 3), ("b", 1))]
    second = [_gemm(1)] if computing == 2 else []
    sched = schedule(4, {"x": ((0, 1), (2, 3))}, [((0,), [all_reduce(0, 1e8), _gemm(1)]),
                                                  ((1,), [all_reduce(0, 1e8)] + second), ((2, 3), [])])
    with_stretch, without = (simulate(sched, m, full=True).timelines[0].end_s[0] for m in machines)
    assert with_stretch == pytest.approx(3 * without if stretched else without, rel=1e-9)


def _latency_and_bytes_alone(tmp_path, nbytes: float) -> tuple[float, float]:
    """(latency, bytes) of an all-reduce of ranks 0 and 1 while nobody computes, on the shared 2-core quad."""
    (tmp_path / "plain").mkdir()
    plain = quad_machine(tmp_path / "plain", slowdown=0.0, shared_cores=2)
    once, twice = (simulate(schedule(4, {"x": ((0, 1), (2, 3))}, [((0, 1), [all_reduce(0, b)]), ((2, 3), [])]), plain,
                            full=True).timelines[0].end_s[0] for b in (nbytes, 2 * nbytes))
    return 2 * once - twice, twice - once  # latency + bytes, latency + twice the bytes


@pytest.mark.parametrize("pace", [0.0, 2e-6, 0.25])  # stalls; part before the GEMMs end, part after; inside
def test_a_transfers_latency_waits_while_its_own_ranks_compute(tmp_path, pace):
    """Ranks 0 and 1 issue an all-reduce, then all four compute a GEMM (node.comm_stretch_under_compute 3,
    node.comm_latency_pace_under_compute `pace`): its bytes move first, at a third of their pace alone; its
    latency then at `pace` of its pace alone until the GEMMs end, and at the pace alone after: at pace 0 it
    starts when the GEMMs end."""
    nbytes = 1e8
    latency, moving = _latency_and_bytes_alone(tmp_path, nbytes)
    machine = quad_machine(tmp_path, slowdown=0.0, shared_cores=2, comm_stretch=3, latency_pace=pace)
    sched = schedule(4, {"x": ((0, 1), (2, 3))}, [((0, 1), [all_reduce(0, nbytes), _gemm(1)]), ((2, 3), [_gemm(0)])])
    t_gemm = _gemm_alone_s()
    assert 3 * moving < t_gemm  # the bytes are done inside the GEMMs
    latency_done_at_gemm_end = (t_gemm - 3 * moving) * pace  # seconds of its time alone
    expected = (3 * moving + latency / pace if latency_done_at_gemm_end >= latency
                else t_gemm + latency - latency_done_at_gemm_end)
    assert (0 < latency_done_at_gemm_end < latency) == (0 < pace < 1e-5)  # the three cases are those meant
    for full in (False, True):
        ends = simulate(sched, machine, full=full).timelines[0].end_s
        assert ends[1] == pytest.approx(t_gemm, rel=1e-9)
        assert ends[0] == pytest.approx(expected, rel=1e-9)


def test_ranks_that_wait_while_others_compute_see_only_the_stretch(tmp_path):
    """Ranks 0 and 1 all-reduce and wait while 2 and 3 compute on both cores: the latency's pace under
    compute is for a transfer whose own ranks compute, so this one ends as without it (bytes then latency
    at one pace take as long as latency then bytes)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    machines = [quad_machine(tmp_path / d, slowdown=0.0, shared_cores=2, comm_stretch=3, latency_pace=p)
                for d, p in (("a", 0.0), ("b", None))]
    sched = schedule(4, {"x": ((0, 1), (2, 3))}, [((0, 1), [all_reduce(0, 1e8)]), ((2, 3), [_gemm(0)])])
    for full in (False, True):
        stalled, stretched = (simulate(sched, m, full=full).timelines[0].end_s[0] for m in machines)
        assert stalled == pytest.approx(stretched, rel=1e-9)
        assert stalled < _gemm_alone_s()  # it ended while 2 and 3 computed


@pytest.mark.parametrize("pairs, factor", [(1, 1.0), (2, 0.5)])
def test_a_ranks_transfers_at_once_share_its_pace(tmp_path, pairs, factor):
    """Two all-reduces on two streams at once, by ranks 0 and 1 while 2 and 3 idle (`pairs` 1) or by all four:
    every transfer of a rank counts, so one pair's two run at the calibrated pace (two ranks in two transfers
    on two cores: what four ranks in one had), and all four ranks' two at half of it, as long as one after the
    other (benchmarks/overlap_sizes.py measured that on this project's 2-core host)."""
    nbytes = 2e9
    shared, alone = _shared_and_alone(tmp_path)
    busy = [((0, 1, 2, 3), [all_reduce(0, nbytes), all_reduce(1, nbytes, group="y", stream="comm:y")])]
    if pairs == 1:
        busy = [((0, 1), busy[0][1]), ((2, 3), [])]
    sched = schedule(4, {"x": ((0, 1), (2, 3)), "y": ((0, 1), (2, 3))}, busy)
    for full in (False, True):
        t_shared = simulate(sched, shared, full=full).step_time_s
        assert t_shared == pytest.approx(simulate(sched, alone, full=full).step_time_s / factor, rel=1e-9)


def test_a_pipeline_gains_from_idle_stages_and_lockstep_data_parallelism_does_not(tmp_path):
    model = parse_model_spec(SMALL_SPEC)
    shared, alone = _shared_and_alone(tmp_path)
    for plan_text, gains in (("tp=2,pp=2,mbs=1,global_batch=4", True), ("gdata=4,mbs=1,global_batch=8", False)):
        plan = parse_plan(plan_text)
        sched = build_step(model, plan, shared, 4).schedule
        with_sharing, without = simulate(sched, shared).step_time_s, simulate(sched, alone).step_time_s
        assert simulate(sched, shared, full=True).step_time_s == pytest.approx(with_sharing, rel=1e-9)
        if gains:
            assert with_sharing < 0.9 * without
        else:
            assert with_sharing == pytest.approx(without, rel=1e-12)


def test_shared_cores_must_be_positive(tmp_path):
    from topologies.errors import InputError
    with pytest.raises(InputError, match="shared_cores"):
        quad_machine(tmp_path, shared_cores=-1)


_FIELD_OF = {"timeslice_skew": "timeslice_skew", "comm_stretch": "comm_stretch_under_compute",
             "latency_pace": "comm_latency_pace_under_compute", "timeslice_lag_us": "timeslice_lag_us",
             "timeslice_lag_after_us": "timeslice_lag_after_us", "comm_core_share": "comm_core_share",
             "timeslice_lag_span_us": "timeslice_lag_span_us",
             "timeslice_skew_beyond_span": "timeslice_skew_beyond_span"}  # arg -> key


@pytest.mark.parametrize("cores, argument, value, says", [
    (2, "timeslice_skew", -0.1, "must be >= 0"), (2, "timeslice_skew", 11, "above the physical limit"),
    (0, "timeslice_skew", 0.2, "add node.shared_cores"), (2, "comm_stretch", 0.5, "must be >= 1"),
    (2, "comm_stretch", 101, "above the physical limit"), (0, "comm_stretch", 2, "add node.shared_cores"),
    (2, "latency_pace", -0.1, r"in \[0, 1\]"), (2, "latency_pace", 1.5, r"in \[0, 1\]"),
    (0, "latency_pace", 0.0, "add node.shared_cores"), (2, "timeslice_lag_us", -1, "must be >= 0"),
    (0, "timeslice_lag_us", 100, "add node.shared_cores"),
    (0, "timeslice_lag_after_us", 100, "add node.shared_cores"), (2, "comm_core_share", 1.2, r"in \[0, 1\]"),
    (0, "comm_core_share", 0.5, "add node.shared_cores"), (2, "timeslice_lag_span_us", 0, "must be > 0"),
    (0, "timeslice_lag_span_us", 100, "add node.shared_cores"),
    (2, "timeslice_skew_beyond_span", 0.1, "needs node.timeslice_lag_span_us"),
    (2, "timeslice_skew_beyond_span", 11, "above the physical limit")])
def test_the_oversubscribed_hosts_numbers_are_checked(tmp_path, cores, argument, value, says):
    from topologies.errors import InputError
    with pytest.raises(InputError, match=f"{_FIELD_OF[argument]}.*{says}"):
        quad_machine(tmp_path, shared_cores=cores, **{argument: value})
