"""The schedule IR on disk (twin.ir_io) and its static checks (twin.ir_validate)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from twin import ir_io
from twin.errors import TwinError
from twin.ir import (
    IR_VERSION, P2P, Attention, Collective, Elementwise, Gemm, GroupAxis, Op, OpTag, Program, Schedule, StepInfo,
)
from twin.ir_io import load_schedule, save_schedule, schedule_from_dict, schedule_to_dict
from twin.ir_validate import validate_schedule
from twin.plan import ParallelPlan

PLAN = ParallelPlan(gx=2, gdata=2, global_batch=8, mbs=2, ga=2)
INFO = StepInfo(model="tiny", plan=PLAN, global_batch=8, seq=128, flops_hardware=1.5e12, flops_model=1.2e12, memory_per_gpu_bytes=2.0e9)
TAG = OpTag(micro_batch=0, phase="fwd", layer=0, block="qkv", role="gemm")
GROUPS = (GroupAxis("x", ((0, 1), (2, 3))), GroupAxis("data", ((0, 2), (1, 3))))


def layer_ops(first_x: str = "all_reduce", second_x: str = "all_gather") -> list[Op]:
    """A small layer: gemm, async all-reduce on x waited by an elementwise, attention, a data all-reduce."""
    return [
        Op(0, "L0.qkv.fwd", "compute", Gemm(64, 96, 32, layout="NT", tunable=True), tag=TAG),
        Op(1, "L0.qkv.fwd.x", "comm", Collective(first_x, "x", 4096.0), deps=(0,)),
        Op(2, "L0.attn.fwd", "compute", Attention(batch=2, seq=128, heads=4, head_dim=8, causal=True), deps=(0,)),
        Op(3, "L0.bias", "compute", Elementwise(nbytes=2048.0, flops=512.0), deps=(1, 2)),
        Op(4, "L0.out.x", "comm", Collective(second_x, "x", 2048.0), deps=(3,)),
        Op(5, "grads.data", "comm", Collective("all_reduce", "data", 1.0e6, dtype="fp32"), deps=(4,)),
    ]


def make_schedule(ops: list[Op] | None = None) -> Schedule:
    """4 ranks, x = [(0,1), (2,3)], data = [(0,2), (1,3)], one program shared by all ranks."""
    program = Program(ranks=(0, 1, 2, 3), ops=tuple(ops if ops is not None else layer_ops()))
    return Schedule(world_size=4, groups=GROUPS, programs=(program,), info=INFO)


def two_programs(ops_even: list[Op], ops_odd: list[Op]) -> Schedule:
    """Ranks 0, 2 (position 0 in their x instance) run one program, ranks 1, 3 another."""
    programs = (Program((0, 2), tuple(ops_even)), Program((1, 3), tuple(ops_odd)))
    return Schedule(world_size=4, groups=GROUPS, programs=programs, info=INFO)


def with_op(index: int, **changes) -> Schedule:
    ops = layer_ops()
    ops[index] = dataclasses.replace(ops[index], **changes)
    return make_schedule(ops)


def with_plan(**changes) -> Schedule:
    return dataclasses.replace(make_schedule(), info=dataclasses.replace(INFO, plan=dataclasses.replace(PLAN, **changes)))


def with_work(index: int, **changes) -> Schedule:
    ops = layer_ops()
    return with_op(index, work=dataclasses.replace(ops[index].work, **changes))


# ---- round trip and files ---------------------------------------------------


def test_round_trip_through_dict_and_json_text():
    s = make_schedule()
    d = schedule_to_dict(s)
    assert d["format"] == "exatwin-schedule" and d["version"] == IR_VERSION == 3
    op = d["programs"][0]["ops"][1]
    assert op == {"id": 1, "name": "L0.qkv.fwd.x", "stream": "comm", "deps": [0], "type": "collective", "work": {"kind": "all_reduce", "group": "x", "nbytes": 4096.0}}
    assert d["programs"][0]["ops"][0]["tag"] == {"micro_batch": 0, "phase": "fwd", "layer": 0, "block": "qkv", "role": "gemm"}
    back = schedule_from_dict(json.loads(json.dumps(d)))
    assert back == s
    assert back.programs[0].ops[0].tag == TAG and back.info.plan == PLAN
    assert back.info.plan_text == PLAN.describe() == "gx=2,gy=1,gz=1,gdata=2,mbs=2,ga=2,recompute=full,oar=1,ors=1,oag=1,tune=1"
    assert isinstance(back.groups[0].instances[0], tuple) and isinstance(back.programs[0].ops[3].deps, tuple)
    assert type(back.programs[0].ops[0].work.m) is int


def test_round_trip_through_file(tmp_path):
    s = two_programs(
        [Op(0, "send", "p2p", P2P("send", "x", 1, 512.0)), Op(1, "ar", "comm", Collective("all_reduce", "x", 8.0), deps=(0,))],
        [Op(0, "recv", "p2p", P2P("recv", "x", -1, 512.0)), Op(1, "ar", "comm", Collective("all_reduce", "x", 8.0))],
    )
    path = tmp_path / "s.json"
    save_schedule(s, path)
    assert load_schedule(path) == s


def test_the_plan_is_written_in_full_and_read_back_only_in_full(tmp_path):
    """Every ParallelPlan field is written, defaults too, so a change to the plan's fields or defaults is an error
    on old files, never a silent guess."""
    d = schedule_to_dict(make_schedule())
    assert d["info"]["plan"] == dataclasses.asdict(PLAN)
    d["info"]["plan"].pop("oag")
    with pytest.raises(TwinError, match=r"schedule.info.plan is missing field 'oag'"):
        load_schedule(write_json(tmp_path, d))


def test_a_schedule_without_a_plan_reports_its_label():
    info = dataclasses.replace(INFO, plan=None, label="microbenchmarks on 4 ranks")
    s = dataclasses.replace(make_schedule(), info=info)
    d = schedule_to_dict(s)
    assert d["info"]["plan"] is None and d["info"]["label"] == "microbenchmarks on 4 ranks"
    back = schedule_from_dict(json.loads(json.dumps(d)))
    assert back == s and back.info.plan_text == "microbenchmarks on 4 ranks"


def test_defaults_are_left_out_and_restored():
    d = schedule_to_dict(make_schedule())
    gemm, grads = d["programs"][0]["ops"][0], d["programs"][0]["ops"][5]
    assert "deps" not in gemm and gemm["work"] == {"m": 64, "n": 96, "k": 32, "layout": "NT", "tunable": True}
    assert grads["work"]["dtype"] == "fp32"  # not the default: written
    assert schedule_from_dict(d).programs[0].ops[0].work == Gemm(64, 96, 32, layout="NT", dtype="bf16", batch=1, tunable=True)


def test_integer_valued_floats_load_as_floats(tmp_path):
    d = schedule_to_dict(make_schedule())
    d["programs"][0]["ops"][3]["work"]["nbytes"] = 2048  # a hand-written file may drop the ".0"
    s = schedule_from_dict(d)
    assert type(s.programs[0].ops[3].work.nbytes) is float and s == make_schedule()


def test_saving_twice_gives_identical_bytes(tmp_path):
    save_schedule(make_schedule(), tmp_path / "a.json")
    save_schedule(make_schedule(), tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temp files left


def test_five_thousand_ops_stay_compact(tmp_path):
    ops = [Op(i, f"L{i // 10}.op{i % 10}.fwd", "compute", Gemm(8192, 4096, 1024), deps=(i - 1,) if i else ()) for i in range(5000)]
    save_schedule(make_schedule(ops), tmp_path / "big.json")
    assert (tmp_path / "big.json").stat().st_size < 650_000  # ~116 B per op


def test_failed_save_leaves_no_file(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("serialization failed")

    monkeypatch.setattr(ir_io.json, "dumps", boom)
    with pytest.raises(RuntimeError):
        save_schedule(make_schedule(), tmp_path / "s.json")
    assert list(tmp_path.iterdir()) == []


def test_failed_replace_keeps_the_old_file_and_removes_the_temp(tmp_path, monkeypatch):
    path = tmp_path / "s.json"
    path.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    from twin import outputs

    monkeypatch.setattr(outputs.os, "replace", boom)  # save_schedule writes through twin.outputs.atomic_path
    with pytest.raises(TwinError, match="cannot write"):
        save_schedule(make_schedule(), path)
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]


# ---- load errors ------------------------------------------------------------


def write_json(tmp_path, d) -> str:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(d))
    return str(path)


def test_missing_file(tmp_path):
    with pytest.raises(TwinError, match="does not exist"):
        load_schedule(tmp_path / "nope.json")


def test_unreadable_path(tmp_path):
    with pytest.raises(TwinError, match="cannot be read"):
        load_schedule(tmp_path)  # a directory


def test_not_json(tmp_path):
    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(TwinError, match="is not JSON"):
        load_schedule(tmp_path / "s.json")


def test_nan_and_duplicate_keys_are_rejected(tmp_path):
    (tmp_path / "s.json").write_text('{"format": NaN}')
    with pytest.raises(TwinError, match="NaN"):
        load_schedule(tmp_path / "s.json")
    (tmp_path / "s.json").write_text('{"format": 1, "format": 2}')
    with pytest.raises(TwinError, match="'format' appears twice"):
        load_schedule(tmp_path / "s.json")


def test_wrong_format(tmp_path):
    d = schedule_to_dict(make_schedule()) | {"format": "chakra"}
    with pytest.raises(TwinError, match="not an exatwin schedule: 'format' is 'chakra'"):
        load_schedule(write_json(tmp_path, d))
    with pytest.raises(TwinError, match="not an exatwin schedule"):
        load_schedule(write_json(tmp_path, [1, 2]))


@pytest.mark.parametrize("version", [1, 2, 7])
def test_another_ir_version_is_refused_with_the_command_that_writes_this_one(tmp_path, version):
    d = schedule_to_dict(make_schedule()) | {"version": version}
    path = write_json(tmp_path, d)
    with pytest.raises(TwinError) as e:
        load_schedule(path)
    assert str(e.value) == (f"schedule file {path} has IR version {version}; this twin reads version 3: "
                            "re-export it with `twin export`")


@pytest.mark.parametrize(
    "edit, expected",
    [
        (lambda d: d["programs"][0]["ops"][2]["work"].pop("heads"), r"ops\[2\] 'L0.attn.fwd'.work is missing field 'heads'"),
        (lambda d: d["programs"][0]["ops"][1].update(color="red"), r"ops\[1\] 'L0.qkv.fwd.x' has unknown field 'color'"),
        (lambda d: d["programs"][0]["ops"][0].pop("stream"), r"ops\[0\] 'L0.qkv.fwd' is missing field 'stream'"),
        (lambda d: d["info"].pop("seq"), r"schedule.info is missing field 'seq'"),
        (lambda d: d.pop("groups"), r"schedule is missing field 'groups'"),
        (lambda d: d["programs"][0]["ops"][0]["work"].update(m=64.5), r"ops\[0\] 'L0.qkv.fwd'.work.m must be an integer, got 64.5"),
        (lambda d: d["programs"][0]["ops"][0]["work"].update(m=True), r"work.m must be an integer, got true"),
        (lambda d: d["programs"][0]["ops"][0]["work"].update(tunable=1), r"work.tunable must be a boolean"),
        (lambda d: d["programs"][0]["ops"][1]["work"].update(nbytes="4096"), r"work.nbytes must be a number"),
        (lambda d: d["programs"][0]["ops"][3].update(deps=[1, "2"]), r"ops\[3\] 'L0.bias'.deps\[1\] must be an integer"),
        (lambda d: d["groups"][0].update(instances=[[0, 1], 2]), r"groups\[0\].instances\[1\] must be a list"),
        (lambda d: d["programs"][0]["ops"][0].update(type="conv"), r"ops\[0\] 'L0.qkv.fwd'.type 'conv' is not a work type"),
        (lambda d: d["programs"].__setitem__(0, "p0"), r"programs\[0\] must be a JSON object, got a JSON string"),
        (lambda d: d["programs"][0]["ops"][0]["tag"].update(layer="L0"), r"'L0.qkv.fwd'.tag.layer must be an integer"),
        (lambda d: d["programs"][0]["ops"][0]["tag"].pop("role"), r"'L0.qkv.fwd'.tag is missing field 'role'"),
        (lambda d: d["programs"][0]["ops"][0]["tag"].update(pass_="fwd"), r"tag has unknown field 'pass_'"),
        (lambda d: d["info"]["plan"].update(gx="2"), r"schedule.info.plan.gx must be an integer, got \"2\""),
        (lambda d: d["info"].update(plan="gx=2,gdata=2"), r"schedule.info.plan must be a JSON object, got a JSON string"),
    ],
)
def test_malformed_fields(tmp_path, edit, expected):
    d = schedule_to_dict(make_schedule())
    edit(d)
    with pytest.raises(TwinError, match=expected) as e:
        load_schedule(write_json(tmp_path, d))
    assert "\n" not in str(e.value)


def test_load_validates(tmp_path):
    d = schedule_to_dict(make_schedule())
    d["programs"][0]["ops"][3]["deps"] = [9]
    with pytest.raises(TwinError, match="s.json: program 0 op 3 'L0.bias': dangling dependency 9"):
        load_schedule(write_json(tmp_path, d))


# ---- validation -------------------------------------------------------------


def test_valid_schedule_passes():
    validate_schedule(make_schedule())


def bad_programs(ranks: tuple[tuple[int, ...], ...]) -> Schedule:
    return dataclasses.replace(make_schedule(), programs=tuple(Program(r, tuple(layer_ops())) for r in ranks))


def bad_groups(*axes: GroupAxis) -> Schedule:
    return dataclasses.replace(make_schedule(), groups=axes)


@pytest.mark.parametrize(
    "schedule, expected",
    [
        (dataclasses.replace(make_schedule(), version=1), r"schedule version 1 is not supported"),
        (with_op(2, id=7), r"program 0 op at position 2 \('L0.attn.fwd'\) has id 7"),
        (with_op(3, deps=(1, -1)), r"op 3 'L0.bias': dependency -1 is negative"),
        (with_op(3, deps=(3,)), r"op 3 'L0.bias': depends on op 3, which is not earlier"),
        (with_op(1, deps=(4,)), r"op 1 'L0.qkv.fwd.x': depends on op 4, which is not earlier"),
        (with_op(3, deps=(6,)), r"op 3 'L0.bias': dangling dependency 6"),
        (with_work(1, kind="allreduce"), r"op 1 'L0.qkv.fwd.x': unknown collective kind 'allreduce'"),
        (with_work(0, layout="TT"), r"op 0 'L0.qkv.fwd': unknown GEMM layout 'TT'"),
        (with_work(0, k=0), r"op 0 'L0.qkv.fwd': gemm k=0 must be a positive integer"),
        (with_work(2, seq=-4), r"op 2 'L0.attn.fwd': attention seq=-4 must be a positive integer"),
        (with_work(3, nbytes=-1.0), r"op 3 'L0.bias': nbytes=-1.0 must be a finite number >= 0"),
        (with_work(3, flops=float("nan")), r"op 3 'L0.bias': flops=nan must be"),
        (with_work(5, nbytes=-8.0), r"op 5 'grads.data': nbytes=-8.0 must be"),
        (with_work(4, group="y"), r"op 4 'L0.out.x': unknown group axis 'y' \(schedule has 'x', 'data'\)"),
        (with_op(0, work=P2P("sendrecv", "x", 1, 8.0)), r"op 0 'L0.qkv.fwd': unknown p2p kind 'sendrecv'"),
        (with_op(0, work=P2P("send", "x", 1, -8.0)), r"op 0 'L0.qkv.fwd': nbytes=-8.0 must be"),
        (with_op(0, tag=dataclasses.replace(TAG, phase="forward")),
         r"op 0 'L0.qkv.fwd': tag.phase 'forward' is not a pass: use one of fwd, rc, bwd, step"),
        (with_op(0, tag=dataclasses.replace(TAG, layer=-1)), r"op 0 'L0.qkv.fwd': tag.layer=-1 must be an index"),
        (with_op(0, tag=dataclasses.replace(TAG, block="")), r"op 0 'L0.qkv.fwd': tag.block is empty"),
        (with_plan(gx=0), r"schedule info.plan.gx=0 is out of range; give 1..10,000,000: re-export the schedule"),
        (with_plan(gx=2, gdata=4), r"info.plan.gx x gy x gz x cp x gdata x pp = 8 ranks, but the schedule's world_size is 4"),
        (with_plan(recompute="most"), r"info.plan.recompute='most' is unknown; use one of full, selective, op, none"),
        (with_plan(zero=4), r"info.plan.zero=4 is not a ZeRO stage"),
        (with_plan(global_batch=16, ga=4), r"info.plan.global_batch=16, but info.global_batch is 8"),
        (with_plan(ga=4), r"info.plan.mbs=2 x ga=4 x gz=1 x gdata=2 sequences is not the global batch of 8"),
        (with_plan(gy=2, gdata=1, sp=True), r"info.plan.sp is set with gy=2"),
        (bad_programs(((0, 1, 2),)), r"rank 3 is in no program"),
        (bad_programs(((0, 1, 2), (2, 3))), r"rank 2 is in programs 0 and 1"),
        (bad_programs(((0, 1, 2, 4),)), r"program 0 names rank 4, outside 0..3"),
        (bad_groups(GroupAxis("x", ((0, 1), (1, 2), (3,))), GROUPS[1]), r"rank 1 appears in instances 0 and 1 of group 'x'"),
        (bad_groups(GroupAxis("x", ((0, 5),)), GROUPS[1]), r"group 'x' instance 0 holds rank 5, outside 0..3"),
        (bad_groups(GROUPS[0], GROUPS[0], GROUPS[1]), r"group axis 'x' is defined twice"),
        (bad_groups(GroupAxis("x", ((0, 1), (2,))), GROUPS[1]), r"op 1 'L0.qkv.fwd.x': group mismatch: uses group 'x' but rank 3"),
    ],
)
def test_validation_errors(schedule, expected):
    with pytest.raises(TwinError, match=expected) as e:
        validate_schedule(schedule)
    assert "\n" not in str(e.value)


def test_p2p_peer_must_exist_in_the_instance():
    ok = two_programs([Op(0, "send", "p2p", P2P("send", "x", 1, 8.0))], [Op(0, "recv", "p2p", P2P("recv", "x", -1, 8.0))])
    validate_schedule(ok)
    bad = make_schedule([Op(0, "pp.send", "p2p", P2P("send", "x", 1, 8.0))])
    with pytest.raises(TwinError, match=r"op 0 'pp.send': rank 1 is at position 1 of group 'x' instance \(0, 1\), so peer \+1 does not exist"):
        validate_schedule(bad)


def test_collectives_in_different_orders_deadlock():
    s = two_programs(layer_ops("all_reduce", "all_gather"), layer_ops("all_gather", "all_reduce"))
    with pytest.raises(TwinError) as e:
        validate_schedule(s)
    assert str(e.value) == (
        "collectives on group 'x' instance (0, 1) would deadlock: rank 0 issues op 1 'L0.qkv.fwd.x' all_reduce 4096 B"
        " as its 1st 'x' collective, rank 1 issues op 1 'L0.qkv.fwd.x' all_gather 4096 B;"
        " make every member issue the same collectives in the same order"
    )


def test_collectives_with_different_sizes_deadlock():
    odd = layer_ops()
    odd[4] = dataclasses.replace(odd[4], work=Collective("all_gather", "x", 1024.0))
    with pytest.raises(TwinError, match=r"rank 0 issues op 4 'L0.out.x' all_gather 2048 B as its 2nd 'x' collective, rank 1 issues op 4 'L0.out.x' all_gather 1024 B"):
        validate_schedule(two_programs(layer_ops(), odd))


@pytest.mark.parametrize("short_first", [False, True])
def test_different_collective_counts_deadlock(short_first):
    full, short = layer_ops(), layer_ops()[:4]
    s = two_programs(short, full) if short_first else two_programs(full, short)
    long_rank, short_rank = (1, 0) if short_first else (0, 1)
    expected = (rf"'x' instance \(0, 1\) would deadlock: rank {long_rank} issues op 4 'L0.out.x' all_gather 2048 B"
                rf" as its 2nd 'x' collective, rank {short_rank} issues only 1 'x' collective;")
    with pytest.raises(TwinError, match=expected):
        validate_schedule(s)


def test_programs_that_agree_on_collectives_pass():
    odd = layer_ops()
    odd[0] = dataclasses.replace(odd[0], work=Gemm(64, 96, 32, layout="NN"))  # compute may differ
    validate_schedule(two_programs(layer_ops(), odd))


def test_32k_rank_single_program_validates():
    sizes = {"x": 8, "y": 4, "z": 4, "data": 256}  # 32,768 ranks, x innermost
    world = 8 * 4 * 4 * 256
    groups, stride = [], 1
    for name, size in sizes.items():
        starts = [r for r in range(world) if (r // stride) % size == 0]
        groups.append(GroupAxis(name, tuple(tuple(s + j * stride for j in range(size)) for s in starts)))
        stride *= size
    axes = list(sizes)
    ops = tuple(
        Op(i, f"op{i}", "comm" if i % 3 == 0 else "compute",
           Collective("all_reduce", axes[i % 4], 1024.0) if i % 3 == 0 else Gemm(128, 128, 128),
           deps=(i - 1,) if i else ())
        for i in range(6000)
    )
    info = dataclasses.replace(INFO, global_batch=2048,
                               plan=dataclasses.replace(PLAN, gx=8, gy=4, gz=4, gdata=256, global_batch=2048, ga=1))
    s = Schedule(world_size=world, groups=tuple(groups), programs=(Program(tuple(range(world)), ops),), info=info)
    validate_schedule(s)


def test_work_says_whether_it_is_communication() -> None:
    """Work.comm (read by the search's hot loops instead of isinstance) is true exactly for collectives and
    transfers, and Op.is_comm follows it."""
    works = [Gemm(1, 1, 1), Attention(1, 1, 1, 1), Elementwise(1.0), Collective("all_reduce", "x", 1.0),
             P2P("send", "pp", 1, 1.0)]
    for work in works:
        assert work.comm == isinstance(work, (Collective, P2P))
        assert Op(0, "op", "s", work).is_comm == work.comm
    assert "comm" not in {f.name for cls in map(type, works) for f in dataclasses.fields(cls)}  # not in the file format
