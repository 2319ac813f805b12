"""`twin fit`, `twin validate --runs` and the measured-runs reader.

The fit is checked where its answer is known: runs simulated at chosen
parameter values must give those values back, from the machine file's
values. Its refusals (a parameter at a bound, parameters the runs cannot
tell apart, a parameter nothing depends on, validation data) and its output
file (loads, says `fitted`, keeps everything else) are checked too.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO
from test_cli import assert_user_error, run
from topologies import load_machine
from twin.cli.runs import what_ran
from twin.errors import TwinError
from twin.fit.machinefile import rewrite, write_fitted
from twin.fit.params import DEFAULT_PARAMETERS, default_parameters, fit_parameters
from twin.fit.protocol import VALIDATION_FILES, check_calibration_file
from twin.fit.solve import _at_bound, _degeneracy, _undetermined, fit
from twin.micro_batches import simulate_step
from twin.model import ModelSpec
from twin.plan import parse_plan
from twin.runs import load_runs

MACHINE = "dgx-a100-800g"
TRUTH = (("device.launch_interval_us", 40.0), ("device.empirical_gemm_bf16_tflop_per_s", 200.0))
SHAPES = [(2, 256, 4), (2, 1024, 16), (4, 2048, 16)]  # layers, hidden, heads: host-bound to GPU-bound
PLANS = [(1, "tp=1,dp=1,mbs=1", 2), (1, "tp=1,dp=1,mbs=4", 8), (2, "tp=2,dp=1,mbs=2", 4), (2, "tp=1,pp=2,dp=1,mbs=1", 4)]
HEADER = ["layers", "hidden", "heads", "seq", "gpus", "plan", "global_batch", "step_time_s", "source"]


# Two nodes of eight: data and pipeline parallelism across the NICs, tensor parallelism over NVLink.
NETWORK_TRUTH = (("node.link_efficiency.nic", 0.5), ("node.link_efficiency.nvlink", 0.4),
                 ("device.launch_interval_us", 40.0))
NETWORK_SHAPES = [(2, 256, 8), (2, 1024, 16), (4, 2048, 16)]
NETWORK_PLANS = [(16, "tp=8,dp=2,mbs=1", 4), (16, "tp=4,pp=2,dp=2,mbs=2", 16), (16, "tp=8,pp=2,dp=1,mbs=1", 4),
                 (8, "tp=8,dp=1,mbs=1", 2)]


def _synthetic_runs(path: Path, truth=TRUTH, shapes=SHAPES, plans=PLANS) -> Path:
    """A runs CSV whose step times the twin itself simulated at `truth`."""
    machine = load_machine(MACHINE, truth)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for layers, hidden, heads in shapes:
            model = ModelSpec("m", layers, hidden, heads, seq=256)
            for gpus, plan, batch in plans:
                p = parse_plan(f"{plan},global_batch={batch}")
                step = simulate_step(model, p, machine, gpus).step_time_s
                w.writerow([layers, hidden, heads, 256, gpus, plan, batch, repr(step), "simulated at the truth"])
    return path


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return _synthetic_runs(tmp_path_factory.mktemp("runs") / "synthetic.csv")


def test_the_fit_finds_the_parameters_the_runs_were_made_with(synthetic):
    runs = load_runs(str(synthetic))
    params = fit_parameters(load_machine(MACHINE), tuple(p for p, _ in TRUTH))
    result = fit(runs, MACHINE, (), params, folds=3, jobs=1)
    for (path, truth), value in zip(TRUTH, result.values):
        assert value == pytest.approx(truth, rel=0.01), path
    assert np.abs(result.errors_after).max() < 0.005
    assert np.abs(result.cv_errors).max() < 0.01
    assert np.abs(result.errors_before).mean() > 0.05  # the file's values were off: the fit had work to do
    assert all(s < 0.05 * v for s, v in zip(result.std, result.values))


def test_the_cli_writes_a_fitted_machine_file_every_command_takes(synthetic, tmp_path, capsys):
    out = tmp_path / "fitted.toml"
    rc, text, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(synthetic), "-o", str(out),
                        "--params", ",".join(p for p, _ in TRUTH), "--folds", "3", "--jobs", "1", "--json")
    assert rc == 0, err
    doc = json.loads(text)
    assert [p["path"] for p in doc["parameters"]] == [p for p, _ in TRUTH]
    assert doc["plans"] == len(SHAPES) * len(PLANS)  # every synthetic run a plan of its own: what a fold holds out
    fitted = load_machine(str(out))
    for path, truth in TRUTH:
        s = fitted.sources[path]
        assert s.value == pytest.approx(truth, rel=0.01)
        assert s.fitted and "synthetic.csv" in s.fitted and "cross-validated" in s.fitted
        assert s.provenance.startswith("FITTED:")
    untouched = load_machine(MACHINE)
    assert fitted.sources["device.hbm_efficiency"] == untouched.sources["device.hbm_efficiency"]
    rc, text, err = run(capsys, "simulate", "--machine", str(out), "--model-spec", "layers=2,hidden=256,heads=4",
                        "--gpus", "1", "--plan", "tp=1,mbs=1", "--global-batch", "2", "--json")
    assert rc == 0, err
    rc, text, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--machine", str(out),
                        "--jobs", "1", "--json")
    assert rc == 0, err
    doc = json.loads(text)
    assert doc["summary"][str(out)]["mean_abs_pct"] < 1.0
    assert doc["summary"][MACHINE]["mean_abs_pct"] > 5.0
    assert any("in-sample" in note for note in doc["notes"])
    first = doc["rows"][0]  # where a run sits and what ran, apart (fit_local.py reads "what"), and together
    assert (first["where"], first["run"]) == ("synthetic.csv line 2", f"synthetic.csv line 2: {first['what']}")
    assert first["what"].startswith("h=256 L=2 on 1 GPUs tp=1,pp=1,dp=1,mbs=1 gb=2")
    rc, text, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--machine", str(out),
                        "--jobs", "1")
    assert rc == 0, err
    lines = text.splitlines()
    assert lines[0] == f"runs: {synthetic}" and f"  column fitted.toml: {out}" in lines  # long paths: a legend
    rows = [line for line in lines if line.startswith("line ")]
    assert len(rows) == len(SHAPES) * len(PLANS)  # every row named in full, from its line number on
    assert rows[0].startswith("line 2: ") and "tp=1,pp=1,dp=1,mbs=1 gb=2" in rows[0]


def test_validate_runs_orders_plans_only_within_labels_that_have_three(synthetic, tmp_path, capsys):
    """A label of one or two runs has no order to score: the summary names no Spearman for it (it once printed an
    empty "by label:")."""
    rows = list(csv.reader(synthetic.read_text().splitlines()))
    single = tmp_path / "one-per-label.csv"
    with open(single, "w", newline="") as f:
        csv.writer(f).writerows([rows[0] + ["label"]] + [row + [f"model{i}"] for i, row in enumerate(rows[1:4])])
    rc, text, err = run(capsys, "validate", "--runs", str(single), "--machine", MACHINE, "--jobs", "1")
    assert rc == 0, err
    summary = [line for line in text.splitlines() if line.startswith(f"{MACHINE}: mean |error|")]
    assert len(summary) == 1 and summary[0].endswith("over 3 runs") and "Spearman" not in text
    rc, text, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--jobs", "1")
    assert rc == 0, err
    assert "Spearman (measured vs predicted order) by label: all " in text  # one unlabelled group of 12: scored


def test_validate_runs_leaves_out_a_run_the_twin_refuses_and_says_why(synthetic, tmp_path, capsys):
    """A measured run the memory model says cannot fit (it ran: the model is off) is not predicted, is named with
    the reason, and is left out of every column's statistics; `twin fit` still refuses such a file."""
    rows = list(csv.reader(synthetic.read_text().splitlines()))
    huge = rows[1][:]
    huge[HEADER.index("plan")], huge[HEADER.index("global_batch")] = "tp=1,dp=1,mbs=4096", "4096"
    mixed = tmp_path / "with-one-too-large.csv"
    with open(mixed, "w", newline="") as f:
        csv.writer(f).writerows(rows[:4] + [huge])
    rc, text, err = run(capsys, "validate", "--runs", str(mixed), "--machine", MACHINE, "--jobs", "1", "--json")
    assert rc == 0, err
    doc = json.loads(text)
    assert doc["summary"][MACHINE]["runs"] == 3
    last = doc["rows"][-1]
    assert last["predicted_s"][MACHINE] is None and "plan does not fit" in last["not_predicted"][MACHINE]
    assert all(row["predicted_s"][MACHINE] > 0 for row in doc["rows"][:-1])
    rc, text, err = run(capsys, "validate", "--runs", str(mixed), "--machine", MACHINE, "--jobs", "1")
    assert rc == 0 and "not predicted" in text and "over 3 runs" in text and "line 5: plan does not fit" in text
    only = tmp_path / "only-too-large.csv"
    with open(only, "w", newline="") as f:
        csv.writer(f).writerows([rows[0], huge])
    assert_user_error(*run(capsys, "validate", "--runs", str(only), "--machine", MACHINE, "--jobs", "1"),
                      "no run could be predicted")
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(mixed), "--params",
                       "device.launch_interval_us", "--folds", "0", "-o", str(tmp_path / "x.toml"))
    assert_user_error(rc, out, err, "line 5: plan does not fit")  # before any pass: nothing else on stderr
    assert not (tmp_path / "x.toml").exists()


