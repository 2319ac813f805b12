"""The Frontier paper's runs (published.md section B): predicted beside published.

    .venv/bin/python benchmarks/frontier_paper.py [--json] [--quick]

For 22B, 175B and 1T: the authors' script plan (twin/presets.py) and a few
neighbours (tp and pp halved/doubled where the plan stays valid and fits),
each simulated; the best is reported beside the published TF/s per GCD. Then
weak scaling (175B 128..1024 GCDs, 1T 1024..3072) and strong scaling (175B
128..1024 at the script's batch of 640, 1T 1024..4096 at 1024) with `twin.scale`.
Nothing here is fitted to the published numbers: they are printed, never read
by the model. Takes several minutes (the 1T pipelines have 128 stages);
--quick skips the 1T rows and the neighbours.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.presets import PRESETS  # noqa: E402
from twin.published import FRONTIER_PAPER_SCALING_EFFICIENCY, FRONTIER_PAPER_TFLOPS_PER_GCD  # noqa: E402
from twin.report import summarize  # noqa: E402
from twin.scale import scaling  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402

ROWS = [("22B", "frontier-22b"), ("175B", "frontier-175b"), ("1T", "frontier-1t")]
SCALING = {
    "175B": ("tp=4,pp=16,zero=1,mbs=1,recompute=full", 640, [128, 256, 512, 1024]),
    "1T": ("tp=4,pp=128,zero=1,mbs=1,recompute=full", 1024, [1024, 2048, 3072]),
}
# Strong scaling keeps the batch, which must split over every dp: 1024 sequences do not split
# over dp = 6 (3,072 GCDs), so 1T strong scaling goes to 4,096 instead.
STRONG_COUNTS = {"1T": [1024, 2048, 4096]}


def neighbours(plan_text: str) -> list[str]:
    """The script plan and its tp/pp neighbours at the same GPU count (dp adjusted)."""
    plan = parse_plan(plan_text)
    out = [plan_text]
    for tp_factor, pp_factor in ((2, 0.5), (0.5, 2), (2, 1), (0.5, 1), (1, 2), (1, 0.5)):
        tp, pp = int(plan.gx * tp_factor), int(plan.pp * pp_factor)
        dp = plan.gdata * plan.gx * plan.pp / (tp * pp) if tp and pp else 0
        if tp >= 1 and pp >= 1 and dp >= 1 and dp == int(dp) and tp <= 8:
            out.append(replace(plan, gx=tp, pp=pp, gdata=int(dp)).describe())
    return out


def simulate_plan(model_name: str, gpus: int, plan_text: str, batch: int) -> dict | None:
    machine = load_machine("frontier")
    try:
        built = build_step(get_model(model_name), parse_plan(f"{plan_text},global_batch={batch}"), machine, gpus)
    except TwinError as err:
        return {"plan": plan_text, "error": str(err)}
    s = summarize(simulate(built.schedule, machine))
    return {"plan": built.plan.describe(), "tflops_per_gpu": s.formula_tflops_per_gpu,
            "pct_peak_advertised": s.formula_pct_peak_advertised,
            "step_time_s": s.step_time_s, "memory_per_gpu_gb": s.memory_per_gpu_gb}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="skip 1T and the neighbour plans")
    args = parser.parse_args()
    start = time.perf_counter()
    results: dict = {"throughput": [], "scaling": []}
    for model_name, preset_name in ROWS:
        if args.quick and model_name == "1T":
            continue
        preset = PRESETS[preset_name]
        candidates = [preset.plan] if args.quick or model_name == "1T" else neighbours(preset.plan)
        tried = [simulate_plan(model_name, preset.gpus, p, preset.global_batch) for p in candidates]
        valid = [t for t in tried if "error" not in t]
        best = max(valid, key=lambda t: t["tflops_per_gpu"])
        script = tried[0]
        print(f"  {model_name}: {len(valid)} of {len(tried)} plans valid, best {best['plan']}: "
              f"{best['tflops_per_gpu']:.1f} TF/s per GCD", file=sys.stderr)
        results["throughput"].append({"model": model_name, "gpus": preset.gpus, "script": script, "best": best,
                                      "published_tflops": FRONTIER_PAPER_TFLOPS_PER_GCD[model_name], "tried": tried})
    for model_name, (plan_text, batch, counts) in SCALING.items():
        if args.quick and model_name == "1T":
            continue
        for mode in ("weak", "strong"):
            plan = parse_plan(f"{plan_text},global_batch={batch}")
            mode_counts = STRONG_COUNTS.get(model_name, counts) if mode == "strong" else counts
            points = scaling(get_model(model_name), plan, load_machine("frontier"), mode_counts, mode)
            results["scaling"].append({"model": model_name, "mode": mode, "points": [asdict(p) for p in points],
                                       "published": FRONTIER_PAPER_SCALING_EFFICIENCY[model_name][mode]})
            print(f"  {model_name} {mode} scaling: " + ", ".join(f"{p.gpus}: {100 * p.efficiency:.1f}%" for p in points),
                  file=sys.stderr)
    results["wall_s"] = time.perf_counter() - start
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print("| model | GCDs | plan (best found) | twin TF/s per GCD | % of 191.5 | published TF/s | twin / published | script plan TF/s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results["throughput"]:
        b, s = r["best"], r["script"]
        print(f"| {r['model']} | {r['gpus']} | {b['plan'].split(',recompute')[0]} | {b['tflops_per_gpu']:.1f} | "
              f"{b['pct_peak_advertised']:.1f} | {r['published_tflops']} | {b['tflops_per_gpu'] / r['published_tflops']:.2f} | "
              f"{s.get('tflops_per_gpu', float('nan')):.1f} |")
    print()
    print("| model | mode | GCDs | batch | twin efficiency at the largest count | published |")
    print("|---|---|---|---|---|---|")
    for r in results["scaling"]:
        pts = r["points"]
        counts = ",".join(str(p["gpus"]) for p in pts)
        batches = ",".join(str(p["global_batch"]) for p in pts)
        print(f"| {r['model']} | {r['mode']} | {counts} | {batches} | {100 * pts[-1]['efficiency']:.1f}% | {100 * r['published']:.0f}% |")
    print(f"\n(wall time {results['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
