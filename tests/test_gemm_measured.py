"""Measured GEMMs in a machine file ([[device.gemm_measured]]): how they load, and how the compute model uses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from topologies.machine import load_machine
from twin.errors import TwinError
from twin.ir import Gemm
from twin.sim.compute import ComputeModel

REPO = Path(__file__).resolve().parents[1]
FRONTIER = (REPO / "topologies" / "frontier.toml").read_text()
EMPIRICAL = 125e12  # frontier.toml's empirical_gemm_bf16_tflop_per_s


def entry(m: int, n: int, k: int, layout: str, tflops: float, source: str = 'source = "test bench"',
          batch: int = 0) -> str:
    return (f'\n[[device.gemm_measured]]\nm = {m}\nn = {n}\nk = {k}\n' + (f"batch = {batch}\n" if batch else "")
            + f'layout = "{layout}"\ntflop_per_s = {{ value = {tflops}, source = "test bench" }}\n{source}\n')


def frontier_with(tmp_path: Path, *entries: str):
    path = tmp_path / "measured.toml"
    path.write_text(FRONTIER + "".join(entries))
    return load_machine(str(path))


def test_entries_load_with_their_sources(tmp_path):
    machine = frontier_with(tmp_path, entry(2048, 6144, 6144, "nn", 90.0), entry(2048, 6144, 6144, "tn", 30.0))
    got = machine.device.gemm_measured
    assert [(e.m, e.n, e.k, e.layout, e.flop_per_s) for e in got] == [(2048, 6144, 6144, "NN", 90e12),
                                                                      (2048, 6144, 6144, "TN", 30e12)]
    assert machine.sources["device.gemm_measured[1].tflop_per_s"].source == "test bench"
    assert load_machine("frontier").device.gemm_measured == ()


@pytest.mark.parametrize("text, field, fix", [
    (entry(64, 64, 64, "tt", 10.0), "device.gemm_measured[0].layout", "use one of nn, nt, tn"),
    (entry(64, 64, 64, "nn", 500.0), "device.gemm_measured[0].tflop_per_s", "above the device peak"),
    (entry(64, 64, 64, "nn", 10.0) + entry(64, 64, 64, "nn", 11.0), "device.gemm_measured[1].m", "keep one entry"),
    (entry(64, 64, 64, "nn", 10.0, source=""), "device.gemm_measured[0].m", "add source"),
    (entry(0, 64, 64, "nn", 10.0), "device.gemm_measured[0].m", "must be > 0"),
    (entry(64, 64, 64, "nn", 10.0, batch=-2), "device.gemm_measured[0].batch", "must be > 0"),
    (entry(64, 64, 64, "nn", 10.0, batch=8) + entry(64, 64, 64, "nn", 11.0, batch=8), "device.gemm_measured[1].m",
     "keep one entry"),
])
def test_bad_entries_name_the_field_and_the_fix(tmp_path, text, field, fix):
    with pytest.raises(TwinError) as err:
        frontier_with(tmp_path, text)
    assert field in str(err.value) and fix in str(err.value) and "\n" not in str(err.value)


def test_without_measurements_the_model_is_unchanged(tmp_path):
    plain = ComputeModel(load_machine("frontier").device)
    # a measurement of a far-away shape that agrees with the model leaves every GEMM where it was
    square = Gemm(32768, 32768, 32768, "NN", tunable=False)
    agreeing = ComputeModel(frontier_with(tmp_path, entry(32768, 32768, 32768, "nn", 125.0)).device)
    for gemm in (Gemm(2048, 6144, 6144, "NN"), Gemm(300, 200, 100, "NT"), square):
        assert agreeing.gemm_efficiency(gemm) == pytest.approx(plain.gemm_efficiency(gemm))


def test_a_measured_shape_runs_at_its_measured_rate(tmp_path):
    model = ComputeModel(frontier_with(tmp_path, entry(2048, 6144, 6144, "nn", 90.0),
                                       entry(32768, 32768, 32768, "nn", 125.0)).device)
    gemm = Gemm(2048, 6144, 6144, "NN", tunable=False)
    assert model.gemm_efficiency(gemm) * EMPIRICAL == pytest.approx(90e12)
    # time: the FLOPs at that rate, plus the per-kernel overhead every kernel pays
    overhead = model.device.kernel_overhead_s
    assert model.gemm_time_s(gemm) == pytest.approx(gemm.flops / 90e12 + overhead)


def test_a_nearby_shape_takes_the_nearest_measurement_times_the_models_ratio(tmp_path):
    plain = ComputeModel(load_machine("frontier").device)
    model = ComputeModel(frontier_with(tmp_path, entry(2048, 6144, 6144, "nn", 90.0),
                                       entry(32768, 32768, 32768, "nn", 125.0)).device)
    near, measured = Gemm(2048, 6144, 5120, "NN", tunable=False), Gemm(2048, 6144, 6144, "NN", tunable=False)
    want = 90e12 / EMPIRICAL * plain.gemm_efficiency(near) / plain.gemm_efficiency(measured)
    assert model.gemm_efficiency(near) == pytest.approx(want)
    assert want < 90e12 / EMPIRICAL  # the shorter k loop costs, by the model


def test_a_layout_prefers_its_own_measurement_and_tuning_takes_the_fastest(tmp_path):
    model = ComputeModel(frontier_with(tmp_path, entry(4096, 4096, 4096, "nn", 100.0),
                                       entry(4096, 4096, 4096, "tn", 20.0)).device)
    assert model.gemm_efficiency(Gemm(4096, 4096, 4096, "TN", tunable=False)) * EMPIRICAL == pytest.approx(20e12)
    assert model.gemm_efficiency(Gemm(4096, 4096, 4096, "TN", tunable=True)) * EMPIRICAL == pytest.approx(100e12)
    # NT was not measured: the nearest measurement of any layout, NN, carries it (NT is at par in the file)
    assert model.gemm_efficiency(Gemm(4096, 4096, 4096, "NT", tunable=False)) * EMPIRICAL == pytest.approx(100e12)


def test_a_batched_gemm_takes_a_batched_measurement(tmp_path):
    """Unfused attention's score GEMMs are one launch over batch x heads small products: they are carried from a
    batched measurement, not from an unbatched one nearer in m, n, k, and an unbatched GEMM the other way round."""
    plain = ComputeModel(load_machine("frontier").device)
    model = ComputeModel(frontier_with(tmp_path, entry(1024, 1024, 64, "nt", 40.0, batch=64),
                                       entry(1024, 1024, 128, "nt", 20.0)).device)
    batched = Gemm(1024, 1024, 128, "NT", batch=64, tunable=False)
    want = 40e12 / EMPIRICAL * plain.gemm_efficiency(batched) / plain.gemm_efficiency(
        Gemm(1024, 1024, 64, "NT", batch=64, tunable=False))
    assert model.gemm_efficiency(batched) == pytest.approx(want)
    assert model.gemm_efficiency(Gemm(1024, 1024, 64, "NT", batch=64, tunable=False)) * EMPIRICAL == pytest.approx(40e12)
    assert model.gemm_efficiency(Gemm(1024, 1024, 128, "NT", tunable=False)) * EMPIRICAL == pytest.approx(20e12)
    # the batch is part of the distance: a batch of 32 is carried from the batch of 64 by the model's ratio
    half = Gemm(1024, 1024, 64, "NT", batch=32, tunable=False)
    assert model.gemm_efficiency(half) == pytest.approx(40e12 / EMPIRICAL * plain.gemm_efficiency(half)
                                                        / plain.gemm_efficiency(Gemm(1024, 1024, 64, "NT", batch=64)))


def test_never_above_the_peak(tmp_path):
    """A measurement at the peak, carried by the model to a shape it rates higher, stays at the peak."""
    model = ComputeModel(frontier_with(tmp_path, entry(200, 200, 200, "nn", 191.5)).device)
    assert model.gemm_efficiency(Gemm(32768, 32768, 32768, "NN")) * EMPIRICAL == pytest.approx(191.5e12)


def test_the_benchmark_writes_entries_a_machine_file_loads(tmp_path):
    """benchmarks/gemm_shapes.py --toml on CPU (small shapes, a small reference square): the block it writes
    loads under [device] and the compute model then runs those shapes at the rates it measured."""
    pytest.importorskip("torch")
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"per_run": {"toy": [[64, 32, 16, "NN", 1.0], [48, 64, 32, "TN", 2.0],
                                                      [32, 32, 16, "NT", 4, 1.0]]}}))
    block, out = tmp_path / "measured.toml", tmp_path / "out.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shapes.py"), "--shapes", str(shapes),
                    "--machine", "frontier", "--device", "cpu", "--reference-dim", "64", "--out", str(out),
                    "--toml", str(block)], check=True, capture_output=True, timeout=120)
    doc = json.loads(out.read_text())
    path = tmp_path / "frontier-measured.toml"
    path.write_text(FRONTIER + block.read_text())
    device = load_machine(str(path)).device
    assert {(e.m, e.n, e.k, e.layout, e.batch) for e in device.gemm_measured} == {
        (64, 32, 16, "NN", 1), (48, 64, 32, "TN", 1), (32, 32, 16, "NT", 4), (64, 64, 64, "NN", 1)}
    model = ComputeModel(device)
    for row in doc["shapes"]:
        gemm = Gemm(row["m"], row["n"], row["k"], row["layout"], batch=row["batch"], tunable=False)
        rate = model.gemm_efficiency(gemm) * EMPIRICAL
        assert rate == pytest.approx(row["measured_tflop_per_s"] * 1e12, rel=1e-3)  # 4 digits in the file


def test_toml_needs_measurements():
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shapes.py"), "--dry-run", "--toml",
                             "x.toml"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--toml needs measurements" in result.stderr


def test_shapes_of_a_measured_runs_file_are_grouped_by_hidden_size(tmp_path):
    """--runs adds the GEMMs of twin fit's CSV, one group per hidden size, a row's micro-batches counted; unfused
    attention's score GEMMs come batched (one launch over the micro-batch's heads)."""
    runs = tmp_path / "runs.csv"
    runs.write_text("gpus,global_batch,layers,hidden,heads,seq,tp,dp,pp,mbs,step_time_ms\n"
                    "2,8,2,256,4,128,1,2,1,2,100\n2,16,2,256,4,128,1,2,1,2,190\n2,8,2,512,8,128,2,1,1,4,120\n")
    out = tmp_path / "shapes.json"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shapes.py"), "--dry-run", "--quick",
                             "--runs", str(runs), "--assume", "attention=unfused,vocab=1024", "--runs-machine",
                             "dgx-a100", "--out", str(out)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    per_run = json.loads(out.read_text())["per_run"]
    h256, h512 = per_run["runs h=256"], per_run["runs h=512"]
    assert all(len(row) == 6 for row in h256 + h512)  # m, n, k, layout, batch, FLOPs
    assert any(row[4] > 1 for row in h256)  # the batched score GEMMs
    # the second h=256 row is the first with twice the micro-batches: the group holds three times one row's FLOPs
    single = tmp_path / "one.csv"
    single.write_text(runs.read_text().splitlines()[0] + "\n" + runs.read_text().splitlines()[1] + "\n")
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shapes.py"), "--dry-run", "--quick", "--runs",
                    str(single), "--assume", "attention=unfused,vocab=1024", "--runs-machine", "dgx-a100", "--out",
                    str(out)], check=True, capture_output=True, timeout=300, cwd=REPO)
    one = json.loads(out.read_text())["per_run"]["one h=256"]
    assert sum(row[-1] for row in h256) == pytest.approx(3 * sum(row[-1] for row in one))


def test_the_report_of_the_h200_run_shows_where_the_shape_model_is_off():
    """docs/gpu-h200.md's tables, from the committed results: on the H200 the twin's shape model (Alps's Hopper
    device) rates the small GEMMs of the A100 runs' shapes too low, the more the smaller they are."""
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shapes.py"), "--report",
                             str(REPO / "benchmarks" / "results" / "2026-12-04-nvidia-h200" / "gemm-shapes.json")],
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    rows = {line[:44].strip(): line[44:].split() for line in result.stdout.splitlines() if line.startswith("a100")}
    ratios = [float(rows[f"a100-megatron-{g}"][-1]) for g in ("single-node h=1024", "single-node h=2048",
                                                              "multi-node h=8192 39.1")]
    assert ratios[0] < ratios[1] < ratios[2] < 1.0  # measured time / twin's: the smallest GEMMs furthest off
    assert "by the FLOPs of one launch" in result.stdout


def test_report_of_a_file_that_is_not_results_is_a_usage_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for path in (bad, tmp_path / "missing.json"):
        result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gemm_shapes.py"), "--report", str(path)],
                                capture_output=True, text=True, timeout=60, cwd=REPO)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "--report: cannot read" in result.stderr.splitlines()[-1]
