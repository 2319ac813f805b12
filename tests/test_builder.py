"""AxoNN's 4D step as a schedule (twin.builders.axonn): bytes, groups, counts, overlap.

Expected sizes are written out here from reference/algorithms.md section 3,
independently of the builder. With m = mbs * seq * gz tokens (the micro-batch
of one Z group) and 2 bytes per element, for a linear with k x n weights:

    AG_z      (gz-1)/gz * nbytes == (gz-1) k n / (gx gy gz) * 2
    RS_z      (gz-1)/gz * nbytes == ((gz-1)/gz) k n / (gx gy) * 2
    AR_y fwd  nbytes == m n / (gz gx) * 2       (non-transposed)
    AR_x bwd  nbytes == m k / (gz gy) * 2       (non-transposed)
    transposed linears (attn_out, mlp_down) swap gx and gy (and the axes);
    AR_data per layer == params_per_layer / (gx gy gz) * 2

Overlap is checked through the dependency graph only (deps plus the previous
op on the same stream, closed transitively), as every backend reads it.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest

from helpers import SMALL_SPEC, happens_before, op_by_name
from twin.build import build_step
from twin.builders.axonn import build_axonn
from twin.ir import Attention, Collective, Elementwise, Gemm
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
NAME = re.compile(r"^mb(\d+)\.(fwd|rc|bwd)\.(L\d+\.\w+|lm_head)\.(gemm|dI|dW|ag_z|rs_z|ar_x|ar_y)$")


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


def linear_ops(program) -> dict[tuple[int, str, str], dict[str, list]]:
    """(micro-batch, layer, linear) -> {"fwd.gemm": [ops], "bwd.dI": [...], ...}."""
    out: dict[tuple[int, str, str], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for op in program.ops:
        match = NAME.match(op.name)
        if not match:
            continue
        mb, phase, lin, what = match.groups()
        layer, _, name = lin.partition(".")
        out[(int(mb), layer, name)][f"{phase}.{what}"].append(op)
    return out


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
                got = ops[(mb, f"L{layer}", name)]
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
        if layer == "lm_head":
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
                got = ops[(mb, f"L{layer}", name)]
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
                got = ops[(mb, f"L{layer}", name)]
                assert len(got["fwd.gemm"]) == 1 and not got["rc.gemm"]
                assert len(got["fwd.ag_z"]) == 1 and not got["rc.ag_z"]  # backward reuses the forward's weights


def test_step_info(frontier):
    b = build(frontier, "gx=2,gy=2,gz=2,gdata=2")
    info = b.schedule.info
    B = 2 * 2 * MBS * GA
    assert info.global_batch == B and info.seq == SEQ
    assert info.flops_hardware == pytest.approx(
        96 * B * SEQ * LAYERS * H**2 * (1 + SEQ / (6 * H) + VOCAB / (16 * LAYERS * H)))
    assert info.flops_model == pytest.approx(
        72 * B * SEQ * LAYERS * H**2 * (1 + SEQ / (6 * H) + VOCAB / (12 * LAYERS * H)))


def test_build_axonn_needs_a_resolved_micro_batch():
    with pytest.raises(ValueError):
        build_axonn(MODEL, parse_plan("gx=2", ParallelPlan(global_batch=4)))


# ---- dependencies and overlap ------------------------------------------------------------


@pytest.mark.parametrize("plan_text", PLANS)
def test_every_collective_waits_for_the_previous_compute_op(frontier, plan_text):
    program = build(frontier, plan_text).program
    last_compute = None
    for op in program.ops:
        if op.is_comm:
            if last_compute is not None:
                assert last_compute in op.deps, op.name
        else:
            last_compute = op.id


@pytest.mark.parametrize("plan_text", PLANS)
def test_weights_are_gathered_before_use(frontier, plan_text):
    b = build(frontier, plan_text)
    if b.gz == 1:
        pytest.skip("no all-gather without Z")
    before = happens_before(b.program)
    for (mb, layer, name), got in linear_ops(b.program).items():
        for phase in ("fwd", "rc"):
            for gemm in got[f"{phase}.gemm"]:
                (ag,) = got[f"{phase}.ag_z"]
                assert ag.id in before[gemm.id], gemm.name
        if got["rc.ag_z"]:  # backward uses the weights the recompute gathered
            assert got["rc.ag_z"][0].id in before[got["bwd.dI"][0].id]


@pytest.mark.parametrize("plan_text", PLANS)
def test_forward_all_reduce_is_blocking(frontier, plan_text):
    program = build(frontier, plan_text).program
    ops = program.ops
    for op in ops:
        match = NAME.match(op.name)
        if match and match.group(2) in ("fwd", "rc") and match.group(4) in ("ar_x", "ar_y"):
            following = next(o for o in ops[op.id + 1:] if not o.is_comm)
            assert op.id in following.deps, op.name


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=2,gy=4,gz=2,gdata=1"])
@pytest.mark.parametrize("oar", [True, False])
def test_oar_overlaps_the_dw_gemm_with_the_di_all_reduce(frontier, plan_text, oar):
    b = build(frontier, plan_text, f"oar={int(oar)}")
    before = happens_before(b.program)
    for key, got in linear_ops(b.program).items():
        if key[1] == "lm_head":
            continue
        _, _, transposed = shape(key[2])
        (ar,) = got["bwd.ar_y" if transposed else "bwd.ar_x"]
        (dW,) = got["bwd.dW"]
        (dI,) = got["bwd.dI"]
        assert dI.id in before[ar.id]  # the all-reduce reduces dI
        assert (ar.id in before[dW.id]) == (not oar), key
        # either way the all-reduce is waited before the linear's backward returns (its bias gradient, the QKV
        # linear's dbias, is computed before the wait, as in LinearWithGradAccumulationAndAsyncCommunication)
        following = next(o for o in b.program.ops[dW.id + 1:] if not o.is_comm and not o.name.endswith(".dbias"))
        assert ar.id in before[following.id]


def _last_backward_op(program, mb: int) -> int:
    """The last op of the micro-batch's backward: the last of its embedding's backward kernels."""
    return max(op.id for op in program.ops if op.name.startswith(f"mb{mb}.embed_bwd."))


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=4,gy=1,gz=2,gdata=1", "gx=1,gy=1,gz=4,gdata=1"])
def test_ors_waits_reduce_scatters_only_after_the_backward(frontier, plan_text):
    b = build(frontier, plan_text, "ors=1")
    program = b.program
    compute = [op for op in program.ops if not op.is_comm]
    for key, got in linear_ops(program).items():
        for rs in got["bwd.rs_z"]:
            end = _last_backward_op(program, key[0])
            assert rs.id < end
            waiting = [op for op in compute if rs.id in op.deps]
            assert waiting, rs.name  # waited somewhere
            assert min(op.id for op in waiting) > end, rs.name


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=4,gy=1,gz=2,gdata=1", "gx=1,gy=1,gz=4,gdata=1"])
def test_without_ors_the_next_compute_op_waits_for_the_reduce_scatter(frontier, plan_text):
    program = build(frontier, plan_text, "ors=0").program
    for key, got in linear_ops(program).items():
        for rs in got["bwd.rs_z"]:
            following = next(o for o in program.ops[rs.id + 1:] if not o.is_comm)
            assert rs.id in following.deps, rs.name


# Regression: ProgramWriter.collective once ignored pending wait()s, so with ors=1 the data-parallel
# all-reduces (issued before the optimizer, the next compute op) did not wait for the deferred
# reduce-scatters that produce the gradient shards they reduce.
def test_data_all_reduce_waits_for_the_gradient_reduce_scatters_with_ors(frontier):
    _check_data_all_reduce_after_reduce_scatters(build(frontier, "gx=2,gy=2,gz=2,gdata=2", "ors=1").program)


def test_data_all_reduce_waits_for_the_gradient_reduce_scatters_without_ors(frontier):
    _check_data_all_reduce_after_reduce_scatters(build(frontier, "gx=2,gy=2,gz=2,gdata=2", "ors=0").program)


def _check_data_all_reduce_after_reduce_scatters(program):
    before = happens_before(program)
    last_mb = GA - 1
    scatters = [op for (mb, _, _), got in linear_ops(program).items() if mb == last_mb for op in got["bwd.rs_z"]]
    assert scatters
    for op in program.ops:
        if isinstance(op.work, Collective) and op.work.group == "data":
            missing = [rs.name for rs in scatters if rs.id not in before[op.id]]
            assert not missing, f"{op.name} may start before {missing[:3]}"


def _module_order() -> list[str]:
    return [f"L{layer}.{name}" for layer in range(LAYERS) for name, *_ in LINEARS] + ["lm_head"]


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=4,gy=1,gz=2,gdata=1", "gx=1,gy=1,gz=4,gdata=1"])
@pytest.mark.parametrize("oag", [True, False])
def test_oag_prefetches_the_next_weights_one_linear_ahead(frontier, plan_text, oag):
    program = build(frontier, plan_text, f"oag={int(oag)}").program
    named = op_by_name(program)
    order = _module_order()
    for mb in range(GA):
        # forward: the chain runs through every linear, LM head included
        for cur, nxt in zip(order, order[1:]):
            gemm = named[f"mb{mb}.fwd.{cur}.gemm"].id
            ag = named[f"mb{mb}.fwd.{nxt}.ag_z"].id
            assert (ag < gemm) == oag, (cur, nxt)
        # recompute: the chain restarts in each block
        for layer in range(LAYERS):
            names = [f"L{layer}.{n}" for n, *_ in LINEARS]
            for cur, nxt in zip(names, names[1:]):
                gemm = named[f"mb{mb}.rc.{cur}.gemm"].id
                ag = named[f"mb{mb}.rc.{nxt}.ag_z"].id
                assert (ag < gemm) == oag, (cur, nxt)
            first_ag = named[f"mb{mb}.rc.{names[0]}.ag_z"].id
            previous_compute = max(op.id for op in program.ops[:first_ag] if not op.is_comm)
            # the block's first all-gather is not prefetched across the previous block's backward
            assert program.ops[previous_compute].name.startswith(f"mb{mb}.")


@pytest.mark.parametrize("oag", [True, False])
def test_no_all_gather_prefetch_without_z(frontier, oag):
    program = build(frontier, "gx=8,gy=1,gz=1,gdata=2", f"oag={int(oag)}").program
    assert not [op for op in program.ops if op.name.endswith("ag_z")]


def test_overlap_switches_change_only_dependencies(frontier):
    """Same ops with and without overlap, in a different order and with different deps."""
    on = build(frontier, "gx=2,gy=2,gz=2,gdata=2").program
    off = build(frontier, "gx=2,gy=2,gz=2,gdata=2", "oar=0,ors=0,oag=0").program
    assert Counter((op.name, op.work) for op in on.ops) == Counter((op.name, op.work) for op in off.ops)
    assert [op.deps for op in on.ops] != [op.deps for op in off.ops]


# ---- attention: flash, or Megatron's unfused core attention --------------------------------------------------

HEADS, HEAD_DIM = 8, H // 8
# One layer's attention kernels per direction, written out independently of the builder from Megatron-DeepSpeed's
# ParallelAttention, CoreAttention and FlashSelfAttention (transformer.py): (name, the batched GEMM's (m, n, k,
# layout), or (what it walks, bytes per element) for an element-wise kernel: 2 per bf16 element read or written, 1
# per dropout-mask element; "scores" are the MBS x HEADS/gx x SEQ x SEQ score elements, "heads" the MBS x SEQ x H/gx
# elements of q, k, v or the context, "bounds" the MBS + 1 int32 sequence boundaries).
UNFUSED_FORWARD = [
    ("attn_scores", (SEQ, SEQ, HEAD_DIM, "NT")),  # Q K^T (baddbmm)
    ("attn_softmax", ("scores", 2 + 2)),  # read the scores, write the probabilities
    ("attn_dropout", ("scores", 2 + 2 + 1)),  # read the probabilities, write the dropped ones and the mask
    ("attn_context", (SEQ, HEAD_DIM, SEQ, "NN")),  # probs V
    ("attn_context_copy", ("heads", 2 + 2)),  # permute(2, 0, 1, 3).contiguous()
]
UNFUSED_BACKWARD = [
    ("attn_context_dV", (SEQ, HEAD_DIM, SEQ, "TN")),  # probs^T dO
    ("attn_context_dP", (SEQ, SEQ, HEAD_DIM, "NT")),  # dO V^T
    ("attn_dropout_bwd", ("scores", 2 + 1 + 2)),  # read the gradient and the mask, write the gradient
    ("attn_softmax_bwd", ("scores", 2 + 2 + 2)),  # read the probabilities and the gradient, write the gradient
    ("attn_scores_dQ", (SEQ, HEAD_DIM, SEQ, "NN")),  # dS K
    ("attn_scores_dQ_scale", ("heads", 2 + 2)),  # baddbmm's backward multiplies by alpha = 1/sqrt(d)
    ("attn_scores_dK", (SEQ, HEAD_DIM, SEQ, "TN")),  # dS^T Q
    ("attn_scores_dK_scale", ("heads", 2 + 2)),
    ("attn_q_grad", ("heads", 2 + 2)),  # the split's backward: torch.cat of strided gradients, a copy each
    ("attn_k_grad", ("heads", 2 + 2)),
    ("attn_v_grad", ("heads", 2 + 2)),
]
FLASH_FORWARD = [  # MBS = 2 sequences: the context's rearrange is a copy too
    ("attn_q_copy", ("heads", 2 + 2)),  # rearrange(x, 's b ... -> b s ...').contiguous()
    ("attn_k_copy", ("heads", 2 + 2)),
    ("attn_v_copy", ("heads", 2 + 2)),
    ("attn_seqlens", ("bounds", 4)),  # torch.arange(...) of the cu_seqlens
    ("attn", "flash"),
    ("attn_context_copy", ("heads", 2 + 2)),
]
FLASH_BACKWARD = [
    ("attn_bwd_copy", ("heads", 2 + 2)),  # the output gradient, made contiguous
    ("attn_bwd", "flash"),
    ("attn_q_grad", ("heads", 2 + 2)),
    ("attn_k_grad", ("heads", 2 + 2)),
    ("attn_v_grad", ("heads", 2 + 2)),
]
ATTENTION_PLANS = ["gx=2,gy=2,gz=2,gdata=2", "gx=8,gy=1,gz=1,gdata=2", "gx=1,gy=4,gz=1,gdata=2"]
ATTENTION_OP = re.compile(r"^mb(\d+)(?:\.c\d+)?\.(fwd|rc|bwd)\.(L\d+)\.(attn\w*)$")  # not attn_out's: they have a role


def attention_ops(program, mb: int, phase: str, layer: int) -> list:
    return [op for op in program.ops if (m := ATTENTION_OP.match(op.name)) and m.groups()[:3] == (str(mb), phase, f"L{layer}")]


def assert_attention_kernels(ops: list, expected: list, gx: int) -> None:
    """`ops` are `expected`'s kernels, in order, on MBS sequences x HEADS/gx heads of SEQ x SEQ scores."""
    batch = MBS * HEADS // gx
    elements = {"scores": batch * SEQ * SEQ, "heads": MBS * SEQ * H / gx, "bounds": MBS + 1}
    assert [op.name.rsplit(".", 1)[1] for op in ops] == [name for name, _ in expected]
    for op, (name, want) in zip(ops, expected):
        if want == "flash":
            assert isinstance(op.work, Attention), name
        elif isinstance(want[0], int):
            m, n, k, layout = want
            assert op.work == Gemm(m, n, k, layout, "bf16", batch=batch), name  # not layout-tuned, like torch.bmm
        else:
            assert isinstance(op.work, Elementwise), name
            what, nbytes = want
            assert op.work.nbytes == pytest.approx(nbytes * elements[what], rel=1e-12), name


