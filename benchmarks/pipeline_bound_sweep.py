"""The search's full bound against the simulated step on pipeline plans sampled from four search spaces.

    .venv/bin/python benchmarks/pipeline_bound_sweep.py [--seed 1] [--scale 1] [--json]

`twin search` ranks exactly only while its bound never exceeds the simulated
step (twin.search.bound). The suite checks that on small plans; this samples
pipeline plans (1F1B, pp > 1) from the every-axis spaces of 175B on 1,024
Frontier GCDs, GPT-20B on 512 Perlmutter GPUs, GPT-40B on 2,048 Frontier GCDs
and GPT-20B on 1,024 Alps GPUs (10, 8, 8 and 6 plans, times --scale), bounds
each, simulates it as the search does (twin.micro_batches.simulate_step) and
prints bound / step. A ratio above 1 is a bound that could drop a plan from
the top k: the script says VIOLATION and exits 1. About two minutes at
--scale 1.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.micro_batches import simulate_step  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.search.bound import BoundModel  # noqa: E402
from twin.search.rank import STOP_SLACK, bound_s  # noqa: E402
from twin.search.space import DEFAULT_AXES, SearchSpace, enumerate_space  # noqa: E402

SPACES = [("frontier", "175B", 1024, 640, 10), ("perlmutter", "GPT-20B", 512, 1024, 8),
          ("frontier", "GPT-40B", 2048, 2048, 8), ("alps", "GPT-20B", 1024, 1024, 6)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1, help="which plans are sampled (default 1)")
    ap.add_argument("--scale", type=int, default=1, help="plans per space times this (default 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.scale < 1:
        ap.error(f"--scale {args.scale}: at least 1")
    rng = random.Random(args.seed)
    rows = []
    for machine_name, model_name, gpus, batch, count in SPACES:
        machine, model = load_machine(machine_name), get_model(model_name)
        found = enumerate_space(model, gpus, batch, machine.device.hbm_bytes, SearchSpace(axes=DEFAULT_AXES))
        pipelines = [c.plan for c in found.candidates if c.plan.pp > 1 and c.plan.vpp == 1]
        bounds = BoundModel(machine, gpus)
        for plan in rng.sample(pipelines, min(count * args.scale, len(pipelines))):
            start = time.perf_counter()
            bound = bound_s(model, plan, machine, gpus, bounds)
            step = simulate_step(model, plan, machine, gpus, collectives=bounds.collectives).step_time_s
            rows.append({"machine": machine_name, "model": model_name, "gpus": gpus, "plan": plan.describe(),
                         "bound_s": bound, "step_s": step, "ratio": bound / step, "wall_s": time.perf_counter() - start})
            if not args.json:
                r = rows[-1]
                print(f"{machine_name:<11}{model_name:<8}{gpus:>6}  {r['plan'][:64]:<64} {r['ratio']:.4f}"
                      + ("  VIOLATION" if bound > step * (1 + STOP_SLACK) else ""), flush=True)
    violations = [r for r in rows if r["bound_s"] > r["step_s"] * (1 + STOP_SLACK)]
    worst = max(r["ratio"] for r in rows)
    if args.json:
        print(json.dumps({"seed": args.seed, "rows": rows, "worst_ratio": worst, "violations": len(violations)},
                         indent=2))
    else:
        print(f"{len(rows)} pipeline plans: bound / simulated step at most {worst:.4f}; "
              f"{len(violations)} above 1 (seed {args.seed})")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
