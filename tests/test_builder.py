"""AxoNN's 4D step as a schedule (twin.builders.schedule): bytes, groups, counts (dependencies and overlap:
tests/test_builder_overlap.py; the attention core: tests/test_builder_attention.py). Ops are found by their tags
(twin.ir.OpTag), never by taking names apart.

Expected sizes are written out here from reference/algorithms.md section 3,
independently of the builder. With m = mbs * seq * gz tokens (the micro-batch
of one Z group) and 2 bytes per element, for a linear with k x n weights:

    AG_z      (gz-1)/gz * nbytes == (gz-1) k n / (gx gy gz) * 2
    RS_z      (gz-1)/gz * nbytes == ((gz-1)/gz) k n / (gx gy) * 2
    AR_y fwd  nbytes == m n / (gz gx) * 2       (non-transposed)
    AR_x bwd  nbytes == m k / (gz gy) * 2       (non-transposed)
    transposed linears (attn_out, mlp_down) swap gx and gy (and the axes);
    AR_data per layer == params_per_layer / (gx gy gz) * 2
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest

from helpers import SMALL_SPEC, op_by_name
from twin.build import build_step
from twin.builders.schedule import build_schedule
from twin.builders.tags import LINEAR_BLOCKS
from twin.ir import P2P, Collective, Gemm
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan

MODEL = parse_model_spec(SMALL_SPEC)
H, F, SEQ, VOCAB, LAYERS = 512, 2048, 128, 1024, 2
MBS, GA = 2, 2
LINEARS = [  # (name, k, n, transposed) for a GPT block with ffn = 4h
    ("qkv", H, 3 * H, False),
    ("attn_out", H, H, True),
    ("mlp_up", H, F, False),
    ("mlp_down", F, H, True),
]
PARAMS_PER_LAYER = 12 * H * H + 13 * H  # 4 linears with biases (12h^2 + 9h) and two layer norms (4h)

PLANS = [
    "gx=2,gy=2,gz=2,gdata=2",
    "gx=4,gy=1,gz=2,gdata=1",
    "gx=1,gy=4,gz=1,gdata=2",
    "gx=2,gy=4,gz=2,gdata=1",
    "gx=1,gy=1,gz=4,gdata=1",  # FSDP
    "gx=8,gy=1,gz=1,gdata=2",  # Megatron-style tensor parallelism
]
LINEAR_ROLES = ("gemm", "dI", "dW", "ag_z", "rs_z", "ar_x", "ar_y")  # the steps of the communication model


@dataclass(frozen=True)
class Built:
    gx: int
    gy: int
    gz: int
    gdata: int
    plan: ParallelPlan
    schedule: object

    @property
    def program(self):
        return self.schedule.programs[0]


_cache: dict[tuple[str, str], Built] = {}


def build(frontier, plan_text: str, extra: str = "") -> Built:
    key = (plan_text, extra)
    if key not in _cache:
        dims = dict(item.split("=") for item in plan_text.split(","))
        gx, gy, gz, gd = (int(dims[a]) for a in ("gx", "gy", "gz", "gdata"))
        plan = parse_plan(plan_text + f",mbs={MBS}" + (f",{extra}" if extra else ""),
                          ParallelPlan(global_batch=gd * gz * MBS * GA))
        built = build_step(MODEL, plan, frontier, gx * gy * gz * gd)
        assert (built.plan.mbs, built.plan.ga) == (MBS, GA)
        _cache[key] = Built(gx, gy, gz, gd, built.plan, built.schedule)
    return _cache[key]


def linear_ops(program) -> dict[tuple[int, int | None, str], dict[str, list]]:
    """(micro-batch, layer, linear) -> {"fwd.gemm": [ops], "bwd.dI": [...], ...}, from the ops' tags (the LM head's
    layer is None)."""
    out: dict[tuple[int, int | None, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for op in program.ops:
        tag = op.tag
        if tag.block in LINEAR_BLOCKS and tag.role in LINEAR_ROLES and tag.micro_batch is not None:
            out[(tag.micro_batch, tag.layer, tag.block)][f"{tag.phase}.{tag.role}"].append(op)
    return out


def test_every_op_is_tagged_and_linear_ops_are_named_by_their_tags(frontier):
    """Names are labels with the tag's parts: mb<i>.<pass>.L<n>.<linear>.<role> for a layer's linear."""
    program = build(frontier, "gx=2,gy=2,gz=2,gdata=2").program
    assert all(op.tag is not None for op in program.ops)
    linears = [op for got in linear_ops(program).values() for ops in got.values() for op in ops]
    assert len(linears) > 100
    for op in linears:
        t = op.tag
        where = "" if t.layer is None else f"L{t.layer}."
        assert op.name == f"mb{t.micro_batch}.{t.phase}.{where}{t.block}.{t.role}"


def shape(name: str) -> tuple[int, int, bool]:
    for n, k, nn, t in LINEARS:
        if n == name:
            return k, nn, t
    raise KeyError(name)


# ---- bytes ------------------------------------------------------------------------


@pytest.mark.parametrize("plan_text", PLANS)
def test_collective_bytes_follow_the_communication_model(frontier, plan_text):
    b = build(frontier, plan_text)
    gx, gy, gz = b.gx, b.gy, b.gz
    m = MBS * SEQ * gz  # tokens of one Z group's micro-batch
    ops = linear_ops(b.program)
    checked = 0
    for mb in range(GA):
        for layer in range(LAYERS):
            for name, k, n, transposed in LINEARS:
                got = ops[(mb, layer, name)]
                fx, fy = (gy, gx) if transposed else (gx, gy)  # transposed layers swap gx and gy
                fwd_axis, bwd_axis = ("x", "y") if transposed else ("y", "x")
                for op in got["fwd.ag_z"] + got["rc.ag_z"]:
                    assert op.work.kind == "all_gather" and op.work.group == "z"
                    assert op.work.nbytes * (gz - 1) / gz == pytest.approx((gz - 1) * k * n / (gx * gy * gz) * 2)
                    checked += 1
                for op in got["bwd.rs_z"]:
                    assert op.work.kind == "reduce_scatter" and op.work.group == "z"
                    assert op.work.nbytes * (gz - 1) / gz == pytest.approx(((gz - 1) / gz) * k * n / (gx * gy) * 2)
                    checked += 1
                for op in got[f"fwd.ar_{fwd_axis}"] + got[f"rc.ar_{fwd_axis}"]:
                    assert op.work.kind == "all_reduce" and op.work.group == fwd_axis
                    assert op.work.nbytes == pytest.approx(m * n / (gz * fx) * 2)
                    checked += 1
                for op in got[f"bwd.ar_{bwd_axis}"]:
                    assert op.work.kind == "all_reduce" and op.work.group == bwd_axis
                    assert op.work.nbytes == pytest.approx(m * k / (gz * fy) * 2)
                    checked += 1
                # no all-reduce of the wrong kind sneaks in under the other axis
                assert not got[f"fwd.ar_{bwd_axis}"] and not got[f"bwd.ar_{fwd_axis}"]
    assert checked > 0 or (gx == gy == gz == 1)


@pytest.mark.parametrize("plan_text", PLANS)
def test_data_parallel_buckets(frontier, plan_text):
    b = build(frontier, plan_text)
    named = op_by_name(b.program)
    tp = b.gx * b.gy * b.gz
    buckets = [op for op in b.program.ops if isinstance(op.work, Collective) and op.work.group == "data"]
    if b.gdata == 1:
        assert buckets == []
        return
    for layer in range(LAYERS):
        op = named[f"dp.L{layer}.ar_data"]
        assert op.work.kind == "all_reduce"
        assert op.work.nbytes == pytest.approx(PARAMS_PER_LAYER / tp * 2)
    assert all(op.work.kind == "all_reduce" for op in buckets)
    # the buckets together hold every parameter once (embeddings, tied LM head, final layer norm)
    all_params = LAYERS * PARAMS_PER_LAYER + VOCAB * H + SEQ * H + 2 * H
    assert sum(op.work.nbytes for op in buckets) == pytest.approx(2 * all_params / tp)


@pytest.mark.parametrize("plan_text", PLANS)
def test_gemm_sizes_are_the_local_blocks(frontier, plan_text):
    b = build(frontier, plan_text)
    rows = MBS * SEQ  # tokens per rank (the Z group's micro-batch split over gz)
    for (mb, layer, name), got in linear_ops(b.program).items():
        if name == "lm_head":
            continue
        k, n, transposed = shape(name)
        for key in ("fwd.gemm", "rc.gemm", "bwd.dI", "bwd.dW"):
            for op in got[key]:
                assert isinstance(op.work, Gemm)
                assert op.work.flops == pytest.approx(2 * rows * k * n / (b.gx * b.gy))
        fwd = got["fwd.gemm"][0].work
        kx = b.gx if transposed else b.gy  # k is split over the forward all-reduce axis
        assert (fwd.m, fwd.k, fwd.n) == (rows, k // kx, n // (b.gx * b.gy // kx))


# ---- groups -----------------------------------------------------------------------


def expected_groups(axis: str, gx: int, gy: int, gz: int, gd: int) -> tuple[tuple[int, ...], ...]:
    """Rank r = x + gx (y + gy (z + gz d)); a group varies one coordinate, ordered by it."""
    sizes = {"x": gx, "y": gy, "z": gz, "data": gd}
    others = [a for a in ("x", "y", "z", "data") if a != axis]
    groups = []
    for fixed in sorted(
        (dict(zip(others, c)) for c in itertools.product(*(range(sizes[a]) for a in others))),
        key=lambda c: _rank({**c, axis: 0}, gx, gy, gz),
    ):
        groups.append(tuple(_rank({**fixed, axis: i}, gx, gy, gz) for i in range(sizes[axis])))
    return tuple(groups)


def _rank(c: dict[str, int], gx: int, gy: int, gz: int) -> int:
    return c["x"] + gx * (c["y"] + gy * (c["z"] + gz * c["data"]))


@pytest.mark.parametrize("plan_text", PLANS)
def test_schedule_groups_are_the_mesh_groups(frontier, plan_text):
    b = build(frontier, plan_text)
    sizes = {"x": b.gx, "y": b.gy, "z": b.gz, "data": b.gdata}
    # an axis of size 1 has no collectives, so no group axis
    assert {axis.name for axis in b.schedule.groups} == {a for a, s in sizes.items() if s > 1}
    for axis in b.schedule.groups:
        assert axis.instances == expected_groups(axis.name, b.gx, b.gy, b.gz, b.gdata)
    if b.gx > 1:
        assert b.schedule.group("x").instances[0] == tuple(range(b.gx))  # X groups: consecutive ranks
    assert b.schedule.world_size == b.gx * b.gy * b.gz * b.gdata
    assert len(b.schedule.programs) == 1
    assert b.schedule.programs[0].ranks == tuple(range(b.schedule.world_size))


@pytest.mark.parametrize("plan_text", PLANS)
def test_no_collective_on_an_axis_of_size_one(frontier, plan_text):
    b = build(frontier, plan_text)
    sizes = {"x": b.gx, "y": b.gy, "z": b.gz, "data": b.gdata}
    used = Counter(op.work.group for op in b.program.ops if isinstance(op.work, Collective))
    for axis, size in sizes.items():
        assert (used[axis] > 0) == (size > 1), axis


# ---- op counts ---------------------------------------------------------------------


@pytest.mark.parametrize("plan_text", PLANS)
def test_op_counts_with_full_recompute(frontier, plan_text):
    b = build(frontier, plan_text)
    assert b.plan.recompute == "full"
    ops = linear_ops(b.program)
    for mb in range(GA):
        for layer in range(LAYERS):
            for name, k, n, transposed in LINEARS:
                got = ops[(mb, layer, name)]
                fwd_axis, bwd_axis = ("x", "y") if transposed else ("y", "x")
                sizes = {"x": b.gx, "y": b.gy}
                assert len(got["fwd.gemm"]) == 1 and len(got["rc.gemm"]) == 1  # forward + recompute
                assert len(got["bwd.dI"]) == 1 and len(got["bwd.dW"]) == 1
                n_ag = len(got["fwd.ag_z"]) + len(got["rc.ag_z"])
                assert n_ag == (2 if b.gz > 1 else 0)
                assert len(got["bwd.rs_z"]) == (1 if b.gz > 1 else 0)
                n_fwd_ar = len(got[f"fwd.ar_{fwd_axis}"]) + len(got[f"rc.ar_{fwd_axis}"])
                assert n_fwd_ar == (2 if sizes[fwd_axis] > 1 else 0)
                assert len(got[f"bwd.ar_{bwd_axis}"]) == (1 if sizes[bwd_axis] > 1 else 0)
    gemms = [op for op in b.program.ops if isinstance(op.work, Gemm)]
    # 4 linears x layers x (fwd, rc, dI, dW) + the LM head's (fwd, dI, dW), per micro-batch
    assert len(gemms) == GA * (4 * LAYERS * 4 + 3)


def test_op_counts_without_recompute(frontier):
    b = build(frontier, "gx=2,gy=2,gz=2,gdata=2", "recompute=none")
    ops = linear_ops(b.program)
    for mb in range(GA):
        for layer in range(LAYERS):
            for name, *_ in LINEARS:
                got = ops[(mb, layer, name)]
                assert len(got["fwd.gemm"]) == 1 and not got["rc.gemm"]
                assert len(got["fwd.ag_z"]) == 1 and not got["rc.ag_z"]  # backward reuses the forward's weights


def test_step_info(frontier):
    b = build(frontier, "gx=2,gy=2,gz=2,gdata=2")
    info = b.schedule.info
    B = 2 * 2 * MBS * GA
    assert info.global_batch == B and info.seq == SEQ
    assert info.plan == b.plan and info.plan_text == b.plan.describe()  # the plan itself, not its text
    assert info.flops_hardware == pytest.approx(
        96 * B * SEQ * LAYERS * H**2 * (1 + SEQ / (6 * H) + VOCAB / (16 * LAYERS * H)))
    assert info.flops_model == pytest.approx(
        72 * B * SEQ * LAYERS * H**2 * (1 + SEQ / (6 * H) + VOCAB / (12 * LAYERS * H)))


def test_build_schedule_needs_a_resolved_micro_batch():
    with pytest.raises(ValueError):
        build_schedule(MODEL, parse_plan("gx=2", ParallelPlan(global_batch=4)))


@pytest.mark.parametrize("plan_text", ["tp=2,pp=2,dp=2,zero=1,mbs=1,global_batch=8",
                                       "tp=2,pp=2,vpp=2,dp=2,sp=1,mbs=1,global_batch=8",
                                       "gx=2,gz=2,gdata=2,zero=3,mbs=1,global_batch=8", "tp=2,cp=2,dp=2,mbs=1,global_batch=4",
                                       "tp=1,pp=4,dp=2,mbs=1,global_batch=8"])
def test_the_schedule_lists_exactly_the_axes_its_communication_uses(frontier, plan_text):
    """The builder lists the group axes as its writers issue communication (twin.builders.program.ProgramWriter
    .axes), not by scanning every op afterwards: the same set as that scan."""
    plan = parse_plan(plan_text)
    gpus = plan.gx * plan.gy * plan.gz * plan.gdata * plan.pp * plan.cp
    schedule = build_step(parse_model_spec(SMALL_SPEC.replace("layers=2", "layers=4")), plan, frontier, gpus).schedule
    scanned = {op.work.group for program in schedule.programs for op in program.ops
               if isinstance(op.work, (Collective, P2P))}
    assert {axis.name for axis in schedule.groups} == scanned
