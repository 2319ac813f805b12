"""recompute=op: torchtitan's per-operator selective activation checkpointing of a Llama block (twin.plan): what the
builder reruns before each block's backward, the gathers it does there, what memory keeps, and the refusals."""

from __future__ import annotations

from collections import Counter

import pytest

from topologies import load_machine
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir import Collective, Gemm
from twin.ir_io import load_schedule, save_schedule
from twin.memory import layer_activation_bytes, layer_input_bytes, op_kept_bytes, stage_memory
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan

from helpers import valid_plan

# Llama-shaped: grouped-query attention (k and v a quarter of q), a SwiGLU MLP of 1,536
LLAMA = parse_model_spec("layers=4,hidden=512,heads=8,kv_heads=2,seq=256,vocab=1024,ffn=1536,arch=llama")
GPT = parse_model_spec("layers=4,hidden=512,heads=8,seq=256,vocab=1024")
FSDP = "gz=4,mbs=1,ga=2"


def plan(text: str, model=LLAMA) -> ParallelPlan:
    return valid_plan(text, model, 8)


def rerun(p: ParallelPlan, layer: int = 1) -> list:
    """The compute ops (block, role, work) rank 0 writes in micro-batch 0's recompute pass of `layer`."""
    program = build_schedule(LLAMA, p).programs[0]
    return [(op.tag.block, op.tag.role, op.work) for op in program.ops
            if op.tag is not None and op.tag.phase == "rc" and op.tag.layer == layer and op.tag.micro_batch == 0
            and not isinstance(op.work, Collective)]


def test_the_plan_text_round_trips():
    p = plan(f"{FSDP},recompute=op")
    assert "recompute=op" in p.describe()
    assert parse_plan(p.describe(), ParallelPlan(global_batch=8)) == p
    assert not any(p.recomputes(i) for i in range(4)) and p.recomputed_layers(4) == 0  # not Megatron's full


@pytest.mark.parametrize("text, model, message", [
    (f"{FSDP},recompute=op", GPT, r"recompute=op .* a Llama model \(got arch=gpt\); use a Llama model"),
    (f"{FSDP},recompute=op,attention=unfused", LLAMA, r"flash attention \(got attention=unfused\); use attention=flash"),
    ("gx=2,gz=2,mbs=1,ga=2,recompute=op", LLAMA, r"no tensor parallelism inside the block \(got gx=2, gy=1\)"),
    ("gz=4,mbs=1,ga=2,fp8=1,recompute=op", LLAMA, r"bf16 linears \(got fp8=1\); leave fp8 out"),
    (f"{FSDP},recompute=op", parse_model_spec("layers=4,hidden=512,heads=8,seq=256,vocab=1024,arch=llama,dropout=1"),
     r"without dropout \(got dropout=1\); use dropout=0"),
])
def test_refusals_name_the_field_and_the_fix(text, model, message):
    with pytest.raises(TwinError, match=message):
        plan(text, model)


