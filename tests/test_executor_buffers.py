"""The executor's buffers: one arena per role at its largest op's size, element-wise work in bounded passes, and
the launcher's estimate of what a rank allocates (executor.kernels, executor.launch.buffer_bytes)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from executor import kernels  # noqa: E402
from executor.cli import _machine_for_peaks  # noqa: E402
from executor.launch import buffer_bytes  # noqa: E402
from twin.ir import Collective, Elementwise, Gemm, Op  # noqa: E402
from twin.ir_io import load_schedule  # noqa: E402
from twin.report import Summary, format_summary  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
H200_STEP = REPO / "benchmarks" / "results" / "2026-12-04-nvidia-h200" / "step-1gpu.json"


def op(i: int, work, stream: str = "compute") -> Op:
    return Op(id=i, name=f"op{i}", stream=stream, work=work)


def reserved(ops: list[Op], dtype=torch.float32) -> kernels.Buffers:
    bufs = kernels.Buffers(torch.device("cpu"), dtype, seed=0)
    for o in ops:
        bufs.reserve(kernels.op_requests(o, dtype, 2))
    return bufs


def test_gemms_of_different_shapes_share_one_arena_per_operand_at_the_largest_size():
    small, large = Gemm(m=8, n=4, k=16, layout="NT"), Gemm(m=32, n=8, k=4, layout="NN")
    bufs = reserved([op(0, small), op(1, large)])
    a1, b1, c1 = kernels.gemm_operands(small, "NT", bufs)
    a2, b2, c2 = kernels.gemm_operands(large, "NN", bufs)
    assert (a1.shape, b1.shape, c1.shape) == ((8, 16), (16, 4), (8, 4))  # B stored (n, k), seen transposed
    assert (a2.shape, b2.shape, c2.shape) == ((32, 4), (4, 8), (32, 8))
    assert a1.data_ptr() == a2.data_ptr() and c1.data_ptr() == c2.data_ptr()
    largest = 32 * 4 + 16 * 4 + 32 * 8  # A of the large one (= small's 128), B of the small one, C of the large one
    assert bufs.nbytes == 4 * largest
    assert float(a2.std()) > 0.5 and float(b1.std()) > 0.5 and not c2.any()  # inputs random, outputs zero


def test_an_unreserved_larger_request_still_gets_its_size():
    bufs = kernels.Buffers(torch.device("cpu"), torch.float32)
    first = bufs.get(kernels.Request(("x",), (4,)))
    second = bufs.get(kernels.Request(("x",), (2, 8)))
    assert first.shape == (4,) and second.shape == (2, 8) and bufs.nbytes == 4 * (4 + 16)


def test_a_large_elementwise_op_copies_through_bounded_buffers_in_passes(monkeypatch):
    monkeypatch.setattr(kernels, "EW_CHUNK_BYTES", 64)  # 16 float32 elements a side per pass
    work = Elementwise(nbytes=2 * 4 * 40, flops=0.0)  # 40 elements read and 40 written
    bufs = reserved([op(0, work)])
    fn = kernels.elementwise_fn(work, bufs)
    assert bufs.nbytes == 2 * 4 * 16
    copied = []
    original = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: (copied.append(src.numel()), original(self, src))[1])
    fn()
    assert copied == [16, 16, 8]  # two whole passes and the rest: the op's 40 elements


def test_an_elementwise_op_of_several_kernels_copies_its_elements_in_that_many_launches(monkeypatch):
    work = Elementwise(nbytes=2 * 4 * 10, flops=0.0, kernels=3)  # e.g. a list all-gather's copy-out loop
    bufs = reserved([op(0, work)])
    fn = kernels.elementwise_fn(work, bufs)
    copied = []
    original = torch.Tensor.copy_
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: (copied.append(src.numel()), original(self, src))[1])
    fn()
    src, dst = (bufs.get(r) for r in kernels.elementwise_requests(work, torch.float32)[0])
    assert len(copied) == 3 and sum(copied) == 10 and torch.equal(src, dst)


def test_a_small_elementwise_op_is_one_copy_of_its_own_size():
    work = Elementwise(nbytes=2 * 4 * 10, flops=0.0)
    bufs = reserved([op(0, work), op(1, Elementwise(nbytes=2 * 4 * 30, flops=0.0))])
    kernels.elementwise_fn(work, bufs)()
    src, dst = (bufs.get(r) for r in kernels.elementwise_requests(work, torch.float32)[0])
    assert src.numel() == 10 and torch.equal(src, dst) and bufs.nbytes == 2 * 4 * 30


def test_collectives_share_arenas_per_stream_not_across_streams():
    ar = [op(0, Collective(kind="all_reduce", group="tp", nbytes=4 * 6), "comm:tp"),
          op(1, Collective(kind="all_reduce", group="tp", nbytes=4 * 10), "comm:tp"),
          op(2, Collective(kind="all_reduce", group="dp", nbytes=4 * 8), "comm:dp")]
    roles = {}
    for o in ar:
        for r in kernels.op_requests(o, torch.float32, 2):
            roles[r.role] = max(roles.get(r.role, 0), r.numel)
    assert roles == {("comm", "comm:tp", "ar.out"): 10, ("comm", "comm:dp", "ar.out"): 8}


def test_the_h200_hidden_4096_step_needs_a_few_gb_of_buffers_not_67():
    """One tensor per role and shape held every element-wise size of this one-GPU step at once (67 GB, 17 G
    random elements drawn on one CPU thread: over a minute at 200 M a second); the twin puts the whole step at
    20.3 GB."""
    need = buffer_bytes(load_schedule(str(H200_STEP)), "bfloat16")
    assert 2e9 < need < 6e9


def test_a_gpu_run_without_machine_has_no_peaks_and_says_so():
    assert _machine_for_peaks(None, "cuda") is None
    assert _machine_for_peaks(None, "cpu") == "local"
    measured = Summary(machine="measured@host", model="m", plan="gx=1", gpus=1, global_batch=1, seq=8,
                       step_time_s=1.0, flops_executed=1e12, pflops_total=1e-3, tflops_per_gpu=1.0,
                       pct_peak_advertised=0.0, pct_peak_empirical=0.0, flops_formula="hardware",
                       flops_by_formula=1e12, formula_pflops_total=1e-3, formula_tflops_per_gpu=1.0,
                       formula_pct_peak_advertised=0.0, formula_pct_peak_empirical=0.0, exposed_comm_s=0.0,
                       memory_per_gpu_gb=1.0, time_by_class_s={"gemm": 1.0}, simulated_ranks=1, sim_wall_s=0.1)
    text = format_summary(measured)
    assert "no machine file for the peaks: --machine NAME" in text and "% advertised" not in text