def test_the_collective_librarys_bandwidth_per_level_is_fitted_where_the_runs_cross_it(synthetic, tmp_path, capsys):
    """The achieved fraction of the NICs' and of NVLink's bandwidth, with the host's time per op, from runs on
    two nodes made with them, written into [node.link_efficiency]; on one node's runs the NICs carry nothing, and
    fitting them is an error."""
    two_nodes = _synthetic_runs(tmp_path / "two-nodes.csv", NETWORK_TRUTH, NETWORK_SHAPES, NETWORK_PLANS)
    runs = load_runs(str(two_nodes))
    params = fit_parameters(load_machine(MACHINE), tuple(p for p, _ in NETWORK_TRUTH))
    result = fit(runs, MACHINE, (), params, folds=3, jobs=1)
    for (path, truth), value in zip(NETWORK_TRUTH, result.values):
        assert value == pytest.approx(truth, rel=0.01), path
    assert np.abs(result.errors_before).mean() > 0.05
    assert np.abs(result.errors_after).max() < 0.005
    out = tmp_path / "fitted.toml"
    rc, _, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(two_nodes), "-o", str(out), "--folds", "0",
                     "--params", ",".join(p for p, _ in NETWORK_TRUTH), "--jobs", "1", "--json")
    assert rc == 0, err
    fitted = load_machine(str(out))
    for path, truth in NETWORK_TRUTH:
        assert fitted.sources[path].fitted and fitted.sources[path].value == pytest.approx(truth, rel=0.01)
    assert fitted.node.link_efficiency["nic"] == pytest.approx(0.5, rel=0.01)
    one_node = load_runs(str(synthetic))
    with pytest.raises(TwinError, match="link_efficiency.nic has no effect"):
        fit(one_node, MACHINE, (), fit_parameters(load_machine(MACHINE), ("node.link_efficiency.nic",)), folds=0)
    machine = load_machine(MACHINE)  # by default, link levels are fitted only where a run spans nodes
    assert default_parameters(machine, [r.gpus for r in one_node]) == DEFAULT_PARAMETERS
    assert set(default_parameters(machine, [r.gpus for r in runs])) - set(DEFAULT_PARAMETERS) == {
        "node.link_efficiency.nvlink", "node.link_efficiency.nic", "node.link_efficiency.attach"}


