"""Do the ranks of a 4-rank run on this host compute in step? fit_local's held-out plans, read from its folder.

    .venv/bin/python benchmarks/rank_drift.py [--out out/fit_local] [--out ...] [--json]

After `benchmarks/fit_local.py --out OUT`; measures nothing. The twin
simulates ranks that run one program as one (twin.sim.symmetry): they
compute, and wait, together. Where the ranks share the host's cores
(node.shared_cores: 4 ranks on 2 cores here) that is also what sets their
compute rate: while all four compute, each runs at the rate `twin
calibrate` measured with all four computing at once (NodeCores). This
reads the per-rank timings saved for each held-out plan (the launch its
summary names: fit_local's median launch) and prints, per plan:

- how far apart the ranks reach and leave a collective: the spread
  (latest minus earliest) of its members' start and end times, the mean
  over the collectives of the measured steps;
- while rank 0 runs a GEMM, how many of the other ranks compute too
  (element-wise, GEMM or attention), measured and as the twin simulates
  every rank (`simulate(full=True)`): 3 where all four keep in step;
- rank 0's GEMM rate, measured and the twin's (its simulated GEMM time on
  the critical rank), each over the machine file's calibrated rate;
- the step's error, predicted (the machine file, as fit_local's first
  column) over measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.measured import Measured, load_measured  # noqa: E402
from topologies.machine import Machine, load_machine  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.ir import Collective, Gemm, Op, Schedule, op_class  # noqa: E402
from twin.ir_io import load_schedule  # noqa: E402
from twin.sim.engine import SimRun, simulate  # noqa: E402

COMPUTE = {"gemm", "elementwise", "attention"}


def collectives_of(schedule: Schedule) -> list[tuple[int, Op, list[tuple[int, ...]]]]:
    """(program, op, instances) of each collective and those of its axis's instances whose members all run its
    program (their op ids then name the same call); a collective with none is left out."""
    program_of = schedule.program_of()
    instances = {axis.name: axis.instances for axis in schedule.groups}
    found = []
    for index, program in enumerate(schedule.programs):
        for op in program.ops:
            if isinstance(op.work, Collective):
                own = [m for m in instances.get(op.work.group, ()) if all(program_of[r] == index for r in m)]
                if own:
                    found.append((index, op, own))
    return found


def collective_spread_s(schedule: Schedule, measured: Measured, edge: int = 1) -> float:
    """Mean over the collectives of every measured step of (latest - earliest) end (`edge` 1; 0: start, how far
    apart the members reach it) among one instance's members, where they all run one program (collectives_of).
    NaN without such a collective."""
    collectives = collectives_of(schedule)
    spreads = []
    for step in zip(*measured.steps):  # per step: (start, end) per rank
        for _, op, members_of in collectives:
            for members in members_of:
                ends = [step[r][edge][op.id] for r in members]
                spreads.append(max(ends) - min(ends))
    return float(np.mean(spreads)) if spreads else float("nan")


def _intervals(starts: np.ndarray, ends: np.ndarray, keep: np.ndarray) -> list[tuple[float, float]]:
    """The kept ops' (start, end), in time order: one rank's compute ops run one after another."""
    return sorted((float(s), float(e)) for s, e, k in zip(starts, ends, keep) if k and e > s)


def _overlap_s(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total time two sets of intervals overlap (each in time order, none overlapping another of its set)."""
    total, j = 0.0, 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            total += max(0.0, min(e, b[k][1]) - max(s, b[k][0]))
            k += 1
    return total


def others_computing(schedule: Schedule, per_rank: list[tuple[np.ndarray, np.ndarray]], rank: int = 0) -> float:
    """While `rank` runs GEMMs, how many other ranks compute at the same time, on average (time-weighted):
    per_rank holds each rank's (start, end) per op of its program, on one time axis."""
    program_of = schedule.program_of()
    classes = [np.array([op_class(op.work) for op in schedule.programs[program_of[r]].ops])
               for r in range(schedule.world_size)]
    gemms = _intervals(*per_rank[rank], classes[rank] == "gemm")
    gemm_s = sum(e - s for s, e in gemms)
    if gemm_s <= 0:
        return float("nan")
    together = sum(_overlap_s(gemms, _intervals(*per_rank[r], np.isin(classes[r], list(COMPUTE))))
                   for r in range(schedule.world_size) if r != rank)
    return together / gemm_s


def gemm_rate(schedule: Schedule, program: int, seconds: np.ndarray) -> float:
    """FLOP/s of one program's GEMMs over their summed durations (`seconds`, per op)."""
    ops = [op for op in schedule.programs[program].ops if isinstance(op.work, Gemm)]
    flops = sum(2.0 * op.work.m * op.work.n * op.work.k * op.work.batch for op in ops)
    return flops / float(sum(seconds[op.id] for op in ops))


