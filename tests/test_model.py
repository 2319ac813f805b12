"""Model shapes: parameter counts, Narayanan's FLOP formulas, parsing and the catalog."""

from __future__ import annotations

import re

import pytest

from twin.errors import TwinError
from twin.model import CATALOG, ModelSpec, get_model, parse_model_spec


def hand_param_count(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """GPT block with ffn = 4h: QKV (3h^2 + 3h), attention out (h^2 + h), MLP (4h^2 + 4h, 4h^2 + h),
    two layer norms (4h) = 12h^2 + 13h per layer; token + position embeddings (tied LM head) and
    the final layer norm (2h)."""
    h = hidden
    return layers * (12 * h * h + 13 * h) + vocab * h + seq * h + 2 * h


# ---- parameter counts -----------------------------------------------------------


def test_gpt80b_has_about_80_billion_parameters():
    m = get_model("GPT-80B")
    assert m.params == pytest.approx(80e9, rel=0.05)
    assert m.params == hand_param_count(42, 12288, 50304, 2048)


def _nominal(name: str) -> float | None:
    """'GPT-80B' -> 80e9, '175B' -> 175e9, '1T' -> 1e12; None for names without a size."""
    match = re.fullmatch(r"(?:GPT-)?(\d+)([BT])", name)
    if not match:
        return None
    return float(match.group(1)) * (1e9 if match.group(2) == "B" else 1e12)


@pytest.mark.parametrize("name", [n for n in CATALOG if _nominal(n) is not None])
def test_catalog_model_size_matches_its_name(name):
    m = CATALOG[name]
    assert m.params == pytest.approx(_nominal(name), rel=0.10)
    assert m.params == hand_param_count(m.layers, m.hidden, m.vocab, m.seq)


def test_every_nominal_catalog_entry_is_checked():
    # Guard for the parametrisation above: only the test model and the Llama models (checked against Meta's exact
    # counts below) lack a GPT-style size in their name.
    assert [n for n in CATALOG if _nominal(n) is None] == [*LLAMA_PARAMS, "tiny"]


# The released checkpoints' parameter counts (sum of numel over the Hugging Face safetensors), which the
# architecture must reproduce exactly: SwiGLU (3 matrices), grouped-query attention, RMSNorm, no biases, no
# position table, an untied LM head.
LLAMA_PARAMS = {
    "Llama-2-7B": 6_738_415_616, "Llama-2-13B": 13_015_864_320, "Llama-2-70B": 68_976_648_192,
    "Llama-3.1-8B": 8_030_261_248, "Llama-3.1-70B": 70_553_706_496, "Llama-3.1-405B": 405_853_388_800,
}


@pytest.mark.parametrize("name", LLAMA_PARAMS)
def test_llama_parameter_counts_are_the_released_checkpoints(name):
    assert CATALOG[name].params == LLAMA_PARAMS[name]


def test_llama_linears_have_grouped_kv_and_a_gated_mlp():
    m = get_model("Llama-3.1-70B")  # 64 heads of 128, 8 K/V heads, ffn 28672
    shapes = {name: (k, n) for name, k, n, _ in m.linear_shapes()}
    assert shapes["qkv"] == (8192, 8192 + 2 * 8 * 128)
    assert shapes["mlp_up"] == (8192, 2 * 28672)  # gate and up, one GEMM
    assert shapes["mlp_down"] == (28672, 8192)
    assert (m.biased, m.tied_head, m.learned_positions, m.dropout) == (False, False, False, False)


def test_llama_flop_formula_counts_its_weights_as_narayanan_counts_gpts():
    """6 (model) or 8 (hardware) FLOPs per linear weight and token, attention's 12 (16) s l h, the head's 6 V h: the
    same sums as Narayanan's closed form, which a GPT layer's 12 h^2 weights reproduce."""
    gpt = ModelSpec(name="gpt", layers=4, hidden=3072, heads=24)
    as_llama = ModelSpec(name="x", layers=gpt.layers, hidden=gpt.hidden, heads=gpt.heads, vocab=gpt.vocab,
                         ffn=8 * gpt.hidden // 3, arch="llama")  # SwiGLU at ffn 8h/3 holds 8 h^2, as GPT's MLP
    assert as_llama.linear_weights_per_layer == gpt.linear_weights_per_layer == 12 * gpt.hidden**2
    for formula in ("hardware", "model"):
        assert as_llama.flops_per_step(8, formula) == pytest.approx(gpt.flops_per_step(8, formula), rel=1e-12)
    m = get_model("Llama-3.1-8B")
    tokens = 4 * m.seq
    six_n = 6 * (m.params - m.embedding_params - m.layers * 2 * m.hidden - m.hidden) * tokens  # 6N, N: matmul weights
    attention = 12 * m.layers * m.hidden * m.seq * tokens
    assert m.flops_per_step(4, "model") == pytest.approx(six_n + attention, rel=1e-12)


@pytest.mark.parametrize(
    "name, layers, hidden, heads",
    [
        ("GPT-5B", 24, 4096, 32), ("GPT-10B", 32, 5120, 40), ("GPT-20B", 32, 7168, 56),
        ("GPT-40B", 38, 9216, 72), ("GPT-60B", 56, 9216, 72), ("GPT-80B", 42, 12288, 96),
        ("GPT-160B", 84, 12288, 96), ("GPT-320B", 96, 16384, 128), ("GPT-640B", 192, 16384, 128),
        ("22B", 48, 6144, 48), ("175B", 96, 12288, 96), ("1T", 128, 25600, 160),
    ],
)
def test_catalog_shapes_are_the_published_ones(name, layers, hidden, heads):
    m = get_model(name)
    assert (m.layers, m.hidden, m.heads, m.seq, m.vocab, m.ffn) == (layers, hidden, heads, 2048, 50304, 4 * hidden)


def test_params_per_layer_counts_weights_biases_and_layer_norms():
    m = ModelSpec("t", layers=3, hidden=64, heads=4, seq=32, vocab=100)
    h = 64
    qkv = h * 3 * h + 3 * h
    out = h * h + h
    up = h * 4 * h + 4 * h
    down = 4 * h * h + h
    assert m.params_per_layer == qkv + out + up + down + 4 * h
    assert m.params == 3 * m.params_per_layer + 100 * h + 32 * h + 2 * h


# ---- FLOP formulas ---------------------------------------------------------------


def test_hardware_flops_formula_for_gpt5b():
    m = get_model("GPT-5B")
    B, s, l, h, V = 8, 2048, 24, 4096, 50304
    expected = 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    # By hand: 96*8*2048*24*4096^2 = 6.33319e14, times (1 + 0.083333 + 0.031982) = 1.115316.
    assert expected == pytest.approx(7.0635e14, rel=1e-4)
    assert m.flops_per_step(8, "hardware") == pytest.approx(expected, rel=1e-12)
    assert m.flops_per_step(8) == pytest.approx(expected, rel=1e-12)  # the default is the recompute form


def test_model_flops_formula_for_gpt5b():
    m = get_model("GPT-5B")
    B, s, l, h, V = 8, 2048, 24, 4096, 50304
    expected = 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    # By hand: 72*8*2048*24*4096^2 = 4.74989e14, times (1 + 0.083333 + 0.042643) = 1.125977.
    assert expected == pytest.approx(5.3483e14, rel=1e-4)
    assert m.flops_per_step(8, "model") == pytest.approx(expected, rel=1e-12)


def test_flops_scale_linearly_with_sequences_and_recompute_costs_more():
    m = get_model("GPT-20B")
    assert m.flops_per_step(64) == pytest.approx(8 * m.flops_per_step(8), rel=1e-12)
    assert m.flops_per_step(8, "hardware") > m.flops_per_step(8, "model")


def test_unknown_flops_formula_is_a_twin_error():
    with pytest.raises(TwinError, match="bogus"):
        get_model("tiny").flops_per_step(1, "bogus")


# ---- parse_model_spec ------------------------------------------------------------


def test_parse_model_spec_all_fields():
    m = parse_model_spec("layers=2, hidden=512 ,heads=8,seq=128,vocab=1024,ffn=1536,dtype=fp32", name="mine")
    assert (m.name, m.layers, m.hidden, m.heads, m.seq, m.vocab, m.ffn, m.dtype) == (
        "mine", 2, 512, 8, 128, 1024, 1536, "fp32")
    assert m.dtype_bytes == 4
    assert m.head_dim == 64


def test_parse_model_spec_defaults():
    m = parse_model_spec("layers=4,hidden=256,heads=4")
    assert (m.seq, m.vocab, m.ffn, m.dtype, m.dtype_bytes) == (2048, 50304, 1024, "bf16", 2)


@pytest.mark.parametrize(
    "text, named",
    [
        ("layers=2,hidden=512,heads=8,depth=3", "depth"),  # unknown key
        ("layers=2,hidden=512,heads", "heads"),  # missing '='
        ("layers=2,hidden=,heads=8", "hidden"),  # empty value
        ("layers=two,hidden=512,heads=8", "layers"),  # not an integer
        ("layers=2,hidden=512", "heads"),  # missing required key
        ("hidden=512,heads=8", "layers"),
        ("layers=0,hidden=512,heads=8", "layers"),  # not positive
        ("layers=2,hidden=512,heads=8,vocab=-5", "vocab"),
        ("layers=2,hidden=512,heads=8,dtype=int3", "dtype"),
    ],
)
def test_parse_model_spec_errors_name_the_key(text, named):
    with pytest.raises(TwinError) as err:
        parse_model_spec(text)
    message = str(err.value)
    assert named in message
    assert "\n" not in message


def test_hidden_not_divisible_by_heads():
    with pytest.raises(TwinError, match=r"hidden=500.*heads=8"):
        parse_model_spec("layers=2,hidden=500,heads=8")
    with pytest.raises(TwinError, match="heads"):
        ModelSpec("x", layers=2, hidden=96, heads=7)


# ---- the catalog -----------------------------------------------------------------


def test_get_model_is_case_insensitive():
    assert get_model("gpt-80b") is CATALOG["GPT-80B"]
    assert get_model("1t") is CATALOG["1T"]


def test_get_model_unknown_lists_the_known_names():
    with pytest.raises(TwinError) as err:
        get_model("GPT-7B")
    message = str(err.value)
    assert "GPT-7B" in message
    for name in CATALOG:
        assert name in message


def test_an_untied_gpt_head_is_its_own_table_and_megatrons_h100_counts_say_untied():
    """tied=0 (Megatron's --untie-embeddings-and-output-weights) adds a V x h table; the 7.1B of Megatron-LM's H100
    table (h 4096, 30 layers, V 131,072, s 4,096) is 7.1B untied and 6.6B tied: untied."""
    spec = "layers=30,hidden=4096,heads=32,seq=4096,vocab=131072"
    tied, untied = parse_model_spec(spec), parse_model_spec(spec + ",tied=0")
    assert tied.tied_head and not untied.tied_head
    assert untied.params - tied.params == 131072 * 4096
    assert (round(untied.params / 1e9, 1), round(tied.params / 1e9, 1)) == (7.1, 6.6)
    assert parse_model_spec("layers=2,hidden=64,heads=4,arch=llama").tied_head is False
    assert parse_model_spec("layers=2,hidden=64,heads=4,arch=llama,tied=1").tied_head is True


def test_runs_files_say_tied_per_row_or_once_for_all(tmp_path):
    """A runs CSV's `tied` column, else `--assume tied=..`, else the arch's default; a bad value names the row."""
    from twin.runs import load_runs

    runs = tmp_path / "runs.csv"
    runs.write_text("gpus,global_batch,layers,hidden,heads,seq,plan,step_time_s,tied\n"
                    "2,4,2,256,4,128,\"tp=2\",1.0,0\n2,4,2,256,4,128,\"tp=2\",1.0,\n")
    untied, default = load_runs(str(runs))
    assert not untied.model.tied_head and default.model.tied_head
    assert not any(r.model.tied_head for r in load_runs(str(runs), "tied=0"))
    runs.write_text("gpus,global_batch,layers,hidden,heads,seq,plan,step_time_s,tied\n2,4,2,256,4,128,tp=2,1.0,yes\n")
    with pytest.raises(TwinError, match="line 2.*tied='yes' must be 0 or 1"):
        load_runs(str(runs))
