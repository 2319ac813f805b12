"""The calibration's numbers for ranks that share a host's cores: how compute and communication disturb each other.

Apart from executor.calibrate's fit of kernels and collectives alone because
each is a ratio of two of the calibration's own microbenchmarks (executor.
calibrate's module docstring says which), not a model fitted over many:
the GEMM's slowdown under an all-reduce, the all-reduce's stretch under
GEMMs, a small all-reduce's latency pace under its ranks' GEMMs, and the
time-slicing lag of the last rank at a synchronisation. Each takes the
samples by kind (`by`) and says what it is without its measurements.
"""

from __future__ import annotations

import numpy as np

from executor.calibration_samples import Sample


def _mean(by: dict[str, list[Sample]], kind: str) -> float | None:
    times = [s.time_s for s in by.get(kind, [])]
    return float(np.mean(times)) if times else None


def comm_compute_slowdown(by: dict[str, list[Sample]]) -> float:
    """1 - (GEMM time alone) / (GEMM time under a large all-reduce), in [0, 0.9]; 0 unmeasured."""
    alone, during = _mean(by, "overlap_alone"), _mean(by, "overlap_during")
    return float(np.clip(1 - alone / during, 0.0, 0.9)) if alone and during else 0.0


def comm_stretch(by: dict[str, list[Sample]]) -> float:
    """(a large all-reduce's time while every rank computes) / (its time alone), in [1, 20]; 1 unmeasured."""
    alone, during = _mean(by, "overlap_comm_alone"), _mean(by, "overlap_comm")
    return float(np.clip(during / alone, 1.0, 20.0)) if alone and during else 1.0


def latency_pace(by: dict[str, list[Sample]]) -> float | None:
    """The pace of a small all-reduce's latency while every rank computes, over its pace alone, in [0, 1];
    None without the measurements (one rank, or an older schedule). With `span` the GEMMs' time: where the
    all-reduce ended inside them it went at (time alone) / (its time) throughout; where it ended
    `during - span` after them, at its pace alone from then on, the rest of its time alone went by under
    them."""
    alone, during, gemm = _mean(by, "latency_comm_alone"), _mean(by, "latency_comm"), _mean(by, "latency_gemm")
    if alone is None or during is None or gemm is None:
        return None
    span = by["latency_comm"][0].params["gemms"] * gemm
    pace = alone / during if during <= span else (alone - (during - span)) / span
    return float(np.clip(pace, 0.0, 1.0))


def fit_skew(leads: list[Sample], syncs: list[Sample], lead_shape: tuple[int, int, int]) -> tuple[float, float]:
    """(the slope of the synchronising all-reduce's time over its lead GEMM's, the `lead_shape` GEMM's time):
    0 and 0 without the measurements (one rank, or an older schedule), and never below 0."""
    lead_of = {(s.params["m"], s.params["n"], s.params["k"]): s.time_s for s in leads}
    pairs = [(lead_of[key], s.time_s) for s in syncs if (key := (s.params["m"], s.params["n"], s.params["k"])) in lead_of]
    if len(pairs) < 2:
        return 0.0, 0.0
    lead, sync = np.array(pairs).T
    slope = float(np.polyfit(lead, sync, 1)[0]) if np.ptp(lead) > 0 else 0.0
    return max(slope, 0.0), lead_of.get(lead_shape, 0.0)
