"""Parallel plans (parsing, validation) and the per-GPU memory model."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from helpers import FUSED_SOFTMAX, SMALL_SPEC, megatron_softmax
from twin.errors import TwinError
from twin.memory import (
    RUNTIME_RESERVE_FRACTION,
    check_fit,
    memory_per_gpu,
    resolve_micro_batch,
)
from twin.model import get_model, parse_model_spec
from twin.plan import ParallelPlan, parse_plan, with_micro_batch
from twin.plan_checks import validate_plan

SMALL = parse_model_spec(SMALL_SPEC)  # hidden 512, heads 8, ffn 2048, vocab 1024, seq 128


# ---- parse_plan -----------------------------------------------------------------


def test_parse_plan_all_keys():
    p = parse_plan("gx=8, gy=2 ,gz=4,gdata=16,mbs=2,ga=4,global_batch=512,recompute=none,oar=0,ors=off,oag=no,tune=false")
    assert (p.gx, p.gy, p.gz, p.gdata, p.mbs, p.ga, p.global_batch) == (8, 2, 4, 16, 2, 4, 512)
    assert p.recompute == "none"
    assert (p.oar, p.ors, p.oag, p.tune_gemm) == (False, False, False, False)
    assert p.world_size == 8 * 2 * 4 * 16
    assert p.tensor_parallel_size == 64
    assert p.sequences_per_rank == 512 // (16 * 4)


def test_parse_plan_defaults_and_base():
    p = parse_plan("")
    assert (p.gx, p.gy, p.gz, p.gdata, p.mbs, p.ga) == (1, 1, 1, 1, 0, 0)
    assert (p.recompute, p.oar, p.ors, p.oag, p.tune_gemm) == ("full", True, True, True, True)
    base = ParallelPlan(global_batch=64, gz=4)
    q = parse_plan("gx=2", base)
    assert (q.gx, q.gz, q.global_batch) == (2, 4, 64)


@pytest.mark.parametrize("word, value", [("1", True), ("true", True), ("on", True), ("YES", True),
                                         ("0", False), ("false", False), ("Off", False), ("no", False)])
def test_parse_plan_boolean_words(word, value):
    p = parse_plan(f"oar={word},ors={word},oag={word},tune={word}", ParallelPlan(oar=not value, ors=not value,
                                                                                 oag=not value, tune_gemm=not value))
    assert (p.oar, p.ors, p.oag, p.tune_gemm) == (value, value, value, value)


def test_parse_plan_keys_are_case_insensitive():
    assert parse_plan("GX=4,Gdata=2").gx == 4


def test_describe_round_trips():
    p = parse_plan("gx=4,gy=2,gz=2,gdata=8,mbs=2,ga=3,recompute=none,oar=0,ors=1,oag=0,tune=0")
    assert parse_plan(p.describe()) == p


def test_attention_is_flash_unless_the_plan_says_unfused():
    flash = parse_plan("gx=2,mbs=1,ga=2,recompute=none")
    assert flash.attention == "flash" == parse_plan("attention=flash").attention
    # flash plans read as they always have (search caches and tests key on the text)
    assert flash.describe() == "gx=2,gy=1,gz=1,gdata=1,mbs=1,ga=2,recompute=none,oar=1,ors=1,oag=1,tune=1"
    unfused = parse_plan("tp=2,pp=2,attention=unfused,recompute=selective")
    assert unfused.attention == "unfused"
    assert unfused.describe() == "gx=2,gy=1,gz=1,gdata=1,pp=2,attention=unfused,recompute=selective,oar=1,ors=1,oag=1,tune=1"
    assert parse_plan(unfused.describe()) == unfused


@pytest.mark.parametrize("base, field, default, other, text", [
    ("tp=2,dp=2", "optimizer", "megatron", "flat",
     "gx=2,gy=1,gz=1,gdata=2,optimizer=flat,recompute=full,oar=1,ors=1,oag=1,tune=1"),
    ("tp=2,pp=2", "p2p", "split", "full", "gx=2,gy=1,gz=1,gdata=1,pp=2,p2p=full,recompute=full,oar=1,ors=1,oag=1,tune=1"),
])
def test_a_word_field_keeps_its_default_unless_the_plan_says_otherwise(base, field, default, other, text):
    """optimizer: Megatron's unless flat; p2p: Megatron's split pipeline transfers unless full."""
    plain = parse_plan(base)
    assert getattr(plain, field) == default == getattr(parse_plan(f"{field}={default}"), field)
    assert field not in plain.describe()  # the default keeps the text (and the cache keys) it had
    changed = parse_plan(f"{base},{field}={other}")
    assert changed.describe() == text
    assert parse_plan(changed.describe()) == changed


@pytest.mark.parametrize("field, value", [("attention", "fused"), ("recompute", "some"), ("optimizer", "adamw"),
                                          ("p2p", "half")])
def test_a_word_field_outside_its_values_is_a_one_line_error(field, value):
    with pytest.raises(TwinError) as parsed:
        parse_plan(f"{field}={value}")
    with pytest.raises(TwinError) as validated:  # a plan made in code, not parsed
        validate_plan(replace(_plan("gx=2,mbs=1", 4), **{field: value}), SMALL, 2)
    allowed = {"attention": "flash, unfused", "recompute": "full, selective, op, none", "optimizer": "megatron, flat",
               "p2p": "split, full"}[field]
    for err in (parsed, validated):
        assert str(err.value) == f"--plan: {field}={value!r} is unknown; use one of {allowed}"


def test_without_overlap_switches_off_only_overlap():
    p = parse_plan("gx=2,gz=2,mbs=1,tune=0")
    q = p.without_overlap()
    assert (q.oar, q.ors, q.oag, q.overlap) == (False, False, False, False)
    assert replace(q, oar=True, ors=True, oag=True) == p


@pytest.mark.parametrize(
    "text, named",
    [
        ("gx=8,gy", "gy"),  # missing '='
        ("gx=8,gy=", "gy"),  # empty value
        ("gx=8,gw=2", "gw"),  # unknown key
        ("gx=two", "gx"),  # not an integer
        ("gx=0", "gx"),  # not positive
        ("gdata=-2", "gdata"),
        ("mbs=-1", "mbs"),
        ("oar=2", "oar"),  # not a boolean
        ("tune=maybe", "tune"),
        ("recompute=partial", "recompute"),
        ("attention=sdpa", "attention"),
    ],
)
def test_parse_plan_errors_name_the_item(text, named):
    with pytest.raises(TwinError) as err:
        parse_plan(text)
    message = str(err.value)
    assert named in message
    assert message.startswith("--plan")
    assert "\n" not in message


# ---- validate_plan --------------------------------------------------------------


def _plan(text: str, global_batch: int = 64) -> ParallelPlan:
    return parse_plan(text, ParallelPlan(global_batch=global_batch))


def test_valid_plan_passes():
    validate_plan(_plan("gx=2,gy=2,gz=2,gdata=2,mbs=2"), SMALL, 16)
    validate_plan(_plan("gx=8,gy=1,gz=1,gdata=1", 8), SMALL, 8)


@pytest.mark.parametrize(
    "model_spec, plan_text, gpus, global_batch, named",
    [
        # product of degrees != GPU count
        (SMALL_SPEC, "gx=2,gy=2,gz=2,gdata=2", 8, 64, "--gpus"),
        # heads (8) not divisible by gx=16
        (SMALL_SPEC, "gx=16", 16, 64, "heads"),
        # hidden (512) not divisible by gy=3
        (SMALL_SPEC, "gy=3", 3, 63, "hidden"),
        # ffn not divisible by gx / gy
        (SMALL_SPEC + ",ffn=1028", "gx=8", 8, 64, "ffn"),
        (SMALL_SPEC + ",ffn=1028", "gy=8", 8, 64, "ffn"),
        # vocab (1001) not divisible by gx
        ("layers=2,hidden=512,heads=8,seq=128,vocab=1001", "gx=2", 2, 64, "vocab"),
        # the attn_out weight block 512*512 = 2^18 is not divisible by gz=3
        (SMALL_SPEC, "gz=3", 3, 63, "gz"),
        # global batch not divisible by gdata*gz = 8
        (SMALL_SPEC, "gx=2,gz=2,gdata=4", 16, 60, "--global-batch"),
        # global batch must be positive
        (SMALL_SPEC, "gx=2", 2, 0, "--global-batch"),
        # mbs*ga != sequences per rank (64 / 4 = 16)
        (SMALL_SPEC, "gz=2,gdata=2,mbs=4,ga=2", 4, 64, "mbs"),
        # mbs does not divide the sequences per rank (16)
        (SMALL_SPEC, "gz=2,gdata=2,mbs=3", 4, 64, "mbs"),
        # ga does not divide the sequences per rank (16)
        (SMALL_SPEC, "gz=2,gdata=2,ga=5", 4, 64, "ga"),
    ],
)
def test_validate_plan_errors_name_the_field(model_spec, plan_text, gpus, global_batch, named):
    model = parse_model_spec(model_spec)
    with pytest.raises(TwinError) as err:
        validate_plan(_plan(plan_text, global_batch), model, gpus)
    message = str(err.value)
    assert named in message
    assert "\n" not in message


def test_mbs_times_ga_mismatch_names_both():
    with pytest.raises(TwinError, match=r"mbs=4 x ga=2 != 16"):
        validate_plan(_plan("gz=2,gdata=2,mbs=4,ga=2"), SMALL, 4)


def test_with_micro_batch_implies_ga():
    p = with_micro_batch(_plan("gz=2,gdata=2"), 4)
    assert (p.mbs, p.ga) == (4, 64 // 4 // 4)


# ---- memory ---------------------------------------------------------------------

FRONTIER_HBM = 64e9
PERLMUTTER_HBM = 40e9


def test_model_state_is_16_bytes_per_param_over_the_tensor_grid():
    model = get_model("GPT-20B")
    plan = _plan("gx=4,gy=2,gz=8,gdata=4,mbs=1", 8192)
    h = 7168
    params = 32 * (12 * h * h + 13 * h) + 50304 * h + 2048 * h + 2 * h
    # bf16 weight 2 + fp32 master 4 + Adam moments 8 + bf16 gradient 2 = 16 bytes per local parameter
    assert memory_per_gpu(model, plan).model_state == pytest.approx(16 * params / (4 * 2 * 8), rel=1e-12)


def test_activations_and_logits_follow_the_documented_formulas():
    model = SMALL
    gx, gy, mbs = 4, 2, 2
    plan = _plan(f"gx={gx},gy={gy},gz=2,gdata=1,mbs={mbs}", 64)
    m, h, f, V, L = mbs * 128, 512, 2048, 1024, 2
    working = 2 * m * (4 * h / gy + 4 * h / gx + 2 * f / gx) + 2 * m * h / gy
    mem = memory_per_gpu(model, plan)
    # full recompute: every layer's input (bf16, split over gy) plus one layer's working set
    assert mem.activations == pytest.approx(L * 2 * m * h / gy + working, rel=1e-12)
    # logits: bf16 + fp32 copy of m x V/gx
    assert mem.logits == pytest.approx(6 * m * V / gx, rel=1e-12)
    # no recompute keeps every layer's working set
    none = memory_per_gpu(model, replace(plan, recompute="none"))
    assert none.activations == pytest.approx(L * working, rel=1e-12)
    assert mem.total == pytest.approx(mem.model_state + mem.gathered_weights + mem.activations + mem.logits)


def test_llama_activations_and_model_state():
    """A Llama layer without recompute keeps the residual stream's four tensors, q and the context whole but k and v
    at kv_heads/heads, and its SwiGLU MLP's 2f gate-and-up outputs and f down inputs; no dropout masks. Its model
    state counts the untied LM head (V h) and RMSNorm's gamma alone."""
    model = parse_model_spec("layers=2,hidden=1024,heads=8,kv_heads=2,ffn=1536,seq=128,vocab=1024,arch=llama")
    gx, mbs = 2, 2
    plan = _plan(f"gx={gx},mbs={mbs},recompute=none,attention=flash", 2)
    m, h, f = mbs * 128, 1024, 1536
    layer = 2 * m * (4 * h + (2 + 2 * 2 / 8) * h / gx + 3 * f / gx)
    mem = memory_per_gpu(model, plan)
    assert mem.activations == pytest.approx(2 * layer, rel=1e-12)
    per_layer = h * (h + 2 * 2 * 128) + h * h + 3 * h * f + 2 * h
    params = 2 * per_layer + 1024 * h + 1024 * h + h
    assert model.params == params
    assert mem.model_state == pytest.approx(16 * params / gx, rel=1e-12)


