"""Where a held-out plan's error sits: fit_local's 4-rank plans, op class by op class, read from its folder.

    .venv/bin/python benchmarks/class_errors.py [--out out/fit_local] [--out ...] [--json]

After `benchmarks/fit_local.py --out OUT`; measures nothing. For each held-out
plan (the launch its summary names: fit_local's median launch) the twin
simulates the schedule on the folder's fitted 4-rank file (local-4.toml where
nothing was fitted) and `executor.compare.compare` sets the busy time of each
op class on the critical rank beside the same rank's measured time (each op's
mean over the measured steps). A collective's time includes its wait for the
last member, so a class can be short because the ranks reach it apart. Prints,
per plan, each class's error (simulated over measured, less 1) and the step's;
last, per class, the error of its time summed over the plans: the class the
folder's step error sits in. The forty-seventh session's reading of
out/fit_local_s47c (docs/fit.md): GEMMs simulated 10-22% long, the all-reduces
over X and the all-gathers over Z 16-30% short, in the plans that gather
weights over Z.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor.compare import compare  # noqa: E402
from rank_drift import folders_parser, held_out_run, rows_of_folders  # noqa: E402
from topologies.machine import Machine  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402

MACHINE_FILES = ("local-4-fitted.toml", "local-4.toml")


def plan_classes(summary: dict, machine: Machine) -> dict:
    """One held-out plan: its step and each op class's (simulated, measured) seconds on the critical rank."""
    plan, schedule, measured = held_out_run(summary)
    c = compare(schedule, simulate(schedule, machine), measured)
    return {"plan": plan,
            "step": (c.simulated_step_s, c.measured_step_s),
            "classes": {r.op_class: (r.simulated_s, r.measured_s) for r in c.rows}}


def summed_errors(rows: list[dict]) -> dict[str, float]:
    """Per op class, its simulated time summed over the plans over its measured time summed, less 1 (and the
    steps' under "step"): where a folder's error sits, the long classes weighing most."""
    sums: dict[str, list[float]] = {}
    for row in rows:
        for name, (sim, meas) in [("step", row["step"]), *row["classes"].items()]:
            total = sums.setdefault(name, [0.0, 0.0])
            total[0] += sim
            total[1] += meas
    return {name: sim / meas - 1 for name, (sim, meas) in sums.items() if meas > 0}


def _error(pair: tuple[float, float] | None) -> str:
    return f"{100 * (pair[0] / pair[1] - 1):+7.1f}%" if pair and pair[1] > 0 else f"{'-':>8}"


def main(argv: list[str] | None = None) -> int:
    ap = folders_parser(__doc__)
    args = ap.parse_args(argv)
    doc = rows_of_folders(ap, args.out or ["out/fit_local"], MACHINE_FILES, plan_classes)
    if args.json:
        print(json.dumps({folder: {"plans": rows, "summed_errors": summed_errors(rows)}
                          for folder, rows in doc.items()}, indent=2))
        return 0
    for folder, rows in doc.items():
        classes = sorted({name for row in rows for name in row["classes"]})
        width = max([len("all plans, summed"), *(len(row["plan"]) for row in rows)]) + 2
        print(f"{folder}: simulated over measured, less 1, on the critical rank ({' or '.join(MACHINE_FILES)})")
        print(f"  {'plan':<{width}}{'step':>8}" + "".join(f"{name[:14]:>16}" for name in classes))
        for row in rows:
            print(f"  {row['plan']:<{width}}{_error(row['step'])}"
                  + "".join(f"{_error(row['classes'].get(name)):>16}" for name in classes))
        summed = summed_errors(rows)
        print(f"  {'all plans, summed':<{width}}{100 * summed['step']:+7.1f}%"
              + "".join(f"{100 * summed[name]:>+15.1f}%" if name in summed else f"{'-':>16}" for name in classes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
