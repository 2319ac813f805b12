"""A calibration's measurements: one Sample per microbenchmark, from a launch's timestamps or from several launches.

Apart from executor.calibrate (the schedule and the fit) because turning
timestamps into samples, and several launches into one set, is statistics
of the measurement, not of the model the fit targets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sample:
    """One microbenchmark: what it ran, its mean time and the standard error of that mean."""

    kind: str  # gemm | elementwise | attention | collective | overlap_alone | overlap_during | beside_idle ...
    params: dict
    time_s: float
    sem_s: float = 0.0
    count: int = 1


def collect(steps: list[list[tuple[np.ndarray, np.ndarray]]], what: dict[int, tuple[str, dict]],
            program_of: Mapping[int, int] | None = None) -> list[Sample]:
    """Mean and its standard error over repeats, steps and ranks of each microbenchmark.

    `steps[r][s]` is rank r's (start, end) arrays of step s. The mean, not
    the median: with more ranks than cores an op is now and then descheduled
    for a time slice, and a step pays those slices on average, so the expected
    time is what a step-time prediction needs; the standard error says how far
    to trust it (the collective fit weighs by it). Overlap GEMMs count only when they ran
    entirely inside the large all-reduce. A microbenchmark whose params name a "program" counts only on
    that program's ranks (`program_of`: each rank's program; None: every rank).
    """
    big = next((i for i, (k, _) in what.items() if k == "overlap_comm"), None)
    values: dict[str, tuple[str, dict, list[float]]] = {}
    for rank, rank_steps in enumerate(steps):
        for start, end in rank_steps:
            for op_id, (kind, params) in what.items():
                if kind == "overlap_during" and not (start[op_id] >= start[big] and end[op_id] <= end[big]):
                    continue
                if program_of is not None and params.get("program", program_of[rank]) != program_of[rank]:
                    continue
                key = json.dumps([kind, params], sort_keys=True)
                values.setdefault(key, (kind, params, []))[2].append(float(end[op_id] - start[op_id]))
    out = []
    for kind, params, xs in values.values():
        x = np.asarray(xs)
        sem = float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else 0.0
        out.append(Sample(kind, params, float(np.mean(x)), sem, len(x)))
    return out


MEDIAN_SE_FACTOR = 1.2533  # sqrt(pi / 2): the median's standard error over the mean's, for normal scatter


def combine_launches(launches: list[list[Sample]]) -> list[Sample]:
    """One sample per microbenchmark from several launches of the calibration: the median of the launches'
    means, so that one launch taken while the host was in an odd state (on this project's 2-core host one
    4-rank calibration measured GEMMs 30% slower than the next two, minutes apart; docs/fit.md) does not
    decide the file. Its standard error is the launches' scatter (MEDIAN_SE_FACTOR x their standard deviation
    / sqrt(launches)), never below the mean within-launch error / sqrt(launches). A microbenchmark missing
    from some launch (an older schedule) keeps the launches that have it. One launch comes back unchanged."""
    if len(launches) == 1:
        return list(launches[0])
    by_key: dict[str, list[Sample]] = {}
    for samples in launches:
        for s in samples:
            by_key.setdefault(json.dumps([s.kind, s.params], sort_keys=True), []).append(s)
    out = []
    for group in by_key.values():
        times = np.array([s.time_s for s in group])
        n = len(group)
        within = float(np.sqrt(np.mean([s.sem_s ** 2 for s in group])) / np.sqrt(n))
        between = MEDIAN_SE_FACTOR * float(np.std(times, ddof=1)) / np.sqrt(n) if n > 1 else 0.0
        out.append(Sample(group[0].kind, group[0].params, float(np.median(times)), max(between, within),
                          sum(s.count for s in group)))
    return out
