"""The kernels a training step launches besides its GEMMs, attention and communication (twin.builders.schedule).

The inventory is written out here, independently of the builder, from Megatron-DeepSpeed's code
(microsoft/Megatron-DeepSpeed c08e2cc2: megatron/model/transformer.py, fused_layer_norm.py, fused_bias_gelu.py,
megatron/core/tensor_parallel/layers.py and cross_entropy.py, megatron/model/distributed.py,
megatron/optimizer/optimizer.py and clip_grads.py), one kernel per entry, with the bytes it moves per element of
the tensor it walks (2 per bf16 value read or written, 4 per fp32 value, 1 per dropout-mask element). Since the
simulator issues ops one host launch apart, the number of kernels is checked as well as the bytes.
"""

from __future__ import annotations

import pytest

from helpers import FUSED_SOFTMAX, SMALL_SPEC, megatron_softmax
from twin.build import build_step
from twin.errors import TwinError
from twin.builders.tags import ACCUMULATE_ROLES
from twin.ir import Attention, Collective, Elementwise, Gemm
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan
from twin.search.passes import pass_of

H, F, SEQ, VOCAB, HEADS, LAYERS = 512, 2048, 128, 1024, 8, 2
SMALL = parse_model_spec(SMALL_SPEC)  # hidden 512: apex's layer norm (not a persistent-kernel size)
WIDE_SPEC = SMALL_SPEC.replace("hidden=512", "hidden=1024")
WIDE = parse_model_spec(WIDE_SPEC)  # hidden 1024: the persistent kernel


def build(frontier, model, text: str, global_batch: int):
    plan = parse_plan(text, ParallelPlan(global_batch=global_batch))
    gpus = plan.gx * plan.gy * plan.gz * plan.gdata * plan.pp
    return build_step(model, plan, frontier, gpus)


def layer_inventory(h: int, gx: int, mbs: int, attention: str, persistent_ln: bool, acc: int = 10,
                    dropout: bool = True):
    """(forward, backward): each a list of (<block>.<role>, elements, bytes per element) for one layer and
    micro-batch on a Megatron tensor-parallel rank (gx = TP, gy = gz = 1, no sequence parallelism), in the words of
    twin.builders.tags; a GEMM or attention kernel has elements None. `acc`: bytes per element of main_grad.add_(grad) (fp32 main_grad in bf16: 4 + 2 + 4).
    Without `dropout` (a model trained without it) the residual adds write no mask and no dropout kernel runs."""
    f, T = 4 * h, mbs * SEQ
    res, heads, ffn, qkv_out = T * h, T * h / gx, T * f / gx, T * 3 * h / gx
    batch = mbs * HEADS // gx  # score matrices
    scores = batch * SEQ * SEQ
    gemm = None
    fwd = [("ln1.fwd", res, 4), ("qkv.gemm", gemm, 0), ("qkv.bias", qkv_out, 4)]
    if attention == "flash":
        fwd += [("attn.q_copy", heads, 4), ("attn.k_copy", heads, 4), ("attn.v_copy", heads, 4),
                ("attn.seqlens", mbs + 1, 4), ("attn.fwd", gemm, 0)]
        fwd += [("attn.context_copy", heads, 4)] if mbs > 1 else []
    else:
        softmax = [(f"attn.{role}", scores, nbytes) for role, nbytes in megatron_softmax(SEQ, batch, False)]
        fwd += [("attn.scores", gemm, 0), *softmax] + ([("attn.dropout", scores, 5)] if dropout else []) + [
                ("attn.context", gemm, 0), ("attn.context_copy", heads, 4)]
    resid = 7 if dropout else 6  # read x and the residual, write the sum (and the 1-byte mask)
    fwd += [("attn_out.gemm", gemm, 0), ("resid1.fwd", res, resid), ("ln2.fwd", res, 4), ("mlp_up.gemm", gemm, 0),
            ("gelu.fwd", ffn, 4), ("mlp_down.gemm", gemm, 0), ("mlp_down.bias", res, 4), ("resid2.fwd", res, resid)]

    def dropout_bwd(name):  # read the gradient and the mask, write dx; nothing without dropout
        return [(name, res, 5)] if dropout else []

    def ln_bwd(name):
        partial_sum = (f"{name}.bwd_params_sum", h, 2 * 16 * 4 + 2 * 2)  # 16 fp32 partial rows of dgamma and dbeta
        if persistent_ln:
            kernels = [(f"{name}.bwd", res, 6), partial_sum]
        else:
            kernels = [(f"{name}.bwd_params", res, 4), partial_sum, (f"{name}.bwd", res, 6)]
        return kernels + [(f"{name}.grad_add", res, 6), (f"{name}.acc_weight", h, acc), (f"{name}.acc_bias", h, acc)]

    def linear_bwd(name, k, n):
        return [(f"{name}.dI", gemm, 0), (f"{name}.dW", gemm, 0), (f"{name}.acc_weight", k * n / gx, acc)]

    bwd = dropout_bwd("resid2.bwd") + [("mlp_down.dbias", res, 2), ("mlp_down.acc_bias", h, acc)]
    bwd += linear_bwd("mlp_down", f, h)
    bwd += [("gelu.bwd", ffn, 6), ("mlp_up.dbias", ffn, 2), ("mlp_up.acc_bias", f / gx, acc)]
    bwd += linear_bwd("mlp_up", h, f)
    bwd += ln_bwd("ln2")
    bwd += dropout_bwd("resid1.bwd") + [("attn_out.dbias", res, 2), ("attn_out.acc_bias", h, acc)]
    bwd += linear_bwd("attn_out", h, h)
    grads = [("attn.q_grad", heads, 4), ("attn.k_grad", heads, 4), ("attn.v_grad", heads, 4)]
    if attention == "flash":
        bwd += ([("attn.bwd_copy", heads, 4)] if mbs > 1 else []) + [("attn.bwd", gemm, 0)]
        bwd += grads if mbs > 1 else [("attn.qkv_grad", 3 * heads, 4)]
    else:
        softmax = [(f"attn.{role}", scores, nbytes) for role, nbytes in megatron_softmax(SEQ, batch, True)]
        bwd += [("attn.context_dV", gemm, 0), ("attn.context_dP", gemm, 0)]
        bwd += [("attn.dropout_bwd", scores, 5)] if dropout else []
        bwd += [*softmax, ("attn.scores_dQ", gemm, 0), ("attn.scores_dQ_scale", heads, 4),
                ("attn.scores_dK", gemm, 0), ("attn.scores_dK_scale", heads, 4)] + grads
    bwd += [("qkv.dI", gemm, 0), ("qkv.dW", gemm, 0), ("qkv.dbias", qkv_out, 2),
            ("qkv.acc_weight", h * 3 * h / gx, acc), ("qkv.acc_bias", 3 * h / gx, acc)]
    bwd += ln_bwd("ln1")
    return fwd, bwd