def test_a_block_reruns_the_even_matrix_multiplies_and_the_elementwise_work_between():
    """Of wq, wk, wv, wo, w1, w3, w2 the even ones rerun (k's columns of the fused QKV, wo, the up half of the fused
    gate and up), with the norms, the rotary embedding, flash's input copies, the residual add and SwiGLU; never the
    attention kernel, whose output the policy keeps, nor w2 or the second residual add."""
    ops = rerun(plan(f"{FSDP},recompute=op"))
    assert Counter((block, role) for block, role, _ in ops) == Counter({
        ("ln1", "fwd"): 1, ("qkv", "gemm_part"): 1, ("rope_q", "fwd"): 1, ("rope_k", "fwd"): 1,
        ("attn", "q_copy"): 1, ("attn", "k_copy"): 1, ("attn", "v_copy"): 1, ("attn_out", "gemm"): 1,
        ("resid1", "fwd"): 1, ("ln2", "fwd"): 1, ("mlp_up", "gemm_part"): 1, ("swiglu", "fwd"): 1})
    tokens, h, f = LLAMA.seq, LLAMA.hidden, LLAMA.ffn
    gemms = {block: (w.m, w.n, w.k) for block, _, w in ops if isinstance(w, Gemm)}
    assert gemms == {"qkv": (tokens, h // 4, h), "attn_out": (tokens, h, h), "mlp_up": (tokens, f, h)}


def test_the_rerun_is_part_of_full_recomputes_and_the_same_in_every_layer_and_micro_batch():
    """Its GEMM FLOPs are (h_kv + h + f) / (h + 2 h_kv + h + 2 f + f) of full recompute's; the blocks written for
    other layers and micro-batches (copied from a recording) rerun the same work."""
    def flops(ops):
        return sum(w.flops for _, _, w in ops if isinstance(w, Gemm))
    h, f, kv = LLAMA.hidden, LLAMA.ffn, LLAMA.hidden // 4
    op, full = plan(f"{FSDP},recompute=op"), plan(f"{FSDP},recompute=full")
    assert flops(rerun(op)) / flops(rerun(full)) == pytest.approx((kv + h + f) / (h + 2 * kv + h + 3 * f))
    works = [[w for _, _, w in rerun(op, layer)] for layer in range(LLAMA.layers)]
    assert all(w == works[0] for w in works)


def backward_gathers(p: ParallelPlan) -> Counter:
    """(phase, block) -> weight all-gathers over z rank 0 issues for layer 1 in micro-batch 0."""
    program = build_schedule(LLAMA, p).programs[0]
    return Counter((op.tag.phase, op.tag.block) for op in program.ops
                   if op.tag is not None and op.tag.micro_batch == 0 and op.tag.layer == 1 and op.tag.role == "ag_z")


@pytest.mark.parametrize("oag", [0, 1])
def test_with_reshard_its_rerun_gathers_the_blocks_weights_back(oag):
    """FSDP gathers a block's freed parameters before the backward that reruns its ops: with reshard the rerun
    gathers all four linears' weights (the down projection's for the backward that follows) and the backward
    gathers none again, where without recompute the backward gathers all four; without reshard the forward's are
    still held, and nothing is gathered after the forward."""
    linears = ("qkv", "attn_out", "mlp_up", "mlp_down")
    forward = {("fwd", b): 1 for b in linears}
    assert backward_gathers(plan(f"{FSDP},recompute=op,reshard=1,oag={oag}")) == \
        Counter({**forward, **{("rc", b): 1 for b in linears}})
    assert backward_gathers(plan(f"{FSDP},recompute=none,reshard=1,oag={oag}")) == \
        Counter({**forward, **{("bwd", b): 1 for b in linears}})
    assert backward_gathers(plan(f"{FSDP},recompute=op,reshard=0,oag={oag}")) == Counter(forward) == \
        backward_gathers(plan(f"{FSDP},recompute=none,reshard=0,oag={oag}"))


def test_without_reshard_it_holds_every_layers_gathered_weights_as_no_recompute_does():
    held = {(r, s): stage_memory(LLAMA, plan(f"{FSDP},recompute={r},reshard={s}"), 0).gathered_weights
            for r in ("none", "op") for s in (0, 1)}
    assert held[("op", 0)] == pytest.approx(held[("none", 0)]) and held[("op", 1)] == pytest.approx(held[("none", 1)])
    assert held[("op", 1)] < held[("op", 0)]


def test_memory_keeps_the_policys_outputs_and_rebuilds_the_rest_one_layer_at_a_time():
    """Per layer: its input and the outputs of wq, wv, the attention, w1 and w2, (h + 3h + h_kv + f) elements a
    token in bf16, counted here from the model; one layer's rest rebuilt at a time; between full and none."""
    p = plan(f"{FSDP},recompute=op")
    tokens, h, f = LLAMA.seq, LLAMA.hidden, LLAMA.ffn
    kept = 2 * tokens * (h + 3 * h + h // 4 + f)
    assert op_kept_bytes(LLAMA, p, tokens) == pytest.approx(kept)
    whole = layer_activation_bytes(LLAMA, p, tokens)
    assert stage_memory(LLAMA, p, 0).activations == pytest.approx(LLAMA.layers * kept + (whole - kept))
    full, none = (stage_memory(LLAMA, plan(f"{FSDP},recompute={r}"), 0).activations for r in ("full", "none"))
    assert full == pytest.approx(LLAMA.layers * layer_input_bytes(LLAMA, p, tokens) + whole)
    assert full < stage_memory(LLAMA, p, 0).activations < none == pytest.approx(LLAMA.layers * whole)


@pytest.mark.parametrize("reshard", [0, 1])
def test_the_step_lies_between_no_recompute_and_full(reshard):
    machine = load_machine("dgx-a100")
    steps = [simulate_step(LLAMA, plan(f"{FSDP},reshard={reshard},recompute={r}"), machine, 4).step_time_s
             for r in ("none", "op", "full")]
    assert steps[0] < steps[1] < steps[2]


def test_in_a_pipeline_every_blocks_backward_starts_with_its_rerun():
    p = plan("pp=2,gz=2,mbs=1,ga=4,recompute=op")
    schedule = build_schedule(LLAMA, p)
    for program in schedule.programs:
        layers = {(op.tag.micro_batch, op.tag.layer) for op in program.ops
                  if op.tag is not None and op.tag.phase == "rc" and op.tag.layer is not None}
        stage_layers = {op.tag.layer for op in program.ops if op.tag is not None and op.tag.phase == "fwd"
                        and op.tag.layer is not None}
        assert layers == {(mb, layer) for mb in range(4) for layer in stage_layers}


def test_an_exported_schedule_keeps_it(tmp_path):
    path = tmp_path / "step.json"
    save_schedule(build_schedule(LLAMA, plan(f"{FSDP},recompute=op")), str(path))
    assert load_schedule(str(path)).info.plan.recompute == "op"


def test_search_tries_it_where_it_applies_and_its_bounds_hold():
    """`twin search --recompute none,op,full` over FSDP and tensor-parallel plans: op only where the block has no
    tensor parallelism (the others rejected with the reason), every plan's bounds at or below its simulated step,
    and branch and bound ranks as simulating every plan does."""
    from helpers import check_search_bounds_and_ranking
    from twin.search.space import SearchSpace, enumerate_space

    machine = load_machine("dgx-a100")
    space = SearchSpace(axes=("gx", "gz", "gdata"), recompute=("none", "op", "full"), reshard=(False, True))
    plans, _, _ = check_search_bounds_and_ranking(LLAMA, machine, 8, 32, space, top=5)
    ops = [p for p in plans if p.recompute == "op"]
    assert ops and all(p.gx == 1 and p.gy == 1 for p in ops)
    rejected = enumerate_space(LLAMA, 8, 32, machine.device.hbm_bytes, space).rejected
    assert any("recompute=op" in reason for reason in rejected)
