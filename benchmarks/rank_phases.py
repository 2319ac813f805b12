"""In step or scattered? fit_local's held-out plans against both bounds of a time-sliced host.

    .venv/bin/python benchmarks/rank_phases.py [--out out/fit_local] [--out ...] [--comm-share S] [--json]

After `benchmarks/fit_local.py --out OUT`; measures nothing (seconds). On
this 2-core host 4 ranks time-share the cores. The twin runs the ranks of a
program in step: while one computes all do, each at the share of a core
`twin calibrate` measured with all four computing at once. The other bound
(twin.sim.phases) scatters the phases: each other rank computes, independently,
the fraction of the step a rank computes (its duty), found as a fixed point.
Per plan, with the fitted 4-rank file (fit_local's second column; the
microbenchmarks' own where it fitted nothing):

- others computing while rank 0 runs a GEMM, measured (rank_drift.py's
  count), beside what independence gives from the measured duty: 3 x the
  fraction of the step rank 0 computes (in step: 3);
- the step's error in step (the twin as it is) and scattered, and whether
  the measured step lies between the two.

--comm-share S counts each other rank as holding S of a core while it moves
bytes in a collective, not none (benchmarks/compute_beside_comm.py measures
S on this host; twin.sim.phases): from when the collective's last member
issued it to its end, beside no compute of its own; `--share-while
out-of-compute` charges it on all the rank's time out of compute instead
(the forty-fourth session's bound, docs/fit.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rank_drift import COMPUTE, folders_parser, held_out_run, others_computing, rows_of_folders  # noqa: E402
from twin.ir import op_class  # noqa: E402
from twin.sim.phases import simulate_scattered  # noqa: E402


def plan_row(summary: dict, machine, comm_share: float = 0.0, share_while: str = "moving") -> dict:
    plan, schedule, measured = held_out_run(summary)
    step = measured.step_time_s
    ops = schedule.programs[measured.ranks[0]["program"]].ops
    computing_s = sum(float(measured.op_mean_s[0][op.id]) for op in ops if op_class(op.work) in COMPUTE)
    per_rank = [measured.steps[r][measured.median_step] for r in range(schedule.world_size)]
    bounds = simulate_scattered(schedule, machine, comm_share, share_while=share_while)
    in_step, scattered = bounds.in_step.step_time_s, bounds.run.step_time_s
    return {
        "plan": plan,
        "others_computing_measured": others_computing(schedule, per_rank),
        "others_if_independent": (schedule.world_size - 1) * computing_s / step,
        "duty_scattered": bounds.duty,
        "moving_scattered": bounds.moving,
        "in_step_error_pct": 100 * (in_step / step - 1),
        "scattered_error_pct": 100 * (scattered / step - 1),
        "between": scattered <= step <= in_step,
    }


def summary_of(rows: list[dict]) -> dict:
    """Each bound's mean absolute step error (None over no plans) and in how many plans the measured step lies
    between them."""
    return {f"{k}_mean_abs_pct": float(np.mean([abs(r[f"{k}_error_pct"]) for r in rows])) if rows else None
            for k in ("in_step", "scattered")} | {"between": sum(r["between"] for r in rows), "plans": len(rows)}


def main(argv: list[str] | None = None) -> int:
    ap = folders_parser(__doc__)
    ap.add_argument("--comm-share", type=float, default=0.0,
                    help="the share of a core a rank takes in a collective (default 0; "
                         "benchmarks/compute_beside_comm.py measures it; when: --share-while)")
    ap.add_argument("--share-while", choices=("moving", "out-of-compute"), default="moving",
                    help="when a rank holds --comm-share of a core: while it moves bytes in a collective (default) "
                         "or all its time out of compute (the forty-fourth session's bound)")
    args = ap.parse_args(argv)
    share_while = args.share_while.replace("-", "_")
    if not 0.0 <= args.comm_share <= 1.0:
        ap.error(f"--comm-share {args.comm_share}: a share of one core, from 0 to 1")
    # the fitted file, or where fit_local fitted nothing the microbenchmarks' own (its second column then)
    rows = rows_of_folders(ap, args.out or ["out/fit_local"], ("local-4-fitted.toml", "local-4.toml"),
                           lambda summary, machine: plan_row(summary, machine, args.comm_share, share_while))
    doc = {folder: {"rows": r, "summary": summary_of(r)} for folder, r in rows.items()}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for folder, d in doc.items():
        print(f"{folder} (fit_local's second column; a rank takes {args.comm_share:g} of a core while "
              + ("it moves bytes in a collective)" if share_while == "moving" else "it does not compute)"))
        print(f"  {'plan':<36}{'others computing':>19}{'step error':>20}")
        print(f"  {'':<36}{'meas.':>9}{'indep.':>10}{'in step':>11}{'scattered':>11}  between")
        for r in d["rows"]:
            print(f"  {r['plan']:<36}{r['others_computing_measured']:>9.2f}{r['others_if_independent']:>10.2f}"
                  f"{r['in_step_error_pct']:>+10.1f}%{r['scattered_error_pct']:>+10.1f}%  "
                  f"{'yes' if r['between'] else 'no'}")
        s = d["summary"]
        if not s["plans"]:
            print("  no held-out plans")
            continue
        print(f"  mean absolute error: in step {s['in_step_mean_abs_pct']:.1f}%, scattered "
              f"{s['scattered_mean_abs_pct']:.1f}%; measured between the two in {s['between']} of {s['plans']} plans")
    return 0


if __name__ == "__main__":
    sys.exit(main())
