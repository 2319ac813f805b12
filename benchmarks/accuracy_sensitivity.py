"""Could one number of the machine file explain a row's error? The sensitivity of each validated run.

    .venv/bin/python benchmarks/accuracy_sensitivity.py [--json] [--all-estimates] [--jobs N]

For each throughput row of `twin validate` with a plan (AxoNN Table III at
the plan the search chose, the Frontier paper's 22B and 175B at the authors'
script plans; 1T with --with-1t), every number below is moved by 20% each way
and the step re-simulated (`twin sensitivity`). Printed per row: the error,
the elasticity of the step to the measured square-GEMM peak and the value
that peak alone would need for the published throughput (first order), and
the estimate of the machine file with the largest elasticity and what it
alone would need. "impossible" means the file's range checks would reject
the value (an efficiency above 1); "beyond x4" that the first-order answer
is too far out to mean anything. This is a diagnosis: nothing is changed and
no published number is read by the model.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.presets import PRESETS  # noqa: E402
from twin.published import AXONN_BATCH_SEQUENCES, AXONN_TABLE_III, FRONTIER_PAPER_TFLOPS_PER_GCD  # noqa: E402
from twin.sensitivity import needed_text, estimated_fields, sensitivity  # noqa: E402
from twin.validate_tasks import axonn_plan  # noqa: E402

GEMM_PEAK = "device.empirical_gemm_bf16_tflop_per_s"
# The estimates that move a step at all in a first full run (`--all-estimates` takes every one), and the
# sourced network efficiency for comparison.
FIELDS = [GEMM_PEAK, "device.attention_efficiency", "device.hbm_efficiency", "device.gemm_tile_m",
          "device.gemm_tile_n", "device.gemm_k_half", "device.comm_compute_slowdown", "device.kernel_overhead_us",
          "node.link_efficiency.nic", "node.link_efficiency.nvlink"]


def runs(with_1t: bool, jobs: int | None) -> list[dict]:
    """(label, machine, model, gpus, plan text, batch, published throughput, flop/s per unit of it) of every row
    with a plan: AxoNN's rows are total PF/s, the Frontier paper's TF/s per GCD."""
    out = []
    for pub in AXONN_TABLE_III:
        b = axonn_plan(pub.machine, pub.model, pub.gpus, AXONN_BATCH_SEQUENCES)
        out.append(dict(label=f"{pub.machine} {pub.gpus} {pub.model}", machine=pub.machine, model=pub.model,
                        gpus=pub.gpus, plan=b["plan"], batch=AXONN_BATCH_SEQUENCES, published=pub.pflops_total,
                        unit=1e15))
    for model, name in (("22B", "frontier-22b"), ("175B", "frontier-175b"), ("1T", "frontier-1t")):
        if model == "1T" and not with_1t:
            continue
        p = PRESETS[name]
        out.append(dict(label=f"Frontier paper {model}@{p.gpus}", machine="frontier", model=model, gpus=p.gpus,
                        plan=p.plan, batch=p.global_batch, published=FRONTIER_PAPER_TFLOPS_PER_GCD[model],
                        unit=1e12 * p.gpus))
    return out


def diagnose(run: dict, all_estimates: bool) -> dict:
    machine = load_machine(run["machine"])
    fields = sorted(set(estimated_fields(machine)) | {GEMM_PEAK}) if all_estimates else \
        [f for f in FIELDS if f in machine.sources]
    model, plan = get_model(run["model"]), parse_plan(f"{run['plan']},global_batch={run['batch']}")
    flops = model.flops_per_step(run["batch"], "hardware")
    target = flops / (run["published"] * run["unit"])  # the step the published throughput means
    result = sensitivity(model, plan, machine, run["gpus"], fields, target_step_s=target, jobs=1)
    step = result.step_time_s
    predicted = flops / step / run["unit"]
    by = {f.path: f for f in result.fields}
    estimates = [f for f in result.fields if f.estimate]
    top = estimates[0] if estimates else None
    return dict(label=run["label"], plan=run["plan"].split(",recompute")[0], published=run["published"],
                predicted=predicted, error_pct=100 * (predicted / run["published"] - 1), step_s=step,
                target_step_s=target, gemm_elasticity=by[GEMM_PEAK].elasticity,
                gemm_needed=needed_text(by[GEMM_PEAK]),
                top_estimate=top.path if top else "", top_elasticity=top.elasticity if top else 0.0,
                top_needed=needed_text(top) if top else "-",
                estimates_sum_abs_elasticity=sum(abs(f.elasticity) for f in estimates),
                fields=[f.to_json_dict() for f in result.fields])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--all-estimates", action="store_true", help="every estimate of each machine file (slower)")
    ap.add_argument("--with-1t", action="store_true", help="include the Frontier paper's 1T on 1,024 GCDs (slow)")
    ap.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    todo = runs(args.with_1t, args.jobs)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(diagnose, todo, [args.all_estimates] * len(todo)))
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"rows": rows, "wall_s": wall}, indent=2))
        return 0
    print(f"{'run':<28}{'plan':<36}{'error':>7}{'e(GEMM)':>9}  {'GEMM peak needed':<18}"
          f"{'largest estimate':<30}{'e':>7}  {'it alone needs':<16}{'sum|e| est.':>11}")
    for r in rows:
        print(f"{r['label']:<28}{r['plan']:<36}{r['error_pct']:>+6.0f}%{r['gemm_elasticity']:>9.2f}  "
              f"{r['gemm_needed']:<18}{r['top_estimate']:<30}{r['top_elasticity']:>7.3f}  {r['top_needed']:<16}"
              f"{r['estimates_sum_abs_elasticity']:>11.3f}")
    print(f"\n{len(rows)} runs, {sum(len(r['fields']) for r in rows)} numbers moved, {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
