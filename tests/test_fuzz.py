"""Random steps and IR files through `twin simulate` (benchmarks/fuzz.py): a sane result or a one-line error,
never a crash, a hang or a throughput above the device's peak (issue 14). The IR fields of version 2 (the plan,
the ops' tags) are also set one at a time to each odd value.

The default suite runs 300 seeded cases and a hypothesis search over the same choices (which shrinks a
failing case to a small one and prints it); the slow suite runs 10,000 seeded cases. A failure names every
bad case's seed and command line.
"""

from __future__ import annotations

import json
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


def _with(doc: dict, where: tuple, value: object) -> bytes:
    """The IR document with the field at path `where` set to `value` (deleted for _DELETE), as file bytes."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in where[:-1]:
        node = node[key]
    if value is _DELETE:
        node.pop(where[-1], None)
    else:
        node[where[-1]] = value
    return json.dumps(doc).encode()


_DELETE = object()


def test_every_plan_and_tag_field_with_every_odd_value_is_a_result_or_a_one_line_error():
    """The fields IR version 2 added (StepInfo.plan, Op.tag) one at a time: each odd value, and each field left
    out, gives a sane result or a one-line error, never a crash."""
    base = fuzz._base_schedules()[0]  # the smaller step: every error is a parse of the whole file
    op = base["programs"][0]["ops"][3]
    paths = [("info", "plan", name) for name in base["info"]["plan"]]
    paths += [("programs", 0, "ops", 3, "tag", name)
              for name in ("micro_batch", "chunk", "phase", "layer", "block", "role")]
    assert "tag" in op and len(paths) > 20
    bad = []
    for where in paths:
        for value in (*fuzz.ODD_VALUES, _DELETE):
            outcome = fuzz.run_ir_case(_with(base, where, value), timeout_s=60)
            if outcome.kind not in ("ok", "error"):
                bad.append(f"{where} = {value!r}: {outcome.kind}: {outcome.detail}")
    assert not bad, "\n".join(bad[:20])