def test_korthikanti_special_case():
    # gy = 1, gx = t, f = 4h: 2m(4h + 4h/t + 8h/t) + 2mh = m h (10 + 24/t) ... per layer (Korthikanti's s b h (10 + 24/t))
    model = parse_model_spec("layers=1,hidden=1024,heads=8,seq=256,vocab=1024")
    t, mbs = 4, 3
    plan = _plan(f"gx={t},mbs={mbs},recompute=none", 3)
    m, h = mbs * 256, 1024
    assert memory_per_gpu(model, plan).activations == pytest.approx(m * h * (10 + 24 / t), rel=1e-12)


# (s, b, h, a, t): sequence, micro-batch, hidden, heads, tensor-parallel size
KORTHIKANTI_CASES = [(128, 1, 512, 8, 1), (256, 2, 1024, 16, 2), (512, 3, 768, 12, 4), (2048, 4, 4096, 32, 8)]


def korthikanti_layer_bytes(s: int, b: int, h: int, a: int, t: int, sp: bool, recompute: str, attention: str) -> float:
    """Activation bytes one layer keeps for its backward, Korthikanti et al. (arXiv 2205.05198) Table 2, with flash
    attention storing no s x s scores: TP s b h (10 + 24/t + 5 a s/(h t)), TP + sp s b h (34/t + 5 a s/(h t)),
    selective recompute drops the 5 a s/(h t) term, full recompute keeps the layer input (split over t with sp).
    Where Megatron cannot run its fused softmax (b a/t = 9 score matrices in one case) torch's softmax keeps its
    fp32 output: 7 a s/(h t) (4 + 2 + 1 bytes a score)."""
    fused = megatron_softmax(s, b * a // t, backward=False) == FUSED_SOFTMAX
    scores = (5 if fused else 7) * a * s / (h * t) if attention == "unfused" else 0.0
    linears = 34 / t if sp else 10 + 24 / t
    if recompute == "full":
        return s * b * h * 2 / (t if sp else 1)
    return s * b * h * (linears + (scores if recompute == "none" else 0.0))


@pytest.mark.parametrize("s, b, h, a, t", KORTHIKANTI_CASES)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_activations_reduce_to_korthikantis_formulas(s, b, h, a, t, sp, recompute, attention):
    """gy = gz = 1, gx = t, ffn = 4h: each layer keeps Korthikanti's bytes. The stage holds its L layers' bytes
    plus what one layer's backward rebuilds at a time: its scores (selective), its whole set (full), nothing (none)."""
    L = 3
    model = parse_model_spec(f"layers={L},hidden={h},heads={a},seq={s},vocab={64 * t}")
    plan = _plan(f"gx={t},mbs={b},sp={int(sp)},recompute={recompute},attention={attention}", b)
    validate_plan(plan, model, t)
    whole = korthikanti_layer_bytes(s, b, h, a, t, sp, "none", attention)
    rebuilt = {"none": 0.0, "selective": whole - korthikanti_layer_bytes(s, b, h, a, t, sp, "selective", attention),
               "full": whole}[recompute]
    want = L * korthikanti_layer_bytes(s, b, h, a, t, sp, recompute, attention) + rebuilt
    assert memory_per_gpu(model, plan).activations == pytest.approx(want, rel=1e-12)


def test_unfused_attention_scores_are_five_bytes_per_score_on_any_grid():
    """mbs x heads/gx x s x s scores per layer (softmax and dropout outputs in bf16, a 1-byte mask), whatever
    gy, gz and sp: attention runs on each rank's whole sequences and local heads."""
    model = SMALL  # heads 8, seq 128
    plan = _plan("gx=2,gy=2,gz=2,mbs=2,recompute=none", 8)
    flash, unfused = memory_per_gpu(model, plan), memory_per_gpu(model, replace(plan, attention="unfused"))
    assert unfused.activations - flash.activations == pytest.approx(2 * 5 * 2 * (8 // 2) * 128 * 128, rel=1e-12)
    assert (unfused.model_state, unfused.gathered_weights, unfused.logits) == \
        (flash.model_state, flash.gathered_weights, flash.logits)


@pytest.mark.parametrize("attention", ["flash", "unfused"])
def test_a_model_without_dropout_keeps_no_masks_nor_dropped_scores(attention):
    """Without dropout each layer keeps 2 m h/(gy r) bytes less (the residual dropouts' 1-byte masks: Korthikanti's
    34 s b h becomes 32 s b h with sp) and unfused attention 3 bytes a score less (the dropped copy and its mask:
    the softmax output feeds the V product itself)."""
    plan = _plan(f"gx=2,mbs=2,recompute=none,attention={attention}", 2)
    without = replace(SMALL, dropout=False)
    m, h, scores = 2 * 128, 512, 2 * (8 // 2) * 128 * 128  # tokens; mbs x local heads x s x s
    saved = memory_per_gpu(SMALL, plan).activations - memory_per_gpu(without, plan).activations
    per_layer = 2 * m * h + (3 * scores if attention == "unfused" else 0)
    assert saved == pytest.approx(SMALL.layers * per_layer, rel=1e-12)
    with pytest.raises(TwinError, match="dropout='no' must be 0 or 1"):
        parse_model_spec("layers=1,hidden=64,heads=1,dropout=no")
    assert parse_model_spec("layers=1,hidden=64,heads=1,dropout=0").dropout is False


def test_gathered_weights_without_z_are_only_the_dw_block():
    plan = _plan("gx=2,gy=2,mbs=1", 4)
    largest = 512 * 2048  # mlp_up / mlp_down k*n
    assert memory_per_gpu(SMALL, plan).gathered_weights == pytest.approx(2 * largest / 4, rel=1e-12)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_resharded_weights_are_held_one_layer_at_a_time(recompute):
    """FSDP's FULL_SHARD (reshard=1) frees each layer's gathered weights after its forward, so without full
    recompute it holds one layer's (and the prefetched linear's), as full recompute does, where keeping them for
    the backward holds every layer's; the rest of the memory is the same."""
    kept = _plan(f"gz=4,mbs=1,recompute={recompute}", 4)
    resharded, rebuilt = replace(kept, reshard=True), replace(kept, recompute="full")
    block = SMALL.params_per_layer * 2  # bf16, over gx * gy = 1
    assert (memory_per_gpu(SMALL, kept).gathered_weights - memory_per_gpu(SMALL, resharded).gathered_weights
            == pytest.approx((SMALL.layers - 1) * block, rel=1e-12))
    assert memory_per_gpu(SMALL, resharded).gathered_weights == memory_per_gpu(SMALL, rebuilt).gathered_weights
    assert memory_per_gpu(SMALL, resharded).activations == memory_per_gpu(SMALL, kept).activations


def test_reshard_needs_sharded_weights_and_round_trips():
    plan = parse_plan("gz=2,gdata=2,reshard=1,recompute=none")
    assert plan.reshard and parse_plan(plan.describe()) == plan
    assert "reshard" not in parse_plan("gz=2").describe()  # the default keeps the text plans always had
    validate_plan(_plan("gdata=2,zero=3,reshard=1", 4), SMALL, 2)  # ZeRO-3 shards them over gdata
    with pytest.raises(TwinError, match="reshard=1 .* shards none"):
        validate_plan(_plan("gx=2,gdata=2,zero=1,reshard=1", 4), SMALL, 4)


def test_memory_needs_a_resolved_micro_batch():
    with pytest.raises(ValueError):
        memory_per_gpu(SMALL, _plan("gx=2"))


def test_check_fit_reports_by_how_much():
    model = get_model("GPT-80B")
    plan = _plan("gx=8,gz=8,mbs=64", 512)  # 64 sequences of 2048 tokens per micro-batch
    validate_plan(plan, model, 64)
    with pytest.raises(TwinError) as err:
        check_fit(model, plan, FRONTIER_HBM)
    message = str(err.value)
    assert "over by" in message
    needs = float(re.search(r"needs ([\d.]+) GB", message).group(1))
    usable = float(re.search(r"([\d.]+) GB are usable", message).group(1))
    over = float(re.search(r"over by ([\d.]+) GB", message).group(1))
    assert usable == pytest.approx(64 * (1 - RUNTIME_RESERVE_FRACTION), abs=0.06)
    assert over == pytest.approx(needs - usable, abs=0.15)
    # the activations alone (every layer's input, 2 m h bytes) exceed the device
    m, h = 64 * 2048, 12288
    assert needs * 1e9 >= 42 * 2 * m * h


def test_check_fit_model_state_alone_too_big():
    # GPT-80B on one 8-GCD node: ~77e9 params x 16 B / 8 = ~153 GB of model state per GCD
    with pytest.raises(TwinError, match="over by"):
        check_fit(get_model("GPT-80B"), _plan("gx=8,mbs=1", 8), FRONTIER_HBM)


def test_check_fit_returns_the_breakdown_when_it_fits():
    plan = _plan("gx=8,gz=8,mbs=1", 512)
    mem = check_fit(get_model("GPT-80B"), plan, FRONTIER_HBM)
    assert mem.total <= FRONTIER_HBM * (1 - RUNTIME_RESERVE_FRACTION)


@pytest.mark.parametrize(
    "model_name, plan_text, hbm",
    [
        ("GPT-80B", "gx=8,gz=8", FRONTIER_HBM),
        ("GPT-5B", "gx=4,gz=2,gdata=64", PERLMUTTER_HBM),
        ("GPT-20B", "gx=8,gz=8,gdata=32", FRONTIER_HBM),
    ],
)
def test_resolve_micro_batch_picks_the_largest_fitting_divisor(model_name, plan_text, hbm):
    model = get_model(model_name)
    plan = _plan(plan_text, 8192)
    resolved = resolve_micro_batch(model, plan, hbm)
    per_rank = 8192 // (plan.gdata * plan.gz)
    usable = hbm * (1 - RUNTIME_RESERVE_FRACTION)
    assert per_rank % resolved.mbs == 0
    assert resolved.mbs * resolved.ga == per_rank
    assert memory_per_gpu(model, resolved).total <= usable
    if resolved.mbs < per_rank:
        assert per_rank % (2 * resolved.mbs) == 0  # powers of two here: the next divisor up is 2 mbs
        bigger = with_micro_batch(plan, 2 * resolved.mbs)
        assert memory_per_gpu(model, bigger).total > usable
    for d in range(resolved.mbs + 1, per_rank + 1):
        if per_rank % d == 0:
            assert memory_per_gpu(model, with_micro_batch(plan, d)).total > usable


def test_resolve_micro_batch_takes_the_whole_batch_when_it_fits():
    plan = _plan("gx=2,gdata=2", 8)
    resolved = resolve_micro_batch(SMALL, plan, FRONTIER_HBM)
    assert (resolved.mbs, resolved.ga) == (4, 1)


def test_resolve_micro_batch_respects_given_mbs_or_ga():
    plan = _plan("gx=2,gz=2,gdata=2", 64)  # 16 sequences per rank
    assert (resolve_micro_batch(SMALL, replace(plan, mbs=4), FRONTIER_HBM).ga) == 4
    assert (resolve_micro_batch(SMALL, replace(plan, ga=8), FRONTIER_HBM).mbs) == 2


def test_resolve_micro_batch_falls_back_to_one_when_nothing_fits():
    resolved = resolve_micro_batch(get_model("GPT-80B"), _plan("gx=8", 64), FRONTIER_HBM)
    assert (resolved.mbs, resolved.ga) == (1, 64)
