"""Measured training runs, read from a CSV file: what `twin fit` learns from and `twin validate --runs` predicts.

One row per measured run: the model's shape, the GPUs, the plan, the global
batch and the measured step time. Columns are matched by name, case and
spacing ignored, under our names or the names of the vTrain data set
(Bang et al., MICRO'24, VIA-Research/vTrain data/*.csv):

| field          | accepted column names                       | |
|----------------|---------------------------------------------|-|
| gpus           | gpus, # gpus                                | required |
| global_batch   | global_batch, global batch                  | sequences per step, required |
| layers         | layers, # layers                            | required |
| hidden         | hidden, hidden size                         | required |
| heads          | heads, attention heads                      | required |
| seq            | seq, sequence length                        | required |
| step time      | step_time_s, step_time_ms, iteration time (ms) | one of them, required |
| plan           | plan (e.g. `tp=2,pp=4,mbs=2`)               | or the degrees below |
| tp, dp, pp, mbs | tp / tensor parallelism, dp / data parallelism, pp / pipeline parallelism, mbs / micro batch | |
| ffn, vocab     | ffn, vocab                                  | optional |
| kv_heads, arch | kv_heads / kv heads, arch (gpt or llama)    | optional (arch=llama trains without dropout) |
| tied           | tied (1: the LM head is the word table)     | optional (default: GPT tied, Llama untied) |
| label          | label, parameters (billion)                 | optional: groups rows (e.g. by model size) |
| source         | source                                      | optional: where the measurement comes from |

A `.json` file is one summary (or a list of them) that `twin run --json`
printed for a schedule it executed: its "step_time_s" is the measurement and
its "schedule" the IR file that ran, which the fit simulates as it is (the
schedule already says everything the plan would).

What a row does not say (the attention kernel, the recompute mode, the
vocabulary) comes from `assume`: plan fields and model fields applied to
every row, stated once on the command line (`--assume attention=unfused`)
so that the choice is visible in one place. Every mistake is a one-line
TwinError naming the file, the row (its line number) and the field.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from twin.errors import TwinError
from twin.model import ModelSpec, parse_switch, trains_with_dropout
from twin.plan import ParallelPlan, parse_plan

_COLUMNS = {
    "gpus": ("gpus", "# gpus"),
    "global_batch": ("global_batch", "global batch"),
    "layers": ("layers", "# layers"),
    "hidden": ("hidden", "hidden size"),
    "heads": ("heads", "attention heads"),
    "seq": ("seq", "sequence length"),
    "step_time_s": ("step_time_s",),
    "step_time_ms": ("step_time_ms", "iteration time (ms)"),
    "plan": ("plan",),
    "tp": ("tp", "tensor parallelism"),
    "dp": ("dp", "data parallelism"),
    "pp": ("pp", "pipeline parallelism"),
    "mbs": ("mbs", "micro batch", "micro_batch"),
    "ffn": ("ffn",),
    "vocab": ("vocab",),
    "kv_heads": ("kv_heads", "kv heads"),
    "arch": ("arch",),
    "tied": ("tied",),
    "label": ("label", "parameters (billion)"),
    "source": ("source",),
}
_REQUIRED = ("gpus", "global_batch", "layers", "hidden", "heads", "seq")
# model fields `assume` may set; the rest are plan fields
MODEL_ASSUMPTIONS = ("vocab", "ffn", "kv_heads", "arch", "dtype", "dropout", "tied")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured training step: what ran, on how many GPUs, and how long it took."""

    origin: str  # the file it came from
    line: int  # its line in that file (the header is line 1; a JSON list's entry, from 1)
    label: str  # groups rows, e.g. a model size
    model: ModelSpec | None  # None for an executed schedule
    plan: ParallelPlan | None  # global_batch set; mbs as measured
    gpus: int
    step_time_s: float
    source: str
    schedule: str | None = None  # the IR file a `twin run` executed, simulated as it is

    @property
    def where(self) -> str:
        return f"{self.origin} {self.position}"

    @property
    def position(self) -> str:
        """Where in its file: "line N" of a CSV, "entry N" of a JSON list of `twin run --json` summaries."""
        return f"{'entry' if self.schedule else 'line'} {self.line}"


