"""twin.fit.workers: a fit's simulation processes keep their runs' schedules from pass to pass.

What makes that safe is checked: a schedule reads no machine number, so one
built before gives the same simulation as a fresh one at other numbers, and
simulating it leaves it unchanged; each run goes to the same process in
every pass; results come back in the order asked, as the inline ones.
"""

from __future__ import annotations

from topologies import load_machine
from twin.build import build_step
from twin.fit.paths import path_costs
from twin.fit.workers import SimulationWorkers, simulate_task
from twin.model import ModelSpec
from twin.plan import parse_plan
from twin.sim.engine import simulate

MACHINE = "dgx-a100-800g"
MODEL = ModelSpec("m", 2, 512, 8, seq=256)
PLANS = [("tp=2,dp=1,mbs=1,global_batch=2", 2), ("tp=1,pp=2,dp=1,mbs=1,global_batch=4", 2),
         ("tp=1,dp=2,mbs=2,global_batch=4", 2), ("tp=2,pp=2,dp=1,mbs=1,global_batch=2", 4)]
SLOWER = (("device.launch_interval_us", 60.0), ("device.hbm_efficiency", 0.4))


def _tasks(overrides=()):
    return [(MACHINE, overrides, MODEL, parse_plan(plan), gpus) for plan, gpus in PLANS]


def test_a_schedule_built_before_simulates_as_a_fresh_one_at_other_machine_numbers():
    built: dict = {}
    plan, gpus = parse_plan(PLANS[3][0]), PLANS[3][1]
    first = build_step(MODEL, plan, load_machine(MACHINE), gpus, built=built).schedule
    path_costs(simulate(first, load_machine(MACHINE)))  # simulated once already: it must not have changed
    slower = load_machine(MACHINE, SLOWER)
    again = build_step(MODEL, plan, slower, gpus, built=built).schedule
    assert again is first and len(built) == 1
    fresh = build_step(MODEL, plan, slower, gpus).schedule
    assert path_costs(simulate(again, slower)) == path_costs(simulate(fresh, slower))


def test_every_run_goes_to_the_same_process_each_pass_and_results_keep_their_order():
    with SimulationWorkers(2) as workers:
        if workers.jobs < 2:  # no fork on this platform: inline, nothing to share out
            return
        first = list(workers.simulate(_tasks()))
        owners = dict(workers._owner)
        second = list(workers.simulate(_tasks(SLOWER)))
        assert workers._owner == owners and sorted(owners.values()) == [0, 0, 1, 1]
    assert first == [simulate_task(t) for t in _tasks()]
    assert second == [simulate_task(t) for t in _tasks(SLOWER)]
    assert all(b.step_s > a.step_s for a, b in zip(first, second))


def test_schedules_are_kept_only_when_asked_and_only_under_the_cap(monkeypatch):
    from twin.fit import workers
    monkeypatch.setattr(workers, "_SCHEDULES", workers._Kept())
    list(SimulationWorkers(1).simulate(_tasks()))
    assert not workers._SCHEDULES  # `twin validate --runs` simulates once: nothing to keep
    with SimulationWorkers(1, keep_schedules=True) as inline:
        list(inline.simulate(_tasks()))
        sizes = [sum(len(p.ops) for p in s.programs) for s in workers._SCHEDULES.values()]
        assert len(sizes) == len(PLANS) and workers._SCHEDULES.ops == sum(sizes)
    assert not workers._SCHEDULES and workers._SCHEDULES.ops == 0  # the fit is over: this process goes on without
    monkeypatch.setattr(workers, "_SCHEDULES", workers._Kept())
    monkeypatch.setattr(workers, "OPS_KEPT", sizes[0] + sizes[1])
    list(SimulationWorkers(1, keep_schedules=True).simulate(_tasks()))
    assert len(workers._SCHEDULES) == 2  # the first two fill the cap; the others are built and dropped
    assert list(SimulationWorkers(1, keep_schedules=True).simulate(_tasks())) == [simulate_task(t) for t in _tasks()]
