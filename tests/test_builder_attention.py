"""The attention core in AxoNN's step (twin.builders.attention): flash, or Megatron's unfused core attention, and
what selective recompute reruns. Steps are built as in tests/test_builder.py (its `build` and sizes); ops are found
by their tags (block "attn"), never their names.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from helpers import SMALL_SPEC, megatron_softmax
from test_builder import GA, H, LAYERS, MBS, SEQ, VOCAB, build
from twin.build import build_step
from twin.ir import Attention, Elementwise, Gemm
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan

HEADS, HEAD_DIM = 8, H // 8
# One layer's attention kernels per direction, written out independently of the builder from Megatron-DeepSpeed's
# ParallelAttention, CoreAttention and FlashSelfAttention (transformer.py): (role, the batched GEMM's (m, n, k,
# layout), or (what it walks, bytes per element) for an element-wise kernel: 2 per bf16 element read or written, 1
# per dropout-mask element; "scores" are the MBS x HEADS/gx x SEQ x SEQ score elements, "heads" the MBS x SEQ x H/gx
# elements of q, k, v or the context, "bounds" the MBS + 1 int32 sequence boundaries).
UNFUSED_FORWARD = [
    ("scores", (SEQ, SEQ, HEAD_DIM, "NT")),  # Q K^T (baddbmm)
    ("softmax", ("scores", 2 + 2)),  # read the scores, write the probabilities
    ("dropout", ("scores", 2 + 2 + 1)),  # read the probabilities, write the dropped ones and the mask
    ("context", (SEQ, HEAD_DIM, SEQ, "NN")),  # probs V
    ("context_copy", ("heads", 2 + 2)),  # permute(2, 0, 1, 3).contiguous()
]
UNFUSED_BACKWARD = [
    ("context_dV", (SEQ, HEAD_DIM, SEQ, "TN")),  # probs^T dO
    ("context_dP", (SEQ, SEQ, HEAD_DIM, "NT")),  # dO V^T
    ("dropout_bwd", ("scores", 2 + 1 + 2)),  # read the gradient and the mask, write the gradient
    ("softmax_bwd", ("scores", 2 + 2 + 2)),  # read the probabilities and the gradient, write the gradient
    ("scores_dQ", (SEQ, HEAD_DIM, SEQ, "NN")),  # dS K
    ("scores_dQ_scale", ("heads", 2 + 2)),  # baddbmm's backward multiplies by alpha = 1/sqrt(d)
    ("scores_dK", (SEQ, HEAD_DIM, SEQ, "TN")),  # dS^T Q
    ("scores_dK_scale", ("heads", 2 + 2)),
    ("q_grad", ("heads", 2 + 2)),  # the split's backward: torch.cat of strided gradients, a copy each
    ("k_grad", ("heads", 2 + 2)),
    ("v_grad", ("heads", 2 + 2)),
]
FLASH_FORWARD = [  # MBS = 2 sequences: the context's rearrange is a copy too
    ("q_copy", ("heads", 2 + 2)),  # rearrange(x, 's b ... -> b s ...').contiguous()
    ("k_copy", ("heads", 2 + 2)),
    ("v_copy", ("heads", 2 + 2)),
    ("seqlens", ("bounds", 4)),  # torch.arange(...) of the cu_seqlens
    ("fwd", "flash"),
    ("context_copy", ("heads", 2 + 2)),
]
FLASH_BACKWARD = [
    ("bwd_copy", ("heads", 2 + 2)),  # the output gradient, made contiguous
    ("bwd", "flash"),
    ("q_grad", ("heads", 2 + 2)),
    ("k_grad", ("heads", 2 + 2)),
    ("v_grad", ("heads", 2 + 2)),
]
ATTENTION_PLANS = [  # MBS x HEADS/gx = 8, 2 and 16 score matrices: gx=8's are too few for Megatron's fused softmax
    "gx=2,gy=2,gz=2,gdata=2", "gx=8,gy=1,gz=1,gdata=2", "gx=1,gy=4,gz=1,gdata=2"]


def unfused(phase: str, gx: int, mbs: int = MBS) -> list:
    """UNFUSED_FORWARD (phase "fwd" or "rc") or UNFUSED_BACKWARD with the softmax Megatron runs on mbs x HEADS/gx
    score matrices of SEQ x SEQ."""
    backward = phase == "bwd"
    softmax = [(role, ("scores", nbytes)) for role, nbytes in megatron_softmax(SEQ, mbs * HEADS // gx, backward)]
    out = []
    for role, want in UNFUSED_BACKWARD if backward else UNFUSED_FORWARD:
        out += softmax if role in ("softmax", "softmax_bwd") else [(role, want)]
    return out


def attention_ops(program, mb: int, phase: str, layer: int) -> list:
    """One layer pass's attention-core ops (block "attn", not the attention-output linear's)."""
    return [op for op in program.ops
            if (op.tag.micro_batch, op.tag.phase, op.tag.layer, op.tag.block) == (mb, phase, layer, "attn")]


def assert_attention_kernels(ops: list, expected: list, gx: int) -> None:
    """`ops` are `expected`'s kernels, in order, on MBS sequences x HEADS/gx heads of SEQ x SEQ scores."""
    batch = MBS * HEADS // gx
    elements = {"scores": batch * SEQ * SEQ, "heads": MBS * SEQ * H / gx, "bounds": MBS + 1}
    assert [op.tag.role for op in ops] == [role for role, _ in expected]
    for op, (role, want) in zip(ops, expected):
        if want == "flash":
            assert isinstance(op.work, Attention), role
        elif isinstance(want[0], int):
            m, n, k, layout = want
            assert op.work == Gemm(m, n, k, layout, "bf16", batch=batch), role  # not layout-tuned, like torch.bmm
        else:
            assert isinstance(op.work, Elementwise), role
            what, nbytes = want
            assert op.work.nbytes == pytest.approx(nbytes * elements[what], rel=1e-12), role