def _normalise(name: str) -> str:
    return " ".join(name.strip().lower().replace("\ufeff", "").split())


def _header_map(header: list[str], origin: str) -> dict[str, int]:
    """Field -> column index, by the accepted names."""
    index = {_normalise(h): i for i, h in enumerate(header)}
    found: dict[str, int] = {}
    for field, names in _COLUMNS.items():
        hits = [index[n] for n in names if n in index]
        if len(hits) > 1:
            raise TwinError(f"{origin}: columns {' and '.join(repr(header[i]) for i in hits)} both give {field}; keep one")
        if hits:
            found[field] = hits[0]
    missing = [f for f in _REQUIRED if f not in found]
    if missing:
        raise TwinError(f"{origin}: no column for {missing[0]} (accepted names: {', '.join(_COLUMNS[missing[0]])}); "
                        "add it to the header")
    if "step_time_s" not in found and "step_time_ms" not in found:
        raise TwinError(f"{origin}: no step-time column; add step_time_s, step_time_ms or 'iteration time (ms)'")
    if "plan" not in found and not {"tp", "dp", "pp"} & found.keys():
        raise TwinError(f"{origin}: no plan; add a 'plan' column (e.g. tp=2,pp=4,mbs=2) or tp/dp/pp columns")
    return found


def _positive_int(text: str, where: str, field: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise TwinError(f"{where}: field '{field}' must be a positive integer, got {text.strip()!r}; fix the row") from None
    if value <= 0:
        raise TwinError(f"{where}: field '{field}' must be a positive integer, got {value}; fix the row")
    return value


def _step_time(cells: dict[str, str], where: str) -> float:
    field, scale = ("step_time_s", 1.0) if "step_time_s" in cells else ("step_time_ms", 1e-3)
    text = cells[field].strip()
    try:
        value = float(text)
    except ValueError:
        raise TwinError(f"{where}: field '{field}' must be a number, got {text!r}; fix the row") from None
    if not math.isfinite(value) or value <= 0:
        raise TwinError(f"{where}: field '{field}' must be a positive time, got {text}; fix the row")
    return value * scale


def parse_assumptions(text: str) -> tuple[dict[str, str], str]:
    """Split `--assume` text into model fields and the plan text that remains."""
    model_fields: dict[str, str] = {}
    plan_items = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value.strip():
            raise TwinError(f"--assume: {item!r} is not key=value (example: attention=unfused,recompute=full)")
        if key.strip() in MODEL_ASSUMPTIONS:
            model_fields[key.strip()] = value.strip()
        else:
            plan_items.append(item)
    return model_fields, ",".join(plan_items)


def _model(cells: dict[str, str], assumed: dict[str, str], where: str) -> ModelSpec:
    fields = {f: _positive_int(cells[f], where, f) for f in ("layers", "hidden", "heads", "seq")}
    for f in ("ffn", "vocab", "kv_heads"):
        text = cells.get(f, "").strip() or assumed.get(f, "")
        if text:
            fields[f] = _positive_int(text, where, f)
    dtype = assumed.get("dtype", "bf16")
    arch = cells.get("arch", "").strip() or assumed.get("arch", "gpt")
    try:
        dropout = (parse_switch(assumed["dropout"], "--assume dropout") if "dropout" in assumed
                   else trains_with_dropout(arch))
        tied_text = cells.get("tied", "").strip() or assumed.get("tied", "")
        tied = parse_switch(tied_text, "field tied") if tied_text else None
        return ModelSpec(name=cells.get("label", "").strip() or "custom", dtype=dtype, dropout=dropout, arch=arch,
                         tied=tied, **fields)
    except TwinError as e:
        raise TwinError(f"{where}: {e}") from None


def _plan(cells: dict[str, str], assumed_plan: str, where: str) -> ParallelPlan:
    items = []
    if cells.get("plan", "").strip():
        items.append(cells["plan"].strip())
    for field in ("tp", "dp", "pp", "mbs"):
        if cells.get(field, "").strip():
            items.append(f"{field}={_positive_int(cells[field], where, field)}")
    text = ",".join(items)
    try:
        base = parse_plan(assumed_plan) if assumed_plan else None
        return parse_plan(text, base)
    except TwinError as e:
        raise TwinError(f"{where}: plan {text!r}: {e}") from None


def load_runs(path: str, assume: str = "") -> list[MeasuredRun]:
    """Every row of the CSV at `path` (or every summary of a `twin run --json` file), as MeasuredRuns; `assume` as
    in the module docstring."""
    if path.endswith(".json"):
        return _load_summaries(path)
    origin = Path(path).name
    assumed_model, assumed_plan = parse_assumptions(assume)
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise TwinError(f"--runs: cannot read '{path}': {e.strerror}; check the path") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise TwinError(f"--runs: '{path}' is not a CSV text file ({e.__class__.__name__}); pass a CSV of runs") from None
    if not rows:
        raise TwinError(f"--runs: '{path}' is empty; it needs a header and one row per run")
    columns = _header_map(rows[0], origin)
    runs = []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        where = f"{origin} line {line}"
        if len(row) != len(rows[0]):
            raise TwinError(f"{where}: {len(row)} cells but the header has {len(rows[0])}; fix the row")
        cells = {field: row[i] for field, i in columns.items()}
        plan = replace(_plan(cells, assumed_plan, where), global_batch=_positive_int(cells["global_batch"], where,
                                                                                         "global_batch"))
        runs.append(MeasuredRun(
            origin=origin, line=line, label=cells.get("label", "").strip(),
            model=_model(cells, assumed_model, where), plan=plan,
            gpus=_positive_int(cells["gpus"], where, "gpus"), step_time_s=_step_time(cells, where),
            source=cells.get("source", "").strip() or origin,
        ))
    if not runs:
        raise TwinError(f"--runs: '{path}' has a header but no rows; add one row per measured run")
    return runs


def _load_summaries(path: str) -> list[MeasuredRun]:
    """`twin run --json` output: one summary or a list; each names the schedule it measured."""
    import json

    origin = Path(path).name
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise TwinError(f"--runs: cannot read '{path}': {e.strerror}; check the path") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TwinError(f"--runs: '{path}' is not JSON ({e.__class__.__name__}); pass `twin run --json` output or a "
                        "CSV") from None
    entries = doc if isinstance(doc, list) else [doc]
    runs = []
    for i, entry in enumerate(entries, start=1):
        where = f"{origin} entry {i}"
        if not isinstance(entry, dict):
            raise TwinError(f"{where}: not a `twin run --json` summary (an object); fix the file")
        for field in ("schedule", "step_time_s", "gpus"):
            if field not in entry:
                raise TwinError(f"{where}: field '{field}' is missing; use the JSON `twin run --json` prints")
        step = entry["step_time_s"]
        if not isinstance(step, (int, float)) or not math.isfinite(step) or step <= 0:
            raise TwinError(f"{where}: field 'step_time_s' must be a positive time, got {step!r}")
        schedule = Path(entry["schedule"])
        if not schedule.is_absolute():
            schedule = Path(path).resolve().parent / schedule
        if not schedule.is_file():
            raise TwinError(f"{where}: field 'schedule' names {schedule}, which does not exist; keep the IR file the "
                            "run executed")
        runs.append(MeasuredRun(origin=origin, line=i, label=str(entry.get("model", "")), model=None, plan=None,
                                gpus=int(entry["gpus"]), step_time_s=float(step),
                                source=f"twin run on {entry.get('machine', '?')}", schedule=str(schedule)))
    if not runs:
        raise TwinError(f"--runs: '{path}' holds no summaries")
    return runs
