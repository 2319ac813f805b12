"""What-if values for a machine file's numbers: ``--set device.attention_efficiency=0.5``.

A prediction rests on the machine file's numbers, and some of them are
estimates. A user who has measured one (a GEMM rate, an all-reduce bandwidth)
or who wants to know how much an estimate matters replaces it on the command
line instead of copying the file. An override names a number by the dotted
path the loader records its provenance under (``twin machines NAME`` lists
them) and goes through the same checks as the file: it is written into the
parsed file before the file is read, so topologies.schema checks it as it
checks every number (finite, in its range, below the physical limit of its
unit; a non-number or inf/nan is refused here already). Its provenance
becomes an estimate that says it was set on the command line, so nothing
downstream mistakes it for a sourced figure, and the machine keeps the list
of overrides, so cached results of the plain file are never served for it.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from topologies.errors import InputError

_STEP = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?$")

Override = tuple[str, float]


def parse_override(text: str) -> Override:
    """``PATH=VALUE`` -> (path, value); a one-line InputError naming the fix otherwise."""
    path, sep, value = text.partition("=")
    path, value = path.strip(), value.strip()
    if not sep or not path or not value:
        raise InputError(f"--set {text!r} must be FIELD=VALUE, e.g. device.attention_efficiency=0.5; "
                        "`twin machines NAME` lists the fields")
    try:
        number = float(value)
    except ValueError:
        raise InputError(f"--set {path}: value {value!r} is not a number") from None
    if not math.isfinite(number):
        raise InputError(f"--set {path}: value {value!r} must be finite")
    return path, number


def number_paths(table: dict[str, Any], prefix: str = "") -> list[str]:
    """Every dotted path of a sourced number (an inline table with a value) in a parsed machine file."""
    paths = []
    for key, value in table.items():
        here = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            paths.extend([here] if "value" in value else number_paths(value, here))
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    paths.extend(number_paths(item, f"{here}[{i}]"))
    return paths


def _entry(data: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The inline table at ``path``, or None when the path does not name a sourced number."""
    node: Any = data
    for step in path.split("."):
        m = _STEP.match(step)
        if m is None or not isinstance(node, dict) or m.group(1) not in node:
            return None
        node = node[m.group(1)]
        if m.group(2) is not None:
            index = int(m.group(2))
            if not isinstance(node, list) or index >= len(node):
                return None
            node = node[index]
    return node if isinstance(node, dict) and "value" in node else None


def apply_overrides(data: dict[str, Any], overrides: tuple[Override, ...], origin: str) -> None:
    """Replace each named number in the parsed file ``data`` (in place), marking it as set here. A number set
    twice takes the last value."""
    for path, value in dict(overrides).items():
        entry = _entry(data, path)
        if entry is None:
            close = difflib.get_close_matches(path, number_paths(data), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else f"; `twin machines` lists the fields of {origin}"
            raise InputError(f"--set {path}: {origin} has no such number{hint}")
        was = entry["value"]
        if isinstance(was, int) and not isinstance(was, bool) and value.is_integer():
            value = int(value)
        entry.clear()
        entry.update(value=value, estimate=f"set on the command line (--set); the file says {was}")


def describe_overrides(overrides: dict[str, float] | tuple[Override, ...]) -> str:
    """One line for output: "machine file overridden: a=1, b=2" (empty when nothing was set)."""
    pairs = overrides.items() if isinstance(overrides, dict) else overrides
    text = ", ".join(f"{path}={value:g}" for path, value in pairs)
    return f"machine file overridden: {text}" if text else ""
