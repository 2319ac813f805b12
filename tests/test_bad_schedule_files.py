"""Schedule IR files a user hands the twin: a bad one is one line, exit code 2 (as tests/test_bad_files.py checks
for every kind of file, with its helpers).

The base schedule is two pipeline stages written by hand, with a plan and a
tagged op, so that every field of IR version 2 (the plan, the tags) has a
case; a file of version 1 is refused with the command that writes a current
one. A control case runs the unmutated file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from test_bad_files import INF, Writer, base_trace, check_case, run, text_file
from twin.ir import P2P, Collective, Elementwise, Gemm, GroupAxis, Op, OpTag, Program, Schedule, StepInfo
from twin.ir_io import schedule_to_dict
from twin.plan import ParallelPlan


def base_schedule() -> dict:
    """Two pipeline stages: rank 0 computes and sends 64 KiB of activations to rank 1, which receives them;
    both then stream some memory and all-reduce over the pair."""
    tag = OpTag(micro_batch=0, phase="fwd", block="w", role="gemm")
    stage0 = (Op(0, "fwd", "compute", Gemm(256, 256, 256), tag=tag),
              Op(1, "send_act", "p2p:send", P2P("send", "pp", 1, 65536.0, "act"), deps=(0,)),
              Op(2, "opt", "compute", Elementwise(1.0e6, 1.0e5), deps=(0,)),
              Op(3, "grads", "comm", Collective("all_reduce", "pp", 4096.0), deps=(2,)))
    stage1 = (Op(0, "recv_act", "p2p:recv", P2P("recv", "pp", -1, 65536.0, "act")),
              Op(1, "fwd", "compute", Gemm(256, 256, 256), deps=(0,)),
              Op(2, "opt", "compute", Elementwise(1.0e6, 1.0e5), deps=(1,)),
              Op(3, "grads", "comm", Collective("all_reduce", "pp", 4096.0), deps=(2,)))
    info = StepInfo("hand", ParallelPlan(pp=2, global_batch=2, mbs=1, ga=2), 2, 128, 1.0e9, 1.0e9, 1.0e6)
    s = Schedule(2, (GroupAxis("pp", ((0, 1),)),), (Program((0,), stage0), Program((1,), stage1)), info)
    return schedule_to_dict(s)


def schedule_with(edit: Callable[[dict], object]) -> Writer:
    """The base schedule, edited, as JSON (INF markers become 1e999, which JSON readers take for infinity)."""
    def write(tmp_path: Path) -> Path:
        d = base_schedule()
        edit(d)
        text = json.dumps(d).replace(f'"{INF}"', "1e999")
        return text_file("schedule.json", text)(tmp_path)
    return write


def schedule_text(text: str | bytes) -> Writer:
    return text_file("schedule.json", text)


def op(d: dict, program: int, index: int) -> dict:
    return d["programs"][program]["ops"][index]


def simulate_schedule(path: Path, _tmp: Path) -> list[str]:
    return ["simulate", "--schedule", str(path), "--machine", "frontier"]


def run_schedule(path: Path, tmp_path: Path) -> list[str]:
    return ["run", str(path), "--out", str(tmp_path / "run-out")]


def compare_trace_schedule(path: Path, tmp_path: Path) -> list[str]:
    trace = text_file("good-trace.json", json.dumps(base_trace()))(tmp_path)
    return ["compare-trace", str(trace), "--schedule", str(path), "--machine", "frontier"]


_GOOD = json.dumps(base_schedule())

SCHEDULE_CASES = [
    pytest.param(schedule_with(lambda d: op(d, 1, 0)["work"].update(nbytes=12345.0)), simulate_schedule,
                 "rank 0 sends 65536 B to rank 1 on 'pp' (its 1st tag 'act' send), but rank 1 receives 12345 B",
                 id="p2p-sizes-differ"),
    pytest.param(schedule_with(lambda d: op(d, 1, 0).update(type="elementwise", work={"nbytes": 10.0},
                                                            stream="compute")),
                 simulate_schedule, "posts only 0 matching recv(s)", id="send-without-recv"),
    pytest.param(schedule_with(lambda d: op(d, 0, 1).update(type="elementwise", work={"nbytes": 10.0},
                                                            stream="compute")),
                 simulate_schedule, "rank 1 receives 65536 B from rank 0", id="recv-without-send"),
    pytest.param(schedule_with(lambda d: op(d, 0, 2)["work"].update(flops=-1.0)), simulate_schedule,
                 "flops=-1.0 must be a finite number >= 0", id="negative-flops"),
    pytest.param(schedule_with(lambda d: op(d, 0, 2)["work"].update(nbytes=INF)), simulate_schedule,
                 "nbytes=inf must be a finite number >= 0", id="infinite-bytes"),
    pytest.param(schedule_with(lambda d: op(d, 0, 3)["work"].update(nbytes=-4096.0)), simulate_schedule,
                 "nbytes=-4096.0 must be", id="negative-collective-bytes"),
    pytest.param(schedule_with(lambda d: d["info"].update(flops_hardware=-1.0)), simulate_schedule,
                 "info.flops_hardware=-1.0 must be a finite number >= 0", id="info-negative-flops"),
    pytest.param(schedule_with(lambda d: d["info"].update(memory_per_gpu_bytes=INF)), simulate_schedule,
                 "info.memory_per_gpu_bytes=inf", id="info-infinite-memory"),
    pytest.param(schedule_with(lambda d: d["info"].update(global_batch=0)), simulate_schedule,
                 "info.global_batch=0 must be at least 1", id="info-zero-batch"),
    pytest.param(schedule_with(lambda d: op(d, 0, 0)["work"].update(dtype="fp8x")), simulate_schedule,
                 "unknown dtype 'fp8x'", id="gemm-unknown-dtype"),
    pytest.param(schedule_with(lambda d: op(d, 1, 3)["work"].update(dtype="int4")), simulate_schedule,
                 "unknown dtype 'int4'", id="collective-unknown-dtype"),
    pytest.param(schedule_with(lambda d: d["programs"][1].update(ops=[])), simulate_schedule,
                 "program 1 has no ops", id="empty-op-list"),
    pytest.param(schedule_with(lambda d: d.update(world_size=10**9)), simulate_schedule,
                 "world_size=1000000000 is above 4,194,304 ranks", id="world-size-1e9"),
    pytest.param(schedule_with(lambda d: d.update(world_size=10**6)), simulate_schedule,
                 "rank 2 is in no program", id="world-size-above-listed-ranks"),
    pytest.param(schedule_with(lambda d: op(d, 0, 0)["work"].update(m=2**40)), simulate_schedule,
                 "gemm m=1099511627776 must be a positive integer below 2^31", id="gemm-dimension-huge"),
    pytest.param(schedule_with(lambda d: op(d, 0, 2)["work"].update(nbytes=10**400)), simulate_schedule,
                 "nbytes must be a finite number", id="integer-too-big-for-a-float"),
    pytest.param(schedule_text(_GOOD[:len(_GOOD) // 2]), simulate_schedule, "is not JSON", id="truncated"),
    pytest.param(schedule_text(""), simulate_schedule, "is not JSON", id="empty-file"),
    pytest.param(schedule_text(_GOOD.replace('"fwd"', '"fw\u00e9"', 1).encode("latin-1")), simulate_schedule,
                 "is not UTF-8 text", id="not-utf8"),
    pytest.param(schedule_text("[" * 100_000), simulate_schedule, "nested too deeply", id="nested-too-deep"),
    pytest.param(schedule_text(_GOOD.replace("65536.0", "NaN", 1)), simulate_schedule, "NaN is not a valid number",
                 id="nan-literal"),
    pytest.param(schedule_text(json.dumps([base_schedule()])), simulate_schedule,
                 "'format' is a JSON array", id="list-not-object"),
    pytest.param(schedule_with(lambda d: d.pop("programs")), simulate_schedule, "schedule is missing field 'programs'",
                 id="missing-key"),
    pytest.param(schedule_with(lambda d: d.update(world_size="2")), simulate_schedule,
                 "schedule.world_size must be an integer", id="wrong-type-world-size"),
    pytest.param(schedule_with(lambda d: d["programs"][0].update(ops={"0": 1})), simulate_schedule,
                 "schedule.programs[0].ops must be a list", id="wrong-type-ops"),
    pytest.param(schedule_with(lambda d: d.update(info=[1, 2])), simulate_schedule,
                 "schedule.info must be a JSON object", id="wrong-type-info"),
    pytest.param(schedule_with(lambda d: d.update(version=1)), simulate_schedule,
                 "schedule.json has IR version 1; this twin reads version 3: re-export it with `twin export`",
                 id="old-ir-version"),
    pytest.param(schedule_with(lambda d: d.update(version=2)), simulate_schedule,
                 "schedule.json has IR version 2; this twin reads version 3: re-export it with `twin export`",
                 id="ir-version-before-cp"),
    pytest.param(schedule_with(lambda d: d.update(version=0)), simulate_schedule,
                 "has IR version 0; this twin reads version 3", id="unknown-ir-version"),
    pytest.param(schedule_with(lambda d: d["info"]["plan"].update(gx=0)), simulate_schedule,
                 "info.plan.gx=0 is out of range", id="plan-zero-degree"),
    pytest.param(schedule_with(lambda d: d["info"]["plan"].update(pp=4)), simulate_schedule,
                 "info.plan.gx x gy x gz x cp x gdata x pp = 4 ranks, but the schedule's world_size is 2",
                 id="plan-of-another-step"),
    pytest.param(schedule_with(lambda d: d["info"]["plan"].update(attention="sparse")), simulate_schedule,
                 "info.plan.attention='sparse' is unknown", id="plan-unknown-word"),
    pytest.param(schedule_with(lambda d: d["info"]["plan"].pop("vpp")), simulate_schedule,
                 "schedule.info.plan is missing field 'vpp'", id="plan-missing-field"),
    pytest.param(schedule_with(lambda d: d["info"]["plan"].update(sp="yes")), simulate_schedule,
                 "schedule.info.plan.sp must be a boolean", id="plan-wrong-type"),
    pytest.param(schedule_with(lambda d: d["info"].update(plan="pp=2")), simulate_schedule,
                 "schedule.info.plan must be a JSON object", id="plan-as-text"),
    pytest.param(schedule_with(lambda d: op(d, 0, 0)["tag"].update(phase="backward")), simulate_schedule,
                 "tag.phase 'backward' is not a pass", id="tag-unknown-pass"),
    pytest.param(schedule_with(lambda d: op(d, 0, 0)["tag"].update(micro_batch=-1)), simulate_schedule,
                 "tag.micro_batch=-1 must be an index", id="tag-negative-index"),
    pytest.param(schedule_with(lambda d: op(d, 1, 0)["work"].update(nbytes=12345.0)), run_schedule,
                 "but rank 1 receives 12345 B", id="run-p2p-sizes-differ"),
    pytest.param(schedule_with(lambda d: d.update(world_size=10**9)), run_schedule, "world_size=1000000000",
                 id="run-world-size-1e9"),
    pytest.param(schedule_with(lambda d: op(d, 0, 2)["work"].update(flops=INF)), compare_trace_schedule,
                 "flops=inf must be a finite number", id="compare-trace-schedule-inf"),
]


@pytest.mark.parametrize("write, argv, mention", SCHEDULE_CASES)
def test_bad_schedule_file(capsys, tmp_path, write, argv, mention):
    check_case(capsys, tmp_path, write, argv, mention)


def test_the_unedited_schedule_simulates(capsys, tmp_path):
    path = schedule_with(lambda d: None)(tmp_path)
    rc, out, err = run(capsys, simulate_schedule(path, tmp_path))
    assert rc == 0 and "step time" in out, err


