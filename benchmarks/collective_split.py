"""Each collective's time in a step, split into the wait for its last member and its transfer, measured and simulated.

    .venv/bin/python benchmarks/collective_split.py [--out out/fit_local] [--out ...] [--plan NAME] [--ops]
                                                    [--lags] [--json]

After `benchmarks/fit_local.py --out OUT`; measures nothing (seconds). On
this 2-core host 4 ranks time-share the cores and reach each collective at
different times. The twin keeps a program's ranks in step and has the last
of them issue each transfer its time-slicing lag later (ComputeUnit.lag:
twin calibrate's skew and floor, over the oversubscribed compute since a
wait last realigned the ranks), then moves its bytes at the pace the cores
allow. Whether a step's total comes out right says little about where that
time falls; this says it op by op.

For each held-out plan, with fit_local's fitted 4-rank file (its
microbenchmark file where it fitted nothing), and each collective (whose
members run one program, so that one op id names it on each), a step's
time in two parts:

- wait: measured, over every step and every member of each instance, the
  last member's issue less the member's own (how far the last is behind
  the mean, as the rank files time each issue); simulated, from the op's
  start (its stream reached it) to its transfer's begin
  (SimRun.transfer_begin_s): the wait for the other members plus the lag;
- transfer: measured, from the later of the last member's issue and the
  end of the transfer before it on its stream (a process group runs its
  transfers in order; its last member's, or this one's first end where
  that is earlier: a blocking wait's end is the host's resume) to the
  members' mean end; simulated, from the transfer's begin to its end.

Summed per step by (axis, kind, pass); --ops lists every collective of the
plans instead (--plan NAME keeps the plans whose name contains NAME).
Point-to-point transfers are left out: a send and its receive are two ops.

--lags pools the measured waits of the folders' plans (one program each) by
how much the members computed before they issued the collective, since the
last of their transfers had ended (their compute ops' time, the members'
mean), per group size, beside the line `twin calibrate` measured for the
lag (twin.sim.compute_unit.timeslice_lag_s over that compute: its skew,
its floor and span; the twin counts only compute that holds every core, and
from the last wait).
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor.measured import Measured  # noqa: E402
from rank_drift import COMPUTE, collectives_of, folders_parser, held_out_run, rows_of_folders  # noqa: E402
from topologies.machine import Machine  # noqa: E402
from twin.ir import Schedule, op_class  # noqa: E402
from twin.sim.compute_unit import timeslice_lag_s  # noqa: E402
from twin.sim.engine import SimRun, simulate  # noqa: E402

# bins of the compute before a collective (seconds), for --lags
COMPUTE_BINS_S = (0.0, 0.0005, 0.002, 0.005, 0.01, 0.02, 0.05, math.inf)


def _previous_on_stream(ops) -> dict[int, int | None]:
    """Op id -> the communication op before it on its stream (None for the first): a transfer starts once that
    one has ended (the executor's process groups, the simulator's streams, run their transfers in order)."""
    before, last = {}, {}
    for op in ops:
        if op.work.comm:
            before[op.id], last[op.stream] = last.get(op.stream), op.id
    return before


def measured_split(schedule: Schedule, measured: Measured) -> dict[tuple[int, int], tuple[float, float]]:
    """(program, op id) -> (wait, transfer) in seconds, each the mean over the measured steps and the members of
    each instance: wait, the last member's issue less the member's own (how far the last is behind the mean);
    transfer, from the later of the last member's issue and the end of the transfer before it on its stream (the
    last member's, or this one's first end if later) to the members' mean end."""
    split = {}
    previous_of = [_previous_on_stream(program.ops) for program in schedule.programs]
    for program, op, members_of in collectives_of(schedule):
        previous = previous_of[program][op.id]
        waits, transfers = [], []
        for step in zip(*measured.steps):  # per step: (start, end) per rank
            for members in members_of:
                issues = np.array([step[r][0][op.id] for r in members])
                ends = np.array([step[r][1][op.id] for r in members])
                # the rank files time a wait the host blocked on at its resume, which can come after the next
                # transfer has ended: the one before it had then completed by that transfer's first end
                free = min(max(step[r][1][previous] for r in members), ends.min()) if previous is not None \
                    else -math.inf
                waits.append(float(issues.max() - issues.mean()))
                transfers.append(float(ends.mean() - max(issues.max(), free)))
        split[(program, op.id)] = (float(np.mean(waits)), float(np.mean(transfers)))
    return split