def as_unfused(names: list[str]) -> list[str]:
    """A flash schedule's op names with each layer's attention kernels replaced by the unfused ones, in place."""
    out: list[str] = []
    previous = None
    for name in names:
        found = ATTENTION_OP.match(name)
        if not found:
            out.append(name)
            previous = None
            continue
        key = found.groups()[:3]
        if key != previous:  # the first of this layer's pass's attention kernels
            prefix = name.rpartition(".")[0]
            out += [f"{prefix}.{k}" for k, _ in (UNFUSED_BACKWARD if found.group(2) == "bwd" else UNFUSED_FORWARD)]
        previous = key
    return out


@pytest.mark.parametrize("plan_text", ATTENTION_PLANS)
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_unfused_attention_replaces_the_flash_kernels_by_megatrons_core_attention(frontier, plan_text, recompute):
    """Per layer, flash forward: 3 q/k/v copies, the cu_seqlens arange, the kernel, the context copy; backward: the
    output-gradient copy, the kernel, 3 q/k/v gradient copies. Unfused forward: 2 batched GEMMs + softmax + dropout
    + the context copy; backward: 4 batched GEMMs, 2 element-wise kernels on the scores, 2 scalings, 3 q/k/v
    gradient copies. Full recompute reruns the forward; nothing else changes."""
    flash = build(frontier, plan_text, f"recompute={recompute}")
    unfused = build(frontier, plan_text, f"attention=unfused,recompute={recompute}")
    assert unfused.plan.attention == "unfused"
    assert not [op for op in unfused.program.ops if isinstance(op.work, Attention)]
    assert [op.name for op in unfused.program.ops] == as_unfused([op.name for op in flash.program.ops])
    for mb, layer in itertools.product(range(GA), range(LAYERS)):
        assert_attention_kernels(attention_ops(unfused.program, mb, "fwd", layer), UNFUSED_FORWARD, unfused.gx)
        assert_attention_kernels(attention_ops(unfused.program, mb, "bwd", layer), UNFUSED_BACKWARD, unfused.gx)
        rc = attention_ops(unfused.program, mb, "rc", layer)
        assert_attention_kernels(rc, UNFUSED_FORWARD if recompute == "full" else [], unfused.gx)
        assert_attention_kernels(attention_ops(flash.program, mb, "fwd", layer), FLASH_FORWARD, flash.gx)
        assert_attention_kernels(attention_ops(flash.program, mb, "bwd", layer), FLASH_BACKWARD, flash.gx)


