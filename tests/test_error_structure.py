"""benchmarks/error_structure.py's residual: the error left after one geometric-mean factor per group of runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from error_structure import main, residual_error  # noqa: E402


def _row(tp: int, mbs: int, measured: float, predicted: float) -> dict:
    return {"model": "m", "tp": tp, "mbs": mbs, "measured_s": measured, "predicted_s": predicted}


def test_a_factor_per_group_removes_an_error_that_follows_the_group_and_nothing_else():
    # tp=2 predicted 20% fast at every micro-batch size, tp=8 5% fast: a factor per tp explains all of it
    rows = [_row(2, m, 1.0, 0.8) for m in (1, 2, 4)] + [_row(8, m, 2.0, 1.9) for m in (1, 2)]
    assert residual_error(rows, lambda r: r["tp"]) == (2, pytest.approx(0.0, abs=1e-12))
    groups, one_factor = residual_error(rows, lambda r: ())
    assert groups == 1 and one_factor > 0.05


def test_what_varies_inside_a_group_is_left():
    # the same layout measured 10% over and 10% under its prediction: the geometric mean factor is ~1
    rows = [_row(4, 1, 1.1, 1.0), _row(4, 2, 0.9, 1.0)]
    groups, error = residual_error(rows, lambda r: r["tp"])
    assert groups == 1
    factor = (1.1 * 0.9) ** 0.5
    assert error == pytest.approx((abs(factor / 1.1 - 1) + abs(factor / 0.9 - 1)) / 2, rel=1e-9)
    assert error > 0.09


def test_an_unknown_machine_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--machine", "no-such-machine.toml"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--machine" in err and "not found" in err and "\n" not in err
