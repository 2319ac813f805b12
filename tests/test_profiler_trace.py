"""twin compare-trace: a profiler trace of a real run, classed per op class and step, beside the twin's step."""

from __future__ import annotations

import gzip
import json

import pytest

from test_cli import assert_user_error, run
from twin.errors import TwinError
from twin.profiler_trace import kernel_class, load_profiled_run
from twin.trace_comparison import compare_trace

# (name, category, class) as real traces name them: rocBLAS/Tensile, cuBLAS, CUTLASS, flash attention, NCCL, RCCL,
# PyTorch's own kernels
NAMES = [
    ("Cijk_Alik_Bljk_BBS_BH_MT256x128x64_MI32x32x8x1_SN_1LDSB0_GRVW8", "kernel", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_nn", "kernel", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1", "kernel", "gemm"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNT", "kernel", "gemm"),
    ("ck_tile::FmhaFwdKernel<ck_tile::BlockFmhaPipelineQRKSVSAsync<...>>", "kernel", "attention"),
    ("_attn_fwd", "kernel", "attention"),
    ("void cuApplyLayerNorm<c10::BFloat16, float, c10::BFloat16>", "kernel", "elementwise"),
    ("scaled_upper_triang_masked_softmax_warp_forward<__nv_bfloat16>", "kernel", "elementwise"),
    ("void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align8>", "kernel", "gemm"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>", "kernel", "attention"),
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "kernel", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k128_sm80", "kernel", "attention"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "all_gather"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_bf16", "kernel", "reduce_scatter"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "kernel", "all_reduce"),
    ("ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "p2p"),
    ("ncclDevKernel_Generic_4", "kernel", "collectives"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "kernel", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>", "kernel", "elementwise"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", "kernel", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "gpu_memcpy", "elementwise"),  # streams HBM like any element-wise kernel
    ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "memcpy"),
    ("Memcpy PtoP (Device -> Device)", "gpu_memcpy", "memcpy"),
    ("Memset (Device)", "gpu_memset", "memset"),
]


@pytest.mark.parametrize("name, category, cls", NAMES)
def test_kernels_are_classed_by_name(name, category, cls):
    assert kernel_class(name, category) == cls


def kernel(name: str, ts: float, dur: float, cat: str = "kernel", device: int = 0, stream: int = 7) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": device, "tid": stream,
            "args": {"device": device, "stream": stream}}


def step_annotation(n: int, ts: float, dur: float, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 0,
            "tid": stream}


def two_step_trace() -> dict:
    """Two 10 ms steps (us in the trace), each: 4 ms of GEMMs, 1 ms attention, 2 ms of all-gather on another
    stream, 0.5 ms element-wise, a 0.1 ms memcpy; a kernel before the first step is not counted."""
    events = [kernel("Cijk_Ailk_Bljk_warmup", 0, 500.0)]  # before the first step
    for i, t0 in enumerate((1000.0, 11000.0)):
        events += [step_annotation(i + 1, t0, 10000.0), step_annotation(i + 1, t0 + 5, 9990.0, stream=20)]
        events += [kernel("Cijk_Ailk_Bljk_BBS_BH_MT128x128x32", t0 + 100, 2000.0),
                   kernel("ampere_bf16_s16816gemm_bf16_128x64", t0 + 2200, 2000.0),
                   kernel("flash_fwd_kernel", t0 + 4300, 1000.0),
                   kernel("ncclDevKernel_AllGather_RING_LL", t0 + 100, 2000.0, stream=20),
                   kernel("vectorized_elementwise_kernel", t0 + 5400, 500.0),
                   kernel("Memcpy HtoD", t0 + 6000, 100.0, cat="gpu_memcpy"),
                   {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t0, "dur": 50.0, "pid": 1, "tid": 1}]
    return {"traceEvents": events}


def write(tmp_path, doc, name="trace.json"):
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            json.dump(doc, f)
    else:
        path.write_text(json.dumps(doc))
    return str(path)


def test_steps_from_annotations_and_per_step_sums(tmp_path):
    r = load_profiled_run(write(tmp_path, two_step_trace()))
    assert r.steps_from == "annotations" and r.steps_s == pytest.approx((0.01, 0.01)) and r.step_s == pytest.approx(0.01)
    want = {"gemm": (2, 0.004), "attention": (1, 0.001), "all_gather": (1, 0.002), "elementwise": (1, 0.0005),
            "memcpy": (1, 0.0001)}
    assert set(r.by_class) == set(want)
    for cls, (kernels, seconds) in want.items():
        assert r.by_class[cls].kernels_per_step == kernels
        assert r.by_class[cls].seconds_per_step == pytest.approx(seconds)


