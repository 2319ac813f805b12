"""Exposed communication split by the pass it delays (twin.report.exposed_comm_by_pass), on a hand-made timeline
and on simulated steps, continued ones included."""

from __future__ import annotations

import numpy as np
import pytest

from topologies import load_machine
from twin.build import build_step
from twin.ir import Collective, Gemm, Op, OpTag, Program
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.report import exposed_comm_by_pass, exposed_comm_s, format_summary, summarize
from twin.sim.engine import RankTimeline, simulate


def _gemm(i: int, phase: str | None) -> Op:
    tag = OpTag(phase=phase, block="qkv", role="gemm") if phase else None
    return Op(i, f"g{i}", "compute", Gemm(8, 8, 8), tag=tag)


def _comm(i: int) -> Op:
    return Op(i, f"c{i}", "comm:z", Collective("all_gather", "z", 1e6))


def test_each_idle_stretch_with_communication_counts_for_the_pass_that_waits_for_it():
    # compute: fwd 0-1, rc 3-4, untagged 4-5 and 6-7 (back to back with nothing, then a gap), bwd 8-9
    # comm: 0.5-2.5 (1.5 exposed before rc), 5.2-5.5 and 5.7-6.5 (0.6 before the untagged op at 6), 8.5-10 (1 after)
    ops = [_gemm(0, "fwd"), _gemm(1, "rc"), _gemm(2, None), _gemm(3, None), _gemm(4, "bwd"),
           _comm(5), _comm(6), _comm(7), _comm(8)]
    start = np.array([0, 3, 4, 6, 8, 0.5, 5.2, 5.7, 8.5])
    end = np.array([1, 4, 5, 7, 9, 2.5, 5.5, 6.5, 10])
    program, timeline = Program((0,), tuple(ops)), RankTimeline(0, 0, start, end)
    parts = exposed_comm_by_pass(program, timeline)
    assert parts == pytest.approx({"rc": 1.5, "untagged": 0.6, "end": 1.0})
    assert sum(parts.values()) == pytest.approx(exposed_comm_s(program, timeline))


def test_communication_before_the_first_compute_op_counts_for_its_pass():
    ops = [_comm(0), _gemm(1, "fwd")]
    program, timeline = Program((0,), tuple(ops)), RankTimeline(0, 0, np.array([0.0, 2.0]), np.array([3.0, 4.0]))
    assert exposed_comm_by_pass(program, timeline) == pytest.approx({"fwd": 2.0})


SPEC = "layers=4,hidden=1024,heads=16,seq=512,vocab=4096"


@pytest.mark.parametrize("gpus, plan_text", [
    (16, "gx=2,gz=4,gdata=2,axonn=1,mbs=1,global_batch=64"),  # continued from two short steps
    (16, "gx=2,gdata=2,pp=4,mbs=1,global_batch=64"),           # a pipeline, continued from short pipelines too
])
def test_the_parts_add_up_to_the_exposed_communication_in_simulated_steps(gpus, plan_text):
    machine, model = load_machine("frontier"), parse_model_spec(SPEC)
    built = build_step(model, parse_plan(plan_text), machine, gpus)
    full = summarize(simulate(built.schedule, machine))
    assert sum(full.exposed_comm_by_pass_s.values()) == pytest.approx(full.exposed_comm_s, rel=1e-9, abs=1e-12)
    fast = simulate_step(model, built.plan, machine, gpus)
    assert sum(fast.exposed_comm_by_pass_s.values()) == pytest.approx(fast.exposed_comm_s, rel=1e-3, abs=1e-9)
    assert set(fast.exposed_comm_by_pass_s) <= {"fwd", "rc", "bwd", "step", "end"}


def test_axonns_blocking_forward_gathers_show_in_the_forward_and_the_summary_says_so():
    machine, model = load_machine("frontier"), parse_model_spec(SPEC)
    built = build_step(model, parse_plan("gz=16,axonn=1,mbs=1,global_batch=16"), machine, 16)
    s = summarize(simulate(built.schedule, machine))
    assert s.exposed_comm_by_pass_s["fwd"] > 0  # AxoNN's code waits for each forward gather (axonn=1)
    assert "by the pass it delays: fwd" in format_summary(s)
