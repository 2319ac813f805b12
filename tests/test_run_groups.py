"""`twin validate --runs FILE --by FIELDS`: each group's mean and mean |error|, worked out by hand on made-up
runs, and from the command on the synthetic runs of test_fit (each group's numbers are its rows' errors)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_cli import assert_user_error, run
from test_fit import MACHINE, _synthetic_runs
from twin.errors import TwinError
from twin.model import ModelSpec
from twin.plan import parse_plan
from twin.run_groups import format_groups, group_errors, parse_group_fields
from twin.runs import MeasuredRun


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return _synthetic_runs(tmp_path_factory.mktemp("runs") / "synthetic.csv")


def measured(line: int, plan: str, hidden: int, step_s: float, label: str = "") -> MeasuredRun:
    p = parse_plan(f"{plan},global_batch=8")
    return MeasuredRun("made.csv", line, label, ModelSpec("m", 2, hidden, 8, seq=128), p, p.gx * p.gdata, step_s,
                       "made up")


def test_each_group_is_the_mean_of_its_runs_errors_in_the_fields_order():
    runs = [measured(2, "tp=2,dp=1,mbs=1", 512, 1.0), measured(3, "tp=1,dp=2,mbs=1", 512, 2.0),
            measured(4, "tp=2,dp=1,mbs=2", 1024, 4.0), measured(5, "tp=1,dp=2,mbs=1", 1024, 1.0)]
    columns = {"a": np.array([1.1, 1.0, 3.0, 1.4]), "b": np.array([1.0, 2.0, 4.0, 1.0])}
    groups = group_errors(runs, columns, ("tp",))
    assert [g["key"] for g in groups] == [{"tp": 1}, {"tp": 2}]
    assert [g["runs"] for g in groups] == [2, 2]
    tp1, tp2 = (g["error_pct"]["a"] for g in groups)
    assert tp1 == pytest.approx({"mean": (-50 + 40) / 2, "mean_abs": (50 + 40) / 2})
    assert tp2 == pytest.approx({"mean": (10 - 25) / 2, "mean_abs": (10 + 25) / 2})
    assert all(g["error_pct"]["b"] == {"mean": 0.0, "mean_abs": 0.0} for g in groups)
    two = group_errors(runs, columns, ("hidden", "mbs"))
    assert [tuple(g["key"].values()) for g in two] == [(512, 1), (1024, 1), (1024, 2)]
    lines = format_groups(two, ("hidden", "mbs"), ["a", "b"])
    assert lines[2].startswith("hidden=512 mbs=1") and "-20.0%" in lines[2] and "30.0%" in lines[2]  # +10%, -50%
    long = "topologies/fitted/a-machine-file-with-a-long-name.toml"
    renamed = group_errors(runs, {"dgx-a100": columns["a"], long: columns["b"]}, ("tp",))
    heading = format_groups(renamed, ("tp",), ["dgx-a100", long])[0]
    assert heading.split()[-2:] == ["dgx-a100", "...th-a-long-name.toml"]  # a file by its name, cut from the left


def test_interleaved_runs_group_by_their_chunks():
    runs = [measured(2, "tp=1,pp=2,dp=1,mbs=1", 512, 1.0), measured(3, "tp=1,pp=2,dp=1,mbs=1,vpp=2", 512, 1.0),
            measured(4, "tp=1,pp=2,dp=1,mbs=1,vpp=2", 512, 2.0)]
    groups = group_errors(runs, {"a": np.array([0.9, 0.8, 1.8])}, ("vpp",))
    assert [(g["key"]["vpp"], g["runs"]) for g in groups] == [(1, 1), (2, 2)]
    assert groups[1]["error_pct"]["a"] == pytest.approx({"mean": -15.0, "mean_abs": 15.0})


def test_a_run_that_does_not_say_a_field_groups_apart():
    """An executed schedule has no model or plan: its group reads '-' and sorts last."""
    runs = [measured(2, "tp=2,dp=1,mbs=1", 512, 1.0),
            MeasuredRun("made.json", 1, "", None, None, 2, 1.0, "executed", schedule="step.json")]
    groups = group_errors(runs, {"a": np.array([1.0, 1.5])}, ("tp",))
    assert [g["key"]["tp"] for g in groups] == [2, None]
    assert "tp=-" in format_groups(groups, ("tp",), ["a"])[-1]


@pytest.mark.parametrize("text, says", [("tp,foo", "'foo' is not a field"), ("tp,tp", "named twice"),
                                        ("", "'' is not a field")])
def test_fields_are_known_and_named_once(text, says):
    with pytest.raises(TwinError, match=says):
        parse_group_fields(text)


def test_the_command_prints_and_writes_the_groups(synthetic, capsys):
    rc, text, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--jobs", "1",
                        "--by", "gpus,tp", "--json")
    assert rc == 0, err
    doc = json.loads(text)
    assert doc["by"]["fields"] == ["gpus", "tp"]
    for group in doc["by"]["groups"]:
        plan = f"tp={group['key']['tp']},"
        errors = [row["error_pct"][MACHINE] for row in doc["rows"]
                  if plan in row["run"] and f"on {group['key']['gpus']} GPUs" in row["run"]]
        assert group["runs"] == len(errors) > 0
        assert group["error_pct"][MACHINE]["mean"] == pytest.approx(np.mean(errors))
    assert sum(g["runs"] for g in doc["by"]["groups"]) == len(doc["rows"])
    rc, text, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--jobs", "1",
                        "--by", "tp")
    assert rc == 0, err
    assert "by tp" in text and "tp=1" in text and "tp=2" in text


def test_by_goes_with_runs_and_names_its_fields(synthetic, capsys):
    rc, out, err = run(capsys, "validate", "--by", "tp")
    assert_user_error(rc, out, err, "--runs")
    rc, out, err = run(capsys, "validate", "--runs", str(synthetic), "--machine", MACHINE, "--by", "tp,flops")
    assert_user_error(rc, out, err, "'flops' is not a field")
