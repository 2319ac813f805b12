"""Fused compute runs (twin.sim.engine._compute_runs): one timeout for consecutive compute ops changes no time.

A stream's consecutive compute ops that nothing outside the stream waits for run as one SimPy timeout; each
op's own start and end are placed afterwards from the rates the run went at. Every op's start and end, and
so the step, the critical path and the time by op class, must be those of the op-by-op simulation, including
where communication starts or stops in the middle of a fused run and slows it (the comm-compute slowdown).
"""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from topologies.machine import load_machine
from topologies.overrides import parse_override
from twin.build import build_step
from twin.ir import P2P, Collective
from twin.model import get_model, parse_model_spec
from twin.plan import parse_plan
from twin.sim import engine
from twin.sim.critical_path import critical_path
from twin.sim.engine import Simulator

CASES = [
    # AxoNN 4D with overlapped all-reduce, reduce-scatter and all-gather: comm starts and stops mid-run
    ("frontier", "GPT-5B", 512, "gx=2,gy=1,gz=8,gdata=32,mbs=2", 1024),
    # a Megatron pipeline with ZeRO-1 over data parallelism, full recompute
    ("frontier", "layers=8,hidden=2048,heads=16,seq=2048", 64, "tp=4,pp=4,dp=4,zero=1,mbs=1,recompute=full", 32),
    # context parallelism: ring attention's shifts overlap the attention kernels
    ("dgx-a100", "layers=4,hidden=1024,heads=16,seq=4096", 16, "tp=4,cp=2,dp=2,mbs=1,attention=flash", 8),
]


def _model(name: str):
    return parse_model_spec(name) if "=" in name else get_model(name)


