"""Why twin.pipeline_depth refuses stages that differ only in their link shares: what each stage adds to the step.

    .venv/bin/python benchmarks/depth_increments.py [--depth 40] [--json]

The depth continuation assumes that a stage added to the middle of a 1F1B
pipeline adds to the step a time of its own kind, whatever the depth. This
script tests that assumption where it is refused: a 1-layer test model on
Frontier with tp=4, dp=6 and ZeRO-1 (stages of three nodes, which straddle
switches in several ways) and as many micro-batches as stages plus one. For
each depth d from SHORT (6) to --depth it simulates the pipeline of the first
d - 2 stages of the full job and its last two stages on the full job's last
nodes (seamed, twin.pipeline_depth.seamed_gpus, so the ends are the same in
every pipeline), on the full job's fabric, and prints how much the step grew
from d - 1 stages, with the kind of the stage that was added (index d - 3:
its cost alone, and its cost with the link shares). Where the same kind
adds different times at different depths, no model linear in the stages of
each kind is exact, on any set of short pipelines. Nothing is fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.fabric import Fabric  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin import pipeline_depth  # noqa: E402
from twin.build import build_step, resolve_step  # noqa: E402
from twin.model import ModelSpec  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.report import summarize  # noqa: E402
from twin.sim.collectives import CollectiveModel  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402

PLAN = "tp=4,dp=6,zero=1,mbs=1"  # 24 GCDs a stage: three Frontier nodes


def _labels(signatures: list[tuple], key) -> list[str]:
    """One letter per stage, the same for stages with the same key (0-9, then A-Z)."""
    seen: dict = {}
    return ["0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"[seen.setdefault(key(s), len(seen)) % 36] for s in signatures]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=40, help="the full pipeline's stages (default 40; 1-2 minutes)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if args.depth < pipeline_depth.SHORT + 2:
        ap.error(f"--depth {args.depth}: at least {pipeline_depth.SHORT + 2}")
    machine = load_machine("frontier")
    model = ModelSpec("pipe-test", layers=args.depth, hidden=1024, heads=16, seq=1024)
    plan = parse_plan(f"{PLAN},pp={args.depth},ga={args.depth + 1}")
    gpus = plan.gx * plan.gdata * args.depth
    plan, _ = resolve_step(model, replace(plan, global_batch=(args.depth + 1) * plan.gdata), machine, gpus)
    collectives = CollectiveModel(Fabric(machine, gpus))
    full = pipeline_depth._stage_signatures(model, plan, machine, gpus, collectives)
    alone = _labels(full, pipeline_depth._alone)
    shared = _labels(full, lambda s: s)
    rows, previous = [], None
    for depth in range(pipeline_depth.SHORT, args.depth + 1):
        m, p, g = pipeline_depth.short_step(model, plan, gpus, depth, depth + 1)
        run = simulate(build_step(m, p, machine, g).schedule, machine, collectives=collectives,
                       gpus=pipeline_depth.seamed_gpus(plan, gpus, depth))
        step = summarize(run).step_time_s
        if previous is not None:
            added = depth - 1 - pipeline_depth.ENDS
            rows.append({"depth": depth, "stage_added": added, "kind_alone": alone[added],
                         "kind_with_shares": shared[added], "step_s": step, "increment_s": step - previous})
        previous = step
        print(f"  {depth} stages simulated", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return rows
    print(f"Frontier, {PLAN}, 1 layer a stage, micro-batches = stages + 1, ends seamed; stages of the full "
          f"{args.depth}-stage pipeline by kind:")
    print(f"  alone        {''.join(alone)}")
    print(f"  with shares  {''.join(shared)}")
    print(f"{'depth':>5} {'stage added':>11} {'kind (alone, shares)':>21} {'increment':>13}")
    for row in rows:
        print(f"{row['depth']:>5} {row['stage_added']:>11} {row['kind_alone'] + ', ' + row['kind_with_shares']:>21} "
              f"{1e3 * row['increment_s']:>10.6f} ms")
    by_kind: dict[str, set[float]] = defaultdict(set)
    for row in rows[:-1]:  # the last is the full pipeline itself: no seam, its own boundary there
        by_kind[row["kind_with_shares"]].add(round(row["increment_s"], 12))
    print("increments by kind with shares (the full depth's own row left out):")
    for kind, increments in sorted(by_kind.items()):
        spread = (max(increments) - min(increments)) / min(increments)
        print(f"  {kind}: {len(increments)} distinct, {', '.join(f'{1e3 * x:.6f}' for x in sorted(increments))} ms"
              f"{f'  (spread {spread:.1e}: depends on depth)' if spread > 1e-9 else ''}")
    return rows


if __name__ == "__main__":
    main()
