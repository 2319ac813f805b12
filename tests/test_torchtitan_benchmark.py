"""benchmarks/torchtitan_a100.py: torchtitan's eight A100 runs predicted on two columns, the second carried from
MosaicML's one-node fit (GEMM rate only), and the validation file refused by `twin fit`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import torchtitan_a100  # noqa: E402
from topologies import load_machine  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.fit.protocol import check_calibration_file  # noqa: E402


def test_every_run_is_predicted_on_the_three_columns(tmp_path, capsys):
    """First principles, MosaicML's one-node GEMM rate carried, and that with its attention efficiency carried too:
    each file differs from dgx-a100 in what it carries only."""
    assert torchtitan_a100.main(["--out", str(tmp_path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    carried, both = (str(tmp_path / name) for name in ("tt-a100-carried.toml", "tt-a100-carried-attention.toml"))
    assert len(result["rows"]) == 8
    for row in result["rows"]:
        assert set(row["predicted_s"]) == {"dgx-a100", carried, both}
        assert all(s > 0 for s in row["predicted_s"].values())
    fitted, plain = load_machine(str(torchtitan_a100.FITTED)).device, load_machine("dgx-a100").device
    for path in (carried, both):
        assert load_machine(path).device.empirical_gemm_flop_per_s == pytest.approx(fitted.empirical_gemm_flop_per_s)
    assert load_machine(carried).device.attention_efficiency == plain.attention_efficiency
    assert load_machine(both).device.attention_efficiency == pytest.approx(fitted.attention_efficiency)


def test_the_70b_run_with_per_operator_checkpointing_fits_at_the_batch_it_ran_and_not_at_two():
    """The page ran Llama 2 70B with selective op checkpointing at local batch 1 because batch 2 ran out of memory
    (its footnote): the memory model, counted from the policy and the model (twin.memory), agrees on both."""
    from dataclasses import replace

    from twin.memory import check_fit
    from twin.plan import with_micro_batch
    from twin.runs import load_runs

    hbm = load_machine("dgx-a100").device.hbm_bytes
    [run] = [r for r in load_runs(str(torchtitan_a100.RUNS), "") if r.label == "Llama-2-70B" and r.plan.recompute == "op"]
    assert run.plan.mbs == 1
    check_fit(run.model, run.plan, hbm)
    doubled = with_micro_batch(replace(run.plan, ga=0, global_batch=2 * run.plan.global_batch), 2)
    with pytest.raises(TwinError, match="plan does not fit"):
        check_fit(run.model, doubled, hbm, reserve=False)


def test_the_runs_are_validation_data():
    with pytest.raises(TwinError, match="validation"):
        check_calibration_file(str(torchtitan_a100.RUNS))


def test_the_h100_runs_are_fitted_on_one_node_and_predicted_on_sixteen(tmp_path, capsys):
    """benchmarks/torchtitan_h100.py: the page's HBM in every file, the GEMM rate carried from MosaicML's one-node
    fit, the attention efficiency fitted on the two one-node runs alone (the fitted file says so and names no
    validation file), the two 128-GPU runs predicted on all three columns; eager slower than compiled in every
    column, as measured."""
    import torchtitan_h100

    assert torchtitan_h100.main(["--out", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    carried, fitted = (str(tmp_path / name) for name in ("tt-h100-carried.toml", "tt-h100-fitted.toml"))
    assert [p["path"] for p in doc["fit"]["parameters"]] == ["device.attention_efficiency"]
    assert doc["fit"]["runs"] == 2 and doc["fit"]["runs_file"] == str(torchtitan_h100.ONE_NODE)
    for part, machines in (("one_node", ("mpt-h100-80g", carried)), ("multi_node", ("mpt-h100-80g", carried, fitted))):
        eager, compiled = doc[part]["rows"]
        assert "norm=eager" in eager["run"] and "eager" not in compiled["run"]
        assert eager["measured_s"] > compiled["measured_s"]
        assert all(eager["predicted_s"][m] > compiled["predicted_s"][m] for m in machines)
    for path in (carried, fitted):
        device = load_machine(path).device
        assert device.hbm_bytes == pytest.approx(96e9) and device.hbm_bw_bytes_per_s == pytest.approx(2.4e12)
        assert device.empirical_gemm_flop_per_s == pytest.approx(
            load_machine(str(torchtitan_h100.FITTED)).device.empirical_gemm_flop_per_s)
    assert load_machine(carried).device.attention_efficiency == load_machine("mpt-h100-80g").device.attention_efficiency
    source = load_machine(fitted).sources["device.attention_efficiency"]
    assert "torchtitan-h100-2025-one-node.csv" in source.fitted and "multi-node" not in source.fitted
    check_calibration_file(str(torchtitan_h100.ONE_NODE))
    with pytest.raises(TwinError, match="validation"):
        check_calibration_file(str(torchtitan_h100.MULTI_NODE))
