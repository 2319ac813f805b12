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
