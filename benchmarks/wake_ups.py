"""How long a rank's host thread waits to run again after a collective it blocked on completes: read from runs.

    .venv/bin/python benchmarks/wake_ups.py RUN_DIR [RUN_DIR ...] [--json]

A RUN_DIR is what `twin run SCHEDULE --out RUN_DIR` writes (its rank*.json are read); measures and
simulates nothing. On CPU the executor ends a comm op the host thread blocked on when the host resumes (the
ops after it wait for that), and records beside it, per step and op, the seconds from the op's completion
(its future's callback, on gloo's thread) to the resume (executor.runtime.StepRecord.woke): the host thread
waiting for a core after the wake-up. Per run, over every rank and measured step: the blocking waits per
step, their wake-ups' mean and 90th percentile, and the wake-ups summed over a step against the step.

Why: on this project's 2-core host, with 4 ranks, the gathers and reduce-scatters of tiny gz=4 take 5.0-5.2
ms each after their last member issued them where calibrate's latency and bandwidth give 2.1-4.2 ms
(docs/fit.md, fiftieth session); a woken thread queued behind other ranks' compute would be one such cost,
which calibrate's collectives, each timed after a synchronisation, do not include. The fiftieth session's
reading: 0.1-0.6 ms a wake-up, 0.2-5% of a step summed, alike in the plans the twin gets right and wrong.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.measured import read_rank_files  # noqa: E402
from twin.errors import TwinError  # noqa: E402


def wake_ups(ranks: list[dict], where: str) -> dict:
    """The wake-ups of one run's rank files (`where` names it in errors): waits per step (mean over ranks and
    steps), the wake-ups' mean and 90th percentile (s), their sum per step (mean over ranks) and the median
    step (s)."""
    per_step, waits, all_woke, steps = [], [], [], []
    for r in ranks:
        for step in r["steps"]:
            if "woke" not in step:
                raise TwinError(f"{where}: rank {r['rank']}'s steps have no 'woke' times (an executor before the "
                                "fiftieth session's); run `twin run` again")
            woke = list(step["woke"].values())
            all_woke.extend(woke)
            per_step.append(sum(woke))
            waits.append(len(woke))
            steps.append(max(step["end"]) if step["end"] else 0.0)
    ordered = sorted(all_woke)
    return {"waits_per_step": statistics.fmean(waits) if waits else 0.0,
            "mean_s": statistics.fmean(all_woke) if all_woke else 0.0,
            "p90_s": ordered[int(0.9 * (len(ordered) - 1))] if ordered else 0.0,
            "summed_per_step_s": statistics.fmean(per_step) if per_step else 0.0,
            "step_s": statistics.median(steps) if steps else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="folders `twin run --out` wrote (their rank*.json)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    rows = {}
    for run in args.runs:
        world = len(list(Path(run).glob("rank*.json")))
        if not world:
            ap.error(f"{run}: no rank*.json there; give a folder `twin run --out` wrote")
        try:
            rows[run] = wake_ups(read_rank_files(run, world), run)
        except (KeyError, TypeError, AttributeError) as e:
            ap.error(f"{run}: its rank files are not the executor's ({e!r}); run `twin run` again")
        except TwinError as e:
            ap.error(str(e))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(run) for run in args.runs) + 2
    print(f"  {'run':<{width}}{'waits/step':>11}{'mean':>9}{'p90':>9}{'summed/step':>13}{'step':>9}")
    for run, row in rows.items():
        print(f"  {run:<{width}}{row['waits_per_step']:>11.1f}{1e3 * row['mean_s']:>7.2f}ms{1e3 * row['p90_s']:>7.2f}ms"
              f"{1e3 * row['summed_per_step_s']:>10.1f} ms{1e3 * row['step_s']:>7.0f}ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
