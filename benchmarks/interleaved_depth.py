"""Is an interleaved pipeline's step linear in its depth? Why twin.pipeline_depth leaves vpp > 1 alone.

    .venv/bin/python benchmarks/interleaved_depth.py [--machines dgx-a100,frontier] [--vpp 2,3,4]
        [--depths 4-16] [--rounds 2] [--stride 1] [--json]

twin.pipeline_depth continues a deep 1F1B pipeline from short ones because
its step is exactly linear in the interior stages (and in the micro-batches),
checked on an extra point to 1e-9. An interleaved pipeline needs its
micro-batches in whole rounds of pp, so its short pipelines would hold
`rounds` x depth micro-batches each; this script asks whether the step is
linear in depth along such a line. For each machine and vpp it simulates
(in full) pipelines of tensor parallelism 8 (one node per stage on both
machines), one layer per model chunk, at every depth of --depths, and prints
the second differences of the step in depth relative to the step: zero (to
rounding) where the step is linear, and from which depth on it stays so.
`--stride S` takes them over depths S apart (d, d + S, d + 2S): whether the
step is linear along depths of one residue modulo S.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import Machine, load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.micro_batches import resolve_step  # noqa: E402
from twin.model import ModelSpec  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402

LINEAR = 1e-9  # relative second difference taken as zero (twin.pipeline_depth's PLANAR)
TP = 8


def step_time(machine: Machine, vpp: int, depth: int, rounds: int) -> float:
    """The simulated step of a pipeline of `depth` stages, `vpp` chunks of one layer each per stage, and `rounds`
    x depth micro-batches (a small GPT, flash attention)."""
    ga = rounds * depth
    model = ModelSpec(name="interleaved", layers=depth * vpp, hidden=2048, heads=16, seq=1024, vocab=32768)
    plan = replace(parse_plan(f"tp={TP},pp={depth},dp=1,mbs=1,vpp={vpp},ga={ga},attention=flash"), global_batch=ga)
    resolved, _ = resolve_step(model, plan, machine, TP * depth)
    return simulate(build_step(model, resolved, machine, TP * depth).schedule, machine).step_time_s


def linear_from(depths: list[int], second: np.ndarray) -> int | None:
    """The smallest depth from which every second difference (the i-th starting at depths[i]) is zero, or None."""
    for i in range(len(second)):
        if np.all(np.abs(second[i:]) < LINEAR):
            return depths[i]
    return None


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machines", default="dgx-a100,frontier")
    ap.add_argument("--vpp", default="2,3,4", help="chunks per stage to try (comma-separated)")
    ap.add_argument("--depths", default="4-16", help="pipeline depths, first-last")
    ap.add_argument("--rounds", type=int, default=2, help="micro-batches per stage (whole rounds of pp)")
    ap.add_argument("--stride", type=int, default=1, help="depths apart in each second difference")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        first, last = (int(x) for x in args.depths.split("-"))
    except ValueError:
        ap.error(f"--depths {args.depths!r} is not first-last (e.g. 4-16)")
    depths = list(range(first, last + 1))
    if args.stride < 1 or len(depths) <= 2 * args.stride:
        ap.error(f"--depths {args.depths} holds no three depths --stride {args.stride} apart; widen the range")
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: give at least one round of micro-batches")
    try:
        rows = _measure(args, depths)
    except (TwinError, ValueError) as e:  # an unknown machine, a vpp the layers or the plan do not allow
        ap.error(str(e).splitlines()[0])
    if args.json:
        print(json.dumps(rows, indent=2))
        return rows
    print(f"{'machine':<10}{'vpp':>4}  {'linear from depth':>18}  {'max |2nd difference| / step':>28}  wall")
    for r in rows:
        since = r["linear_from_depth"]
        print(f"{r['machine']:<10}{r['vpp']:>4}  {since if since is not None else 'never':>18}  "
              f"{r['max_abs_second_difference_rel']:>28.1e}  {r['wall_s']:.0f} s")
    print(f"\n(depths {first}-{last}, {args.rounds} rounds of micro-batches, second differences over depths "
          f"{args.stride} apart; linear: every one from that depth on below {LINEAR:g} of the step)")
    return rows


def _measure(args: argparse.Namespace, depths: list[int]) -> list[dict]:
    """One row per machine and vpp: the steps at the depths the second differences need, and what they say."""
    rows = []
    for name in args.machines.split(","):
        machine = load_machine(name)
        for vpp in (int(v) for v in args.vpp.split(",")):
            t0 = time.perf_counter()
            starts = range(len(depths) - 2 * args.stride)  # each second difference's first depth
            used = sorted({depths[i + j * args.stride] for i in starts for j in range(3)})
            times = {d: step_time(machine, vpp, d, args.rounds) for d in used}
            second = np.array([times[depths[i + 2 * args.stride]] - 2 * times[depths[i + args.stride]]
                               + times[depths[i]] for i in starts]) / times[depths[0]]
            rows.append({"machine": name, "vpp": vpp, "rounds": args.rounds, "stride": args.stride, "depths": used,
                         "step_s": [times[d] for d in used], "second_difference_rel": second.tolist(),
                         "linear_from_depth": linear_from(depths, second),
                         "max_abs_second_difference_rel": float(np.abs(second).max()),
                         "wall_s": time.perf_counter() - t0})
    return rows


if __name__ == "__main__":
    main()