class HeldOutRun(NamedTuple):
    """A held-out run fit_local saved: its plan's name, its schedule and what the executor measured."""

    plan: str
    schedule: Schedule
    measured: Measured


def held_out_run(summary: dict) -> HeldOutRun:
    """The run a `twin run --json` summary names: the schedule it ran, and the run folder beside it (fit_local
    saves OUT/NAME.json and OUT/NAME/)."""
    stem = os.path.splitext(summary["schedule"])[0]
    schedule = load_schedule(summary["schedule"])
    return HeldOutRun(os.path.basename(stem), schedule, load_measured(stem, schedule))


def plan_row(summary: dict, machine: Machine) -> dict:
    plan, schedule, measured = held_out_run(summary)
    calibrated = machine.device.empirical_gemm_flop_per_s
    reduced, full = simulate(schedule, machine), simulate(schedule, machine, full=True)
    critical = max(reduced.timelines, key=lambda t: float(np.nanmax(t.end_s)))
    per_rank_measured = [measured.steps[r][measured.median_step] for r in range(schedule.world_size)]
    return {
        "plan": plan,
        "collective_start_spread_ms": 1e3 * collective_spread_s(schedule, measured, edge=0),
        "collective_end_spread_ms": 1e3 * collective_spread_s(schedule, measured),
        "others_computing_measured": others_computing(schedule, per_rank_measured),
        "others_computing_twin": others_computing(schedule, _per_rank(full)),
        "gemm_rate_over_calibrated_measured": gemm_rate(schedule, measured.ranks[0]["program"],
                                                        measured.op_mean_s[0]) / calibrated,
        "gemm_rate_over_calibrated_twin": gemm_rate(schedule, critical.program,
                                                    critical.end_s - critical.start_s) / calibrated,
        "step_error_pct": 100 * (reduced.step_time_s / measured.step_time_s - 1),
    }


def _per_rank(run: SimRun) -> list[tuple[np.ndarray, np.ndarray]]:
    by_rank = {t.rank: (t.start_s, t.end_s) for t in run.timelines}
    return [by_rank[r] for r in range(run.schedule.world_size)]


def rows_of_folders(ap: argparse.ArgumentParser, folders: list[str], machine_files: tuple[str, ...],
                    row: Callable[[dict, Machine], dict]) -> dict[str, list[dict]]:
    """Per fit_local folder, `row(summary, machine)` of each held-out run, with the first of `machine_files`
    the folder has; a folder without them, or a run whose schedule cannot be read, is one line naming the
    folder (exit 2)."""
    doc = {}
    for folder in folders:
        candidates = [os.path.join(folder, name) for name in machine_files]
        held = os.path.join(folder, "held-out-runs.json")
        machine = next((p for p in candidates if os.path.exists(p)), " or ".join(candidates))
        missing = next((p for p in (held, machine) if not os.path.exists(p)), None)
        if missing:
            ap.error(f"--out {folder}: {missing} is missing; run benchmarks/fit_local.py --out {folder} first")
        try:
            file = load_machine(machine)
            doc[folder] = [row(summary, file) for summary in json.loads(Path(held).read_text())]
        except TwinError as e:  # a schedule of an older twin, a rank file missing: one line, exit 2
            ap.error(f"--out {folder}: {e}")
    return doc


def folders_parser(doc: str) -> argparse.ArgumentParser:
    """The parser of a benchmark that reads fit_local's folders (`doc`: its module docstring): --out, repeatable,
    and --json; a benchmark adds its own options before parsing."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", action="append", help="benchmarks/fit_local.py's folder (repeatable; default "
                    "out/fit_local)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = folders_parser(__doc__)
    args = ap.parse_args(argv)
    doc = rows_of_folders(ap, args.out or ["out/fit_local"], ("local-4.toml",), plan_row)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for folder, rows in doc.items():
        print(f"{folder} (machine file local-4.toml; GEMM rates over its calibrated one)")
        print(f"  {'plan':<36}{'spread at':>9}{'end':>6}{'others computing':>18}{'GEMM rate':>15}{'step':>8}")
        print(f"  {'':<36}{'start ms':>9}{'ms':>6}{'meas.':>9}{'twin':>9}{'meas.':>8}{'twin':>7}{'error':>8}")
        for r in rows:
            print(f"  {r['plan']:<36}{r['collective_start_spread_ms']:>9.2f}{r['collective_end_spread_ms']:>6.2f}"
                  f"{r['others_computing_measured']:>9.2f}"
                  f"{r['others_computing_twin']:>9.2f}{r['gemm_rate_over_calibrated_measured']:>8.2f}"
                  f"{r['gemm_rate_over_calibrated_twin']:>7.2f}{r['step_error_pct']:>+7.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
