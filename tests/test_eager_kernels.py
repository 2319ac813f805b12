"""kernels=eager: a Llama layer's element-wise work op by op, as torchtitan's Llama of 2024 runs in eager PyTorch
(twin.builders.eager_kernels): the kernels each block writes, their bytes, what memory keeps, and the refusals."""

from __future__ import annotations

from collections import Counter

import pytest

from topologies import load_machine
from twin.builders.eager_kernels import REPEAT_KV_BYTES, ROPE_BACKWARD, ROPE_FORWARD, SWIGLU_BACKWARD, SWIGLU_FORWARD
from twin.builders.megatron_kernels import ROPE_BYTES, SWIGLU_BACKWARD_BYTES, SWIGLU_BYTES
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir import Elementwise
from twin.memory import layer_activation_bytes
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan

from helpers import valid_plan

GQA = parse_model_spec("layers=2,hidden=512,heads=8,kv_heads=2,seq=256,vocab=1024,ffn=1536,arch=llama")
MHA = parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024,ffn=1536,arch=llama")
PLAN = "gz=2,mbs=1,ga=1,recompute=none"


def plan(text: str, model=GQA) -> ParallelPlan:
    return valid_plan(text, model, 2)


def kernels(model, text: str, phase: str) -> Counter:
    """(block, role) -> the element-wise kernels rank 0 writes for layer 0 in micro-batch 0's pass `phase`."""
    program = build_schedule(model, plan(text, model)).programs[0]
    return Counter((op.tag.block, op.tag.role) for op in program.ops
                   if op.tag.layer == 0 and op.tag.phase == phase and isinstance(op.work, Elementwise))


def traffic(model, text: str, block: str) -> float:
    """Bytes the element-wise kernels of `block` move in layer 0's forward and backward."""
    program = build_schedule(model, plan(text, model)).programs[0]
    return sum(op.work.nbytes for op in program.ops
               if op.tag.layer == 0 and op.tag.block == block and isinstance(op.work, Elementwise))


def test_the_plan_text_round_trips_and_fused_keeps_the_old_text():
    p = plan(f"{PLAN},kernels=eager")
    assert "kernels=eager" in p.describe() and parse_plan(p.describe(), ParallelPlan(global_batch=2)) == p
    assert "kernels" not in plan(PLAN).describe()


@pytest.mark.parametrize("text, model, message", [
    (f"{PLAN},kernels=eager", parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024"),
     r"kernels=eager .* a Llama model \(got arch=gpt\); use a Llama model, or leave kernels out"),
    (f"{PLAN},kernels=eager,attention=unfused", GQA, r"flash attention \(got attention=unfused\)"),
    ("cp=2,mbs=1,ga=1,recompute=none,kernels=eager", GQA, r"whole sequences on a rank \(got cp=2\); use cp=1"),
    (f"{PLAN},kernels=slow", GQA, r"kernels='slow' is unknown; use one of fused, eager"),
])
def test_refusals_name_the_field_and_the_fix(text, model, message):
    with pytest.raises(TwinError, match=message):
        plan(text, model)


def test_rotary_and_swiglu_run_as_eager_pytorch_launches_them():
    """Three kernels on q and on k each way (cast up, complex multiply, cast down), silu and the multiply forward,
    the multiply's two products and silu's backward; fused, one kernel each."""
    forward, backward = kernels(GQA, f"{PLAN},kernels=eager", "fwd"), kernels(GQA, f"{PLAN},kernels=eager", "bwd")
    for which in ("rope_q", "rope_k"):
        assert [role for (block, role) in forward if block == which] == [r for r, _, _ in ROPE_FORWARD]
        assert [role for (block, role) in backward if block == which] == [r for r, _, _ in ROPE_BACKWARD]
    assert [role for (block, role) in forward if block == "swiglu"] == [r for r, _, _ in SWIGLU_FORWARD]
    assert [role for (block, role) in backward if block == "swiglu"] == [r for r, _, _ in SWIGLU_BACKWARD]
    fused = kernels(GQA, PLAN, "fwd")
    assert [role for (block, role) in fused if block in ("rope_q", "rope_k", "swiglu")] == ["fwd"] * 3