def test_steps_given_divide_the_kernel_window(tmp_path):
    doc = two_step_trace()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] != "gpu_user_annotation"]
    r = load_profiled_run(write(tmp_path, doc, "trace.json.gz"), steps=2)
    assert r.steps_from == "--steps"
    assert r.steps_s == pytest.approx(((11000 + 6100 - 0) / 2 * 1e-6,) * 2)  # first kernel 0, last end 17,100 us
    assert r.by_class["gemm"].seconds_per_step == pytest.approx((0.0005 + 2 * 0.004) / 2)  # the warm-up counts too


@pytest.mark.parametrize("doc, kwargs, mentions", [
    ({"traceEvents": [kernel("gemm", 0, 1)]}, {}, "--steps K"),
    ({"traceEvents": [kernel("gemm", 0, 1)]}, {"steps": 0}, "--steps 0"),
    ({"traceEvents": []}, {"steps": 1}, "no GPU kernels"),
    ({"nothing": 1}, {}, "no traceEvents"),
    ({"traceEvents": [kernel("gemm", 0, 1, device=1)]}, {"steps": 1, "device": "0"}, "--device 0"),
    ({"traceEvents": [kernel("gemm", 5, 0)]}, {"steps": 1}, "lasts no time"),
    ({"traceEvents": [kernel("gemm", 0, -5)]}, {"steps": 1}, "no GPU kernels"),  # a negative span is no span
])
def test_bad_traces_say_why(tmp_path, doc, kwargs, mentions):
    with pytest.raises(TwinError, match=mentions.replace("-", "\\-")):
        load_profiled_run(write(tmp_path, doc), **kwargs)


def test_unreadable_files_say_why(tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TwinError, match="not a JSON trace"):
        load_profiled_run(str(tmp_path / "bad.json"))
    with pytest.raises(TwinError, match="cannot read"):
        load_profiled_run(str(tmp_path / "missing.json"))


def test_a_device_is_picked_when_the_trace_has_several(tmp_path):
    doc = {"traceEvents": [kernel("gemm_a", 0, 1000.0, device=0), kernel("gemm_b", 0, 3000.0, device=1)]}
    path = write(tmp_path, doc)
    assert load_profiled_run(path, steps=1).by_class["gemm"].seconds_per_step == pytest.approx(0.001)
    assert load_profiled_run(path, steps=1, device="1").by_class["gemm"].seconds_per_step == pytest.approx(0.003)


def test_rows_pair_the_classes(tmp_path):
    r = load_profiled_run(write(tmp_path, two_step_trace()))
    twin = {"gemm": 0.003, "attention": 0.001, "all_gather": 0.001, "elementwise": 0.001, "send": 0.0002, "recv": 0.0003}
    c = compare_trace(twin, 0.008, r)
    rows = {row.op_class: row for row in c.rows}
    assert rows["gemm"].error == pytest.approx(-0.25)
    assert rows["memcpy"].twin_s is None and rows["memcpy"].error is None  # not modelled
    assert rows["p2p"].twin_s == pytest.approx(0.0005) and rows["p2p"].error is None  # nothing measured
    assert c.step_error == pytest.approx(-0.2)


def test_collectives_of_unknown_kind_merge_every_collective_row(tmp_path):
    doc = {"traceEvents": [kernel("ncclDevKernel_Generic", 0, 1000.0), kernel("ncclDevKernel_AllReduce_Sum", 0, 500.0),
                           kernel("Cijk_x", 0, 2000.0)]}
    c = compare_trace({"all_reduce": 0.001, "all_gather": 0.0005, "gemm": 0.002}, 0.003,
                      load_profiled_run(write(tmp_path, doc), steps=1))
    rows = {row.op_class: row for row in c.rows}
    assert set(rows) == {"collectives", "gemm"}
    assert rows["collectives"].twin_s == pytest.approx(0.0015) and rows["collectives"].measured_s == pytest.approx(0.0015)
    assert rows["collectives"].kernels_per_step == 2


