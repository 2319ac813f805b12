"""Where the twin misses Megatron-DeepSpeed's multi-node A100 runs: time per pipeline slot, measured and predicted.

    .venv/bin/python benchmarks/pipeline_slots.py [--model 39.1|all] [--jobs N] [--json]

A 1F1B step of m micro-batches on pp stages is m + pp - 1 slots long on its
critical path, each slot one stage's forward, recompute and backward of one
micro-batch (plus the data-parallel gradient sum and the optimizer at the
end, a small part here). Per GPU, a slot holds (layers / pp) layers of
(1 / tp) of the work each, at the same micro-batch: so at one micro-batch
size, every plan with the same tp x pp does the same work per GPU per slot,
whatever its tp. The table divides each run's step by its slots, measured
and as the twin predicts it (first principles, topologies/dgx-a100-800g.toml,
the assumptions of benchmarks/fit_accuracy.py), grouped by tp x pp and
micro-batch size. Rows that differ only in tp should then have equal
measured slot times, up to tensor parallelism's own costs (more all-reduces
and smaller GEMMs as tp grows); where they do not, what the twin leaves out
grows with tp in the other direction. Last, the mean step error by tensor
parallelism over the runs shown. Data: benchmarks/data/README.md
(validation data: nothing is fitted here).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twin.fit.solve import simulate_runs  # noqa: E402
from twin.runs import load_runs  # noqa: E402
from twin.search.rank import worker_count  # noqa: E402

from fit_accuracy import ASSUME, MACHINE, VALIDATION  # noqa: E402


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="39.1",
                    help="the model size column's value to show (default 39.1), or all")
    ap.add_argument("--jobs", type=int, default=0, help="worker processes (default: one per core)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    runs = [r for r in load_runs(str(VALIDATION), ASSUME) if args.model in (r.label, "all")]
    if not runs:
        ap.error(f"--model {args.model}: no such model size in {VALIDATION.name}")
    predicted = [p.step_s for p in simulate_runs(runs, MACHINE, [()] * len(runs), args.jobs or worker_count(None))]
    rows = []
    for run, step in zip(runs, predicted):
        p = run.plan
        micro_batches = p.global_batch // (p.batch_split * p.mbs)  # per pipeline: the batch over dp, in mbs
        slots = micro_batches + p.pp - 1
        rows.append({"model": run.label, "tp": p.gx, "pp": p.pp, "dp": p.gdata, "mbs": p.mbs, "micro_batches": micro_batches,
                     "slots": slots,
                     "measured_slot_s": run.step_time_s / slots, "predicted_slot_s": step / slots,
                     "measured_s": run.step_time_s, "predicted_s": step})
    if args.json:
        print(json.dumps(rows, indent=1))
        return rows
    groups: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["tp"] * row["pp"], row["mbs"], row["model"])].append(row)
    print(f"model {args.model}: step / (micro-batches + pp - 1), measured and predicted (first principles)")
    print(f"{'model':>5} {'tp*pp':>5} {'mbs':>3} {'tp':>3} {'pp':>3} {'dp':>3} {'slots':>5} {'measured':>9} {'predicted':>9}"
          f" {'pred/meas':>9}")
    for (size, mbs, model), members in sorted(groups.items(), key=lambda item: (item[0][2], item[0][:2])):
        for row in sorted(members, key=lambda r: r["tp"]):
            print(f"{model:>5} {size:>5} {mbs:>3} {row['tp']:>3} {row['pp']:>3} {row['dp']:>3} {row['slots']:>5} "
                  f"{1e3 * row['measured_slot_s']:>7.0f}ms {1e3 * row['predicted_slot_s']:>7.0f}ms "
                  f"{row['predicted_slot_s'] / row['measured_slot_s']:>9.2f}")
    by_tp: dict[int, list[float]] = defaultdict(list)
    for row in rows:
        by_tp[row["tp"]].append(row["predicted_s"] / row["measured_s"] - 1)
    print("mean step error by tp: " + ", ".join(f"tp={tp} {100 * sum(e) / len(e):+.1f}% ({len(e)} runs)"
                                               for tp, e in sorted(by_tp.items())))
    return rows


if __name__ == "__main__":
    main()
