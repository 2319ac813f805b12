"""What AxoNN's weights cache would do to the published AxoNN rows: each row's plan with the most layers cached.

    .venv/bin/python benchmarks/axonn_cache.py [--json]      # about a minute cold, seconds from twin's cache

Megatron-AxoNN's --num-layers-for-caching-weights-in-depth-tensor-parallel-
all-gather N (the twin's plan key cache=N, with axonn=1) keeps the weights the
first N layers gather over Z for the whole step. `twin validate` predicts
AxoNN's Table III rows with none cached, as the launcher of the paper's runs
does unless asked; the paper's per-run values are not public. For each row
this takes the plan `twin validate` predicts it with (the fastest, by the
twin, of AxoNN's communication model's top 20), finds the most layers that
still fit in the GPU's memory, and prints the row's error against the paper
with none and with that many cached, from the machine files (first
principles) and from the fitted ones in topologies/fitted/ (calibrated), and
Frontier's weak-scaling efficiency (512 -> 8,192 GCDs) both ways. A what-if:
the plan is not searched again with caching.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twin.build import resolve_step  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.published import AXONN_BATCH_SEQUENCES, AXONN_TABLE_III  # noqa: E402
from twin.validate_tasks import axonn_plan, cached_step, machine_for, paper_rate, tasks_see  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = (("first principles", {}), ("calibrated", {m: str(ROOT / "topologies" / "fitted" / f"{m}.toml")
                                                     for m in ("frontier", "perlmutter")}))


def most_cached(machine_name: str, model_name: str, gpus: int, plan_text: str) -> int:
    """The most layers `plan_text` can cache and still fit in memory (0 if none)."""
    model, machine = get_model(model_name), machine_for(machine_name)
    for layers in range(model.layers, 0, -1):
        try:
            resolve_step(model, parse_plan(f"{plan_text},cache={layers},global_batch={AXONN_BATCH_SEQUENCES}"),
                         machine, gpus)
            return layers
        except TwinError:
            continue
    return 0


def predicted_pflops(machine_name: str, model_name: str, gpus: int, plan_text: str) -> float:
    plan = parse_plan(f"{plan_text},global_batch={AXONN_BATCH_SEQUENCES}")
    step = cached_step(get_model(model_name), plan, machine_for(machine_name), gpus)
    return paper_rate(model_name, AXONN_BATCH_SEQUENCES, gpus, step.step_time_s)["pflops_total"]


def _prediction(row: dict, plan: str, cached: int) -> dict:
    """A column's numbers for one row: PF/s with none and with `cached` layers cached, and their errors."""
    none = predicted_pflops(row["machine"], row["model"], row["gpus"], plan)
    with_cache = predicted_pflops(row["machine"], row["model"], row["gpus"], f"{plan},cache={cached}")
    return {"plan": plan, "cached_layers": cached, "pflops": none, "cached_pflops": with_cache,
            "error_pct": 100 * (none / row["published_pflops"] - 1),
            "cached_error_pct": 100 * (with_cache / row["published_pflops"] - 1)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = [{"machine": r.machine, "model": r.model, "gpus": r.gpus, "published_pflops": r.pflops_total}
            for r in AXONN_TABLE_III]
    for column, files in COLUMNS:
        with tasks_see({}, files, 1):
            for row in rows:
                plan = axonn_plan(row["machine"], row["model"], row["gpus"], AXONN_BATCH_SEQUENCES)["plan"]
                row[column] = _prediction(row, plan, most_cached(row["machine"], row["model"], row["gpus"], plan))
    weak = weak_scaling(rows)
    if args.json:
        print(json.dumps({"rows": rows, "frontier_weak_scaling_pct": weak}, indent=1))
        return rows
    print("AxoNN Table III, each row's plan (twin validate's) with none and with the most layers cached that fit:")
    print(f"  {'row':<24} {'layers':>7} {'first principles':>18} {'calibrated':>16}")
    for row in rows:
        fp, cal = row["first principles"], row["calibrated"]
        layers = f"{cal['cached_layers']}/{get_model(row['model']).layers}"
        name = f"{row['machine']} {row['model']}@{row['gpus']}"
        print(f"  {name:<24} {layers:>7} "
              f"{fp['error_pct']:+6.0f}% -> {fp['cached_error_pct']:+4.0f}% {cal['error_pct']:+6.0f}% -> "
              f"{cal['cached_error_pct']:+4.0f}%")
    print("  Frontier weak-scaling efficiency 512 -> 8192 GCDs (the paper's 88.3%): "
          + ", ".join(f"{column} {w['none']:.1f}% -> {w['cached']:.1f}%" for column, w in weak.items()))
    return rows


def weak_scaling(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Frontier's weak-scaling efficiency (TF/s per GCD at 8,192 over 512), per column, with none and with the most
    layers cached, from each row's predicted PF/s."""
    ends = {r["gpus"]: r for r in rows if r["machine"] == "frontier" and r["gpus"] in (512, 8192)}
    return {column: {key: 100 * (ends[8192][column][pflops] / 8192) / (ends[512][column][pflops] / 512)
                     for key, pflops in (("none", "pflops"), ("cached", "cached_pflops"))}
            for column, _ in COLUMNS}


if __name__ == "__main__":
    main()
