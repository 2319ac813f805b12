"""benchmarks/gemm_published.py and its data: published A100 GEMM rates beside the twin's shape model."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from gemm_published import COLUMNS, CSV_PATH, load, main, summarize  # noqa: E402


def test_csv_parses_and_every_row_has_a_source_and_positive_numbers():
    rows = load()
    assert len(rows) >= 15
    for r in rows:
        assert min(r.m, r.n, r.k, r.batch) > 0 and r.tflops > 0, r
        assert r.tflops < 312.0, f"{r.shape}: above the A100's 312 TF/s dense peak: {r.tflops}"
        assert r.source and r.gpu and r.library, r
        assert "A100" in r.gpu, r
        assert r.dtype in ("bf16", "fp16"), r
    with open(CSV_PATH, newline="") as f:
        assert tuple(next(csv.reader(f))) == COLUMNS


def test_data_cover_square_and_training_shapes_small_and_large():
    rows = load()
    assert any(r.m == r.n == r.k for r in rows) and sum(not r.m == r.n == r.k for r in rows) >= 10
    assert any(r.flops < 1e9 for r in rows) and any(r.flops > 1e11 for r in rows)
    assert any(min(r.m, r.n) <= 64 for r in rows)


def test_a_row_without_a_source_is_rejected(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(COLUMNS) + "\n" + "1024,1024,1024,1,NN,bf16,100.0,A100,cuBLAS,,no source\n")
    with pytest.raises(ValueError, match="source"):
        load(bad)


def test_a_non_positive_rate_is_rejected(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(COLUMNS) + "\n" + "1024,1024,1024,1,NN,bf16,0,A100,cuBLAS,somewhere,x\n")
    with pytest.raises(ValueError, match="positive"):
        load(bad)


def test_main_returns_one_prediction_per_row(capsys):
    rows = load()
    report = main([])
    assert len(report["rows"]) == len(rows)
    for row, p in zip(rows, report["rows"]):
        assert p["shape"] == row.shape and p["measured"] == row.tflops
        # without the per-kernel overhead the twin is never slower than with it
        assert p["twin"] >= p["twin_with_overhead"] > 0
        assert p["twin"] <= 312.0
    groups = {s["group"]: s for s in report["summary"]}
    assert groups["all"]["rows"] == len(rows)
    assert groups["square"]["rows"] + groups["training (the rest)"]["rows"] == len(rows)
    assert "MARE" in capsys.readouterr().out


def test_json_output(capsys):
    import json
    main(["--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["machine"] == "dgx-a100" and len(out["rows"]) == len(load())


def test_the_shape_model_is_within_15_percent_at_large_cublas_gemms():
    """Above 100 GFLOP the twin tracks the published cuBLAS rates of plain GEMMs (docs/gemm-shape-model.md; batched
    ones it does not); a change to the A100 machine file or the compute model that breaks this should say why."""
    report = main([])
    large = [p for p in report["rows"] if p["gflop"] >= 100 and not p["triton"] and p["batch"] == 1]
    assert len(large) >= 5
    assert summarize(large)[0]["mare_with_overhead"] < 0.15


def _synthetic(k_half: float, scale_by_source: dict[str, float]) -> list:
    """The CSV's training-shape rows with rates the twin's own model gives at k_half, one scale per source."""
    from dataclasses import replace

    from gemm_published import _source_group, fit_rows
    from topologies.machine import load_machine
    from twin.sim.compute import ComputeModel
    device = load_machine("dgx-a100").device
    compute = ComputeModel(replace(device, gemm_k_half=k_half))
    rows = []
    for r in fit_rows(load()):
        t = compute.gemm_time_s(r.gemm)
        rate = r.flops / (t - device.kernel_overhead_s) / 1e12 * scale_by_source.get(_source_group(r), 1.0)
        rows.append(replace(r, tflops=rate))
    return rows


@pytest.mark.parametrize("k_half", [90.0, 600.0])
def test_fit_recovers_the_k_half_that_made_the_rates_whatever_each_sources_rate(k_half):
    from gemm_published import _source_group, fit_k_half
    groups = sorted({_source_group(r) for r in _synthetic(k_half, {})})
    rows = _synthetic(k_half, {g: 0.7 + 0.1 * i for i, g in enumerate(groups)})
    fit = fit_k_half(rows)
    assert fit["k_half"] == pytest.approx(k_half, rel=0.02)
    assert fit["rms_log_error"] < 1e-3
    assert fit["leave_one_out"][0] <= fit["k_half"] <= fit["leave_one_out"][1]


def test_the_a100_machine_files_carry_the_fitted_k_half():
    """The A100 files' gemm_k_half names this fit as its source; a new row in the CSV that moves it fails here."""
    from gemm_published import fit_k_half
    from topologies.machine import load_machine
    fitted = fit_k_half(load())["k_half"]
    for name in ("dgx-a100", "dgx-a100-800g", "perlmutter"):
        machine = load_machine(name)
        assert machine.device.gemm_k_half == pytest.approx(fitted, rel=0.02), name
        assert "gemm_published.py --fit" in machine.sources["device.gemm_k_half"].provenance


def test_the_a100_machine_files_carry_the_wave_quantization_the_training_shapes_fit():
    """The wave term, fitted at the files' k_half: the training-shape rows ask for full wave quantisation, which
    the A100 files carry with this fit as their source; the small or square rows ask for less, and none of
    either set for none (Hopper's 0)."""
    from gemm_published import fit_wave_quantization
    from topologies.machine import load_machine
    fit = fit_wave_quantization(load())
    training, rest = fit["training"], fit["small_or_square"]
    assert training["leave_one_out"][0] <= training["wave_quantization"] <= training["leave_one_out"][1]
    assert rest["wave_quantization"] < training["wave_quantization"]
    assert training["no_waves_rms_log_error"] > training["rms_log_error"] and (
        rest["no_waves_rms_log_error"] > rest["rms_log_error"])
    for name in ("dgx-a100", "dgx-a100-800g", "perlmutter"):
        machine = load_machine(name)
        assert machine.device.gemm_wave_quantization == pytest.approx(training["wave_quantization"]), name
        assert "gemm_published.py --fit" in machine.sources["device.gemm_wave_quantization"].provenance


def test_fit_prints_its_value_and_sources(capsys):
    report = main(["--fit"])
    out = capsys.readouterr().out
    assert f"gemm_k_half = {report['k_half']:.0f}" in out and "EleutherAI/cookbook" in out
