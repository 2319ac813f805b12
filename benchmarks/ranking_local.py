"""Does the twin rank plans as this host does? AxoNN's own check of its model, on a machine we can touch.

    .venv/bin/python benchmarks/ranking_local.py [--nproc 2] [--machine FILE] [--model SPEC] [--json]

1. `twin calibrate` on --nproc ranks (skipped with --machine);
2. `twin search --exhaustive` on that machine file: every valid plan of the
   model on --nproc ranks (every axis, ZeRO 0/1, recompute full/none, the
   micro-batch sizes the space allows), each simulated;
3. every one of those plans executed with the executor (gloo, median step);
4. the overlap of the twin's top 5 with the measured top 5, the rank
   correlation (Spearman) of all plans, how much slower than the measured
   best the twin's pick actually ran, and the mean absolute step-time error.

Nothing is fitted to these runs: the machine file comes from the
microbenchmarks (executor.calibrate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from executor.calibrate_host import calibrate_host  # noqa: E402
from executor.launch import WorkerOptions, other_load, run_local, wait_for_quiet  # noqa: E402
from executor.measured import load_measured  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.ir_io import save_schedule  # noqa: E402
from twin.model import parse_model_spec  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.search.rank import search  # noqa: E402
from twin.search.space import DEFAULT_AXES, SearchSpace  # noqa: E402

MODEL = "layers=4,hidden=512,heads=8,seq=128,vocab=2048"
BATCH = 16
TOP = 5


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--machine", help="an already calibrated machine file (skips calibration)")
    ap.add_argument("--model", default=MODEL, help=f"model spec (default {MODEL})")
    ap.add_argument("--global-batch", type=int, default=BATCH)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", help="working folder (default out/ranking_local-<nproc>)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out = args.out or f"out/ranking_local-{args.nproc}"
    os.makedirs(out, exist_ok=True)
    machine_path = args.machine
    if machine_path is None:
        machine_path = os.path.join(out, "local.toml")
        wait_for_quiet(max_wait_s=120)
        calibrate_host(args.nproc, machine_path, os.path.join(out, "calibrate"), WorkerOptions(steps=3, warmup=1))
    machine = load_machine(machine_path)
    model = parse_model_spec(args.model, "ranking")
    space = SearchSpace(axes=DEFAULT_AXES, zero=(0, 1), recompute=("full", "none"))
    result = search(model, args.nproc, args.global_batch, machine, space, top=1000, exhaustive=True, use_cache=False,
                    jobs=1)
    rows = []
    for i, r in enumerate(result.ranked):
        built = build_step(model, parse_plan(r.plan + f",global_batch={args.global_batch}"), machine, args.nproc)
        path = os.path.join(out, f"plan{i}.json")
        save_schedule(built.schedule, path)
        run_dir = os.path.join(out, f"plan{i}")
        wait_for_quiet(max_wait_s=60)
        start = time.perf_counter()
        run_local(built.schedule, path, args.nproc, run_dir, WorkerOptions(steps=args.steps, warmup=2), 600)
        measured = load_measured(run_dir, built.schedule)
        rows.append({"plan": r.plan, "simulated_s": r.step_time_s, "measured_s": float(np.median(measured.step_times_s)),
                     "other_load_cores": other_load(run_dir), "wall_s": time.perf_counter() - start})
        print(f"  {i + 1:>2}/{len(result.ranked)} sim {r.step_time_s:.4f} s  measured {rows[-1]['measured_s']:.4f} s  "
              f"{r.plan}", file=sys.stderr)
    sim_order = sorted(range(len(rows)), key=lambda i: rows[i]["simulated_s"])
    meas_order = sorted(range(len(rows)), key=lambda i: rows[i]["measured_s"])
    overlap = len(set(sim_order[:TOP]) & set(meas_order[:TOP]))
    rho = spearman([r["simulated_s"] for r in rows], [r["measured_s"] for r in rows])
    regret = rows[sim_order[0]]["measured_s"] / rows[meas_order[0]]["measured_s"] - 1
    mean_abs = sum(abs(r["simulated_s"] / r["measured_s"] - 1) for r in rows) / len(rows)
    summary = {"machine": machine_path, "nproc": args.nproc, "model": args.model, "plans": len(rows),
               "top": TOP, "top_overlap": overlap, "spearman": rho, "regret_of_twin_pick": regret,
               "mean_abs_step_error": mean_abs, "rows": rows}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(summary, f, indent=2)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{'twin':>5}{'meas':>5}{'sim s':>9}{'meas s':>9}  plan")
    for i in sim_order:
        print(f"{sim_order.index(i) + 1:>5}{meas_order.index(i) + 1:>5}{rows[i]['simulated_s']:>9.4f}"
              f"{rows[i]['measured_s']:>9.4f}  {rows[i]['plan']}")
    print(f"top-{TOP} overlap: {overlap} of {TOP}; Spearman rank correlation {rho:.2f} over {len(rows)} plans; "
          f"the twin's pick ran {100 * regret:.1f}% slower than the measured best; mean absolute step-time error "
          f"{100 * mean_abs:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
