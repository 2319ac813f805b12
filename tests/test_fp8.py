"""fp8=1: the layers' linears in FP8 as Transformer Engine runs them with current scaling (twin.builders.linears,
twin.sim.compute, twin.memory): the quantisations' traffic, the GEMMs' dtype and rate, the halved gathers, the
weights' copies and the smaller saved inputs, and the refusals where no FP8 rate is known."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from helpers import REPO, check_search_bounds_and_ranking
from topologies import load_machine
from topologies.overrides import parse_override
from twin.build import build_step
from twin.errors import TwinError
from twin.ir import FP8, Collective, Elementwise, Gemm
from twin.ir_io import save_schedule
from twin.memory import layer_activation_bytes, stage_memory
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan
from twin.search.space import SearchSpace
from twin.sim.compute import ComputeModel

MODEL = parse_model_spec("layers=2,hidden=1024,heads=16,kv_heads=4,ffn=2816,seq=512,vocab=4096,arch=llama")
TP = 4
BASE = f"tp={TP},dp=2,sp=1,mbs=1,recompute=none"
# Bytes a quantisation moves per element: current scaling reads the tensor for its amax, then again for the cast,
# which writes the row-wise and the transposed FP8 copies; delayed scaling casts alone (its scale is known).
QUANTIZE_BYTES = {"current": 2 + 2 + 1 + 1, "delayed": 2 + 1 + 1}


@pytest.fixture(scope="module")
def h100():
    return load_machine("mpt-h100-80g")


def plan(fp8: bool, extra: str = "") -> ParallelPlan:
    return parse_plan(f"{BASE},fp8={int(fp8)}{extra}", ParallelPlan(global_batch=4))


def layer_ops(h100, fp8: bool, extra: str = "") -> list:
    """Micro-batch 0's ops of layer 0 on rank 0's program."""
    program = build_step(MODEL, plan(fp8, extra), h100, 2 * TP).schedule.programs[0]
    return [op for op in program.ops if op.tag.micro_batch == 0 and op.tag.layer == 0]


def test_fp8_round_trips_and_defaults_off():
    p = plan(True)
    assert p.fp8 and "fp8=1" in p.describe() and "fp8recipe" not in p.describe()
    assert parse_plan(p.describe(), ParallelPlan(global_batch=4)) == p
    assert not plan(False).fp8 and "fp8" not in plan(False).describe()
    delayed = plan(True, ",fp8recipe=delayed")
    assert "fp8recipe=delayed" in delayed.describe()
    assert parse_plan(delayed.describe(), ParallelPlan(global_batch=4)) == delayed
    with pytest.raises(TwinError, match="fp8recipe=delayed .* needs fp8=1"):
        validate_plan(plan(False, ",fp8recipe=delayed"), MODEL, 2 * TP)
    with pytest.raises(TwinError, match="fp8recipe='late' is unknown; use one of current, delayed"):
        plan(True, ",fp8recipe=late")


def test_every_linear_of_a_layer_runs_its_three_gemms_in_fp8_and_the_lm_head_does_not(h100):
    program = build_step(MODEL, plan(True), h100, 2 * TP).schedule.programs[0]
    gemms = [op for op in program.ops if isinstance(op.work, Gemm) and op.tag.block in
             ("qkv", "attn_out", "mlp_up", "mlp_down", "lm_head")]
    layer = [op for op in gemms if op.tag.layer is not None]
    assert {op.work.dtype for op in layer} == {FP8}
    assert {(op.tag.block, op.tag.role) for op in layer if op.tag.micro_batch == 0 and op.tag.layer == 0} == {
        (b, r) for b in ("qkv", "attn_out", "mlp_up", "mlp_down") for r in ("gemm", "dI", "dW")}
    assert {op.work.dtype for op in gemms if op.tag.block == "lm_head"} == {MODEL.dtype}


@pytest.mark.parametrize("recipe", ["current", "delayed"])
def test_each_linear_quantises_its_own_rows_of_input_and_output_gradient(h100, recipe):
    """Under sequence parallelism a column-parallel linear's input (and a row-parallel one's output gradient) is
    quantised on the rank's 1/tp of the tokens, before the gather; the others on the whole local tensor; each
    element moving the recipe's bytes."""
    tokens, h, per_element = MODEL.seq, MODEL.hidden, QUANTIZE_BYTES[recipe]
    q = {(op.tag.block, op.tag.role): op.work for op in layer_ops(h100, True, f",fp8recipe={recipe}")
         if op.tag.role.startswith("fp8_")}
    expected = {  # elements: (input, output gradient) of each linear on one rank
        "qkv": (tokens * h / TP, tokens * (h + 2 * MODEL.kv_heads * MODEL.head_dim) / TP),
        "attn_out": (tokens * h / TP, tokens * h / TP),
        "mlp_up": (tokens * h / TP, tokens * 2 * MODEL.ffn / TP),
        "mlp_down": (tokens * MODEL.ffn / TP, tokens * h / TP),
    }
    assert set(q) == {(b, r) for b in expected for r in ("fp8_in", "fp8_grad")}
    for block, (inputs, grads) in expected.items():
        assert isinstance(q[block, "fp8_in"], Elementwise)
        assert q[block, "fp8_in"].nbytes == pytest.approx(per_element * inputs)
        assert q[block, "fp8_grad"].nbytes == pytest.approx(per_element * grads)
    assert not any(op.tag.role.startswith("fp8_") for op in layer_ops(h100, False))