def simulated_split(run: SimRun) -> dict[tuple[int, int], tuple[float, float]]:
    """(program, op id) -> (wait, transfer) in seconds, each the mean over the program's ranks, for the
    collectives measured_split reads: wait, from the op's start (its stream reached it) to its transfer's begin
    (SimRun.transfer_begin_s: the others had arrived and the lag had passed); transfer, from there to its end."""
    schedule, sym = run.schedule, run.symmetry
    ranks_of = defaultdict(list)
    for rank, program in schedule.program_of().items():
        ranks_of[program].append(rank)
    split = {}
    for program, op, _ in collectives_of(schedule):
        waits, transfers = [], []
        for rank in ranks_of[program]:
            cls = sym.class_of[rank]
            timeline, begin = run.timelines[cls], run.transfer_begin_s[(cls, op.id)]
            waits.append(begin - float(timeline.start_s[op.id]))
            transfers.append(float(timeline.end_s[op.id]) - begin)
        split[(program, op.id)] = (float(np.mean(waits)), float(np.mean(transfers)))
    return split


PARTS = ("measured_wait_s", "measured_transfer_s", "simulated_wait_s", "simulated_transfer_s")


def by_kind(schedule: Schedule, measured: dict, simulated: dict) -> list[dict]:
    """The waits and transfers summed per step by (axis, kind, pass) over the collectives of the first program
    that has them (a program's ranks run each of its ops once a step), the largest measured total first."""
    programs = sorted({program for program, _ in measured})
    if not programs:
        return []
    ops = schedule.programs[programs[0]].ops
    rows: dict[tuple, dict] = {}
    for (program, op_id), (wait, transfer) in measured.items():
        if program != programs[0]:
            continue
        work, tag = ops[op_id].work, ops[op_id].tag
        key = (work.group, work.kind, tag.phase if tag is not None else "")
        row = rows.setdefault(key, {"axis": key[0], "kind": key[1], "pass": key[2], "ops": 0}
                              | dict.fromkeys(PARTS, 0.0))
        row["ops"] += 1
        for part, value in zip(PARTS, (wait, transfer) + simulated[(program, op_id)]):
            row[part] += value
    return sorted(rows.values(), key=lambda r: -(r["measured_wait_s"] + r["measured_transfer_s"]))


def _compute_before(starts: np.ndarray, ends: np.ndarray, is_compute: np.ndarray):
    """One rank's step: t -> the time its compute ops ran up to t (they run one after another)."""
    order = np.argsort(starts[is_compute])
    s, e = starts[is_compute][order], ends[is_compute][order]
    done = np.concatenate(([0.0], np.cumsum(e - s)))
    xs, ys = np.empty(2 * len(s)), np.empty(2 * len(s))
    xs[0::2], xs[1::2], ys[0::2], ys[1::2] = s, e, done[:-1], done[1:]
    return lambda t: float(np.interp(t, xs, ys)) if len(xs) else 0.0


def lag_points(schedule: Schedule, measured: Measured) -> list[tuple[int, float, float]]:
    """(members, compute_s, lag_s) per collective, instance and measured step of a one-program schedule (none
    otherwise): lag_s how far the last member issued it behind the members' mean; compute_s the members' mean
    compute since the last of their own transfers had ended before they issued it."""
    if len(schedule.programs) != 1:
        return []
    ops = schedule.programs[0].ops
    is_compute = np.array([op_class(op.work) in COMPUTE for op in ops])
    comm = np.array([op.work.comm for op in ops])
    points, collectives = [], collectives_of(schedule)
    for step in zip(*measured.steps):
        before = [_compute_before(st, en, is_compute) for st, en in step]
        comm_ends = [np.sort(en[comm]) for _, en in step]
        for _, op, members_of in collectives:
            for members in members_of:
                issues = np.array([step[r][0][op.id] for r in members])
                computed = []
                for r, issue in zip(members, issues):
                    ended = comm_ends[r][comm_ends[r] <= issue]
                    computed.append(before[r](issue) - (before[r](ended[-1]) if len(ended) else 0.0))
                points.append((len(members), float(np.mean(computed)), float(issues.max() - issues.mean())))
    return points


def calibrated_lag_s(machine: Machine, compute_s: float) -> float:
    """The lag twin calibrate's line gives after `compute_s` of compute that holds every core."""
    node = machine.node
    return timeslice_lag_s(compute_s, node.timeslice_skew, node.timeslice_lag_s, node.timeslice_lag_after_s,
                           node.timeslice_lag_span_s, node.timeslice_skew_beyond_span)


def lags_by_compute(points: list[tuple[int, float, float, float]]) -> list[dict]:
    """(members, compute_s, lag_s, calibrated_s) points binned by group size and COMPUTE_BINS_S: per bin the
    points, their mean compute, mean and median lag, and the calibrated line's mean over them."""
    rows = []
    for members in sorted({p[0] for p in points}):
        group = np.array([p[1:] for p in points if p[0] == members])
        for lo, hi in zip(COMPUTE_BINS_S[:-1], COMPUTE_BINS_S[1:]):
            inside = group[(group[:, 0] >= lo) & (group[:, 0] < hi)]
            if len(inside):
                rows.append({"members": members, "from_s": lo, "to_s": hi, "points": len(inside),
                             "compute_s": float(inside[:, 0].mean()), "lag_mean_s": float(inside[:, 1].mean()),
                             "lag_median_s": float(np.median(inside[:, 1])),
                             "calibrated_s": float(inside[:, 2].mean())})
    return rows


