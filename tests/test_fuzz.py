"""Random steps and IR files through `twin simulate` (benchmarks/fuzz.py): a sane result or a one-line error,
never a crash, a hang or a throughput above the device's peak (issue 14).

The default suite runs 300 seeded cases and a hypothesis search over the same choices (which shrinks a
failing case to a small one and prints it); the slow suite runs 10,000 seeded cases. A failure names every
bad case's seed and command line.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fuzz  # noqa: E402


def _report(bad) -> str:
    return "\n".join(f"seed {s}: {o.kind}: {o.detail}\n  twin {' '.join(a)}" for s, a, o in bad)


def test_random_cases_are_results_or_one_line_errors():
    counts, bad = fuzz.run_cases(300, seed=0, timeout_s=60)
    assert not bad, _report(bad)
    assert counts["ok"] >= 30, counts  # the generator reaches the simulator, not only validation


@pytest.mark.slow
def test_ten_thousand_random_cases():
    counts, bad = fuzz.run_cases(10_000, seed=1_000_000, timeout_s=60)
    assert not bad, _report(bad)
    assert counts["ok"] >= 1000, counts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.data())
def test_hypothesis_search_finds_no_crash(data):
    argv = fuzz.draw_case(lambda options: data.draw(st.sampled_from(list(options))))
    outcome = fuzz.run_case(argv, timeout_s=60)
    assert outcome.kind in ("ok", "error"), f"{outcome.kind}: {outcome.detail}\n  twin {' '.join(argv)}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(st.data())
def test_hypothesis_search_over_ir_files_finds_no_crash(data):
    ir = fuzz.draw_ir_case(lambda options: data.draw(st.sampled_from(list(options))))
    outcome = fuzz.run_ir_case(ir, timeout_s=60)
    assert outcome.kind in ("ok", "error"), f"{outcome.kind}: {outcome.detail}\n  IR file: {ir[:2000]!r}"