def _selective_expected(none_program) -> list[tuple]:
    """(name, stream, work) of the program without recompute with each layer's core-attention forward rerun, as
    recompute, right before its backward."""
    out = []
    for op in none_program.ops:
        found = ATTENTION_OP.match(op.name)
        if found and found.group(4) == UNFUSED_BACKWARD[0][0]:
            mb, layer = int(found.group(1)), int(found.group(3)[1:])
            out += [(f.name.replace(".fwd.", ".rc."), f.stream, f.work) for f in attention_ops(none_program, mb, "fwd", layer)]
        out.append((op.name, op.stream, op.work))
    return out


@pytest.mark.parametrize("plan_text", ATTENTION_PLANS)
def test_selective_recompute_with_unfused_attention_reruns_only_the_core_attention(frontier, plan_text):
    selective = build(frontier, plan_text, "attention=unfused,recompute=selective")
    none = build(frontier, plan_text, "attention=unfused,recompute=none")
    assert [(op.name, op.stream, op.work) for op in selective.program.ops] == _selective_expected(none.program)
    for mb, layer in itertools.product(range(GA), range(LAYERS)):
        assert_attention_kernels(attention_ops(selective.program, mb, "rc", layer), UNFUSED_FORWARD, selective.gx)


@pytest.mark.parametrize("text, gpus", [("tp=2,pp=2,mbs=1,ga=4", 4), ("tp=2,pp=2,vpp=2,sp=1,mbs=1,ga=4", 4)])
def test_selective_recompute_with_unfused_attention_in_a_pipeline(frontier, text, gpus):
    def schedule(extra: str):
        plan = parse_plan(f"{text},attention=unfused,{extra}", ParallelPlan(global_batch=4))
        return build_step(parse_model_spec(SMALL_SPEC.replace("layers=2", "layers=4")), plan, frontier, gpus).schedule

    selective, none = schedule("recompute=selective"), schedule("recompute=none")
    assert len(selective.programs) == len(none.programs) == 2
    for sel, base in zip(selective.programs, none.programs):
        assert [(op.name, op.stream, op.work) for op in sel.ops] == _selective_expected(base)
        assert len(sel.ops) == len(base.ops) + 5 * 4 * 4 // 2  # 5 kernels x 4 micro-batches x 2 layers a stage


