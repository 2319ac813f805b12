"""The GEMM shape model's wave quantisation (twin/sim/compute.py) and the one GPU that measured its form.

`gemm_wave_quantization` is how much of the last wave's idle units a GEMM pays: 1 for grids of fixed tiles
(every machine file without the key), 0 for Hopper cuBLAS's persistent kernels (alps.toml, from an H200's
timings: docs/gpu-h200.md), 0.5 for the MI250X's rocBLAS kernels (frontier.toml, from rocBLAS's own benchmarks of
them: benchmarks/tensile_logic.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from topologies.machine import load_machine
from twin.errors import TwinError
from twin.ir import Gemm
from twin.sim.compute import ComputeModel

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from rocblas_efficiencies import Size, load, summary  # noqa: E402
from tensile_logic import entries  # noqa: E402

H200_GEMMS = REPO / "benchmarks" / "results" / "2026-12-04-nvidia-h200" / "gemm-shapes.json"
ROCBLAS_GEMMS = REPO / "benchmarks" / "data" / "rocblas-gfx90a-bf16-gemms.csv"


def efficiency(device, m: int, n: int, k: int, waves: float) -> float:
    return ComputeModel(replace(device, gemm_wave_quantization=waves)).gemm_efficiency(Gemm(m, n, k, tunable=False))


def test_a_tail_wave_costs_in_proportion():
    """One tile more than the units: with full wave quantisation the GEMM takes two waves for barely more than
    one wave's work; with none it runs at its tile and k-loop efficiency; halfway pays half the idle units."""
    device = load_machine("dgx-a100").device  # 108 units, 256 x 128 tiles
    m, n, k = 256 * 109, 128, 4096  # 109 tiles in one column
    full, none, half = (efficiency(device, m, n, k, w) for w in (1.0, 0.0, 0.5))
    idle = 1 - 109 / 216  # of two waves of 108 units
    # each is relative to the 32768^3 square, whose 32,768 tiles fill 304 waves but for a little of the last
    reference_idle = 1 - 32768 / (304 * 108)
    assert full / none == pytest.approx((1 - idle) / (1 - reference_idle), rel=1e-9)
    assert half / none == pytest.approx((1 - 0.5 * idle) / (1 - 0.5 * reference_idle), rel=1e-9)
    # a GEMM of whole waves differs only by the reference's tail
    assert efficiency(device, 256 * 108, 128, k, 1.0) / efficiency(device, 256 * 108, 128, k, 0.0) == pytest.approx(
        1 / (1 - reference_idle), rel=1e-9)


def test_the_a100_files_keep_full_wave_quantisation_and_the_measured_ones_cite_their_measurements():
    for name in ("perlmutter", "dgx-a100", "dgx-a100-800g"):
        assert load_machine(name).device.gemm_wave_quantization == 1.0
    alps = load_machine("alps")
    assert alps.device.gemm_wave_quantization == 0.0
    assert "H200" in alps.sources["device.gemm_wave_quantization"].source
    frontier = load_machine("frontier")
    assert frontier.device.gemm_wave_quantization == 0.5
    assert "rocblas-gfx90a-bf16-gemms.csv" in frontier.sources["device.gemm_wave_quantization"].source