def test_the_first_pass_over_every_run_reuses_the_subsets_last_pass(synthetic, monkeypatch):
    """Early passes over a subset, then passes over every run: the first of those starts where the subset's last
    pass was simulated, and takes those runs from it instead of simulating them again; the fit is the same."""
    from twin.fit import solve
    runs = load_runs(str(synthetic))
    params = fit_parameters(load_machine(MACHINE), tuple(p for p, _ in TRUTH))
    monkeypatch.setattr(solve, "SUBSET_MIN", 1)
    monkeypatch.setattr(solve, "SUBSET_STRIDE", 2)
    said: list[str] = []
    result = fit(runs, MACHINE, (), params, folds=0, jobs=1, say=said.append)
    reused = [line for line in said if "as simulated by the pass before" in line]
    assert reused and reused[0].startswith("pass ") and f"simulating {len(runs) - len(runs[::2])} runs" in reused[0]
    for (path, truth), value in zip(TRUTH, result.values):
        assert value == pytest.approx(truth, rel=0.01), path
    assert np.abs(result.errors_after).max() < 0.005


def test_two_parameters_that_move_every_run_alike_are_refused():
    params = fit_parameters(load_machine(MACHINE), ("device.hbm_efficiency", "device.kernel_overhead_us"))
    J = np.array([[1.0, 2.0], [2.0, 4.0001], [0.5, 1.0]])
    assert "cannot tell them apart" in _degeneracy(params, J)
    assert _degeneracy(params, np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])) is None
    assert "no effect" in _degeneracy(params, np.array([[1.0, 0.0], [2.0, 0.0]]))


