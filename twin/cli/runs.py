"""What `twin fit` and `twin validate --runs` share: naming a measured run, summarising prediction errors, and
reading their --jobs and --progress."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from twin.cli.args import shows_progress

if TYPE_CHECKING:
    from twin.runs import MeasuredRun


def run_progress(args: argparse.Namespace) -> Callable[..., Iterable] | None:
    """A tqdm wrapper on stderr when it is a terminal (or --progress), else None."""
    if not shows_progress(args):
        return None
    from tqdm import tqdm

    return lambda it, total=None: tqdm(it, total=total, file=sys.stderr, leave=False, unit="run")


def job_count(args: argparse.Namespace) -> int:
    """--jobs as twin search reads it (at most every core)."""
    from twin.search.rank import worker_count

    return worker_count(args.jobs)


def describe_run(run: MeasuredRun) -> str:
    """One line naming a run: where it is, its size and its plan."""
    return f"{run.where}: {what_ran(run)}"


def what_ran(run: MeasuredRun) -> str:
    """A run's size and plan (or the schedule it executed), without its file and line."""
    if run.schedule:
        return f"{Path(run.schedule).name} on {run.gpus} ranks"
    p = run.plan
    extras = [f"{key}={n}" for key, n in (("gy", p.gy), ("gz", p.gz), ("cp", p.cp), ("vpp", p.vpp)) if n > 1]
    extras += ([f"zero={p.zero}"] if p.zero else []) + (["sp=1"] if p.sp else [])  # beyond Megatron's four degrees
    extras += ["reshard=1"] if p.reshard else []  # FSDP's FULL_SHARD beside its SHARD_GRAD_OP
    extras += ["fsdp2=1"] if p.fsdp2 else []  # and FSDP2's copies
    extras += ["axonn=1"] if p.axonn else []  # AxoNN's code's gathers
    extras += [f"cache={p.cache}"] if p.cache else []  # and its weights cache
    extras += [f"recompute={p.recompute}"] if p.recompute != "full" else []  # Korthikanti's pairs differ by it
    extras += [f"rcl={p.rcl}"] if p.rcl else []  # only some layers recompute
    extras += ["fp8=1"] if p.fp8 else []  # the linears' precision
    extras += ["fp8pg=1"] if p.fp8pg else []  # and their weights' (--fp8-param-gather)
    extras += ["gradfp32=1"] if p.gradfp32 else []  # gradients reduced in fp32
    extras += [f"kernels={p.kernels}"] if p.kernels != "fused" else []  # element-wise work op by op (torchtitan)
    extras += [f"norm={p.norm}"] if p.norm != "fused" else []  # the RMSNorms too
    plan = ",".join([f"tp={p.gx},pp={p.pp},dp={p.gdata},mbs={p.mbs}", *extras])
    return (f"{run.label + ' ' if run.label else ''}h={run.model.hidden} L={run.model.layers} "
            f"on {run.gpus} GPUs {plan} gb={p.global_batch}")


def count_noun(n: int, noun: str) -> str:
    """"1 run", "2 runs"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def finite(x: float) -> float | None:
    """x, or None where it is not a number (a spread from as many runs as parameters; a rank correlation of a
    constant): JSON has no NaN."""
    return float(x) if np.isfinite(x) else None


def error_stats(e: np.ndarray) -> dict[str, float]:
    """Mean |error|, mean error and max |error| of relative errors `e`, in percent."""
    return {"mean_abs_pct": 100 * float(np.abs(e).mean()), "mean_pct": 100 * float(e.mean()),
            "max_abs_pct": 100 * float(np.abs(e).max())}


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(x: np.ndarray) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for value in np.unique(x):
            tied = x == value
            r[tied] = r[tied].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def spearman_by_label(runs: list[MeasuredRun], measured: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Spearman's rank correlation of measured and predicted step times within each label (model size) of at
    least three runs: whether the plans of one model are ordered as measured (nan where one side is constant)."""
    return {label: spearman(measured[sel], predicted[sel]) for label in sorted({r.label for r in runs})
            if (sel := np.array([r.label == label for r in runs])).sum() > 2}