@pytest.mark.parametrize("tpo", [0, 1])
def test_current_scaling_reduces_the_amax_of_what_sequence_parallelism_gathers(h100, tpo):
    """Transformer Engine's current scaling all-reduces (MAX) the amax of a column-parallel linear's input and a
    row-parallel linear's output gradient over the tensor-parallel ranks, whose FP8 gather needs one scale: one
    fp32 over x per such quantisation, before the gather; delayed scaling and plans without sp reduce none."""
    def amaxes(extra):
        return {(op.tag.block, op.tag.phase): op.work for op in layer_ops(h100, True, extra)
                if op.tag.role == "amax_x"}
    reduced = amaxes(f",tpo={tpo}")
    assert set(reduced) == {("qkv", "fwd"), ("mlp_up", "fwd"), ("attn_out", "bwd"), ("mlp_down", "bwd")}
    for work in reduced.values():
        assert (work.kind, work.group, work.nbytes, work.dtype) == ("all_reduce", "x", 4, "fp32")
    assert amaxes(",fp8recipe=delayed") == {}
    without_sp = parse_plan(BASE.replace("sp=1", "sp=0") + ",fp8=1", ParallelPlan(global_batch=4))
    program = build_step(MODEL, without_sp, h100, 2 * TP).schedule.programs[0]
    assert not any(op.tag.role == "amax_x" for op in program.ops)


@pytest.mark.parametrize("tpo", [0, 1])
def test_sequence_parallel_gathers_move_one_byte_per_element(h100, tpo):
    def gathers(fp8):
        return {(op.tag.block, op.tag.role, op.tag.phase): op.work for op in layer_ops(h100, fp8, f",tpo={tpo}")
                if isinstance(op.work, Collective) and op.tag.role in ("ag_x", "ag_in_x")}
    bf16, fp8 = gathers(False), gathers(True)
    assert bf16.keys() == fp8.keys() and len(bf16) >= 6
    for key, work in fp8.items():
        assert work.nbytes == bf16[key].nbytes / MODEL.dtype_bytes and work.dtype == FP8
    reductions = [op.work for op in layer_ops(h100, True) if isinstance(op.work, Collective)
                  and op.tag.role in ("rs_x", "ar_x")]
    assert reductions and {w.dtype for w in reductions} == {MODEL.dtype}


def test_the_weights_are_quantised_once_a_step(h100):
    program = build_step(MODEL, plan(True), h100, 2 * TP).schedule.programs[0]
    casts = [op.work for op in program.ops if op.tag.role == "fp8_weights"]
    per_layer = sum(k * n for _, k, n, _ in MODEL.linear_shapes())
    assert len(casts) == 1
    assert casts[0].nbytes == pytest.approx(QUANTIZE_BYTES["current"] * MODEL.layers * per_layer / TP)


