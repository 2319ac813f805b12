"""benchmarks/kernel_gaps.py: a GPU's fixed cost per kernel from a profiled step, on a synthetic trace whose gaps
and copy line are known, and on the H200's traces that set Alps's kernel_overhead_us."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topologies.machine import load_machine

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "kernel_gaps.py"
H200 = REPO / "benchmarks" / "results" / "2026-12-04-nvidia-h200"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def synthetic(copies: int = 6, intercept_us: float = 1.5, gb_per_s: float = 2000.0) -> dict:
    """Per op: a memset and a GEMM of one host call 2 us apart, then a copy of its own call 5 us later; each copy
    lasts intercept + moved / bandwidth; one 400 us host stall that must be left out."""
    events, t = [], 0.0

    def span(cat: str, name: str, dur: float, op: int, nbytes: float | None = None) -> None:
        nonlocal t
        args = {"device": 0, "External id": op, **({"bytes": nbytes} if nbytes is not None else {})}
        events.append({"ph": "X", "cat": cat, "name": name, "ts": t, "dur": dur, "pid": 0, "tid": 7, "args": args})
        t += dur

    for i in range(copies):
        span("gpu_memset", "Memset (Device)", 0.5, 2 * i, 4)
        t += 2.0
        span("kernel", "nvjet_sm90_gemm", 30.0, 2 * i)
        t += 5.0 if i != 2 else 400.0
        nbytes = (i + 1) * 1e6  # one side: 2x moved
        span("gpu_memcpy", "Memcpy DtoD (Device -> Device)", intercept_us + 2 * nbytes / (gb_per_s * 1e3), 2 * i + 1,
             nbytes)
        t += 5.0
    return {"traceEvents": events}


def test_gaps_and_the_copy_line_come_back_from_a_trace_that_has_them(tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(synthetic()))
    result = run(str(trace), "--hbm-peak-gb-per-s", "4000", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["gaps"]["inside one call"]["n"] == 6 and doc["gaps"]["inside one call"]["median_us"] == pytest.approx(2.0)
    # 11 gaps between calls, one of them the 400 us stall, left out
    assert doc["gaps"]["between calls"]["n"] == 10 and doc["gaps"]["between calls"]["median_us"] == pytest.approx(5.0)
    assert doc["copies"]["intercept_us"] == pytest.approx(1.5, rel=1e-6)
    assert doc["copies"]["bandwidth_gb_per_s"] == pytest.approx(2000, rel=1e-6)
    assert doc["copies"]["share_of_peak"] == pytest.approx(0.5, rel=1e-6)
    assert doc["per_kernel_overhead_us"] == pytest.approx(3.5, rel=1e-6)
    printed = run(str(trace)).stdout
    assert "2000 GB/s" in printed and "3.50 us" in printed


def test_a_trace_without_copies_is_a_one_line_error(tmp_path):
    trace = tmp_path / "trace.json"
    doc = synthetic()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["cat"] != "gpu_memcpy"]
    trace.write_text(json.dumps(doc))
    result = run(str(trace))
    assert result.returncode == 2 and "device-to-device copies" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_the_h200_traces_give_alps_its_kernel_overhead():
    """Alps's kernel_overhead_us is this script's reading of the H200's three profiled steps (same Hopper SMs)."""
    file_value = load_machine("alps").device.kernel_overhead_s * 1e6
    for trace in sorted(H200.glob("profile-*.json.gz")):
        doc = json.loads(run(str(trace), "--hbm-peak-gb-per-s", "4800", "--json").stdout)
        assert doc["per_kernel_overhead_us"] == pytest.approx(file_value, abs=0.05), trace.name
        assert 0.85 < doc["copies"]["share_of_peak"] < 0.92  # alps.toml's hbm_efficiency 0.85 is the stream kernels'
        assert doc["gaps"]["between calls"]["median_us"] > doc["gaps"]["inside one call"]["median_us"] + 2