@pytest.mark.parametrize("plan_text", ATTENTION_PLANS)
def test_selective_recompute_with_flash_attention_is_no_recompute(frontier, plan_text):
    """Flash keeps nothing of size s^2 and rebuilds its scores inside its backward: nothing to recompute."""
    selective = build(frontier, plan_text, "recompute=selective").schedule
    none = build(frontier, plan_text, "recompute=none").schedule
    assert selective.programs == none.programs and selective.groups == none.groups
    assert selective.info.memory_per_gpu_bytes == none.info.memory_per_gpu_bytes


@pytest.mark.parametrize("plan_text", ATTENTION_PLANS)
@pytest.mark.parametrize("attention, recompute", list(itertools.product(["flash", "unfused"], ["none", "selective", "full"])))
def test_compute_flops_per_rank(frontier, plan_text, attention, recompute):
    """GEMM and attention flops of a rank's step, from the model's shapes alone. Flash: one causal kernel (half of
    the 4 b s^2 h/gx forward), backward 2.5x its forward; unfused: the full s x s products, forward 2 GEMMs and
    backward 4; full recompute reruns the layers' forward, selective the unfused attention's forward."""
    b = build(frontier, plan_text, f"attention={attention},recompute={recompute}")
    gx, gy = b.gx, b.gy
    T = MBS * SEQ  # rows of every linear on a rank
    linear_forward = 2 * T * 12 * H * H / (gx * gy)
    lm_head_pass = 2 * T * H * VOCAB / (gx * gy)
    scores = 2 * MBS * SEQ * SEQ * H / gx  # one s x s x d product per local head
    attn_forward, attn_backward = (scores, 2.5 * scores) if attention == "flash" else (2 * scores, 4 * scores)
    layer = 3 * linear_forward + attn_forward + attn_backward
    if recompute == "full":
        layer += linear_forward + attn_forward
    if recompute == "selective" and attention == "unfused":
        layer += attn_forward
    want = GA * (LAYERS * layer + 3 * lm_head_pass)
    got = sum(op.work.flops for op in b.program.ops if isinstance(op.work, (Gemm, Attention)))
    assert got == pytest.approx(want, rel=1e-12)
