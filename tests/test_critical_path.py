"""The critical path of a simulated step, the host thread, and the path costs `twin fit` moves along.

The critical path must add up to the step exactly (it is a chain of ops each
starting when the previous ends); the host thread must leave every machine
without a launch interval unchanged and, with one, bound the step below by
the host's own time; and the path costs must predict a re-simulation at
nearby parameters, which is what lets the fit simulate once per pass.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from topologies import load_machine
from twin.build import build_step
from twin.fit.paths import path_costs, simulate_path_costs
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.sim.compute import ComputeModel
from twin.sim.critical_path import critical_path
from twin.sim.engine import simulate

from helpers import SMALL_SPEC

FOUR_LAYERS = SMALL_SPEC.replace("layers=2", "layers=4")  # splits into 4 pipeline stages

PLANS = [  # (machine, gpus, plan): no pipeline, 4D, pipelines with and without data parallelism
    ("dgx-a100", 2, "tp=2,mbs=2,global_batch=4"),
    ("frontier", 16, "gx=2,gy=2,gz=2,gdata=2,mbs=1,global_batch=8"),
    ("dgx-a100", 4, "tp=1,pp=4,dp=1,mbs=1,global_batch=8"),
    ("dgx-a100", 8, "tp=2,pp=2,dp=2,mbs=1,global_batch=8,attention=unfused"),
    ("frontier", 16, "tp=2,pp=4,dp=2,zero=1,mbs=1,global_batch=16"),
]


def _with_launch_interval(machine, seconds: float):
    return replace(machine, device=replace(machine.device, launch_interval_s=seconds))


@pytest.mark.parametrize("machine_name,gpus,plan", PLANS)
@pytest.mark.parametrize("interval_us", [0.0, 30.0, 300.0])
def test_the_critical_path_adds_up_to_the_step(machine_name, gpus, plan, interval_us):
    machine = _with_launch_interval(load_machine(machine_name), interval_us * 1e-6)
    schedule = build_step(parse_model_spec(FOUR_LAYERS), parse_plan(plan), machine, gpus).schedule
    run = simulate(schedule, machine)
    path = critical_path(run)
    assert sum(step.elapsed_s for step in path) == pytest.approx(run.step_time_s, rel=1e-9)
    assert all(step.elapsed_s >= -1e-12 for step in path)
    kinds = {step.kind for step in path}
    if interval_us == 300.0:  # far slower than any op of this small model: the host sets the pace
        assert "host" in kinds
    else:
        assert "compute" in kinds


def test_a_schedule_simulated_again_keeps_its_predecessor_pairs_and_drops_them_with_it():
    """The fit simulates one schedule pass after pass: the second walk reuses the first's pairs, at the second
    simulation's times, and the pairs go when the schedule does."""
    import gc
    from twin.sim import critical_path as module
    machine_name, gpus, plan = PLANS[3]
    machine = load_machine(machine_name)
    busy_host = _with_launch_interval(machine, 30e-6)
    schedule = build_step(parse_model_spec(FOUR_LAYERS), parse_plan(plan), machine, gpus).schedule
    first = critical_path(simulate(schedule, machine))
    kept = {id(p) for p in schedule.programs} & set(module._PAIRS)
    assert kept
    again = critical_path(simulate(schedule, busy_host))
    assert again != first and again == critical_path(simulate(build_step(
        parse_model_spec(FOUR_LAYERS), parse_plan(plan), busy_host, gpus).schedule, busy_host))
    del schedule
    gc.collect()
    assert not kept & set(module._PAIRS)


def test_without_a_launch_interval_there_is_no_host_and_no_change():
    machine = load_machine("dgx-a100")
    model, plan = parse_model_spec(SMALL_SPEC), parse_plan("tp=2,pp=2,dp=2,mbs=1,global_batch=8")
    schedule = build_step(model, plan, machine, 8).schedule
    zero = _with_launch_interval(machine, 0.0)
    run = simulate(schedule, zero)
    assert all(t.host is None for t in run.timelines)
    assert run.step_time_s == simulate(schedule, zero).step_time_s


def test_a_host_bound_step_takes_the_hosts_time():
    """With an interval far above every op's duration and no pipeline, the step is the host issuing every op."""
    machine = _with_launch_interval(load_machine("dgx-a100"), 1e-3)
    schedule = build_step(parse_model_spec(SMALL_SPEC), parse_plan("tp=1,dp=1,mbs=1,global_batch=2"),
                          machine, 1).schedule
    run = simulate(schedule, machine)
    n_ops = len(schedule.programs[0].ops)
    assert run.step_time_s >= n_ops * 1e-3
    assert run.step_time_s < n_ops * 1e-3 * 1.05  # the last op's own duration on top, nothing else


