"""Op meaning travels as typed fields, not in names (issue 16, items 1 and 2).

The builder tags every op (twin.ir.OpTag) and records its plan as a
ParallelPlan (StepInfo.plan); its names are labels. So no source outside the
builder may take an op name apart again: this test greps twin/, executor/ and
tests/ for the regexes and string surgery that once read the name grammar
mb<i>[.c<j>].<pass>.L<n>.<block>.<role> (search passes and bound, numerics,
tests), and for plan text parsed back from a schedule. Renaming an op can
then no longer quietly weaken the search's bounds or make numerics skip roles.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WRITERS = (REPO / "twin" / "builders",)  # where names are written: the only place that knows their grammar
THIS = Path(__file__).resolve()

# Each pattern with a line of the code it was written against (all removed by issue 16).
PATTERNS = {
    "a regex over micro-batch tags": (r"mb\(?(\?P<\w+>)?\\d", r'_NAME = re.compile(r"^mb(?P<mb>\d+)(?:\.c\d+)?\.")'),
    "a regex over layers in names": (r"\\\.\(?L\\d", r'_PASS_OF_LAYER = re.compile(r"^(mb\d+\.(?:c\d+\.)?\w+\.L\d+)\.")'),
    "a regex over the passes in names": (r"fwd\|rc\|bwd|fwd\|bwd", r'ATTENTION_OP = re.compile(r"\.(fwd|rc|bwd)\.")'),
    "a name split into its parts": (r"\b(op|o)\.name\.(r?split|r?partition|startswith|endswith|remove(pre|suf)fix)\(",
                                    'tag = op.name.partition(".")[0]'),
    "a part of a name looked for": (r"\bin (op|o)\.name\b", 'accs = [op for op in ops if ".acc." in op.name]'),
    "a pass read from a name's parts": (r'split\("\."\)\[-2\]', 'kind = key.split(".")[-2]'),
    "a linear read from a name's parts": (r'\binfo\.name\.split\(', 'want = shapes[info.name.split(".")[-1]]'),
    "plan text parsed back from a schedule": (r"parse_plan\([^)]*info\.plan", "plan = parse_plan(schedule.info.plan)"),
}


def sources() -> list[Path]:
    files = [p for folder in ("twin", "executor", "tests") for p in sorted((REPO / folder).rglob("*.py"))]
    return [p for p in files if p.resolve() != THIS and not any(w in p.resolve().parents for w in WRITERS)]


@pytest.mark.parametrize("what", PATTERNS)
def test_each_pattern_catches_the_code_it_was_written_against(what):
    pattern, old_line = PATTERNS[what]
    assert re.search(pattern, old_line), (what, old_line)


def test_no_source_outside_the_builder_parses_op_names_or_plan_text():
    found = []
    for path in sources():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for what, (pattern, _) in PATTERNS.items():
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(REPO)}:{number}: {what}: {line.strip()}")
    assert len(sources()) > 100
    assert not found, "read the op's tag (twin.ir.OpTag) or the plan (StepInfo.plan) instead:\n" + "\n".join(found)