def test_a_parameter_on_its_bound_is_refused():
    params = fit_parameters(load_machine(MACHINE), ("device.hbm_efficiency",))
    lo, hi = np.log([0.1]), np.log([1.0])
    assert "upper bound" in _at_bound(params, np.log([1.0]), lo, hi)
    assert _at_bound(params, np.log([0.5]), lo, hi) is None


def test_a_number_the_runs_leave_open_is_refused(synthetic, tmp_path, monkeypatch):
    """A standard error over half the value: the runs do not tell the number's size, so it is not written."""
    from twin.fit import solve
    params = fit_parameters(load_machine(MACHINE), ("device.kernel_overhead_us",))
    assert "not determined" in _undetermined(params, np.array([18.8]), np.array([19.7]))
    assert _undetermined(params, np.array([18.8]), np.array([5.0])) is None
    assert _undetermined(params, np.array([18.8]), np.array([np.nan])) is None  # an exact solve: no spread
    rows = list(csv.reader(synthetic.read_text().splitlines()))
    step = HEADER.index("step_time_s")
    for i, row in enumerate(rows[1:]):  # every other run 20% slower: a spread no parameter explains
        row[step] = repr(float(row[step]) * (1.2 if i % 2 else 1.0))
    noisy = tmp_path / "noisy.csv"
    with open(noisy, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    runs = load_runs(str(noisy))
    params = fit_parameters(load_machine(MACHINE), tuple(p for p, _ in TRUTH))
    loose = fit(runs, MACHINE, (), params, folds=0, jobs=1)  # the default threshold keeps both numbers
    assert all(0 < s <= solve.UNDETERMINED * v for s, v in zip(loose.std, loose.values))
    monkeypatch.setattr(solve, "UNDETERMINED", 0.5 * min(s / v for s, v in zip(loose.std, loose.values)))
    with pytest.raises(TwinError, match="is not determined by these runs"):
        fit(runs, MACHINE, (), params, folds=0, jobs=1)


def test_a_parameter_asked_for_that_no_run_depends_on_is_an_error(synthetic):
    runs = load_runs(str(synthetic))  # flash attention: alone it cannot make up for the slow GEMMs, and says so
    with pytest.raises(TwinError, match="lower bound"):
        fit(runs, MACHINE, (), fit_parameters(load_machine(MACHINE), ("device.attention_efficiency",)), folds=0)
    unfused = load_runs(str(synthetic), "attention=unfused")  # no flash kernel at all
    with pytest.raises(TwinError, match="attention_efficiency has no effect"):
        fit(unfused, MACHINE, (), fit_parameters(load_machine(MACHINE), ("device.attention_efficiency",)), folds=0)


@pytest.mark.parametrize("name", sorted(VALIDATION_FILES))
def test_validation_data_is_never_fitted(name, tmp_path, capsys):
    validation = REPO / "benchmarks" / "data" / name
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(validation), "-o", str(tmp_path / "x.toml"))
    assert_user_error(rc, out, err, "validation data")
    renamed = tmp_path / "my-runs.csv"
    renamed.write_bytes(validation.read_bytes())  # the digest in VALIDATION_FILES is this file's: a copy is refused
    with pytest.raises(TwinError, match="validation data"):
        check_calibration_file(str(renamed))
    assert not (tmp_path / "x.toml").exists()


def test_no_fitted_machine_file_was_fitted_on_validation_data():
    fitted = sorted((REPO / "topologies").rglob("*.toml"))
    assert any(p.parent.name == "fitted" for p in fitted)  # `make fit`'s files are among those checked
    for path in fitted:
        for key, s in load_machine(str(path)).sources.items():
            for name in VALIDATION_FILES:
                assert not (s.fitted and name in s.fitted), f"{path.name}: {key} was fitted on {name}"