def test_a_pipeline_host_waits_for_its_transfers():
    """After each receive the host must issue the dependent op anew: a 4-stage pipeline is slower host-bound than
    the longest stage's op count alone would make it."""
    machine = _with_launch_interval(load_machine("dgx-a100"), 1e-3)
    model = parse_model_spec(SMALL_SPEC)
    schedule = build_step(model, parse_plan("tp=1,pp=2,dp=1,mbs=1,global_batch=4"), machine, 2).schedule
    run = simulate(schedule, machine)
    longest = max(len(p.ops) for p in schedule.programs)
    assert run.step_time_s > longest * 1e-3 * 1.05
    assert any(t.host.synced for t in run.timelines)


@pytest.mark.parametrize("field,factor", [("launch_interval_s", 1.2), ("hbm_efficiency", 0.9),
                                          ("empirical_gemm_flop_per_s", 0.9), ("kernel_overhead_s", 1.5)])
def test_path_costs_predict_a_resimulation_nearby(field, factor):
    """The surrogate `twin fit` minimises: the step at moved device numbers, from the first simulation's path."""
    base = _with_launch_interval(load_machine("dgx-a100"), 20e-6)
    model = parse_model_spec("layers=4,hidden=1024,heads=16,seq=1024")
    plan = parse_plan("tp=2,pp=2,dp=2,mbs=2,global_batch=32,attention=unfused")
    costs = simulate_path_costs(model, plan, base, 8)
    assert costs.step_s == pytest.approx(simulate_step(model, plan, base, 8).step_time_s, rel=1e-9)
    moved = replace(base, device=replace(base.device, **{field: getattr(base.device, field) * factor}))
    compute = ComputeModel(moved.device)
    predicted = costs.at({w: compute.duration_s(w) for w in costs.works}, moved.device.launch_interval_s,
                         base.node.link_efficiency)
    assert predicted == pytest.approx(simulate_step(model, plan, moved, 8).step_time_s, rel=5e-3)


@pytest.mark.parametrize("level,factor,tolerance", [("nic", 0.5, 1e-9), ("nic", 1.2, 1e-9), ("nvlink", 0.9, 1e-2)])
def test_path_costs_predict_a_resimulation_at_another_link_efficiency(level, factor, tolerance):
    """A communication op on the path is charged to the level of the links that set its time: moving the NICs'
    achieved bandwidth on a two-node plan whose path crosses them predicts the re-simulated step exactly (the
    data-parallel reduction after the last backward); NVLink's tensor-parallel collectives also slow the compute
    they overlap, which the path holds fixed, so that move is predicted to within a percent."""
    base = _with_launch_interval(load_machine("dgx-a100"), 20e-6)
    model = parse_model_spec("layers=4,hidden=1024,heads=16,seq=1024")
    plan = parse_plan("tp=4,pp=2,dp=2,mbs=2,global_batch=32,attention=unfused")
    costs = simulate_path_costs(model, plan, base, 16)
    assert {lvl for lvl, _ in costs.link_work} >= {"nic", "nvlink"}
    efficiency = dict(base.node.link_efficiency)
    efficiency[level] = min(1.0, efficiency[level] * factor)
    moved = replace(base, node=replace(base.node, link_efficiency=efficiency))
    compute = ComputeModel(moved.device)
    predicted = costs.at({w: compute.duration_s(w) for w in costs.works}, moved.device.launch_interval_s, efficiency)
    simulated = simulate_step(model, plan, moved, 16).step_time_s
    assert simulated != pytest.approx(costs.step_s, rel=1e-3)  # the move matters
    assert predicted == pytest.approx(simulated, rel=tolerance)


def test_path_costs_hold_the_path_not_the_rank():
    """A comm-free single rank without a host: the path is every compute op once, unstretched, with no constant."""
    machine = _with_launch_interval(load_machine("dgx-a100"), 0.0)
    schedule = build_step(parse_model_spec(SMALL_SPEC), parse_plan("tp=1,dp=1,mbs=1,global_batch=1"),
                          machine, 1).schedule
    costs = path_costs(simulate(schedule, machine))
    ops = schedule.programs[0].ops
    assert costs.constant_s == 0.0 and costs.launches == 0.0
    assert sum(costs.stretch) == pytest.approx(len(ops))
    assert set(costs.works) == {op.work for op in ops}