def test_the_command_prints_and_says_why_it_cannot(capsys, tmp_path):
    path = write(tmp_path, two_step_trace())
    step = ["--machine", "frontier", "--model-spec", "layers=2,hidden=512,heads=8,seq=128,vocab=1024", "--gpus", "8",
            "--plan", "gx=2,gz=4", "--global-batch", "8"]
    rc, out, _ = run(capsys, "compare-trace", path, *step, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["step"]["measured_s"] == pytest.approx(0.01) and doc["steps_from"] == "annotations"
    classes = {r["op_class"] for r in doc["by_class"]}
    assert {"gemm", "attention", "all_gather", "memcpy", "elementwise"} <= classes
    rc, out, _ = run(capsys, "compare-trace", path, *step, "--set", "device.hbm_efficiency=0.5")
    assert rc == 0 and "not modelled" in out and "step time" in out
    assert "machine file overridden: device.hbm_efficiency=0.5" in out
    figure = tmp_path / "classes.png"
    rc, out, _ = run(capsys, "compare-trace", path, *step, "--figure", str(figure))
    assert rc == 0 and figure.stat().st_size > 0 and f"figure written to {figure}" in out
    assert_user_error(*run(capsys, "compare-trace", path, *step, "--figure", str(tmp_path / "x.gif")), "--figure")
    assert_user_error(*run(capsys, "compare-trace", str(tmp_path / "none.json"), *step), "cannot read")
    assert_user_error(*run(capsys, "compare-trace", path, "--machine", "frontier"), "--gpus", "--plan")


def test_the_twin_side_can_be_an_exported_schedule(capsys, tmp_path):
    schedule = str(tmp_path / "step.json")
    rc, _, _ = run(capsys, "export", "--machine", "frontier", "--model", "tiny", "--gpus", "4", "--plan", "gx=2,gz=2",
                   "--global-batch", "8", "-o", schedule)
    assert rc == 0
    trace = write(tmp_path, two_step_trace())
    rc, out, _ = run(capsys, "compare-trace", trace, "--schedule", schedule, "--machine", "frontier", "--json")
    doc = json.loads(out)
    assert rc == 0 and "gx=2,gy=1,gz=2" in doc["twin_side"] and doc["step"]["twin_s"] > 0
    assert_user_error(*run(capsys, "compare-trace", trace, "--schedule", schedule), "--machine")


@pytest.mark.parametrize("extra, mentions", [(["--profile-steps", "-1"], "--profile-steps"),
                                             (["--profile-steps", "1", "--check-numerics"], "--check-numerics")])
def test_run_refuses_bad_profile_requests(capsys, tmp_path, extra, mentions):
    pytest.importorskip("torch")
    schedule = str(tmp_path / "step.json")
    run(capsys, "export", "--machine", "local", "--model", "tiny", "--gpus", "2", "--plan", "gx=2", "--global-batch",
        "8", "-o", schedule)
    assert_user_error(*run(capsys, "run", schedule, *extra), mentions)


def test_the_twin_side_is_the_traces_rank(capsys, tmp_path):
    """Kineto names the rank it traced (distributedInfo); --rank overrides it; without either, the critical rank."""
    doc = two_step_trace()
    doc["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 8}
    named = write(tmp_path, doc, "named.json")
    plain = write(tmp_path, two_step_trace(), "plain.json")
    step = ["--machine", "frontier", "--model-spec", "layers=4,hidden=512,heads=8,seq=128,vocab=1024", "--gpus", "8",
            "--plan", "gx=2,pp=2,gdata=2,mbs=1", "--global-batch", "16"]
    sides = {}
    for key, args in (("named", [named]), ("override", [named, "--rank", "7"]), ("plain", [plain])):
        rc, out, err = run(capsys, "compare-trace", *args, *step, "--json")
        assert rc == 0, err
        doc_out = json.loads(out)
        sides[key] = (doc_out["twin_side"].split(" of ")[0], doc_out["trace_rank"])
    assert sides == {"named": ("rank 1", 1), "override": ("rank 7", 1), "plain": ("the critical rank", None)}
    assert_user_error(*run(capsys, "compare-trace", plain, *step, "--rank", "8"), "--rank 8", "0..7")


def test_cpu_side_step_marks_when_the_gpu_has_none(tmp_path):
    """Steps marked only on the CPU: a step's kernels run from its CPU start to the next one's, the last step's
    until the last kernel ends (the GPU lags the CPU)."""
    cpu = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": t, "dur": d, "pid": 1, "tid": 1}
           for n, t, d in ((1, 0.0, 9500.0), (2, 10000.0, 9000.0))]
    kernels = [kernel("Cijk_a", 2000.0, 3000.0), kernel("Cijk_b", 6000.0, 3000.0),  # step 1
               kernel("Cijk_c", 12000.0, 3000.0), kernel("Cijk_d", 16000.0, 6000.0)]  # step 2, ends at 22 ms
    r = load_profiled_run(write(tmp_path, {"traceEvents": cpu + kernels}))
    assert r.steps_from == "CPU annotations"
    assert r.steps_s == pytest.approx((0.010, 0.012)) and r.step_s == pytest.approx(0.011)
    assert r.by_class["gemm"].seconds_per_step == pytest.approx(0.0075)