@pytest.mark.parametrize("odp", [0, 1])
def test_fp8_param_gather_quantises_the_shard_gathers_in_fp8_and_transposes_after(h100, odp):
    """fp8pg=1 (--fp8-param-gather) under ZeRO-1 over dp=2: the shard (half the linears' weights) quantised from
    the fp32 master weights (an amax read of 4 bytes, a cast reading 4 and writing 1), the four weights' amaxes a
    layer all-reduced over data, each layer's bucket gathered with its linear weights in FP8 (its norms in bf16),
    then each gathered layer's transposed copy made (1 byte read, 1 written) after its gather: at the step's end,
    or with odp under the next forward, before the layer's first use."""
    per_layer = MODEL.linear_weights_per_layer
    gathered = build_step(MODEL, plan(True, f",zero=1,odp={odp},fp8pg=1"), h100, 2 * TP).schedule.programs[0]
    ops = gathered.ops
    casts = [op.work for op in ops if op.tag.role == "fp8_weights"]
    assert len(casts) == 1 and casts[0].nbytes == pytest.approx((4 + 4 + 1) * MODEL.layers * per_layer / TP / 2)
    amax = [op.work for op in ops if op.tag.role == "fp8_amax"]
    assert [(w.kind, w.group, w.nbytes, w.dtype) for w in amax] == [("all_reduce", "data", 4 * 4 * MODEL.layers,
                                                                     "fp32")]
    layer_gathers = {op.tag.layer: op for op in ops if op.tag.role == "ag_data" and op.tag.block == "layer"}
    assert set(layer_gathers) == set(range(MODEL.layers))
    for op in layer_gathers.values():
        norms = MODEL.params_per_layer - per_layer
        assert op.work.nbytes == pytest.approx((1 * per_layer + MODEL.dtype_bytes * norms) / TP)
        assert op.work.dtype == FP8
    embed = next(op for op in ops if op.tag.role == "ag_data" and op.tag.block == "embed")
    assert embed.work.dtype == MODEL.dtype  # not an FP8 linear
    transposes = {op.tag.layer: op for op in ops if op.tag.role == "fp8_transpose"}
    assert set(transposes) == set(range(MODEL.layers))
    for layer, op in transposes.items():
        assert op.work.nbytes == pytest.approx(2 * per_layer / TP)
        assert layer_gathers[layer].id in op.deps  # waits for its layer's gather
    plain = build_step(MODEL, plan(True, f",zero=1,odp={odp}"), h100, 2 * TP).schedule.programs[0]
    assert not any(op.tag.role in ("fp8_transpose", "fp8_amax") for op in plain.ops)


def test_fp8_param_gather_keeps_no_bf16_weights_and_needs_fp8_and_zero(h100):
    """The FP8 weights are the weights: the model state loses the 2 bytes a weight that fp8=1 adds beside bf16."""
    with_copies = stage_memory(MODEL, plan(True, ",zero=1"), 0).model_state
    fp8_only = stage_memory(MODEL, plan(True, ",zero=1,fp8pg=1"), 0).model_state
    assert with_copies - fp8_only == pytest.approx(2 * MODEL.layers * MODEL.linear_weights_per_layer / TP)
    assert stage_memory(MODEL, plan(False, ",zero=1"), 0).model_state == pytest.approx(fp8_only)
    for bad in (plan(False, ",zero=1,fp8pg=1"), plan(True, ",fp8pg=1")):
        with pytest.raises(TwinError, match="fp8pg=1 .* needs fp8=1 and zero=1 or 2"):
            validate_plan(bad, MODEL, 2 * TP)
    assert "fp8=1,fp8pg=1" in plan(True, ",zero=1,fp8pg=1").describe()


def test_an_fp8_gemm_runs_at_the_fp8_rate_where_it_was_measured_and_its_short_k_costs_more(h100):
    compute, dev = ComputeModel(h100.device), h100.device
    d = 8192
    big = Gemm(d, d, d, "NT", FP8)
    assert compute.duration_s(big) == pytest.approx(big.flops / dev.empirical_gemm_fp8_flop_per_s
                                                    + dev.kernel_overhead_s)
    short, short16 = Gemm(d, d, 256, "NT", FP8), Gemm(d, d, 256, "NT", "bf16")
    # each relative to its dtype's rate where that was measured: the FP8 one is 1 at 8192^3
    eff8, eff16 = compute.gemm_efficiency(short), compute.gemm_efficiency(short16)
    assert eff8 < eff16 / compute.gemm_efficiency(Gemm(d, d, d, "NT", "bf16"))
    assert compute.gemm_memory_s(big) < compute.gemm_memory_s(Gemm(d, d, d, "NT", "bf16"))


def test_memory_adds_the_weight_copies_and_shrinks_the_saved_inputs():
    p8, p16 = plan(True), plan(False)
    tokens, h, f = MODEL.seq, MODEL.hidden, MODEL.ffn
    saved = layer_activation_bytes(MODEL, p16, tokens) - layer_activation_bytes(MODEL, p8, tokens)
    # the normed inputs of the QKV and the MLP and the down projection's input kept as 1-byte copies instead; the
    # attention's output gains a 1-byte copy beside the bf16 one its backward keeps
    assert saved == pytest.approx((MODEL.dtype_bytes - 1) * tokens * (2 * h / TP + f / TP) - tokens * h / TP)
    copies = stage_memory(MODEL, p8, 0).model_state - stage_memory(MODEL, p16, 0).model_state
    assert copies == pytest.approx(2 * MODEL.layers * sum(k * n for _, k, n, _ in MODEL.linear_shapes()) / TP)