def layer_ops(program, mb: int, phase: str, layer: int) -> list[tuple[str, object]]:
    """(<block>.<role> from its tag, work) of one layer pass's compute ops, accumulations included."""
    return [(f"{op.tag.block}.{op.tag.role}", op.work) for op in program.ops
            if not op.is_comm and (op.tag.micro_batch, op.tag.phase, op.tag.layer) == (mb, phase, layer)]


def assert_inventory(got: list, want: list) -> None:
    assert [name for name, _ in got] == [name for name, _, _ in want]
    for (name, work), (_, elements, nbytes) in zip(got, want):
        if elements is None:
            assert isinstance(work, (Gemm, Attention)), name
        else:
            assert isinstance(work, Elementwise), name
            assert work.nbytes == pytest.approx(elements * nbytes, rel=1e-12), name


# Kernels per layer and micro-batch (forward; backward with its accumulations), counted by hand from the lists
# above: the report's inventory table, where Megatron's fused softmax runs (at tp=2 and mbs=1 its 4 score matrices
# of 128 x 128 are too few: torch's softmax then adds 4 kernels each way).
TORCH_SOFTMAX_EXTRA = 4
COUNTS = [  # (model, plan, attention, mbs, forward, backward)
    (WIDE, "flash", 1, 16, 35),
    (WIDE, "flash", 2, 17, 38),
    (WIDE, "unfused", 1, 16, 44),
    (SMALL, "flash", 2, 17, 40),  # apex's layer norm: one more backward kernel per layer norm
    (SMALL, "unfused", 2, 16, 46),
]