def test_fit_input_errors_name_the_row_and_field(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("layers,hidden,heads,seq,gpus,plan,global_batch,step_time_ms\n"
                   "2,256,4,256,1,tp=1,dp=1,2,1.5\n")  # a plan with a comma must be quoted: this row has 9 cells
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(bad), "-o", str(tmp_path / "o.toml"))
    assert_user_error(rc, out, err, "bad.csv line 2")
    bad.write_text('layers,hidden,heads,seq,gpus,plan,global_batch,step_time_ms\n2,256,4,256,1,"tp=1",2,-1\n')
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(bad), "-o", str(tmp_path / "o.toml"))
    assert_user_error(rc, out, err, "line 2", "step_time_ms", "positive")
    bad.write_text("layers,hidden,seq,gpus,plan,global_batch,step_time_ms\n")
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(bad), "-o", str(tmp_path / "o.toml"))
    assert_user_error(rc, out, err, "heads")
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(bad), "-o",
                       str(REPO / "topologies" / "dgx-a100-800g.toml"))
    assert_user_error(rc, out, err, "is the input --machine")
    bad.write_text('layers,hidden,heads,seq,gpus,plan,global_batch,step_time_ms\n2,256,4,256,1,"tp=1",2,1.5\n')
    rc, out, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(bad), "--assume", "dropout=off",
                       "-o", str(tmp_path / "o.toml"))
    assert_user_error(rc, out, err, "line 2", "--assume dropout='off' must be 0 or 1")
    assert not (tmp_path / "o.toml").exists()
    assert [r.model.dropout for r in load_runs(str(bad), "dropout=0") + load_runs(str(bad))] == [False, True]


def test_vtrains_columns_are_read_as_they_are():
    runs = load_runs(str(REPO / "benchmarks" / "data" / "a100-megatron-multi-node.csv"), "attention=unfused")
    assert len(runs) == 88
    first = runs[0]
    assert (first.label, first.gpus, first.model.hidden, first.model.layers, first.model.seq) == ("3.6", 64, 3072, 30,
                                                                                                2048)
    assert (first.plan.gx, first.plan.gdata, first.plan.pp, first.plan.mbs, first.plan.global_batch) == (1, 64, 1, 8,
                                                                                                         512)
    assert first.plan.attention == "unfused"
    assert first.step_time_s == pytest.approx(3.5665)


