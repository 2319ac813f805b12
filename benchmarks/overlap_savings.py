"""Does overlap pay on this host? Plans run with their overlapped collectives and without, measured and simulated.

    .venv/bin/python benchmarks/overlap_savings.py --machine FILE [--machine FILE ...] [--nproc 4]
                                                   [--launches 3] [--out out/overlap_savings] [--json]

A what-if a user asks the twin: should this plan overlap its collectives
(AxoNN's OAR, ORS and OAG)? Each of PLANS is exported for the first
--machine and executed on --nproc ranks of this host twice, as it is and
with oar=0,ors=0,oag=0 (--launches times each, the median launch kept, as
benchmarks/fit_local.py does), and `twin validate --runs` predicts both on
every --machine. Per plan: the measured saving, 1 - (step with overlap) /
(step without), and each file's. On this project's 2-core host at 4 ranks
the measured savings were -2% to +2% where the twin credited 7-20%
(docs/fit.md, "Overlap buys nothing"); give the files to compare, e.g. one
calibration fitted with and without `node.comm_latency_pace_under_compute`
(benchmarks/oversubscribed_host.py writes both as local-4-both.toml and
local-4-all-three.toml). Nothing is fitted here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_local import measure, median_launches, twin_json  # noqa: E402

PLANS = [("tiny", "gx=2,gz=2", 8), ("tiny", "gz=4", 8), ("tiny", "gx=4", 8), ("small", "gx=2,gz=2", 8),
         ("deep", "gz=2,gdata=2,zero=3", 8)]
OFF = "oar=0,ors=0,oag=0"


def savings(rows: list[dict], machines: list[str]) -> list[dict]:
    """Per plan, from `twin validate --json` rows in PLANS order, each plan then its overlap-off twin: the
    measured and each machine's predicted saving of overlap (1 - on / off)."""
    out = []
    for (model, plan, _), on, off in zip(PLANS, rows[0::2], rows[1::2]):
        out.append({"model": model, "plan": plan, "measured_on_s": on["measured_s"], "measured_off_s": off["measured_s"],
                    "measured_saving": 1 - on["measured_s"] / off["measured_s"],
                    "predicted_saving": {m: 1 - on["predicted_s"][m] / off["predicted_s"][m] for m in machines}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", action="append", required=True,
                    help="a calibrated machine file of this host (repeat to compare; the first exports the plans)")
    ap.add_argument("--nproc", type=int, default=4, help="ranks (default 4; the plans need 4)")
    ap.add_argument("--launches", type=int, default=3, help="launches of each run, the median kept (default 3)")
    ap.add_argument("--steps", type=int, default=7, help="measured steps per run (default 7)")
    ap.add_argument("--out", default="out/overlap_savings", help="working folder (default out/overlap_savings)")
    ap.add_argument("--quiet-wait", type=float, default=120.0, help="seconds to wait for a quiet host (0: never)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if args.nproc != 4:
        ap.error(f"--nproc {args.nproc}: the plans are written for 4 ranks; give --nproc 4")
    if args.launches < 1:
        ap.error(f"--launches {args.launches}: give at least 1")
    for path in args.machine:
        if not os.path.isfile(path):
            ap.error(f"--machine {path}: no such file; write one with twin calibrate or benchmarks/fit_local.py")
    runs = [(m, p, b) for m, plan, b in PLANS for p in (plan, f"{plan},{OFF}")]
    rounds = [measure(runs, args.nproc, args.machine[0], os.path.join(args.out, f"launch-{k + 1}"), args.steps,
                      args.quiet_wait) for k in range(args.launches)]
    path = os.path.join(args.out, "runs.json")
    Path(path).write_text(json.dumps(median_launches(rounds), indent=1))
    table = twin_json("validate", "--runs", path, *[a for m in args.machine for a in ("--machine", m)], "--json")
    rows = savings(table["rows"], args.machine)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"overlap's saving, 1 - (step with) / (step without), {args.nproc} ranks, median of {args.launches} launches")
    print(f"{'plan':<28}{'measured with / without':>26}{'saving':>8}" + "".join(f"{Path(m).stem[:22]:>24}" for m in args.machine))
    for r in rows:
        print(f"{r['model'] + ' ' + r['plan']:<28}{1e3 * r['measured_on_s']:>13.1f} / {1e3 * r['measured_off_s']:>6.1f} ms"
              f"{100 * r['measured_saving']:>+7.1f}%" + "".join(f"{100 * r['predicted_saving'][m]:>+23.1f}%" for m in args.machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