def test_the_key_is_a_share_and_a_bad_one_names_the_field(tmp_path):
    text = (REPO / "topologies" / "alps.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("gemm_wave_quantization = { value = 0.0", "gemm_wave_quantization = { value = 1.5"))
    with pytest.raises(TwinError) as err:
        load_machine(str(bad))
    assert "device.gemm_wave_quantization" in str(err.value) and "in [0, 1]" in str(err.value)


def test_the_h200_timings_support_no_wave_quantisation():
    """benchmarks/gemm_shape_fit.py on the committed H200 timings: the twin's times fit them best with no wave
    quantisation, worst with all of it (the form every file had before)."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shape_fit.py"), str(H200_GEMMS), "--json"],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    rows = {r["wave_quantization"]: r for r in json.loads(result.stdout)["rows"] if r["form"] == "fitted"}
    assert rows[0.0]["rms_log_error"] < rows[0.5]["rms_log_error"] < rows[1.0]["rms_log_error"]
    assert rows[0.0]["rms_log_error"] < 0.5 * rows[1.0]["rms_log_error"]


def test_rocblas_own_mi250x_benchmarks_support_half_a_wave_and_frontier_carries_it():
    """benchmarks/gemm_shape_fit.py on rocBLAS's efficiencies of the MI250X: half the tail wave fits them best, far
    better than all of it (the file's estimate before) and better than none; frontier.toml carries the fitted form."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shape_fit.py"), str(ROCBLAS_GEMMS),
                             "--machine", "frontier", "--json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["efficiencies"] and doc["shapes"] > 2000
    rows = {r["wave_quantization"]: r for r in doc["rows"] if r["form"] == "fitted"}
    assert rows[0.5]["rms_log_error"] < rows[0.0]["rms_log_error"] < rows[1.0]["rms_log_error"]
    assert rows[0.5]["rms_log_error"] < 0.5 * rows[1.0]["rms_log_error"]
    device = load_machine("frontier").device
    assert (device.gemm_wave_quantization, device.gemm_k_half) == (0.5, rows[0.5]["k_half"])


def test_tensile_logic_reads_exact_logic_entries_of_a_gemm_of_at_least_a_gflop():
    text = "  - - [4096, 8192, 1, 4096]\n    - [324, 94.65]\n  - - [64, 64, 1, 64]\n    - [3, 0.5]\n"
    assert entries(text, "NN") == [dict(m=4096, n=8192, k=4096, batch=1, layout="NN", efficiency_pct=94.65)]


def test_a_csv_without_efficiencies_is_one_line_exit_2(tmp_path):
    path = tmp_path / "efficiencies.csv"
    path.write_text("m,n\n1,2\n")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shape_fit.py"), str(path), "--machine",
                             "frontier"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "efficiency_pct" in result.stderr


@pytest.mark.parametrize("content", [None, "{}", "not json"])
def test_a_file_that_is_not_timed_results_is_one_line_exit_2(tmp_path, content):
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shape_fit.py"), str(path)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "gemm_shape_fit: cannot read" in result.stderr


def test_rocblas_summary_compares_training_shapes_with_the_squares():
    sizes = [Size(8192, 8192, 8192, 1, layout, eff) for layout, eff in (("NN", 80.0), ("NT", 79.0), ("TN", 78.0))]
    sizes += [Size(4096, 16384, 8192, 1, "NN", eff) for eff in (70.0, 75.0, 90.0)]
    sizes += [Size(64, 64, 64, 1, "NN", 10.0), Size(8192, 8192, 8192, 4, "NN", 99.0)]  # too small; batched
    result = summary(sizes)
    assert result["squares_range_pct"] == [78.0, 80.0]
    assert result["non_square_count"] == 3 and result["non_square_median_pct"] == 75.0
    assert result["best_non_square_nn"]["efficiency_pct"] == 90.0
    assert result["every_layout_pct"] == {"NN": 80.0, "NT": 79.0, "TN": 78.0}


def test_rocblas_training_shapes_run_at_or_above_the_large_squares():
    """docs/gemm-shape-model.md's reading of rocBLAS's MI250X benchmarks, on the committed CSV."""
    result = summary(load(str(ROCBLAS_GEMMS)))
    assert result["non_square_median_pct"] >= result["squares_range_pct"][0]
    assert set(result["every_layout_pct"]) == {"NN", "NT", "TN"}
    assert max(result["every_layout_pct"].values()) - min(result["every_layout_pct"].values()) < 2.0


def test_rocblas_summary_of_a_csv_without_its_columns_is_one_line_exit_2(tmp_path):
    path = tmp_path / "efficiencies.csv"
    path.write_text("m,n\n1,2\n")
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "rocblas_efficiencies.py"), str(path)],
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "efficiency_pct" in result.stderr
