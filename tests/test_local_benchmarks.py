"""The host-loop benchmarks' own logic (benchmarks/fit_local.py, launch_noise.py), without executing anything."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from fit_local import median_launches  # noqa: E402
from launch_noise import main as launch_noise  # noqa: E402


def _launch(step_s: float, tag: str) -> dict:
    return {"step_time_s": step_s, "run": tag}


def test_the_median_launch_of_each_plan_is_compared():
    """Three rounds of two plans: each plan's middle launch, whichever round it came from; with two launches the
    lower one."""
    rounds = [[_launch(0.30, "a1"), _launch(0.90, "b1")],
              [_launch(0.20, "a2"), _launch(0.70, "b2")],
              [_launch(0.25, "a3"), _launch(0.80, "b3")]]
    assert [s["run"] for s in median_launches(rounds)] == ["a3", "b3"]
    assert [s["run"] for s in median_launches(rounds[:2])] == ["a2", "b2"]
    assert [s["run"] for s in median_launches(rounds[:1])] == ["a1", "b1"]


@pytest.mark.parametrize("argv, field", [(["--launches", "1"], "--launches"),
                                         (["--machine", "no/such.toml"], "--machine")])
def test_launch_noise_refuses_bad_arguments_before_measuring(argv, field, capsys):
    with pytest.raises(SystemExit) as stop:
        launch_noise(argv)
    assert stop.value.code == 2
    assert field in capsys.readouterr().err
