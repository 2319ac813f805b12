"""A step of many micro-batches, continued from two short steps, against simulating all of them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topologies import load_machine
from twin.build import build_step
from twin.micro_batches import evaluation_points, periods_past, shortened, simulate_step
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.report import summarize
from twin.sim.engine import simulate

SPEC = "layers=8,hidden=1024,heads=16,seq=512,vocab=4096"

CASES = [
    ("frontier", 16, "gx=2,gz=2,gdata=4,mbs=1,global_batch=256"),
    ("frontier", 16, "gx=4,gy=2,gdata=2,mbs=2,global_batch=256"),
    ("frontier", 16, "gz=16,mbs=1,global_batch=256"),
    ("frontier", 16, "gx=2,gdata=2,pp=4,mbs=1,global_batch=64"),
    ("frontier", 32, "gx=2,gdata=2,pp=8,zero=1,mbs=1,global_batch=64"),
    ("perlmutter", 16, "gx=2,gdata=2,pp=4,mbs=2,global_batch=128"),
    # interleaved: whole rounds of pp micro-batches, from 2 pp and 3 pp
    ("frontier", 16, "gx=2,gdata=2,pp=4,vpp=2,mbs=1,global_batch=48"),
    ("perlmutter", 32, "gx=2,gdata=4,pp=4,vpp=2,mbs=1,global_batch=96"),
    ("dgx-a100", 64, "tp=8,pp=4,vpp=2,dp=2,mbs=1,global_batch=48"),  # the data-parallel all-reduce over the NICs
]


@pytest.mark.parametrize("machine_name, gpus, plan_text", CASES)
def test_continued_step_matches_the_full_simulation(machine_name, gpus, plan_text):
    machine, model = load_machine(machine_name), parse_model_spec(SPEC)
    built = build_step(model, parse_plan(plan_text), machine, gpus)
    assert evaluation_points(built.plan) is not None  # the cases do take the shortcut
    full = summarize(simulate(built.schedule, machine))
    fast = simulate_step(model, built.plan, machine, gpus)
    assert fast.step_time_s == pytest.approx(full.step_time_s, rel=1e-6)
    assert fast.exposed_comm_s == pytest.approx(full.exposed_comm_s, rel=1e-6, abs=1e-9)
    assert fast.tflops_per_gpu == pytest.approx(full.tflops_per_gpu, rel=1e-6)
    assert fast.pct_peak_empirical == pytest.approx(full.pct_peak_empirical, rel=1e-6)
    assert fast.memory_per_gpu_gb == pytest.approx(full.memory_per_gpu_gb)
    assert (fast.plan, fast.global_batch) == (full.plan, full.global_batch)
    for name, seconds in full.time_by_class_s.items():
        assert fast.time_by_class_s[name] == pytest.approx(seconds, rel=1e-6, abs=1e-9), name


def test_evaluation_points():
    plan = parse_plan("gx=2,gdata=2,pp=4,mbs=1,ga=16,global_batch=32")
    assert evaluation_points(plan) == (5, 6)
    assert evaluation_points(shortened(plan, 7)) is None  # too few to save any
    assert evaluation_points(parse_plan("gx=2,gdata=8,mbs=1,ga=5,global_batch=40")) == (2, 3)
    assert evaluation_points(parse_plan("gx=2,gdata=2,pp=4,vpp=2,mbs=1,ga=16,global_batch=32")) is None  # 4 rounds
    interleaved = parse_plan("gx=2,gdata=2,pp=4,vpp=2,mbs=1,ga=28,global_batch=56")
    assert evaluation_points(interleaved) == (8, 12)  # a round is pp micro-batches
    assert periods_past(interleaved, (8, 12)) == 4
    assert evaluation_points(shortened(interleaved, 26)) is None  # not whole rounds
    assert shortened(plan, 5).global_batch == 1 * 5 * 2


def test_values_are_continued_only_where_the_short_plans_cost_less_one_after_the_other():
    """A bound's terms are evaluated in one process: short plans of pp + 1 and pp + 2 micro-batches are worth it
    only when together they hold fewer than the plan."""
    from twin.micro_batches import continued

    def evaluated(ga: int) -> list[int]:
        seen: list[int] = []
        plan = parse_plan(f"gx=2,gdata=2,pp=4,mbs=1,ga={ga},global_batch={2 * ga}")
        value = continued(plan, lambda p: (seen.append(p.ga), 3.0 + 2.0 * p.ga)[1:])
        assert value == pytest.approx((3.0 + 2.0 * ga,))
        return seen

    assert evaluated(10) == [10]  # 5 + 6 micro-batches would cost more than 10
    assert evaluated(11) == [11]
    assert evaluated(12) == [5, 6]


def test_one_ranks_busy_time_is_continued_like_the_step():
    """A pipeline's first and last stages differ (the last carries the LM head and the loss); each rank's busy
    time per class, continued from two short steps, equals its class's timeline in the full simulation, with
    1F1B and interleaved."""
    from twin.micro_batches import rank_busy_by_class
    from twin.report import rank_time_by_class

    machine, model = load_machine("frontier"), parse_model_spec(SPEC)
    for plan in ("gx=2,gdata=2,pp=4,mbs=1,global_batch=64", "gx=2,gdata=2,pp=4,vpp=2,mbs=1,global_batch=48"):
        built = build_step(model, parse_plan(plan), machine, 16)
        assert evaluation_points(built.plan) is not None, plan
        run = simulate(built.schedule, machine)
        first, last = rank_time_by_class(run, 0), rank_time_by_class(run, 15)
        assert first != last
        critical = summarize(run).time_by_class_s
        assert critical in (first, last)
        assert rank_time_by_class(run, None) == critical  # no rank named: the critical one
        for rank, full in ((0, first), (15, last)):
            step_s, fast = rank_busy_by_class(model, built.plan, machine, 16, rank)
            assert step_s == pytest.approx(run.step_time_s, rel=1e-6)
            assert set(fast) == set(full)
            for name, seconds in full.items():
                assert fast[name] == pytest.approx(seconds, rel=1e-6, abs=1e-9), (plan, rank, name)
    with pytest.raises(Exception, match="--rank 16"):
        rank_time_by_class(run, 16)


def test_the_two_short_steps_at_once_give_the_same_summary(monkeypatch):
    """jobs=2 simulates one short step in a forked process (twin.forked): the same Summary, every field."""
    import twin.micro_batches as mb

    machine, model = load_machine("frontier"), parse_model_spec(SPEC)
    plan = parse_plan("gx=2,gdata=2,pp=4,mbs=1,global_batch=64")
    forks, real = [], mb.Forked
    monkeypatch.setattr(mb, "Forked", lambda compute: forks.append(compute) or real(compute))
    one = simulate_step(model, plan, machine, 16)
    assert forks == []
    two = simulate_step(model, plan, machine, 16, jobs=2)
    assert len(forks) == 1
    assert replace(two, sim_wall_s=one.sim_wall_s) == one
