"""Write a fitted machine file: the base file, line for line, with the fitted numbers replaced.

Copying the base file's text (not re-serialising its parsed tables) keeps its
comments and its other numbers' sources exactly; only the lines of the fitted
numbers change, each to ``{ value = ..., fitted = "..." }`` with the fit's
provenance (which runs, when, the cross-validated error, and the value it
replaced). A number the base file lacks (an optional key) is added under its
table. The result is loaded back before it is written, so a file that the
loader would reject is never left behind.
"""

from __future__ import annotations

import re
from pathlib import Path

from topologies.machine import load_machine
from twin.errors import TwinError
from twin.outputs import atomic_path

_HEADER = re.compile(r"^\s*\[([A-Za-z0-9_.]+)\]\s*(#.*)?$")


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _entry(key: str, value: float, fitted: str) -> str:
    return f"{key} = {{ value = {value:.6g}, fitted = {_toml_string(fitted)} }}"


def rewrite(text: str, values: dict[str, tuple[float, str]]) -> str:
    """`text` with each dotted path's line replaced by (value, fitted note); paths inside [[arrays]] are refused."""
    lines = text.splitlines()
    for path, (value, fitted) in values.items():
        table, _, key = path.rpartition(".")
        if "[" in path or not table:
            raise TwinError(f"cannot write {path}: only numbers of plain tables (e.g. device.kernel_overhead_us) "
                            "can be fitted")
        start = next((i for i, line in enumerate(lines) if (m := _HEADER.match(line)) and m.group(1) == table), None)
        if start is None:
            raise TwinError(f"the base machine file has no [{table}] table for {path}; add it and fit again")
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        key_line = re.compile(rf"^\s*{re.escape(key)}\s*=")
        at = next((i for i in range(start + 1, end) if key_line.match(lines[i])), None)
        if at is None:
            lines.insert(start + 1, _entry(key, value, fitted))
        else:
            lines[at] = _entry(key, value, fitted)
    return "\n".join(lines) + "\n"


def write_fitted(base_path: str, values: dict[str, tuple[float, str]], output: str) -> None:
    """Write the fitted file to `output` atomically, after checking that it loads."""
    text = rewrite(Path(base_path).read_text(encoding="utf-8"), values)
    with atomic_path(output) as tmp:
        Path(tmp).write_text(text, encoding="utf-8")
        load_machine(tmp)  # the loader's checks, before the file takes its name
