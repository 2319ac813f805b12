"""How fast the simulator is, and what it predicts for the published AxoNN rows.

    .venv/bin/python benchmarks/sim_speed.py [--json] [--skip-full]

For each Frontier and Perlmutter row of AxoNN's Table III (published.md,
section A) one step is simulated with a hand-chosen plan (the minimum
tensor-parallel size AxoNN's launcher used for the model, inside a node where
possible; not searched, not tuned to the published number), then a GPT-320B
step on 32,768 Frontier GCDs, then the full per-rank simulation of a 512-GPU
plan next to its symmetry-reduced twin. Prints one table with simulated step
time, predicted and published PF/s, and wall time, then each speed target
with the ratio measured/target (< 1 meets it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.published import AXONN_BATCH_SEQUENCES, AXONN_TABLE_III  # noqa: E402
from twin.report import summarize  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402

# Hand-chosen plans: gx*gy*gz = the minimum tensor-parallel size AxoNN's launcher
# used for each model (algorithms.md section 3), gx inside a node.
PLANS = {
    ("perlmutter", "GPT-5B"): "gx=4,gy=1,gz=1,gdata=128",
    ("perlmutter", "GPT-10B"): "gx=4,gy=1,gz=2,gdata=128",
    ("perlmutter", "GPT-20B"): "gx=4,gy=1,gz=4,gdata=128",
    ("perlmutter", "GPT-40B"): "gx=4,gy=2,gz=4,gdata=128",
    ("frontier", "GPT-5B"): "gx=4,gy=1,gz=1,gdata=128",
    ("frontier", "GPT-10B"): "gx=8,gy=1,gz=1,gdata=128",
    ("frontier", "GPT-20B"): "gx=8,gy=1,gz=2,gdata=128",
    ("frontier", "GPT-40B"): "gx=8,gy=1,gz=4,gdata=128",
    ("frontier", "GPT-80B"): "gx=8,gy=1,gz=8,gdata=128",
}
BIG = ("frontier", 32768, "GPT-320B", "gx=8,gy=1,gz=32,gdata=128")
FULL = ("frontier", 512, "GPT-5B", "gx=8,gy=1,gz=2,gdata=32")
TARGET_ROW_S, TARGET_BIG_S, TARGET_FULL_S = 2.0, 5.0, 60.0


def run_case(machine_name: str, gpus: int, model_name: str, plan_text: str, full: bool = False) -> dict:
    machine = load_machine(machine_name)
    start = time.perf_counter()
    plan = parse_plan(f"{plan_text},global_batch={AXONN_BATCH_SEQUENCES}")
    built = build_step(get_model(model_name), plan, machine, gpus)
    run = simulate(built.schedule, machine, full=full)
    wall = time.perf_counter() - start
    s = summarize(run)
    return {
        "machine": machine_name, "gpus": gpus, "model": model_name, "plan": built.plan.describe(),
        "step_time_s": s.step_time_s, "pflops_total": s.formula_pflops_total,
        "pct_peak_empirical": s.formula_pct_peak_empirical,
        "simulated_ranks": s.simulated_ranks, "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--skip-full", action="store_true", help="skip the slow full per-rank simulation")
    args = parser.parse_args()

    rows = []
    for pub in AXONN_TABLE_III:
        row = run_case(pub.machine, pub.gpus, pub.model, PLANS[(pub.machine, pub.model)])
        row["published_pflops"] = pub.pflops_total
        rows.append(row)
    big = run_case(*BIG)
    full = None if args.skip_full else run_case(*FULL, full=True)
    reduced = run_case(*FULL)

    if args.json:
        print(json.dumps({"rows": rows, "gpt320b_32768": big, "full_512": full, "reduced_512": reduced}, indent=2))
        return 0
    print(f"{'machine':<11}{'GPUs':>6} {'model':<9}{'plan':<27}{'step s':>8}{'pred PF/s':>10}{'pub PF/s':>9}"
          f"{'pred/pub':>9}{'% emp':>7}{'wall s':>8}")
    for r in rows:
        plan = ",".join(r["plan"].split(",")[:5])
        print(f"{r['machine']:<11}{r['gpus']:>6} {r['model']:<9}{plan:<27}{r['step_time_s']:>8.2f}"
              f"{r['pflops_total']:>10.1f}{r['published_pflops']:>9.1f}{r['pflops_total'] / r['published_pflops']:>9.2f}"
              f"{r['pct_peak_empirical']:>7.1f}{r['wall_s']:>8.2f}")
    for label, r in (("GPT-320B on 32,768 Frontier GCDs", big), ("reduced 512-GPU plan", reduced), ("full 512-GPU plan", full)):
        if r is not None:
            print(f"{label}: step {r['step_time_s']:.3f} s, {r['pflops_total']:.1f} PF/s, "
                  f"{r['simulated_ranks']} rank(s) simulated, wall {r['wall_s']:.2f} s ({r['plan']})")
    print("\ntargets (ratio = measured / target, < 1 meets it):")
    worst = max(r["wall_s"] for r in rows)
    print(f"  every published row under {TARGET_ROW_S:.0f} s: worst {worst:.2f} s, ratio {worst / TARGET_ROW_S:.2f}")
    print(f"  GPT-320B on 32,768 GCDs under {TARGET_BIG_S:.0f} s: {big['wall_s']:.2f} s, ratio {big['wall_s'] / TARGET_BIG_S:.2f}")
    if full is not None:
        print(f"  full per-rank 512-GPU simulation under {TARGET_FULL_S:.0f} s: {full['wall_s']:.2f} s, "
              f"ratio {full['wall_s'] / TARGET_FULL_S:.2f}")
        same = abs(full["step_time_s"] - reduced["step_time_s"]) <= 1e-9 * full["step_time_s"]
        print(f"  full and reduced step times equal: {same} ({full['step_time_s']:.6f} s vs {reduced['step_time_s']:.6f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
