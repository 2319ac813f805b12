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
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_stage_runs_and_writes_its_output(tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    (inputs / "gemm-shapes-input.json").write_text(json.dumps({"per_run": {"toy": [[64, 32, 16, "NN", 1.0],
                                                                                  [48, 64, 32, "TN", 2.0]]}}))
    subprocess.run([sys.executable, "-m", "twin.cli", "export", "--machine", "local", "--model", "tiny", "--gpus", "1",
                    "--plan", "gx=1", "--global-batch", "4", "-o", str(inputs / "step-1gpu.json")], check=True,
                   cwd=REPO, capture_output=True, timeout=120)
    env = dict(os.environ, OUT=str(out), IN=str(inputs), DEVICE="cpu", REF_DIM="128",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # python3 = this interpreter
    result = subprocess.run(["bash", str(REPO / "benchmarks" / "device_check.sh")], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed stages: compare-trace compare-trace-json" in result.stderr
    for name in ("gpu.txt", "gemm-shapes.json", "gemm-measured.toml", "compare.txt", "compare.json",
                 "run-profiled.txt", "profile-rank0.json.gz", "compare-trace.txt"):
        assert (out / name).stat().st_size > 0, name
    assert "no GPU kernels" in (out / "compare-trace.txt").read_text()
    assert "[[device.gemm_measured]]" in (out / "gemm-measured.toml").read_text()
    assert json.loads((out / "compare.json").read_text())["by_class"]
