"""How the time-slicing lag grows with the compute before a synchronisation, far beyond what `twin calibrate` measures.

    .venv/bin/python benchmarks/lag_growth.py [--nproc 4] [--out out/lag_growth] [--json]

`twin calibrate` times a 4-byte all-reduce of every rank right after GEMMs
of its four SKEW_LEADS sizes (2-35 ms of compute on this project's 2-core
host with 4 ranks) and fits a line to it: `timeslice_skew` per second of
compute, plus a floor (executor.calibrate_sharing.fit_skew). A step's phases
of compute between two synchronisations run much longer than that where a
layer's weight gathers or gradient reductions overlap the compute (the ranks
drift on through an asynchronous transfer: twin.sim.compute_unit), so the
simulator needs the lag of phases the calibration never ran. This schedule
runs the same measurement on phases of 1, 2, 4, ... PHASES[-1] of the
largest calibrated GEMM, each after a synchronisation of every rank,
REPEATS times, and prints per phase its measured compute (the mean over
ranks of the GEMMs' time) and the all-reduce after it (mean and median over
ranks, repeats and steps), beside what the line through the calibrated range
(the phases of one and two GEMMs, as calibrate's own longest) would give.
Nothing is simulated or fitted; where the measured time falls under the
line, extrapolating the line overstates the lag, which is why the
simulator holds it at the longest calibrated phase (node.timeslice_lag_span_us).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.calibrate_sharing import SKEW_LEADS  # noqa: E402
from executor.microbenchmark_ops import DTYPE  # noqa: E402
from executor.microbenchmark_ops import synchronise  # noqa: E402
from local_microbenchmark import parse_args, run_microbenchmark  # noqa: E402
from twin.builders.program import ProgramWriter  # noqa: E402
from twin.ir import Collective, Gemm, GroupAxis, Program, Schedule, StepInfo  # noqa: E402

PHASES = (1, 2, 4, 8, 16, 32)  # GEMMs of SKEW_LEADS[-1] per phase
CALIBRATED = 2  # the phases within calibrate's range: its longest GEMM is one SKEW_LEADS[-1]; two bound the line
REPEATS = 3


def growth_schedule(nproc: int) -> tuple[Schedule, dict[int, tuple[str, int]]]:
    """One program for every rank and, per timed op id, ("gemm" or "sync", GEMMs in its phase)."""
    w, timed, axis = ProgramWriter(), {}, f"g{nproc}"
    for rep in range(REPEATS):
        for gemms in PHASES:
            synchronise(w, f"align.{gemms}.{rep}", axis)
            for i in range(gemms):
                timed[w.compute(f"gemm.{gemms}.{rep}.{i}", Gemm(*SKEW_LEADS[-1], "NN", DTYPE))] = ("gemm", gemms)
            sync = w.collective(f"sync.{gemms}.{rep}", axis, Collective("all_reduce", axis, 4, DTYPE))
            w.wait(sync)
            timed[sync] = ("sync", gemms)
    info = StepInfo(model="lag growth", plan=None, label=f"time-slicing lag after long compute, {nproc} ranks",
                    global_batch=1, seq=1, flops_hardware=0.0, flops_model=0.0, memory_per_gpu_bytes=0.0)
    groups = (GroupAxis(axis, (tuple(range(nproc)),)),)
    return Schedule(nproc, groups, (Program(tuple(range(nproc)), tuple(w.ops)),), info), timed


def summarize(timed: dict[int, tuple[str, int]], steps: list[list[tuple[np.ndarray, np.ndarray]]]) -> list[dict]:
    """Per phase: its compute (the GEMMs' summed time, mean over ranks, repeats and steps), the all-reduce after it
    (mean and median), and the line through the CALIBRATED phases' (compute, mean all-reduce) at this compute."""
    gemm: dict[tuple[int, int, int], float] = {}  # (rank, step, phase) -> summed GEMM time over repeats
    syncs: dict[int, list[float]] = {g: [] for g in PHASES}
    for rank, rank_steps in enumerate(steps):
        for s, (start, end) in enumerate(rank_steps):
            for op, (kind, gemms) in timed.items():
                if kind == "gemm":
                    gemm[(rank, s, gemms)] = gemm.get((rank, s, gemms), 0.0) + float(end[op] - start[op]) / REPEATS
                else:
                    syncs[gemms].append(float(end[op] - start[op]))
    rows = [{"gemms": g, "compute_s": float(np.mean([v for (_, _, p), v in gemm.items() if p == g])),
             "sync_mean_s": float(np.mean(syncs[g])), "sync_median_s": float(np.median(syncs[g])),
             "samples": len(syncs[g])} for g in PHASES]
    x = [r["compute_s"] for r in rows[:CALIBRATED]]
    y = [r["sync_mean_s"] for r in rows[:CALIBRATED]]
    slope, intercept = np.polyfit(x, y, 1) if np.ptp(x) > 0 else (0.0, float(np.mean(y)))
    for r in rows:
        r["line_s"] = float(intercept + max(slope, 0.0) * r["compute_s"])
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0], "out/lag_growth", 2, "as fit_local's 2- and 4-rank calibrations")
    schedule, timed = growth_schedule(args.nproc)
    rows = summarize(timed, run_microbenchmark(schedule, args.out, "lag-growth"))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"a 4-byte all-reduce of {args.nproc} ranks after a phase of compute (ms; mean and median over ranks, "
          f"{REPEATS} repeats and the steps), and the line through the first {CALIBRATED} phases (calibrate's range)")
    print(f"{'GEMMs':>6}{'compute':>10}{'all-reduce':>12}{'median':>9}{'line':>9}{'measured/line':>15}")
    for r in rows:
        print(f"{r['gemms']:>6}{1e3 * r['compute_s']:>10.1f}{1e3 * r['sync_mean_s']:>12.2f}"
              f"{1e3 * r['sync_median_s']:>9.2f}{1e3 * r['line_s']:>9.2f}{r['sync_mean_s'] / r['line_s']:>15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
