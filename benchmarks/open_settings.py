"""A published run predicted as the twin's fastest over the settings its table leaves open.

Published tables of large runs give the model, the GPUs, the batch and the
parallel degrees, and leave out what their authors tuned for throughput (the
micro-batch, the interleaved pipeline's chunks, the recompute, ...). Such a
run is predicted as the fastest, by the twin, of the plans that differ only
in those settings and fit in memory, as the AxoNN rows of `twin validate`
are the fastest of AxoNN's candidates. Used by benchmarks/megatron_h100.py
and benchmarks/llama3_405b.py.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twin.errors import TwinError  # noqa: E402
from twin.memory import memory_per_gpu, usable_bytes  # noqa: E402
from twin.micro_batches import simulate_step  # noqa: E402
from twin.model import ModelSpec  # noqa: E402
from twin.pipeline_split import most_chunk_layers  # noqa: E402
from twin.plan import ParallelPlan, parse_plan  # noqa: E402
from twin.plan_checks import validate_plan  # noqa: E402
from twin.runs import MeasuredRun  # noqa: E402


def recompute_options(model: ModelSpec, plan: ParallelPlan) -> list[str]:
    """The recompute settings from least to most: none, selective, full recompute of the first 1, 2, ... layers of
    each model chunk (rcl, Megatron-Core's --recompute-method block), then of all of them."""
    partial = [f"full,rcl={n}" for n in range(1, most_chunk_layers(model.layers, plan))]
    return ["none", "selective", *partial, "full"]


def fastest(run: MeasuredRun, machine, settings: list[str]) -> tuple[float, str]:
    """The twin's fastest step over `settings` (plan texts without recompute) that fit in memory, each with the
    least recompute that fits: (step seconds, plan)."""
    best: tuple[float, str] | None = None
    for base in settings:
        plan = parse_plan(f"{base},recompute=none", ParallelPlan(global_batch=run.plan.global_batch))
        try:
            validate_plan(plan, run.model, run.gpus)
        except TwinError:
            continue
        for recompute in recompute_options(run.model, plan):
            plan = parse_plan(f"{base},recompute={recompute}", ParallelPlan(global_batch=run.plan.global_batch))
            if memory_per_gpu(run.model, plan).total > usable_bytes(machine.device.hbm_bytes):
                continue
            step = simulate_step(run.model, plan, machine, run.gpus).step_time_s
            if best is None or step < best[0]:
                best = (step, plan.describe())
            break
    if best is None:
        raise TwinError(f"{run.origin} line {run.line}: no open setting fits in memory")
    return best


def chunk_counts(slots_per_stage: int, micro_batches: int, pp: int, most: int) -> list[int]:
    """The interleaved chunks per pipeline rank Megatron allows: 1, or any divisor of the stage's layers (slots)
    up to `most`, when the micro-batches are a multiple of the stages."""
    return [vpp for vpp in range(1, most + 1)
            if vpp == 1 or (pp > 1 and slots_per_stage % vpp == 0 and micro_batches % pp == 0)]


def predict_table(runs: list[MeasuredRun], columns: dict[str, object], settings: Callable[[MeasuredRun], list[str]],
                  as_json: bool, header: dict) -> int:
    """Each run's fastest open setting on each machine column, printed as one line per run (the plan of the last
    column) and the mean absolute error per column, or as JSON (`header` first)."""
    rows = []
    for run in runs:
        row = {"label": run.label, "gpus": run.gpus, "measured_s": run.step_time_s, "predicted_s": {}, "plan": {}}
        for name, machine in columns.items():
            row["predicted_s"][name], row["plan"][name] = fastest(run, machine, settings(run))
        rows.append(row)
        if not as_json:
            steps = row["predicted_s"].values()
            cells = "  ".join(f"{t:7.3f} ({100 * (t / run.step_time_s - 1):+5.1f}%)" for t in steps)
            print(f"{run.label:>5} on {run.gpus:>5} GPUs  measured {run.step_time_s:7.3f} s  {cells}   "
                  f"{row['plan'][list(columns)[-1]]}", flush=True)
    means = {n: sum(abs(r["predicted_s"][n] / r["measured_s"] - 1) for r in rows) / len(rows) * 100 for n in columns}
    if as_json:
        print(json.dumps({**header, "rows": rows, "mean_abs_error_pct": means}, indent=1))
        return 0
    print(f"columns: {' | '.join(columns)}; plans shown for the last")
    print("mean |error|: " + ", ".join(f"{n} {m:.1f}%" for n, m in means.items()))
    return 0
