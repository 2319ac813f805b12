"""benchmarks/gemm_shapes.py, the GPU check of the GEMM shape model: its shape list and its timing path on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from gemm_shapes import gemm_flops, measure_gemm_s, twin_efficiency  # noqa: E402

from topologies.machine import load_machine  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.sim.compute import ComputeModel  # noqa: E402


def test_shapes_carry_every_gemm_flop_of_a_micro_batch():
    """tp=1, pp=8 22B: the GEMM FLOPs of one micro-batch over all stages are the model's GEMM FLOPs with
    recompute (forward twice, backward twice the forward)."""
    run = dict(machine="frontier", model="22B", gpus=16, plan="tp=1,pp=8,dp=2,zero=0,mbs=1,recompute=full", batch=640)
    flops = gemm_flops(run)
    model = get_model("22B")
    h, tokens = model.hidden, model.seq
    per_layer_forward = 2 * tokens * sum(k * n for _, k, n, _ in model.linear_shapes())
    lm_head_forward = 2 * tokens * h * model.vocab
    want = model.layers * 4 * per_layer_forward + 3 * lm_head_forward  # the LM head is not recomputed
    assert sum(flops.values()) == pytest.approx(want, rel=1e-9)
    assert {layout for _, _, _, layout, _ in flops} <= {"NN", "NT", "TN"}


def test_twin_efficiency_is_one_at_the_reference_square():
    compute = ComputeModel(load_machine("alps").device)
    assert twin_efficiency(compute, (32768, 32768, 32768, "NN", 1)) == pytest.approx(1.0)
    assert twin_efficiency(compute, (300, 200, 100, "NN", 1)) < 0.5
    # with wave quantisation (an A100's grids of tiles), a batched launch fills the GPU with all its products' tiles
    a100 = ComputeModel(load_machine("dgx-a100").device)
    assert twin_efficiency(a100, (300, 200, 100, "NN", 64)) > twin_efficiency(a100, (300, 200, 100, "NN", 1))


@pytest.mark.parametrize("layout", ["NN", "NT", "TN"])
def test_timing_runs_each_layout(layout):
    pytest.importorskip("torch")
    import torch

    assert measure_gemm_s((64, 32, 16, layout, 1), "cpu", torch.float32, budget_s=0.01) > 0
    assert measure_gemm_s((64, 32, 16, layout, 3), "cpu", torch.float32, budget_s=0.01) > 0  # batched


def test_a_dry_run_file_replays_without_building(tmp_path):
    """What a GPU machine runs: the shapes of an earlier dry run, read back, give the same table."""
    import json
    import subprocess

    script = str(Path(__file__).resolve().parents[1] / "benchmarks" / "gemm_shapes.py")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    subprocess.run([sys.executable, script, "--quick", "--dry-run", "--out", str(first)], check=True,
                   capture_output=True, timeout=120)
    subprocess.run([sys.executable, script, "--shapes", str(first), "--dry-run", "--out", str(second)], check=True,
                   capture_output=True, timeout=120)
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["shapes"] == b["shapes"] and len(a["shapes"]) > 10
    assert [r["run"] for r in a["runs"]] == [r["run"] for r in b["runs"]]
    for x, y in zip(a["runs"], b["runs"]):  # sums over the same shapes, perhaps in another order
        assert x["shapes"] == y["shapes"] and x["twin_efficiency"] == pytest.approx(y["twin_efficiency"], rel=1e-12)
