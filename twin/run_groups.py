"""Prediction errors of measured runs grouped by what the runs vary (`twin validate --runs FILE --by tp,mbs`).

One mean error over a file hides where a machine file is wrong: on vTrain's
single-node A100 runs the twin was within 14% on average for every (tp,
micro-batch) group but one, tp=8 at micro-batch 1, 28% fast, which is how the
softmax Megatron cannot fuse was found (docs/fit.md). A table per field
combination says so in one command instead of a script over the JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from twin.errors import TwinError

if TYPE_CHECKING:
    from twin.runs import MeasuredRun

# field -> how to read it from a run; None where the run does not say (an executed schedule has no plan or model)
GROUP_FIELDS: dict[str, Callable[["MeasuredRun"], object]] = {
    "label": lambda r: r.label,
    "gpus": lambda r: r.gpus,
    "tp": lambda r: r.plan.gx if r.plan else None,
    "pp": lambda r: r.plan.pp if r.plan else None,
    "dp": lambda r: r.plan.gdata if r.plan else None,
    "mbs": lambda r: r.plan.mbs if r.plan else None,
    "vpp": lambda r: r.plan.vpp if r.plan else None,  # interleaved model chunks per stage (1: plain 1F1B)
    "hidden": lambda r: r.model.hidden if r.model else None,
    "layers": lambda r: r.model.layers if r.model else None,
    "heads": lambda r: r.model.heads if r.model else None,
    "seq": lambda r: r.model.seq if r.model else None,
}


def parse_group_fields(text: str) -> tuple[str, ...]:
    """--by's comma-separated fields, each known and named once."""
    fields = tuple(f.strip() for f in text.split(","))
    known = ", ".join(GROUP_FIELDS)
    for field in fields:
        if field not in GROUP_FIELDS:
            raise TwinError(f"--by: {field!r} is not a field of a run; use one or more of {known}, e.g. --by tp,mbs")
    if len(set(fields)) != len(fields):
        raise TwinError(f"--by {text}: a field is named twice; name each once, e.g. --by tp,mbs")
    return fields


def _sortable(value: object) -> tuple:
    return (value is None, value if value is not None else 0)


def group_errors(runs: list["MeasuredRun"], columns: dict[str, np.ndarray],
                 fields: tuple[str, ...]) -> list[dict]:
    """One entry per combination of the fields' values, in their order: its key, how many runs it has, and per
    column (machine) the mean and the mean absolute relative error of its runs' predictions, in percent."""
    measured = np.array([r.step_time_s for r in runs])
    keys = [tuple(GROUP_FIELDS[f](r) for f in fields) for r in runs]
    out = []
    for key in sorted(set(keys), key=lambda k: tuple(_sortable(v) for v in k)):
        sel = np.array([k == key for k in keys])
        errors = {name: 100 * (predicted[sel] / measured[sel] - 1) for name, predicted in columns.items()}
        out.append({"key": dict(zip(fields, key)), "runs": int(sel.sum()),
                    "error_pct": {name: {"mean": float(e.mean()), "mean_abs": float(np.abs(e).mean())}
                                  for name, e in errors.items()}})
    return out


def format_groups(groups: list[dict], fields: tuple[str, ...], names: list[str]) -> list[str]:
    """The table `twin validate --runs --by` prints: a line per group, per machine its mean and mean |error|."""
    header = f"{'by ' + ','.join(fields):<34}{'runs':>6}" + "".join(f"{_column_label(n):>24}" for n in names)
    lines = [header, f"{'':<40}" + "".join(f"{'mean   mean |e|':>24}" for _ in names)]
    for g in groups:
        key = " ".join(f"{f}={'-' if v is None else v}" for f, v in g["key"].items())
        cells = "".join(f"{g['error_pct'][n]['mean']:>+14.1f}%{g['error_pct'][n]['mean_abs']:>8.1f}%" for n in names)
        lines.append(f"{key[:33]:<34}{g['runs']:>6}{cells}")
    return lines


def _column_label(machine: str) -> str:
    """A machine's column heading in 22 characters: a machine file by its file name (the folder is in the lines
    above the table), cut from the left with an ellipsis if still longer."""
    label = Path(machine).name
    return label if len(label) <= 22 else "..." + label[-19:]
