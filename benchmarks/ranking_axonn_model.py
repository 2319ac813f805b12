"""The twin's ranking beside AxoNN's own communication model, the one AxoNN chose its published runs with.

    .venv/bin/python benchmarks/ranking_axonn_model.py [--json] [--quick]

AxoNN ranked every (G_x, G_y, G_z, G_data) with its communication model
(twin/search/axonn_model.py) and ran the top 10-20; it validated the model
on GPT-20B with 32 and GPT-40B with 64 Perlmutter GPUs (9 of its top 10
among the 10 fastest measured). For those two cases and the nine runs of
Table III, over the plans the twin finds valid and fitting (AxoNN's four axes,
the per-model minimum tensor-parallel size of AxoNN's launcher, 16.8M-token
batch; each plan with AxoNN's code's weight gathers, axonn=1), this prints: how many of the twin's top 10 are in the model's top 10
and in its top 20 (the runs AxoNN would have measured), where the twin's
best plan ranks in the model, and how much slower in the twin the model's
first choice is than the twin's. --quick: the two small cases only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.micro_batches import simulate_step  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.published import AXONN_BATCH_SEQUENCES, AXONN_TABLE_III  # noqa: E402
from twin.search.axonn_model import MIN_TP, Grid, comm_time_s  # noqa: E402
from twin.search.rank import search  # noqa: E402
from twin.search.space import AXONN_AXES, AXONN_CODE, SearchSpace, enumerate_space  # noqa: E402

VALIDATION_CASES = [("perlmutter", "GPT-20B", 32), ("perlmutter", "GPT-40B", 64)]


def grid_of(plan) -> Grid:
    return Grid(plan.gx, plan.gy, plan.gz, plan.gdata)


def compare(machine_name: str, model_name: str, gpus: int, top: int = 10) -> dict:
    machine, model = load_machine(machine_name), get_model(model_name)
    space = SearchSpace(axes=AXONN_AXES, min_tp=MIN_TP[model_name], fixed=AXONN_CODE)  # AxoNN's code's gathers
    found = enumerate_space(model, gpus, AXONN_BATCH_SEQUENCES, machine.device.hbm_bytes, space)
    plans = {grid_of(c.plan): c.plan for c in found.candidates}  # auto micro-batch: one plan per grid
    modelled = sorted(plans, key=lambda g: (comm_time_s(model, g, AXONN_BATCH_SEQUENCES, machine_name), g.describe()))
    result = search(model, gpus, AXONN_BATCH_SEQUENCES, machine, space, top=top)
    twin_top = [grid_of(parse_plan(r.plan)) for r in result.ranked]
    axonn_first = simulate_step(model, plans[modelled[0]], machine, gpus)
    twin_best_s = result.ranked[0].step_time_s
    return {
        "case": f"{machine_name} {gpus} {model_name}", "plans": len(plans),
        "twin_top": [g.describe() for g in twin_top], "model_top": [g.describe() for g in modelled[:top]],
        "in_model_top10": len(set(twin_top) & set(modelled[:10])),
        "in_model_top20": len(set(twin_top) & set(modelled[:20])),
        "twin_best_rank_in_model": modelled.index(twin_top[0]) + 1,
        "model_first_slower_in_twin_pct": 100 * (axonn_first.step_time_s / twin_best_s - 1),
        "model_first": modelled[0].describe(), "twin_best": twin_top[0].describe(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--quick", action="store_true", help="only AxoNN's two validation cases")
    args = ap.parse_args()
    cases = list(VALIDATION_CASES)
    if not args.quick:
        cases += [(p.machine, p.model, p.gpus) for p in AXONN_TABLE_III]
    t0 = time.perf_counter()
    rows = [compare(*case) for case in cases]
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"rows": rows, "wall_s": wall}, indent=2))
        return 0
    print(f"{'case':<26}{'plans':>6}{'top10 in model top10':>22}{'in top20':>9}{'twin #1 in model':>18}"
          f"{'model #1 slower':>17}  model #1 / twin #1")
    for r in rows:
        print(f"{r['case']:<26}{r['plans']:>6}{r['in_model_top10']:>19}/10{r['in_model_top20']:>6}/10"
              f"{r['twin_best_rank_in_model']:>18}{r['model_first_slower_in_twin_pct']:>+16.1f}%  "
              f"{r['model_first']} / {r['twin_best']}")
    print(f"\n{len(rows)} cases in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