def test_megatron_sc21_runs_are_table_1_of_the_paper_run_backwards():
    """Each step time is the paper's equation (3) FLOPs over the TF/s its source column quotes; each plan fills the
    run's GPUs, and an interleaved one splits the stage's layers evenly into the script's chunks."""
    runs = load_runs(str(REPO / "benchmarks" / "data" / "megatron-sc21-table1.csv"), "attention=unfused")
    assert [r.gpus for r in runs] == [32, 64, 128, 256, 512, 1024, 1536, 1920, 2520, 3072]
    for r in runs:
        m, p = r.model, r.plan
        tflops = float(re.search(r"Table 1: ([0-9.]+) TF/s per GPU", r.source).group(1))
        flops = 96 * p.global_batch * m.seq * m.layers * m.hidden ** 2 * (
            1 + m.seq / (6 * m.hidden) + m.vocab / (16 * m.layers * m.hidden))
        assert r.step_time_s == pytest.approx(flops / (tflops * 1e12 * r.gpus), rel=1e-4), r.label
        assert p.gx * p.pp * p.gdata == r.gpus
        assert m.layers % (p.pp * p.vpp) == 0
        assert (p.global_batch // (p.gdata * p.mbs)) % p.pp == 0  # Megatron's interleaving needs it; 1F1B is fine
    assert [r.plan.vpp for r in runs] == [1, 1, 1, 1, 1, 3, 2, 2, 3, 1]
    assert "tp=8,pp=4,dp=32,mbs=2,vpp=3 gb=1792" in what_ran(runs[5])  # validate --runs' rows show the interleaving


@pytest.mark.parametrize("name, count, gpus, peak", [
    ("mpt-a100-40gb-one-node.csv", 46, {8}, 312e12),
    ("mpt-a100-40gb-multi-node.csv", 32, {16, 32, 64, 128}, 312e12),
    ("mpt-a100-80gb.csv", 61, {8, 32, 64}, 312e12),
    ("mpt-h100-80gb-one-node.csv", 37, {8}, 989e12),
    ("mpt-h100-80gb-multi-node.csv", 33, {16, 32, 64, 128, 256, 512}, 989e12),
    ("mpt-h100-80gb-fp8-one-node.csv", 7, {8}, 1979e12)])
def test_mosaicml_runs_reproduce_the_tables_mfu(name, count, gpus, peak):
    """Each MPT row's step time is its tokens over the tokens per second its source quotes, its plan FSDP over every
    GPU with the table's micro-batch (resharding the weights after the forward where the table says FULL_SHARD),
    and MosaicML's MFU formula ((3 x 2 N s + 3 x 4 l h s^2) per sequence over the GPU's dense bf16 peak, 312 TF/s
    for an A100 and 989 for an H100; the H100's dense FP8 peak, 1,979, for its amp_fp8 runs) on the row's shape
    gives the MFU the table prints: the shapes, the vocabulary and the throughput were copied right."""
    runs = load_runs(str(REPO / "benchmarks" / "data" / name), "dropout=0")
    assert len(runs) == count and {r.gpus for r in runs} == gpus
    for r in runs:
        m, p = r.model, r.plan
        tokens_per_s = float(re.search(r"\): (\d+) tokens/s", r.source).group(1))
        mfu = float(re.search(r"MFU ([0-9.]+)%", r.source).group(1)) / 100
        assert r.step_time_s == pytest.approx(p.global_batch * m.seq / tokens_per_s, rel=1e-5)
        assert (p.gz, p.gx * p.gy * p.gdata * p.pp) == (r.gpus, 1) and p.attention == "flash"
        assert p.fp8 == ("amp_fp8" in r.source) and p.fp8recipe == ("delayed" if p.fp8 else "current")  # TE 0.10
        assert p.recompute == ("full" if "checkpointing True" in r.source else "none")
        assert p.reshard == ("FSDP FULL_SHARD" in r.source) != ("FSDP SHARD_GRAD_OP" in r.source)
        per_sequence = 3 * 2 * m.params * m.seq + 3 * m.layers * 4 * m.hidden * m.seq ** 2
        assert per_sequence * tokens_per_s / m.seq / (r.gpus * peak) == pytest.approx(mfu, rel=1e-3), r.where


def test_korthikanti_runs_pair_full_recompute_with_sequence_parallel_selective_recompute():
    """Table 5's eight runs: each model once with full recompute and once with sequence parallelism and selective
    recompute on the same GPUs and batch; each step time is the seconds its source column quotes."""
    runs = load_runs(str(REPO / "benchmarks" / "data" / "megatron-korthikanti-table5.csv"), "attention=unfused")
    assert [r.label for r in runs] == ["22B", "22B", "175B", "175B", "530B", "530B", "1T", "1T"]
    for full, selective in zip(runs[::2], runs[1::2]):
        assert (full.plan.recompute, full.plan.sp, selective.plan.recompute, selective.plan.sp) == ("full", False,
                                                                                                    "selective", True)
        assert (full.model, full.gpus, full.plan.global_batch) == (selective.model, selective.gpus,
                                                                   selective.plan.global_batch)
    for r in runs:
        m, p = r.model, r.plan
        seconds = float(re.search(r"Table 5: ([0-9.]+) s per iteration", r.source).group(1))
        assert r.step_time_s == pytest.approx(seconds)
        assert (p.gx, p.gdata, p.gx * p.pp) == (8, 1, r.gpus)
        assert m.layers % (p.pp * p.vpp) == 0 and (p.global_batch // p.mbs) % p.pp == 0
    assert [r.plan.vpp for r in runs[::2]] == [1, 3, 3, 1]
    # Megatron-LM's README of 2022-05-19 (841f789f48): the selective runs' model FLOPs utilization, dp=1
    for r, mfu in zip(runs[1::2], (0.415, 0.514, 0.560, 0.563)):
        m, p = r.model, r.plan
        flops = 72 * p.global_batch * m.seq * m.layers * m.hidden ** 2 * (
            1 + m.seq / (6 * m.hidden) + m.vocab / (12 * m.layers * m.hidden))
        assert r.step_time_s == pytest.approx(flops / (mfu * 312e12 * r.gpus), rel=5e-3), r.label
    assert "tp=8,pp=8,dp=1,mbs=1,vpp=3,sp=1,recompute=selective gb=64" in what_ran(runs[3])
    assert "recompute" not in what_ran(runs[2])  # full, the plans' default, is not named


def test_rewrite_replaces_only_the_fitted_lines_and_adds_missing_keys():
    text = ('# a comment\n[device]\nname = "x"\nhbm_efficiency = { value = 0.8, estimate = "guess" }  \n'
            '[node]\ngpus = 1\n')
    out = rewrite(text, {"device.hbm_efficiency": (0.61, 'twin fit on "a.csv"'),
                         "device.launch_interval_us": (33.0, "twin fit")})
    lines = out.splitlines()
    assert lines[0] == "# a comment" and 'name = "x"' in lines
    assert 'hbm_efficiency = { value = 0.61, fitted = "twin fit on \\"a.csv\\"" }' in lines
    assert lines.index('launch_interval_us = { value = 33, fitted = "twin fit" }') < lines.index("[node]")
    with pytest.raises(TwinError, match="no \\[network\\] table"):
        rewrite(text, {"network.oversubscription": (1.0, "x")})


def test_a_fitted_file_the_loader_rejects_is_never_written(tmp_path):
    base = REPO / "topologies" / f"{MACHINE}.toml"
    out = tmp_path / "f.toml"
    with pytest.raises(TwinError):
        write_fitted(str(base), {"device.hbm_efficiency": (1.5, "out of range")}, str(out))
    assert not out.exists() and not list(tmp_path.iterdir())


def test_twin_run_summaries_are_measured_runs_too(tmp_path, capsys):
    """`twin run --json` prints the schedule it executed beside the step: the fit simulates that schedule."""
    ir = tmp_path / "step.json"
    rc, _, err = run(capsys, "export", "--machine", MACHINE, "--model-spec", "layers=2,hidden=256,heads=4,seq=128",
                     "--gpus", "2", "--plan", "tp=2,mbs=1", "--global-batch", "2", "-o", str(ir))
    assert rc == 0, err
    summaries = tmp_path / "measured.json"
    summaries.write_text(json.dumps([{"schedule": "step.json", "step_time_s": 0.01, "gpus": 2, "model": "tiny"},
                                     {"schedule": str(ir), "step_time_s": 0.02, "gpus": 2}]))
    runs = load_runs(str(summaries))
    assert [r.schedule for r in runs] == [str(ir), str(ir)] and runs[1].step_time_s == 0.02
    rc, out, err = run(capsys, "validate", "--runs", str(summaries), "--machine", MACHINE, "--jobs", "1", "--json")
    assert rc == 0, err
    rows = json.loads(out)["rows"]
    assert rows[0]["predicted_s"][MACHINE] == rows[1]["predicted_s"][MACHINE] > 0
    summaries.write_text(json.dumps({"schedule": "gone.json", "step_time_s": 0.01, "gpus": 2}))
    rc, out, err = run(capsys, "validate", "--runs", str(summaries), "--machine", MACHINE)
    assert_user_error(rc, out, err, "measured.json entry 1", "schedule")


def test_carrying_a_fit_to_another_machine_says_where_it_came_from(synthetic, tmp_path, capsys):
    donor = tmp_path / "donor.toml"
    rc, _, err = run(capsys, "fit", "--machine", MACHINE, "--runs", str(synthetic), "-o", str(donor), "--params",
                     "device.empirical_gemm_bf16_tflop_per_s", "--folds", "0", "--jobs", "1")
    assert rc == 0, err
    out = tmp_path / "perlmutter.toml"
    rc, text, err = run(capsys, "fit", "--machine", "perlmutter", "--from", str(donor), "-o", str(out), "--params",
                        "device.empirical_gemm_bf16_tflop_per_s")
    assert rc == 0, err
    carried = load_machine(str(out))
    assert carried.name == "perlmutter"
    s = carried.sources["device.empirical_gemm_bf16_tflop_per_s"]
    assert s.value == pytest.approx(load_machine(str(donor)).device.empirical_gemm_flop_per_s / 1e12)
    assert "carried from donor.toml" in s.fitted and "synthetic.csv" in s.fitted
    rc, text, err = run(capsys, "fit", "--machine", "perlmutter", "--from", str(donor), "-o", str(out), "--params",
                        "device.hbm_efficiency")
    assert_user_error(rc, text, err, "was not fitted there")
    # --set with --from: the what-if is written too, marked as set (it was once dropped without a word), and a
    # number both set and carried is refused
    rc, text, err = run(capsys, "fit", "--machine", "perlmutter", "--from", str(donor), "-o", str(out), "--params",
                        "device.empirical_gemm_bf16_tflop_per_s", "--set", "device.hbm_bw_gb_per_s=1234")
    assert rc == 0, err
    s = load_machine(str(out)).sources["device.hbm_bw_gb_per_s"]
    assert s.value == 1234 and "set with --set for twin fit --from donor.toml" in s.provenance
    rc, text, err = run(capsys, "fit", "--machine", "perlmutter", "--from", str(donor), "-o", str(out), "--params",
                        "device.empirical_gemm_bf16_tflop_per_s", "--set", "device.empirical_gemm_bf16_tflop_per_s=9")
    assert_user_error(rc, text, err, "--set device.empirical_gemm_bf16_tflop_per_s and --params carries it")


def test_validate_runs_needs_a_machine_and_the_published_rows_take_none(synthetic, capsys):
    rc, out, err = run(capsys, "validate", "--runs", str(synthetic))
    assert_user_error(rc, out, err, "--machine")
    rc, out, err = run(capsys, "validate", "--machine", MACHINE)
    assert_user_error(rc, out, err, "--runs")


def test_validate_runs_takes_a_what_if_for_every_machine_and_refuses_the_published_rows_flags(synthetic, capsys):
    """The synthetic runs were simulated at TRUTH: --set TRUTH predicts them exactly; the file's numbers do not
    (--set with --runs was once ignored without a word)."""
    what_if = [a for path, value in TRUTH for a in ("--set", f"{path}={value}")]
    rc, out, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--json", "--jobs", "1",
                       *what_if)
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["overrides"] == dict(TRUTH)
    assert doc["summary"][MACHINE]["max_abs_pct"] < 0.01
    rc, out, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--json", "--jobs", "1")
    assert rc == 0 and json.loads(out)["summary"][MACHINE]["mean_abs_pct"] > 5
    for flags in (["--readme", "README.md"], ["--figures"], ["--sections", "A"], ["--first-principles-only"]):
        rc, out, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, *flags)
        assert_user_error(rc, out, err, f"{flags[0]}: for the published rows only")


