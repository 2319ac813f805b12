"""benchmarks/device_check.sh, the one command a lent GPU machine runs, end to end on this CPU (slow).

A lent GPU is one try of a few minutes, so the script is checked here with small inputs and DEVICE=cpu: every
stage runs, each writes its output, and a failing stage does not stop the others. On a CPU the last stage,
compare-trace, must fail (a CPU run has no GPU kernels): that is the one failure expected here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_stage_runs_and_writes_its_output(tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "gemm-shapes-input.json").write_text(json.dumps({"per_run": {"toy": [[64, 32, 16, "NN", 1.0],
                                                                                  [48, 64, 32, "TN", 2.0]],
                                                                          "batched": [[32, 32, 16, "NT", 4, 1.0]]}}))
    for name, plan in (("step-1gpu.json", "gx=1"), ("step-megatron-1gpu.json", "gx=1,attention=unfused,optimizer=flat")):
        subprocess.run([sys.executable, "-m", "twin.cli", "export", "--machine", "local", "--model", "tiny", "--gpus",
                        "1", "--plan", plan, "--global-batch", "4", "-o", str(inputs / name)], check=True,
                       cwd=REPO, capture_output=True, timeout=120)
    bundle = tmp_path / "back" / "device-check.tar.gz"
    bundle.parent.mkdir()
    env = dict(os.environ, OUT=str(out), IN=str(inputs), DEVICE="cpu", REF_DIM="128", HBM_GIB="0.01",
               BUNDLE=str(bundle),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # python3 = this interpreter
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "device_check.sh")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed stages: compare-trace compare-trace-json compare-trace-megatron" in result.stderr
    names = ("gpu.txt", "gemm-shapes.json", "gemm-measured.toml", "hbm-stream.txt", "compare.txt", "compare.json",
             "run-profiled.txt", "profile-rank0.json.gz", "compare-trace.txt", "compare-megatron.json",
             "run-profiled-megatron.txt", "profile-megatron-rank0.json.gz", "compare-trace-megatron.txt")
    for name in names:
        assert (out / name).stat().st_size > 0, name
    with tarfile.open(bundle) as tar:  # the one file a lent machine brings back holds every output
        assert {f"./{name}" for name in names if not name.startswith("profile-")} <= set(tar.getnames())
    assert json.loads((out / "hbm-stream.txt").read_text())["gb_per_s"]["copy"] > 0
    assert {s["batch"] for s in json.loads((out / "gemm-shapes.json").read_text())["shapes"]} == {1, 4}
    assert "no GPU kernels" in (out / "compare-trace.txt").read_text()
    assert "[[device.gemm_measured]]" in (out / "gemm-measured.toml").read_text()
    assert json.loads((out / "compare.json").read_text())["by_class"]
