"""twin.pipeline_depth's shortcut against the full simulation, over machines and stage sizes: exact, or refused.

    .venv/bin/python benchmarks/depth_shortcut_sweep.py [--short N] [--case I ...] [--json]

For each case (a 1-layer-per-stage test model, 12-48 stages, stages of 1-4
nodes on Frontier, Perlmutter, Alps and dgx-a100, with and without
data-parallel collectives and ZeRO-1) it runs simulate_deep and, where the
shortcut is taken, the full simulation of every stage and micro-batch, and
prints the step's relative difference, the short pipelines' depths and both
wall times. Refused cases fall back to twin.micro_batches in `twin
simulate`; here they print "refused". The cost limit (SAVING) is lifted, as
in tests/test_pipeline_depth.py: the cases are shallow so that their full
simulations stay quick.

--short N tries the short pipelines from N stages instead of the shipped
SHORT (MIN_DEPTH follows as 2 N): docs/speed.md "Shorter short pipelines"
has what 4 and 5 gave (faster, and one case accepted 8.1e-4 off). About two
minutes for every case.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import Machine, load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin import pipeline_depth  # noqa: E402
from twin.build import build_step, resolve_step  # noqa: E402
from twin.model import ModelSpec  # noqa: E402
from twin.plan import ParallelPlan, parse_plan  # noqa: E402
from twin.report import summarize  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402

MODEL = ModelSpec("pipe-test", layers=1, hidden=1024, heads=16, seq=1024)
ONE_LEAF = "network.nodes_per_leaf_group=40"  # 32 nodes under one leaf switch: no stage boundary crosses the spine

# (machine, plan, stages, micro-batches, layers per stage, overrides): tests/test_pipeline_depth.py's cases first
CASES = [
    ("dgx-a100", "tp=8,dp=1", 12, 15, 2, ()),
    ("dgx-a100", "tp=8,dp=2", 16, 17, 1, (ONE_LEAF,)),
    ("dgx-a100", "tp=8,dp=2", 12, 13, 1, ()),
    ("frontier", "tp=4,dp=2,zero=1", 16, 17, 1, ()),
    ("topologies/fitted/dgx-a100-800g.toml", "tp=8,dp=1", 12, 30, 1, ()),
    ("dgx-a100", "tp=8,dp=1", 12, 60, 1, ()),
    ("frontier", "tp=4,dp=8,zero=1", 40, 41, 1, ()),
    ("frontier", "tp=4,dp=8,zero=1", 40, 40, 1, ()),
    ("frontier", "tp=4,dp=8,zero=1", 48, 49, 1, ()),
    ("frontier", "tp=8,dp=4,zero=1", 40, 41, 1, ()),
    ("frontier", "tp=2,dp=8", 40, 41, 1, ()),
    ("alps", "tp=4,dp=2", 40, 41, 1, ()),
    ("dgx-a100", "tp=8,dp=3", 40, 40, 1, ()),
    ("perlmutter", "tp=4,dp=2", 40, 41, 1, ()),
    ("perlmutter", "tp=4,dp=1", 40, 41, 1, ()),
    ("alps", "tp=4,dp=1", 40, 41, 1, ()),
    ("alps", "tp=4,dp=3", 40, 41, 1, ()),  # stages of three nodes: refused from 6 stages, 8.1e-4 off from 4 or 5
    ("perlmutter", "tp=4,dp=4,zero=1", 40, 41, 1, ()),
    ("frontier", "tp=8,dp=1", 40, 41, 1, ()),
    ("frontier", "tp=8,dp=16,zero=1", 24, 25, 1, ()),
    ("dgx-a100", "tp=8,dp=4", 24, 48, 2, ()),
]


def case(machine: str, plan: str, pp: int, ga: int, layers_per_stage: int = 1, *overrides: str
         ) -> tuple[ModelSpec, ParallelPlan, Machine, int]:
    """(model, resolved plan, machine, GPUs) of a pipeline of `pp` stages of MODEL's layers, one micro-batch
    per data-parallel replica and step `ga` times over."""
    m = load_machine(machine, tuple(parse_override(o) for o in overrides))
    model = replace(MODEL, layers=layers_per_stage * pp)
    parsed = parse_plan(f"{plan},pp={pp},mbs=1,ga={ga}")
    gpus = parsed.gx * parsed.gy * parsed.gz * parsed.gdata * pp
    parsed = replace(parsed, global_batch=ga * parsed.gdata * parsed.gz)
    resolved, _ = resolve_step(model, parsed, m, gpus)
    return model, resolved, m, gpus


def run_case(index: int) -> dict:
    machine, plan, pp, ga, layers, overrides = CASES[index]
    model, resolved, m, gpus = case(machine, plan, pp, ga, layers, *overrides)
    row = {"case": index, "machine": machine, "plan": f"{plan},pp={pp},ga={ga}", "gpus": gpus}
    start = time.perf_counter()
    deep = pipeline_depth.simulate_deep(model, resolved, m, gpus)
    row["shortcut_s"] = time.perf_counter() - start
    if deep is None:
        return {**row, "refused": True}
    depths = [p.depth for p in pipeline_depth.short_pipelines(model, resolved, m, gpus).points]
    start = time.perf_counter()
    full = summarize(simulate(build_step(model, resolved, m, gpus).schedule, m))
    return {**row, "refused": False, "full_s": time.perf_counter() - start, "depths": depths,
            "step_s": deep.step_time_s, "full_step_s": full.step_time_s,
            "relative_error": abs(deep.step_time_s / full.step_time_s - 1)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--short", type=int, default=pipeline_depth.SHORT,
                    help=f"the shortest short pipeline, in stages (shipped: {pipeline_depth.SHORT}; at least 3)")
    ap.add_argument("--case", type=int, action="append", help=f"only these cases (0-{len(CASES) - 1}; repeatable)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if args.short < 3:
        ap.error(f"--short {args.short}: at least 3 (one stage between the two ends)")
    for i in args.case or ():
        if not 0 <= i < len(CASES):
            ap.error(f"--case {i}: give 0-{len(CASES) - 1}")
    shipped = pipeline_depth.SHORT, pipeline_depth.MIN_DEPTH, pipeline_depth.SAVING
    pipeline_depth.SHORT, pipeline_depth.MIN_DEPTH = args.short, 2 * args.short
    pipeline_depth.SAVING = 0.01  # the cases are shallow: let the short pipelines cost what they cost
    rows = []
    try:
        for i in args.case or range(len(CASES)):
            rows.append(run_case(i))
            if not args.json:
                r = rows[-1]
                result = "refused" if r["refused"] else f"{r['relative_error']:.1e}"
                timing = f"{r['shortcut_s']:6.1f}" + ("" if r["refused"] else f"{r['full_s']:7.1f}  {r['depths']}")
                print(f"{i:>3} {r['machine'][:12]:<13}{r['plan']:<28}{result:>9}{timing}", flush=True)
    finally:  # imported by a test: leave the module as shipped
        pipeline_depth.SHORT, pipeline_depth.MIN_DEPTH, pipeline_depth.SAVING = shipped
    taken = [r["relative_error"] for r in rows if not r["refused"]]
    if args.json:
        print(json.dumps({"short": args.short, "rows": rows}, indent=1))
    else:
        print(f"(SHORT {args.short}: {len(taken)} of {len(rows)} taken, worst relative error "
              f"{max(taken, default=0.0):.1e}; columns: relative error, shortcut s, full simulation s, depths)")
    return rows


if __name__ == "__main__":
    main()
