"""`twin scale` and `twin presets`: efficiencies by the paper's definitions, and their errors."""

from __future__ import annotations

import json

import pytest

from twin.cli import main

SPEC = "layers=8,hidden=512,heads=8,seq=128,vocab=1024"


def scale(capsys, tmp_path, mode, *extra):
    figure = tmp_path / f"{mode}.png"
    rc = main(["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2,pp=2,mbs=1",
               "--gpus", "8,16,32", "--mode", mode, "--global-batch", "16", "--figure", str(figure), "--json", *extra])
    out = capsys.readouterr().out
    assert rc == 0 and figure.exists()
    return json.loads(out)["points"]


def test_weak_scaling_grows_the_batch_and_compares_per_gpu_throughput(capsys, tmp_path):
    points = scale(capsys, tmp_path, "weak")
    assert [p["gpus"] for p in points] == [8, 16, 32]
    assert [p["global_batch"] for p in points] == [16, 32, 64]
    assert [p["plan"].split(",")[3] for p in points] == ["gdata=2", "gdata=4", "gdata=8"]
    first = points[0]
    assert first["efficiency"] == 1.0
    for p in points[1:]:
        assert p["efficiency"] == pytest.approx(p["tflops_per_gpu"] / first["tflops_per_gpu"])


def test_strong_scaling_keeps_the_batch_and_compares_to_ideal_speedup(capsys, tmp_path):
    points = scale(capsys, tmp_path, "strong")
    assert {p["global_batch"] for p in points} == {16}
    first = points[0]
    for p in points[1:]:
        ideal = first["step_time_s"] * first["gpus"] / p["gpus"]
        assert p["efficiency"] == pytest.approx(ideal / p["step_time_s"])
        assert p["step_time_s"] < first["step_time_s"]  # more GPUs, same batch: faster


@pytest.mark.parametrize("gpus,needle", [("8,10", "multiple of"), ("8,x", "comma-separated")])
def test_bad_gpu_lists_are_one_line_errors(capsys, tmp_path, gpus, needle):
    rc = main(["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2,pp=2,mbs=1",
               "--gpus", gpus, "--mode", "weak", "--global-batch", "16", "--figure", str(tmp_path / "f.png")])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1


def test_presets_list_and_contradictions(capsys):
    assert main(["presets", "--json"]) == 0
    names = [p["name"] for p in json.loads(capsys.readouterr().out)]
    assert "frontier-175b" in names and "frontier-1t" in names
    rc = main(["simulate", "--preset", "frontier-22b", "--gpus", "32"])
    err = capsys.readouterr().err
    assert rc == 2 and "contradicts --preset" in err
    rc = main(["simulate", "--preset", "no-such"])
    assert rc == 2 and "unknown preset" in capsys.readouterr().err