def test_fp8_is_faster_but_not_by_more_than_its_gemm_rate(h100):
    big = parse_model_spec("layers=4,hidden=4096,heads=32,kv_heads=8,seq=2048,vocab=32000,arch=llama")
    p = parse_plan("tp=8,sp=1,tpo=1,mbs=1,recompute=none", ParallelPlan(global_batch=8))
    t16 = simulate_step(big, p, h100, 8).step_time_s
    t8 = simulate_step(big, replace(p, fp8=True), h100, 8).step_time_s
    dev = h100.device
    assert t16 * dev.empirical_gemm_flop_per_s / dev.empirical_gemm_fp8_flop_per_s < t8 < t16


def test_a_machine_without_an_fp8_rate_refuses_the_plan(frontier):
    with pytest.raises(TwinError, match="fp8=1 needs the device's FP8 GEMM rate, which frontier's file does not give"):
        build_step(MODEL, plan(True), frontier, 2 * TP)


def test_a_machine_file_with_one_fp8_key_names_the_other(tmp_path):
    text = (REPO / "topologies" / "mpt-h100-80g.toml").read_text()
    lines = [line for line in text.split("\n") if not line.startswith("peak_fp8_tflop_per_s")]
    path = tmp_path / "half.toml"
    path.write_text("\n".join(lines))
    with pytest.raises(TwinError, match="peak_fp8_tflop_per_s.*missing; give both"):
        load_machine(str(path))


def test_the_executor_refuses_an_fp8_schedule_in_one_line(h100, tmp_path):
    path = tmp_path / "fp8.json"
    save_schedule(build_step(MODEL, plan(True), h100, 2 * TP).schedule, str(path))
    done = subprocess.run([sys.executable, "-m", "twin.cli", "run", str(path)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 2 and "fp8=1" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert Path(path).exists()


def test_the_search_tries_fp8_with_bounds_below_each_step_and_an_exact_ranking(h100):
    """--fp8 0,1: every plan in both precisions once; the screening and the full bound stay below each simulated
    step (FP8 GEMMs are timed by the same compute model in both), and branch and bound ranks as simulating every
    plan does; a machine without an FP8 rate is refused before the search starts."""
    model = parse_model_spec("layers=4,hidden=1024,heads=16,kv_heads=4,seq=1024,vocab=4096,arch=llama")
    space = SearchSpace(axes=("gx", "gdata", "pp"), zero=(0, 1), sp=(False, True), tpo=(False, True),
                        recompute=("none", "full"), fp8=(False, True))
    plans, _, _ = check_search_bounds_and_ranking(model, h100, 8, 16, space, top=6)
    assert len({p.describe() for p in plans}) == len(plans)
    assert {p.fp8 for p in plans} == {False, True}
    assert {replace(p, fp8=False) for p in plans if p.fp8} == {p for p in plans if not p.fp8}
    assert "fp8 0,1" in space.describe()
    done = subprocess.run([sys.executable, "-m", "twin.cli", "search", "--machine", "frontier", "--model", "GPT-5B",
                           "--gpus", "8", "--fp8", "0,1", "--no-cache"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 2 and "--fp8 1 needs the device's FP8 GEMM rate, which frontier's file" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_fp8_gemm_never_runs_above_the_fp8_peak(h100):
    """A GEMM larger than the one the FP8 rate was measured on runs a little faster, up to the FP8 peak: with the
    k loop's cost set absurdly high (so the reference shape is slow), a long-k GEMM is capped there."""
    dev = h100.device
    big = Gemm(16384, 16384, 16384, "NT", FP8)
    assert 1 < ComputeModel(dev).gemm_efficiency(big) < dev.peak_fp8_flop_per_s / dev.empirical_gemm_fp8_flop_per_s
    slow_k = load_machine("mpt-h100-80g", (parse_override("device.gemm_k_half=4096"),)).device
    huge_k = Gemm(8192, 8192, 1 << 20, "NT", FP8)
    assert ComputeModel(slow_k).gemm_efficiency(huge_k) == pytest.approx(
        slow_k.peak_fp8_flop_per_s / slow_k.empirical_gemm_fp8_flop_per_s)