@pytest.mark.parametrize("model, attention, mbs, n_fwd, n_bwd", COUNTS)
@pytest.mark.parametrize("gx", [1, 2])
def test_layer_kernels_per_pass(frontier, model, attention, mbs, n_fwd, n_bwd, gx):
    b = build(frontier, model, f"tp={gx},dp=2,mbs={mbs},attention={attention},recompute=full", 2 * 2 * mbs)
    program = b.schedule.programs[0]
    fwd, bwd = layer_inventory(model.hidden, gx, mbs, attention, persistent_ln=model.hidden == 1024)
    fused = megatron_softmax(SEQ, mbs * HEADS // gx, backward=False) == FUSED_SOFTMAX
    extra = 0 if attention == "flash" or fused else TORCH_SOFTMAX_EXTRA
    assert (len(fwd), len(bwd)) == (n_fwd + extra, n_bwd + extra)
    for mb in range(b.plan.ga):
        for layer in range(LAYERS):
            assert_inventory(layer_ops(program, mb, "fwd", layer), fwd)
            assert_inventory(layer_ops(program, mb, "rc", layer), fwd)  # full recompute reruns the forward
            assert_inventory(layer_ops(program, mb, "bwd", layer), bwd)


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_a_model_without_dropout_runs_no_dropout_kernel(frontier, attention):
    """MPT and LLaMA train without dropout: the residual adds keep no mask, and the embedding's, the attention's
    and the residuals' dropouts (and their backwards) launch nothing; everything else is as with dropout."""
    plan = f"tp=2,dp=2,mbs=2,attention={attention},recompute=full"
    without = build(frontier, parse_model_spec(WIDE_SPEC + ",dropout=0"), plan, 8).schedule.programs[0]
    fwd, bwd = layer_inventory(1024, 2, 2, attention, persistent_ln=True, dropout=False)
    fwd_d, bwd_d = layer_inventory(1024, 2, 2, attention, persistent_ln=True)
    unfused = attention == "unfused"
    assert (len(fwd_d) - len(fwd), len(bwd_d) - len(bwd)) == (unfused, 2 + unfused)
    for layer in range(LAYERS):
        assert_inventory(layer_ops(without, 0, "fwd", layer), fwd)
        assert_inventory(layer_ops(without, 0, "bwd", layer), bwd)
    with_dropout = build(frontier, WIDE, plan, 8).schedule.programs[0]
    embed = [[op for op in p.ops if op.tag.block == "embed" and op.tag.micro_batch == 0]
             for p in (with_dropout, without)]
    assert len(embed[0]) - len(embed[1]) == 2  # the embedding's dropout, forward and backward


def test_unfused_layer_of_the_dgx_example(frontier):
    """Per layer and micro-batch, unfused attention at mbs = 1 (13 forward and 18 backward kernels before this
    inventory): 16 and 44, accumulations included."""
    b = build(frontier, WIDE, "tp=1,dp=2,mbs=1,attention=unfused,recompute=full", 4)
    program = b.schedule.programs[0]
    assert len(layer_ops(program, 0, "fwd", 1)) == 16
    assert len(layer_ops(program, 0, "bwd", 1)) == 44


def test_accumulations_stay_outside_the_layer_passes(frontier):
    """main_grad adds follow the parameters' sharding (ZeRO-3 over gz x gdata), which the search's screening bound
    (built on the tensor-parallel grid alone) does not see: they are no layer pass's ops."""
    b = build(frontier, SMALL, "gz=2,gdata=2,zero=3,mbs=1", 8)
    accs = [op for op in b.schedule.programs[0].ops if op.tag.role in ACCUMULATE_ROLES]
    assert len(accs) == b.plan.ga * (12 * LAYERS + 2 + 2)  # the layers', ln_f's, the word and position tables'
    assert all(op.tag.phase == "bwd" for op in accs) and all(pass_of(op) is None for op in accs)
    weight = next(op for op in accs if op.name == "mb0.bwd.acc.L0.mlp_up.weight")
    assert (weight.tag.micro_batch, weight.tag.layer, weight.tag.block, weight.tag.role) == (0, 0, "mlp_up", "acc_weight")
    assert weight.work.nbytes == pytest.approx(10 * H * F / 4)  # the z+data shard of the weight


@pytest.mark.parametrize("dtype, acc", [("bf16", 4 + 2 + 4), ("fp16", 2 + 2 + 2)])
def test_every_parameter_is_accumulated_once_per_micro_batch(frontier, dtype, acc):
    model = parse_model_spec(SMALL_SPEC + f",dtype={dtype}")
    b = build(frontier, model, "tp=2,dp=2,mbs=1", 2 * 3)
    program = b.schedule.programs[0]
    # On each of the 2 tensor-parallel ranks: the weights, the QKV and h->4h biases and the word table (tied to the
    # LM head) split in two; the other biases, the layer norms and the position table whole (Megatron's
    # RowParallelLinear, LayerNorm and Embedding replicate them).
    layer = (12 * H * H + 3 * H + F) / 2 + H + H + 4 * H
    local = LAYERS * layer + VOCAB * H / 2 + SEQ * H + 2 * H
    for mb in range(3):
        total = sum(op.work.nbytes for op in program.ops if op.tag.micro_batch == mb and op.tag.role in ACCUMULATE_ROLES)
        assert total == pytest.approx(acc * local)


# ---- the step: main_grad zeroed and scaled, the optimizer's passes ---------------------------------------------

def step_bytes_per_param(program, local_params: float) -> float:
    step = [op for op in program.ops if op.tag.block in ("main_grad", "optimizer")]
    return sum(op.work.nbytes for op in step) / local_params


@pytest.mark.parametrize("dtype, want", [
    # zero_grad 4 + main_grad /= dp 4 + 4 + l2 norm 4 + clip 4 + 4 + Adam (4 reads, 3 writes of fp32) 28
    # + fp32 master to bf16 weight 4 + 2
    ("bf16", 4 + 8 + 4 + 8 + 28 + 6),
    # fp16 main_grad: zero 2, scale 2 + 2, then .float() 2 + 4 and unscale 4 + 4 before the same passes
    ("fp16", 2 + 4 + 6 + 8 + 4 + 8 + 28 + 6),
])
def test_optimizer_bytes_per_parameter(frontier, dtype, want):
    model = parse_model_spec(SMALL_SPEC + f",dtype={dtype}")
    b = build(frontier, model, "tp=2,dp=2,mbs=1", 4)
    program = b.schedule.programs[0]
    params = LAYERS * (12 * H * H + 13 * H) + VOCAB * H + SEQ * H + 2 * H
    assert step_bytes_per_param(program, params / 2) == pytest.approx(want)
    assert want == (58 if dtype == "bf16" else 66)
    passes = [op.tag.role for op in program.ops if op.tag.block == "optimizer"]
    tensors = 12 * LAYERS + 4  # per layer 4 weights, 4 biases, 2 x 2 norm parameters; word, position, ln_f x 2
    casts = ["grad_cast"] * tensors if dtype == "fp16" else []
    unscale = ["unscale"] if dtype == "fp16" else []
    assert passes == casts + unscale + ["grad_norm", "clip", "adam", "copy_params"]
    assert (program.ops[0].name, program.ops[0].tag.block, program.ops[0].tag.role) == ("zero_grad", "main_grad", "zero")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_flat_optimizer_is_three_passes_of_34_bytes_per_parameter(frontier, dtype):
    """optimizer=flat (DeepSpeed's FP16_Optimizer.step_fused_adam): the 16-bit gradients flattened (2 + 2), their norm
    (2), one fused Adam reading the 16-bit gradient and the fp32 master and moments, writing those three and the
    16-bit weight (2 + 12 + 12 + 2); no casts, unscale, clip or copy pass, whatever the dtype. main_grad is zeroed
    and scaled as before."""
    model = parse_model_spec(SMALL_SPEC + f",dtype={dtype}")
    megatron = build(frontier, model, "tp=2,dp=2,mbs=1", 4).schedule.programs[0]
    flat = build(frontier, model, "tp=2,dp=2,mbs=1,optimizer=flat", 4).schedule.programs[0]
    params = (LAYERS * (12 * H * H + 13 * H) + VOCAB * H + SEQ * H + 2 * H) / 2
    passes = [op for op in flat.ops if op.tag.block == "optimizer"]
    assert [op.tag.role for op in passes] == ["flatten_grads", "grad_norm", "adam"]
    assert sum(op.work.nbytes for op in passes) / params == pytest.approx(4 + 2 + 28)
    before = [op for op in megatron.ops if op.tag.block == "main_grad"]
    assert [(op.name, op.work) for op in flat.ops if op.tag.block == "main_grad"] == [(op.name, op.work) for op in before]
    megatron_step = sum(op.work.nbytes for op in megatron.ops if op.tag.block == "optimizer") / params
    assert megatron_step == pytest.approx(60 if dtype == "fp16" else 46)  # so flat streams 26 or 12 bytes fewer


def test_flat_optimizer_refuses_zero(frontier):
    with pytest.raises(TwinError, match="optimizer=flat is DeepSpeed's ZeRO-0 fp16 optimizer .*zero=1"):
        build(frontier, SMALL, "tp=2,dp=2,zero=1,mbs=1,optimizer=flat", 4)


def test_zero_shards_only_the_optimizer_passes(frontier):
    """ZeRO-1: main_grad is zeroed and scaled whole (12 bytes a parameter), the passes run on 1/gdata of it."""
    b = build(frontier, SMALL, "tp=2,dp=4,zero=1,mbs=1", 8)
    params = LAYERS * (12 * H * H + 13 * H) + VOCAB * H + SEQ * H + 2 * H
    assert step_bytes_per_param(b.schedule.programs[0], params / 2) == pytest.approx(12 + 46 / 4)


# ---- the loss ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gx", [1, 2, 4])
def test_loss_bytes_per_logit(frontier, gx):
    b = build(frontier, SMALL, f"tp={gx},dp=2,mbs=2", 8)
    program = b.schedule.programs[0]
    logits = 2 * SEQ * VOCAB / gx  # tokens of the micro-batch x this rank's share of the vocabulary
    loss = [op for op in program.ops if (op.tag.micro_batch, op.tag.block) == (0, "loss")]
    fwd = [op for op in loss if op.tag.phase == "fwd" and op.tag.role != "token" and not op.is_comm]
    bwd = [op for op in loss if op.tag.phase == "bwd" and op.tag.role != "token"]
    # cast to fp32 2 + 4, max 4, subtract 4 + 4, exp 4 + 4, sum 4, divide 4 + 4
    assert [op.tag.role for op in fwd] == ["cast", "max", "sub", "exp", "sum", "div"]
    assert sum(op.work.nbytes for op in fwd) / logits == pytest.approx(6 + 4 + 8 + 8 + 4 + 8)
    # multiply by the incoming gradient 4 + 4 (in place, fp32), cast back 4 + 2
    assert [op.tag.role for op in bwd] == ["scale", "cast"]
    assert sum(op.work.nbytes for op in bwd) / logits == pytest.approx(8 + 6)
    tokens = [op for op in loss if op.tag.role == "token"]
    assert len(tokens) == 21 + 11
    reduces = [op for op in loss if op.is_comm]
    if gx == 1:
        assert reduces == []
    else:  # max, target logit, sum of exponentials: one fp32 per token each
        assert [op.name for op in reduces] == ["mb0.loss.max.ar_x", "mb0.loss.target.ar_x", "mb0.loss.sum.ar_x"]
        assert all(op.work == Collective("all_reduce", "x", 4 * 2 * SEQ, "fp32") for op in reduces)


# ---- the embedding -------------------------------------------------------------------------------------------------

def test_embedding_kernels(frontier):
    b = build(frontier, SMALL, "tp=2,dp=2,mbs=2", 8)
    program = b.schedule.programs[0]
    embed = [op.tag for op in program.ops if (op.tag.micro_batch, op.tag.block) == (0, "embed")]
    fwd = [tag.role for tag in embed if tag.phase == "fwd"]
    assert fwd == ["token"] * 6 + ["word", "mask", "ar_x", "pos", "add", "transpose", "dropout"]
    bwd = [tag.role for tag in embed if tag.phase == "bwd"]
    assert bwd == ["dropout", "pos_copy", "pos_zero", "pos", "word_copy", "word_zero", "word", "tied_grad_add",
                   "acc_word", "acc_pos"]
    named = {op.name: op for op in program.ops}
    assert named["mb0.embed.ar_x"].work == Collective("all_reduce", "x", 2 * 2 * SEQ * H, "bf16")
    assert named["mb0.embed_bwd.word_zero"].work.nbytes == pytest.approx(2 * VOCAB * H / 2)
    assert named["mb0.embed_bwd.tied_grad_add"].work.nbytes == pytest.approx(6 * VOCAB * H / 2)


# ---- a Llama layer (ModelSpec.arch "llama") ------------------------------------------------------------------------

LLAMA_SPEC = "layers=2,hidden=1024,heads=8,kv_heads=2,ffn=1536,seq=128,vocab=1024,arch=llama"


def llama_layer_inventory(gx: int, mbs: int, acc: int = 10):
    """(forward, backward) of one Llama layer and micro-batch with flash attention, as layer_inventory for GPT:
    RMSNorm (the persistent kernel at hidden 1024, gamma alone), no biases, rotary embedding on q and on k, k and v
    a quarter of q (2 K/V heads for 8), SwiGLU over the ffn outputs (read gate and up, write the product; backward
    read both and the gradient, write both gradients), residual adds without dropout."""
    h, f, kv = 1024, 1536, 2 / 8
    T = mbs * SEQ
    res, heads, ffn = T * h, T * h / gx, T * f / gx
    gemm = None
    fwd = [("ln1.fwd", res, 4), ("qkv.gemm", gemm, 0), ("rope_q.fwd", heads, 4), ("rope_k.fwd", heads * kv, 4),
           ("attn.q_copy", heads, 4), ("attn.k_copy", heads * kv, 4), ("attn.v_copy", heads * kv, 4),
           ("attn.seqlens", mbs + 1, 4), ("attn.fwd", gemm, 0)]
    fwd += [("attn.context_copy", heads, 4)] if mbs > 1 else []
    fwd += [("attn_out.gemm", gemm, 0), ("resid1.fwd", res, 6), ("ln2.fwd", res, 4), ("mlp_up.gemm", gemm, 0),
            ("swiglu.fwd", ffn, 6), ("mlp_down.gemm", gemm, 0), ("resid2.fwd", res, 6)]

    def norm_bwd(name):  # one fp32 partial-sum row set (dgamma), no beta to accumulate
        return [(f"{name}.bwd", res, 6), (f"{name}.bwd_params_sum", h, 16 * 4 + 2), (f"{name}.grad_add", res, 6),
                (f"{name}.acc_weight", h, acc)]

    def linear_bwd(name, k, n):
        return [(f"{name}.dI", gemm, 0), (f"{name}.dW", gemm, 0), (f"{name}.acc_weight", k * n / gx, acc)]

    bwd = linear_bwd("mlp_down", f, h) + [("swiglu.bwd", ffn, 10)] + linear_bwd("mlp_up", h, 2 * f)
    bwd += norm_bwd("ln2") + linear_bwd("attn_out", h, h)
    bwd += ([("attn.bwd_copy", heads, 4)] if mbs > 1 else []) + [("attn.bwd", gemm, 0)]
    if mbs > 1:
        bwd += [("attn.q_grad", heads, 4), ("attn.k_grad", heads * kv, 4), ("attn.v_grad", heads * kv, 4)]
    else:
        bwd += [("attn.qkv_grad", heads * (1 + 2 * kv), 4)]
    bwd += [("rope_q.bwd", heads, 4), ("rope_k.bwd", heads * kv, 4)]
    bwd += linear_bwd("qkv", h, h * (1 + 2 * kv)) + norm_bwd("ln1")
    return fwd, bwd


@pytest.mark.parametrize("gx, mbs", [(1, 1), (2, 2)])
def test_llama_layer_kernels(frontier, gx, mbs):
    b = build(frontier, parse_model_spec(LLAMA_SPEC), f"tp={gx},dp=2,mbs={mbs},attention=flash,recompute=full",
              2 * 2 * mbs)
    program = b.schedule.programs[0]
    fwd, bwd = llama_layer_inventory(gx, mbs)
    for layer in range(LAYERS):
        assert_inventory(layer_ops(program, 0, "fwd", layer), fwd)
        assert_inventory(layer_ops(program, 0, "rc", layer), fwd)
        assert_inventory(layer_ops(program, 0, "bwd", layer), bwd)
    qkv = next(op.work for op in program.ops if (op.tag.phase, op.tag.block, op.tag.role) == ("fwd", "qkv", "gemm"))
    up = next(op.work for op in program.ops if (op.tag.phase, op.tag.block, op.tag.role) == ("fwd", "mlp_up", "gemm"))
    assert qkv.n == (1024 + 2 * 2 * 128) // gx and up.n == 2 * 1536 // gx  # narrower K/V; gate and up in one GEMM


@pytest.mark.parametrize("spec", [SMALL_SPEC, SMALL_SPEC + ",tied=0", LLAMA_SPEC])
@pytest.mark.parametrize("pp", [1, 2])
def test_data_parallel_all_reduce_moves_every_parameter_once(frontier, spec, pp):
    """Summed over the pipeline's stages, the gradient all-reduces carry every parameter of the model once (an
    untied LM head among them), plus a tied table once more on the last stage when pp > 1."""
    model = parse_model_spec(spec)
    b = build(frontier, model, f"tp=1,dp=2,pp={pp},mbs=1", 2 * 2)
    total = 0.0
    for stage in range(pp):
        program = b.schedule.programs[b.schedule.program_of()[stage * 2]]  # rank 0 of each stage (dp inner to pp)
        total += sum(op.work.nbytes for op in program.ops if op.is_comm and op.tag.role == "ar_data")
    tied_copy = VOCAB * model.hidden if pp > 1 and model.tied_head else 0
    assert total == pytest.approx(2 * (model.params + tied_copy))
