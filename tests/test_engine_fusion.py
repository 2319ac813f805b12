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
    assert fused.step_time_s == pytest.approx(reference.step_time_s, rel=1e-12)
    for a, b in zip(fused.timelines, reference.timelines):
        np.testing.assert_allclose(a.start_s, b.start_s, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(a.end_s, b.end_s, rtol=1e-12, atol=1e-15)
    assert [(s.cls, s.op_id, s.kind) for s in critical_path(fused)] == \
        [(s.cls, s.op_id, s.kind) for s in critical_path(reference)]
    if machine_name == "frontier" and "gz" in plan_text:
        assert any(interrupted), "no fused run was slowed mid-way by communication: the piecewise placement is untested"


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