def test_the_measured_vs_predicted_figure_is_a_png(tmp_path):
    from twin.figures import measured_vs_predicted_figure

    out = tmp_path / "fit.png"
    measured_vs_predicted_figure(str(out), [("one node", [0.1, 0.2, 0.4], {"fitted": [0.11, 0.19, 0.5]}),
                                            ("cluster", [3.0, 9.0], {"a": [2.5, 9.5], "b": [3.1, 8.0]})], "t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["fit.png"]  # written whole, no temporary left


def test_a_number_on_its_upper_bound_is_probed_downward_not_called_idle():
    """hbm_efficiency = 1 (the executor's calibrated files) sits on its upper bound: a step that depends on it
    must not be reported as depending on nothing (a forward difference would be clamped back to 1)."""
    from types import SimpleNamespace

    from twin.fit.params import FitParameter
    from twin.fit.solve import _drop_idle

    param = FitParameter("device.hbm_efficiency", 0.1, 1.0, "efficiency")

    class Steps:  # a step of 1 s of element-wise work at efficiency 1, slower at lower efficiency
        def steps(self, x):
            return np.array([1.0 / min(float(np.exp(x[0])), 1.0)])

    runs = [SimpleNamespace(step_time_s=1.2)]
    kept, idle = _drop_idle((param,), Steps(), np.log([1.0]), runs, np.arange(1), explicit=True)
    assert kept == (param,) and idle == ()


def test_the_fp8_gemm_rate_is_fitted_from_fp8_runs_and_refused_from_bf16_ones(tmp_path):
    """On an H100 file, runs simulated with FP8 linears at 1,100 TF/s give that rate back from the file's 1,507;
    the same parameter asked of runs without FP8 is one no run depends on (refused)."""
    machine_name, truth = "mpt-h100-80g", (("device.empirical_gemm_fp8_tflop_per_s", 1100.0),)
    machine = load_machine(machine_name, truth)

    def runs(fp8: int):
        path = tmp_path / f"fp8-{fp8}.csv"
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(HEADER)
            for layers, hidden, heads in [(2, 2048, 16), (2, 4096, 32)]:
                model = ModelSpec("m", layers, hidden, heads, seq=1024)
                for gpus, plan, batch in [(1, f"tp=1,mbs=1,recompute=none,fp8={fp8}", 2),
                                          (2, f"tp=2,sp=1,mbs=2,recompute=none,fp8={fp8}", 4)]:
                    p = parse_plan(f"{plan},global_batch={batch}")
                    step = simulate_step(model, p, machine, gpus).step_time_s
                    w.writerow([layers, hidden, heads, 1024, gpus, plan, batch, repr(step), "simulated at the truth"])
        return load_runs(str(path))

    params = fit_parameters(load_machine(machine_name), tuple(p for p, _ in truth))
    result = fit(runs(1), machine_name, (), params, folds=0, jobs=1)
    assert result.values[0] == pytest.approx(1100.0, rel=0.01)
    assert np.abs(result.errors_before).mean() > 0.03
    with pytest.raises(TwinError, match="empirical_gemm_fp8_tflop_per_s has no effect"):
        fit(runs(0), machine_name, (), params, folds=0, jobs=1)
    with pytest.raises(TwinError, match="empirical_gemm_fp8"):
        fit_parameters(load_machine(MACHINE), tuple(p for p, _ in truth))  # an A100 file has no FP8 rate
