"""How much of the A100 multi-node error follows the parallel layout, and how much varies inside one layout.

    .venv/bin/python benchmarks/error_structure.py [--machine FILE] [--jobs N] [--json]

Issue 13 asks for a mean absolute error of 10% or less on vTrain's 88
multi-node runs, predicted from a fit on one node. This predicts them on the
fitted file (`make fit`'s topologies/fitted/dgx-a100-800g.toml by default,
the assumptions of benchmarks/fit_accuracy.py) and then asks a diagnostic
question of the errors alone: if the twin were off by one constant factor
per group of runs (one for all, one per model size, one per tensor-parallel
degree, one per model size and tp, one per model size and (tp, pp, dp)
layout), each factor the geometric mean of measured / predicted over its
group, what error would remain? What remains after the finest grouping is
what the runs of one layout do at different micro-batch sizes that no
factor shared by the layout explains; what the coarse groupings remove says
where the systematic part of the error lies. It also prints the correlation
of each run's signed error with the twin's memory per GPU (twin.memory): a
plan near the GPU's capacity could run slow from the allocator's pressure,
which the twin does not model (-0.18 on make fit's file: it does not).

A diagnostic of the validation data, never a prediction: the factors are
fitted to the very runs they are scored on, they are printed and thrown
away, and nothing here writes a machine file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.fit.solve import simulate_runs  # noqa: E402
from twin.memory import memory_per_gpu  # noqa: E402
from twin.runs import load_runs  # noqa: E402
from twin.search.rank import worker_count  # noqa: E402

from fit_accuracy import ASSUME, VALIDATION  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FITTED = ROOT / "topologies" / "fitted" / "dgx-a100-800g.toml"

# (name, the key that puts a run in its group): from one factor for every run to one per layout.
GROUPINGS: tuple[tuple[str, Callable[[dict], Hashable]], ...] = (
    ("one factor for every run", lambda r: ()),
    ("one per model size", lambda r: r["model"]),
    ("one per tensor-parallel degree", lambda r: r["tp"]),
    ("one per model size and tp", lambda r: (r["model"], r["tp"])),
    ("one per model size and (tp, pp, dp)", lambda r: (r["model"], r["tp"], r["pp"], r["dp"])),
)


def residual_error(rows: Sequence[dict], key: Callable[[dict], Hashable]) -> tuple[int, float]:
    """(groups, mean absolute relative error) after scaling each group's predictions by the geometric mean of its
    measured / predicted ratios (the factor that minimises the group's squared log error)."""
    groups: dict[Hashable, list[dict]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    errors = []
    for members in groups.values():
        factor = math.exp(sum(math.log(r["measured_s"] / r["predicted_s"]) for r in members) / len(members))
        errors += [abs(r["predicted_s"] * factor / r["measured_s"] - 1) for r in members]
    return len(groups), sum(errors) / len(errors)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machine", default=str(FITTED.relative_to(ROOT)) if Path.cwd() == ROOT else str(FITTED),
                    help="the machine file that predicts the runs (default: make fit's fitted A100 file)")
    ap.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    try:
        load_machine(args.machine)
    except TwinError as e:
        ap.exit(2, f"error_structure.py: error: --machine: {e}\n")
    runs = load_runs(str(VALIDATION), ASSUME)
    predicted = [p.step_s for p in simulate_runs(runs, args.machine, [()] * len(runs), args.jobs or worker_count(None))]
    rows = [{"model": run.label, "tp": run.plan.gx, "pp": run.plan.pp, "dp": run.plan.gdata,
             "mbs": run.plan.mbs, "measured_s": run.step_time_s, "predicted_s": step,
             "memory_gb": memory_per_gpu(run.model, run.plan).total / 1e9}
            for run, step in zip(runs, predicted)]
    unscaled = sum(abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows) / len(rows)
    table = [{"factors": "none (the twin as it is)", "groups": None, "mean_abs_error": unscaled}]
    for name, key in GROUPINGS:
        groups, error = residual_error(rows, key)
        table.append({"factors": name, "groups": groups, "mean_abs_error": error})
    by_tp: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        by_tp[row["tp"]].append(row["predicted_s"] / row["measured_s"] - 1)
    signed = [r["predicted_s"] / r["measured_s"] - 1 for r in rows]
    result = {"machine": args.machine, "runs": len(rows), "assume": ASSUME, "residuals": table,
              "mean_error_by_tp": {tp: sum(e) / len(e) for tp, e in sorted(by_tp.items())},
              "error_memory_correlation": float(np.corrcoef(signed, [r["memory_gb"] for r in rows])[0, 1]),
              "rows": rows}
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    print(f"{VALIDATION.name}: {len(rows)} runs predicted on {args.machine} ({ASSUME})")
    print("factors fitted to these runs for this diagnostic only (never a prediction), and the error left:")
    print(f"  {'factors':<38} {'groups':>6} {'mean |error|':>12}")
    for row in table:
        groups = "-" if row["groups"] is None else row["groups"]
        print(f"  {row['factors']:<38} {groups:>6} {100 * row['mean_abs_error']:>11.2f}%")
    print("mean step error by tp: " + ", ".join(f"tp={tp} {100 * e:+.1f}% ({len(by_tp[tp])} runs)"
                                               for tp, e in result["mean_error_by_tp"].items()))
    print(f"correlation of the signed step error with the twin's memory per GPU "
          f"({min(r['memory_gb'] for r in rows):.0f}-{max(r['memory_gb'] for r in rows):.0f} GB): "
          f"{result['error_memory_correlation']:+.2f}")
    return result


if __name__ == "__main__":
    main()