def test_the_eager_kernels_move_the_bytes_counted_from_the_code():
    tokens, h, f = GQA.seq, GQA.hidden, GQA.ffn
    rope = sum(b for _, b, _ in ROPE_FORWARD + ROPE_BACKWARD) * tokens * (h + h // 4)  # q, and k a quarter of it
    assert traffic(GQA, f"{PLAN},kernels=eager", "rope_q") + traffic(GQA, f"{PLAN},kernels=eager", "rope_k") == \
        pytest.approx(rope)
    assert traffic(GQA, f"{PLAN},kernels=eager", "swiglu") == \
        pytest.approx(sum(b for _, b, _ in SWIGLU_FORWARD + SWIGLU_BACKWARD) * tokens * f)
    assert traffic(GQA, PLAN, "swiglu") == pytest.approx((SWIGLU_BYTES + SWIGLU_BACKWARD_BYTES) * tokens * f)
    assert traffic(GQA, PLAN, "rope_q") == pytest.approx(2 * ROPE_BYTES * tokens * h)


def test_grouped_query_attention_copies_k_and_v_out_to_every_head_and_sums_them_back():
    """repeat_kv: a copy of k and of v at every head's width before SDPA and a sum after its backward, where
    kv_heads < heads; with as many as heads, none. Around the kernel only the output's copy, no q/k/v rearrangement
    (Megatron's path) and no cu_seqlens."""
    tokens, h = GQA.seq, GQA.hidden
    forward, backward = kernels(GQA, f"{PLAN},kernels=eager", "fwd"), kernels(GQA, f"{PLAN},kernels=eager", "bwd")
    attention = {role for block, role in forward if block == "attn"}
    assert attention == {"k_repeat", "v_repeat", "context_copy"}
    assert {role for block, role in backward if block == "attn"} == {"k_repeat_bwd", "v_repeat_bwd"}
    assert traffic(GQA, f"{PLAN},kernels=eager", "attn") == pytest.approx(
        2 * REPEAT_KV_BYTES * tokens * h + 2 * (2 + 2 * 0.25) * tokens * h + 4 * tokens * h)
    assert {role for block, role in kernels(MHA, f"{PLAN},kernels=eager", "fwd") if block == "attn"} == \
        {"context_copy"}
    assert not {role for block, role in kernels(MHA, f"{PLAN},kernels=eager", "bwd") if block == "attn"}


def test_memory_keeps_silus_output_and_every_heads_k_and_v():
    tokens, h, f = GQA.seq, GQA.hidden, GQA.ffn
    extra = 2 * tokens * (f + 2 * (h - h // 4))  # silu's output; k and v at every head's width, not a quarter
    assert layer_activation_bytes(GQA, plan(f"{PLAN},kernels=eager"), tokens) - \
        layer_activation_bytes(GQA, plan(PLAN), tokens) == pytest.approx(extra)


@pytest.mark.parametrize("recompute", ["none", "op", "full"])
@pytest.mark.parametrize("fused_words, eager_words", [("", ",kernels=eager"),
                                                      (",kernels=eager", ",kernels=eager,norm=eager")])
def test_the_step_takes_longer_op_by_op(recompute, fused_words, eager_words):
    """The element-wise work op by op (kernels=eager), and the RMSNorms too (norm=eager: tests/test_eager_norm.py)."""
    machine = load_machine("dgx-a100")
    fused, eager = (simulate_step(GQA, plan(f"gz=2,mbs=1,ga=1,recompute={recompute}{k}"), machine, 2).step_time_s
                    for k in (fused_words, eager_words))
    assert eager > fused
