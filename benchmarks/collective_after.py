"""A small collective after what: a synchronisation, itself, a copy, a GEMM, or `twin calibrate`'s chain (issue 13).

    .venv/bin/python benchmarks/collective_after.py [--nproc 4] [--out out/collective_after] [--json]

`twin calibrate` times each collective microbenchmark right after a GEMM
(calibrate's LEAD_GEMM), GEMM after collective after GEMM with no
synchronisation of every rank between them, and takes out of each the
time-slicing lag it measures behind that GEMM (node.timeslice_skew x the
GEMM). Its point-to-point sends, which a pipeline's stages exchange, it
times after a synchronisation instead. On a host whose ranks share too few
cores the two conditions differ by more than that lag; this schedule times
the same collectives (all-reduce and all-gather of SIZES, in the pairs 0-1,
2-3, ... and over every rank) in five conditions, REPEATS times each:

- sync: right after a 4-byte all-reduce of every rank;
- itself: right after the same collective;
- copy: right after a 1 MB copy (an element-wise op);
- gemm-synced: right after calibrate's LEAD_GEMM, which every rank began
  together (a synchronisation before it);
- gemm-chain: CHAIN of (LEAD_GEMM, collective) back to back after one
  synchronisation: calibrate's own condition.

Per collective and condition: the mean and median over ranks, repeats and
steps (calibrate takes the mean). Nothing is simulated or fitted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.calibrate import DTYPE, LEAD_GEMM, TINY_BYTES  # noqa: E402
from executor.microbenchmark_ops import synchronise  # noqa: E402
from local_microbenchmark import parse_args, run_microbenchmark  # noqa: E402
from twin.builders.program import ProgramWriter  # noqa: E402
from twin.ir import Collective, Elementwise, Gemm, GroupAxis, Program, Schedule, StepInfo  # noqa: E402

SIZES = [4 << 10, 256 << 10]
KINDS = ("all_reduce", "all_gather")
CONDITIONS = ("sync", "itself", "copy", "gemm-synced", "gemm-chain")
COPY_BYTES = 1 << 20
CHAIN = 4  # (GEMM, collective) pairs back to back in the chain
REPEATS = 3


def after_schedule(nproc: int) -> tuple[Schedule, dict[int, tuple[str, str, str, int]]]:
    """One program for every rank (module docstring) and, per timed op id, (condition, group, kind, bytes); the
    group is "pairs" (the x axis: 0-1, 2-3, ...) or "all" (every rank)."""
    w, timed = ProgramWriter(), {}
    everyone = f"g{nproc}"

    def collective(name: str, axis: str, kind: str, nbytes: int, condition: str) -> None:
        op = w.collective(name, axis, Collective(kind, axis, nbytes, DTYPE))
        w.wait(op)
        w.compute(f"{name}.done", Elementwise(TINY_BYTES))
        timed[op] = (condition, "pairs" if axis == "x" else "all", kind, nbytes)

    for rep in range(REPEATS):
        for axis in ("x", everyone):
            for kind in KINDS:
                for nbytes in SIZES:
                    at = f"{axis}.{kind}.{nbytes}.{rep}"
                    synchronise(w, f"sync.{at}", everyone)
                    collective(f"after-sync.{at}", axis, kind, nbytes, "sync")
                    collective(f"after-itself.{at}", axis, kind, nbytes, "itself")
                    w.compute(f"copy.{at}", Elementwise(COPY_BYTES))
                    collective(f"after-copy.{at}", axis, kind, nbytes, "copy")
                    synchronise(w, f"sync-gemm.{at}", everyone)
                    w.compute(f"gemm-synced.{at}", Gemm(*LEAD_GEMM, "NN", DTYPE))
                    collective(f"after-gemm-synced.{at}", axis, kind, nbytes, "gemm-synced")
                    synchronise(w, f"sync-chain.{at}", everyone)
                    for i in range(CHAIN):
                        w.compute(f"gemm-chain.{at}.{i}", Gemm(*LEAD_GEMM, "NN", DTYPE))
                        collective(f"after-gemm-chain.{at}.{i}", axis, kind, nbytes, "gemm-chain")
    info = StepInfo(model="collective after", plan=None, label=f"small collectives after what, {nproc} ranks",
                    global_batch=1, seq=1, flops_hardware=0.0, flops_model=0.0, memory_per_gpu_bytes=0.0)
    groups = (GroupAxis(everyone, (tuple(range(nproc)),)), GroupAxis("x", tuple((i, i + 1) for i in range(0, nproc, 2))))
    return Schedule(nproc, groups, (Program(tuple(range(nproc)), tuple(w.ops)),), info), timed


def summarize(timed: dict[int, tuple[str, str, str, int]], steps: list[list[tuple[np.ndarray, np.ndarray]]]
              ) -> list[dict]:
    """Per (group, kind, bytes, condition), in that order: the mean and median time of the timed ops over every
    rank, step and repeat."""
    seconds: dict[tuple[str, str, int, str], list[float]] = {}
    for rank_steps in steps:
        for start, end in rank_steps:
            for op, (condition, group, kind, nbytes) in timed.items():
                seconds.setdefault((group, kind, nbytes, condition), []).append(float(end[op] - start[op]))
    order = {c: i for i, c in enumerate(CONDITIONS)}
    return [{"group": g, "kind": k, "nbytes": b, "condition": c, "mean_s": float(np.mean(x)),
             "median_s": float(np.median(x)), "samples": len(x)}
            for (g, k, b, c), x in sorted(seconds.items(), key=lambda kv: (*kv[0][:3], order[kv[0][3]]))]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0], "out/collective_after", 2, "the pairs 0-1, 2-3, ...")
    schedule, timed = after_schedule(args.nproc)
    rows = summarize(timed, run_microbenchmark(schedule, args.out, "collective-after"))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"a small collective on {args.nproc} ranks, after what (ms over ranks, repeats and steps; calibrate's "
          "collectives are timed in the gemm-chain condition, its point-to-point sends after a sync)")
    print(f"{'group':<7}{'kind':<12}{'size':>8}  " + "".join(f"{c:>13}" for c in CONDITIONS) + "   (mean / median)")
    for i in range(0, len(rows), len(CONDITIONS)):
        first = rows[i]
        cells = "".join(f"{1e3 * r['mean_s']:>6.2f}/{1e3 * r['median_s']:<6.2f}" for r in rows[i:i + len(CONDITIONS)])
        print(f"{first['group']:<7}{first['kind']:<12}{first['nbytes'] >> 10:>5} KB  {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