def _assert_same_times(fused, reference) -> None:
    """Every op's start and end, and the step, as the op-by-op simulation's."""
    assert fused.step_time_s == pytest.approx(reference.step_time_s, rel=1e-12)
    for a, b in zip(fused.timelines, reference.timelines):
        np.testing.assert_allclose(a.start_s, b.start_s, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(a.end_s, b.end_s, rtol=1e-12, atol=1e-15)


def _fused_with_host_and_reference(schedule, machine, monkeypatch):
    """The fused and the op-by-op simulation, and the size of each run ComputeUnit.run_issued timed."""
    sizes = []
    run_issued = engine.ComputeUnit.run_issued
    monkeypatch.setattr(engine.ComputeUnit, "run_issued",
                        lambda unit, works, issue_s: (sizes.append(len(works)), run_issued(unit, works, issue_s))[1])
    return Simulator(schedule, machine).run(), Simulator(schedule, machine, fuse=False).run(), sizes


@pytest.mark.parametrize("machine_name,model_name,gpus,plan_text,batch", CASES)
def test_fused_runs_time_every_op_as_the_op_by_op_simulation(machine_name, model_name, gpus, plan_text, batch,
                                                             monkeypatch):
    machine = load_machine(machine_name)
    if machine.device.launch_interval_s > 0:  # a host thread switches fusion off: test the device alone
        machine = load_machine(machine_name, (parse_override("device.launch_interval_us=0"),))
    schedule = build_step(_model(model_name), parse_plan(f"{plan_text},global_batch={batch}"), machine,
                          gpus).schedule
    interrupted = []
    place = engine._place_fused
    monkeypatch.setattr(engine, "_place_fused",
                        lambda run, works, pieces, *rest: (interrupted.append(len(pieces) > 1),
                                                           place(run, works, pieces, *rest)))
    fused = Simulator(schedule, machine).run()
    reference = Simulator(schedule, machine, fuse=False).run()

    assert interrupted, "no compute ops were fused: the case does not test fusion"
    _assert_same_times(fused, reference)
    assert [(s.cls, s.op_id, s.kind) for s in critical_path(fused)] == \
        [(s.cls, s.op_id, s.kind) for s in critical_path(reference)]
    if machine_name == "frontier" and "gz" in plan_text:
        assert any(interrupted), "no fused run was slowed mid-way by communication: the piecewise placement is untested"


HOST_CASES = [
    # host-bound: a small model at 40 us an op, one micro-batch's compute ops one run on tp=1
    ("dgx-a100", "layers=4,hidden=1024,heads=16,seq=1024", 8, "tp=1,dp=8,mbs=1,attention=unfused", 16, 40.0),
    # a pipeline: the host waits for every receive before it issues what follows it
    ("dgx-a100", "layers=8,hidden=1024,heads=16,seq=1024", 16, "tp=2,pp=4,dp=2,mbs=1", 16, 40.0),
    # device-bound with overlapped collectives slowing runs mid-way, and a host that keeps ahead
    ("dgx-a100", "GPT-5B", 512, "gx=2,gy=1,gz=8,gdata=32,mbs=2", 1024, 5.0),
]


@pytest.mark.parametrize("machine_name,model_name,gpus,plan_text,batch,interval_us", HOST_CASES)
def test_fused_runs_with_a_host_thread_time_every_op_as_the_op_by_op_simulation(
        machine_name, model_name, gpus, plan_text, batch, interval_us, monkeypatch):
    """With a host thread each op of a fused run waits for its own issue time: the same starts and ends."""
    machine = load_machine(machine_name, (parse_override(f"device.launch_interval_us={interval_us}"),))
    schedule = build_step(_model(model_name), parse_plan(f"{plan_text},global_batch={batch}"), machine,
                          gpus).schedule
    fused, reference, sizes = _fused_with_host_and_reference(schedule, machine, monkeypatch)

    assert sizes and max(sizes) > 5, "no compute ops were fused with the host: the case does not test it"
    _assert_same_times(fused, reference)
    for a, b in zip(fused.timelines, reference.timelines):
        np.testing.assert_array_equal(a.host.issue_s, b.host.issue_s)
    assert [(s.cls, s.op_id, s.kind) for s in critical_path(fused)] == \
        [(s.cls, s.op_id, s.kind) for s in critical_path(reference)]


def test_runs_never_cross_an_op_another_stream_waits_for():
    machine = load_machine("frontier")
    schedule = build_step(get_model("GPT-5B"), parse_plan("gx=2,gy=1,gz=8,gdata=32,mbs=2,global_batch=1024"),
                          machine, 512).schedule
    program = schedule.programs[0]
    done = engine._completion_events(simpy.Environment(), program)
    comm = {op.id: None for op in program.ops if isinstance(op.work, (Collective, P2P))}
    stream_of = [op.stream for op in program.ops]
    fused = 0
    for ops in engine._by_stream(program).values():
        runs = engine._compute_runs(ops, done, comm, fuse=True)
        assert [op for run in runs for op in run] == ops
        for run in (r for r in runs if len(r) > 1):
            fused += 1
            assert not any(op.id in comm for op in run)
            assert all(done[op.id] is None for op in run[:-1]), "an op another stream waits for ended mid-run"
            assert all(stream_of[d] == op.stream for op in run[1:] for d in op.deps)
        assert engine._compute_runs(ops, done, comm, fuse=False) == [[op] for op in ops]
    assert fused


def test_a_fused_run_the_host_has_not_issued_to_its_end_is_cut_where_the_host_waits(monkeypatch):
    """Rank 1's compute ops c1a, c1b, c1c are one run, but its host issues c1b only after the transfer it waits
    for (a send that depends on a receive) arrives: the run is cut there, and every op is timed as op by op."""
    from twin.ir import Gemm, GroupAxis, Op, Program, Schedule, StepInfo
    from twin.sim.host_thread import HostThread
    machine = load_machine("dgx-a100", (parse_override("device.launch_interval_us=20"),))
    gemm = Gemm(4096, 4096, 4096)
    rank0 = (Op(0, "c0", "compute", gemm), Op(1, "send", "p2p:send", P2P("send", "pp", 1, 1e6, "fwd"), (0,)),
             Op(2, "recv", "p2p:recv", P2P("recv", "pp", 1, 1e6, "back")))
    rank1 = (Op(0, "c1a", "compute", gemm), Op(1, "recv", "p2p:recv", P2P("recv", "pp", -1, 1e6, "fwd")),
             Op(2, "send", "p2p:send", P2P("send", "pp", -1, 1e6, "back"), (1,)),
             Op(3, "c1b", "compute", gemm, (0,)), Op(4, "c1c", "compute", gemm, (3,)))
    info = StepInfo(model="hand", plan=None, global_batch=1, seq=1, flops_hardware=1.0, flops_model=1.0,
                    memory_per_gpu_bytes=0.0)
    schedule = Schedule(2, (GroupAxis("pp", ((0, 1),)),), (Program((0,), rank0), Program((1,), rank1)), info)
    fused, reference, runs = _fused_with_host_and_reference(schedule, machine, monkeypatch)
    assert runs == [2], "c1b and c1c run fused once the host issued them; c1a ran alone, cut from them"
    one = next(t for t in fused.timelines if t.rank == 1)
    assert isinstance(one.host, HostThread) and one.start_s[3] > one.end_s[0] + 1e-6  # c1b waited for its host
    _assert_same_times(fused, reference)