def as_unfused(tags: list, gx: int) -> list:
    """A flash schedule's op tags with each layer pass's attention kernels replaced by the unfused ones, in place."""
    out: list = []
    previous = None
    for tag in tags:
        if tag.block != "attn":
            out.append(tag)
            previous = None
            continue
        key = (tag.micro_batch, tag.phase, tag.layer)
        if key != previous:  # the first of this layer's pass's attention kernels
            out += [replace(tag, role=role) for role, _ in unfused(tag.phase, gx)]
        previous = key
    return out


@pytest.mark.parametrize("plan_text", ATTENTION_PLANS)
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_unfused_attention_replaces_the_flash_kernels_by_megatrons_core_attention(frontier, plan_text, recompute):
    """Per layer, flash forward: 3 q/k/v copies, the cu_seqlens arange, the kernel, the context copy; backward: the
    output-gradient copy, the kernel, 3 q/k/v gradient copies. Unfused forward: 2 batched GEMMs + softmax + dropout
    + the context copy; backward: 4 batched GEMMs, 2 element-wise kernels on the scores, 2 scalings, 3 q/k/v
    gradient copies; where the fused softmax cannot run (gx=8 here), torch's five kernels each way in its place.
    Full recompute reruns the forward; nothing else changes."""
    flash = build(frontier, plan_text, f"recompute={recompute}")
    unfused_step = build(frontier, plan_text, f"attention=unfused,recompute={recompute}")
    assert unfused_step.plan.attention == "unfused"
    assert not [op for op in unfused_step.program.ops if isinstance(op.work, Attention)]
    gx = unfused_step.gx
    assert [op.tag for op in unfused_step.program.ops] == as_unfused([op.tag for op in flash.program.ops], gx)
    for mb, layer in itertools.product(range(GA), range(LAYERS)):
        assert_attention_kernels(attention_ops(unfused_step.program, mb, "fwd", layer), unfused("fwd", gx), gx)
        assert_attention_kernels(attention_ops(unfused_step.program, mb, "bwd", layer), unfused("bwd", gx), gx)
        rc = attention_ops(unfused_step.program, mb, "rc", layer)
        assert_attention_kernels(rc, unfused("rc", gx) if recompute == "full" else [], gx)
        assert_attention_kernels(attention_ops(flash.program, mb, "fwd", layer), FLASH_FORWARD, flash.gx)
        assert_attention_kernels(attention_ops(flash.program, mb, "bwd", layer), FLASH_BACKWARD, flash.gx)


def _selective_expected(none_program) -> list[tuple]:
    """(tag, stream, work) of the program without recompute with each layer's core-attention forward rerun, as
    recompute, right before its backward."""
    out = []
    for op in none_program.ops:
        tag = op.tag
        if tag.block == "attn" and tag.phase == "bwd" and tag.role == UNFUSED_BACKWARD[0][0]:
            out += [(replace(f.tag, phase="rc"), f.stream, f.work)
                    for f in attention_ops(none_program, tag.micro_batch, "fwd", tag.layer)]
        out.append((tag, op.stream, op.work))
    return out


@pytest.mark.parametrize("plan_text", ATTENTION_PLANS)
def test_selective_recompute_with_unfused_attention_reruns_only_the_core_attention(frontier, plan_text):
    selective = build(frontier, plan_text, "attention=unfused,recompute=selective")
    none = build(frontier, plan_text, "attention=unfused,recompute=none")
    assert [(op.tag, op.stream, op.work) for op in selective.program.ops] == _selective_expected(none.program)
    for mb, layer in itertools.product(range(GA), range(LAYERS)):
        assert_attention_kernels(attention_ops(selective.program, mb, "rc", layer), unfused("rc", selective.gx),
                                 selective.gx)


@pytest.mark.parametrize("text, gpus", [("tp=2,pp=2,mbs=1,ga=4", 4), ("tp=2,pp=2,vpp=2,sp=1,mbs=1,ga=4", 4)])
def test_selective_recompute_with_unfused_attention_in_a_pipeline(frontier, text, gpus):
    def schedule(extra: str):
        plan = parse_plan(f"{text},attention=unfused,{extra}", ParallelPlan(global_batch=4))
        return build_step(parse_model_spec(SMALL_SPEC.replace("layers=2", "layers=4")), plan, frontier, gpus).schedule

    selective, none = schedule("recompute=selective"), schedule("recompute=none")
    assert len(selective.programs) == len(none.programs) == 2
    for sel, base in zip(selective.programs, none.programs):
        assert [(op.tag, op.stream, op.work) for op in sel.ops] == _selective_expected(base)
        # the core attention's forward kernels (1 x 8/2 = 4 score matrices: torch's softmax) x 4 micro-batches x 2
        # layers a stage
        assert len(sel.ops) == len(base.ops) + len(unfused("rc", gx=2, mbs=1)) * 4 * 4 // 2


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