def plan_lags(summary: dict, machine: Machine) -> dict:
    plan, schedule, measured = held_out_run(summary)
    return {"plan": plan, "points": [(n, c, lag, calibrated_lag_s(machine, c))
                                     for n, c, lag in lag_points(schedule, measured)]}


def print_lags(rows: list[dict]) -> None:
    print("the last member's issue behind the mean, by the members' compute since their last transfer ended")
    print(f"  {'members':>7}  {'compute (ms)':<14}{'points':>7}{'mean':>9}{'lag mean':>10}{'median':>8}"
          f"{'calibrated line':>17}")
    for r in rows:
        top = "up" if math.isinf(r["to_s"]) else f"{1e3 * r['to_s']:g}"
        span = f"{1e3 * r['from_s']:g}-{top}"
        print(f"  {r['members']:>7}  {span:<14}{r['points']:>7}"
              f"{1e3 * r['compute_s']:>9.2f}{1e3 * r['lag_mean_s']:>10.2f}{1e3 * r['lag_median_s']:>8.2f}"
              f"{1e3 * r['calibrated_s']:>17.2f}")


def plan_row(summary: dict, machine) -> dict:
    plan, schedule, measured = held_out_run(summary)
    meas, sim = measured_split(schedule, measured), simulated_split(simulate(schedule, machine))
    program = min((p for p, _ in meas), default=0)
    ops = schedule.programs[program].ops
    return {
        "plan": plan,
        "kinds": by_kind(schedule, meas, sim),
        "ops": [{"op": op_id, "name": ops[op_id].name, "axis": ops[op_id].work.group, "kind": ops[op_id].work.kind}
                | dict(zip(PARTS, parts + sim[(p, op_id)])) for (p, op_id), parts in sorted(meas.items())
                if p == program],
    }


def _ms(row: dict) -> str:
    return "".join(f"{1e3 * row[part]:>10.2f}" for part in PARTS)


HEADER = f"{'wait':>10}{'transfer':>10}{'wait':>10}{'transfer':>10}   ms: measured | simulated"


def print_plan(row: dict, ops: bool) -> None:
    if ops:
        print(f"  {row['plan']}: per collective (rank 0's program)")
        print(f"    {'op':>5}  {'name':<34}{'axis':<7}{'kind':<16}{HEADER}")
        for op in row["ops"]:
            print(f"    {op['op']:>5}  {op['name'][:33]:<34}{op['axis']:<7}{op['kind']:<16}{_ms(op)}")
        return
    total = {part: sum(k[part] for k in row["kinds"]) for part in PARTS}
    print(f"  {row['plan']}: a step's collectives, measured wait {1e3 * total['measured_wait_s']:.1f} + transfer "
          f"{1e3 * total['measured_transfer_s']:.1f} ms, simulated {1e3 * total['simulated_wait_s']:.1f} + "
          f"{1e3 * total['simulated_transfer_s']:.1f} ms")
    print(f"    {'axis':<7}{'kind':<16}{'pass':<7}{'ops':>4}{HEADER}")
    for k in row["kinds"]:
        print(f"    {k['axis']:<7}{k['kind']:<16}{k['pass']:<7}{k['ops']:>4}{_ms(k)}")


def main(argv: list[str] | None = None) -> int:
    ap = folders_parser(__doc__)
    ap.add_argument("--plan", help="only the plans whose name contains this (e.g. gx2_gz2)")
    ap.add_argument("--ops", action="store_true", help="every collective of each plan, not sums by kind")
    ap.add_argument("--lags", action="store_true",
                    help="the measured waits of all the folders' plans by the compute before them, beside "
                         "twin calibrate's line (one table)")
    args = ap.parse_args(argv)
    row = plan_lags if args.lags else plan_row

    def kept(summary: dict, machine: Machine) -> dict | None:  # --plan: skip the others before reading them
        return row(summary, machine) if not args.plan or args.plan in Path(summary["schedule"]).stem else None

    rows = rows_of_folders(ap, args.out or ["out/fit_local"], ("local-4-fitted.toml", "local-4.toml"), kept)
    rows = {folder: [r for r in plan_rows if r is not None] for folder, plan_rows in rows.items()}
    if args.plan and not any(rows.values()):
        ap.error(f"--plan {args.plan}: no held-out plan's name contains it")
    if args.lags:
        binned = lags_by_compute([p for plan_rows in rows.values() for r in plan_rows for p in r["points"]])
        if args.json:
            print(json.dumps({"lags": binned}, indent=2))
        else:
            print_lags(binned)
        return 0
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for folder, plan_rows in rows.items():
        print(f"{folder} (fit_local's second column; waits and transfers summed over a step)")
        for row in plan_rows:
            print_plan(row, args.ops)
    return 0


if __name__ == "__main__":
    sys.exit(main())
