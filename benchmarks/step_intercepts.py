"""What a step costs besides its micro-batches, measured against simulated, on the A100 calibration runs.

    .venv/bin/python benchmarks/step_intercepts.py [--jobs N] [--json]

vTrain's single-node file (calibration data: benchmarks/data/README.md) runs
each model, plan and micro-batch size at 2-4 global batches, so its step
times are lines in the number of micro-batches ga: step = a + b ga. The
slope b is one micro-batch; the intercept a is what the step does once:
without a pipeline, the gradients' data-parallel all-reduce and the
optimizer's passes, which stream a fixed number of bytes per parameter this
GPU holds. This script fits both lines to every group of runs without a
pipeline (measured, and simulated on the machine file under each optimizer
inventory of twin.builders.megatron_kernels) and prints the intercepts in
milliseconds per billion parameters per GPU, by hidden size, tensor and data
parallelism: the number that says which optimizer the runs executed
(docs/fit.md, "The step's fixed cost"). Validation data is never read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_accuracy import ASSUME, CALIBRATION, MACHINE  # noqa: E402

from twin.fit.solve import simulate_runs  # noqa: E402
from twin.runs import MeasuredRun, load_runs  # noqa: E402
from twin.search.rank import worker_count  # noqa: E402

BASE_ASSUME = ASSUME.replace(",optimizer=flat", "")  # each optimizer in turn below
OPTIMIZERS = ("megatron", "flat")


def _group(run: MeasuredRun) -> tuple[int, int, int, int, int]:
    """(hidden, layers, tp, dp, mbs): the runs of one group differ only in their global batch."""
    p = run.plan
    return run.model.hidden, run.model.layers, p.gx, p.gdata, p.mbs


def _parameters_per_gpu(run: MeasuredRun) -> float:
    """Parameters this GPU holds (12 h^2 a layer and the vocabulary's table, over tp), in billions."""
    m = run.model
    return (12 * m.layers * m.hidden ** 2 + m.vocab * m.hidden) / run.plan.gx / 1e9


def intercepts(runs: list[MeasuredRun], steps: dict[str, np.ndarray]) -> dict[tuple, dict[str, float]]:
    """Per (hidden, tp, dp): each column's mean intercept per billion parameters per GPU, and its slope's mean
    ratio to the measured one (how well the micro-batches themselves are predicted)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, run in enumerate(runs):
        groups[_group(run)].append(i)
    table: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for (hidden, _, tp, dp, _), rows in groups.items():
        if len(rows) < 2:
            continue
        ga = np.array([runs[i].plan.global_batch / (runs[i].plan.mbs * dp) for i in rows])
        design = np.vstack([np.ones_like(ga), ga]).T
        billions = _parameters_per_gpu(runs[rows[0]])
        slope = {}
        for column, seconds in steps.items():
            a, b = np.linalg.lstsq(design, 1000 * seconds[rows], rcond=None)[0]
            table[(hidden, tp, dp)][column].append(a / billions)
            slope[column] = b
        for column in steps:
            if column != "measured":
                table[(hidden, tp, dp)][f"{column} slope"].append(slope[column] / slope["measured"])
    return {key: {column: float(np.mean(values)) for column, values in row.items()} for key, row in table.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=worker_count(None))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    runs = [r for r in load_runs(str(CALIBRATION), BASE_ASSUME) if r.plan.pp == 1]
    steps = {"measured": np.array([r.step_time_s for r in runs])}
    for optimizer in OPTIMIZERS:  # the same runs, each optimizer's step in the plan
        assumed = [replace(r, plan=replace(r.plan, optimizer=optimizer)) for r in runs]
        steps[optimizer] = np.array([p.step_s for p in simulate_runs(assumed, MACHINE, [()] * len(runs), args.jobs)])
    table = intercepts(runs, steps)
    doc = {"machine": MACHINE, "assume": BASE_ASSUME, "runs": len(runs),
           "intercept_ms_per_billion_parameters": {f"h={h},tp={tp},dp={dp}": row for (h, tp, dp), row in
                                                   sorted(table.items())}}
    if args.json:
        print(json.dumps(doc, indent=2))
        return doc
    print(f"{len(runs)} single-node runs without a pipeline, {MACHINE} as it is ({BASE_ASSUME}); each group's step "
          "= a + b x micro-batches, fitted")
    print("intercept a per billion parameters per GPU (ms), and the simulated slope b over the measured one")
    print(f"{'hidden':>7}{'tp':>4}{'dp':>4}{'measured':>10}" + "".join(f"{o:>10}" for o in OPTIMIZERS)
          + "".join(f"{o + ' b':>12}" for o in OPTIMIZERS))
    for (hidden, tp, dp), row in sorted(table.items()):
        print(f"{hidden:>7}{tp:>4}{dp:>4}{row['measured']:>10.1f}" + "".join(f"{row[o]:>10.1f}" for o in OPTIMIZERS)
              + "".join(f"{row[o + ' slope']:>12.3f}" for o in OPTIMIZERS))
    return doc


if __name__ == "__main__":
    main()
