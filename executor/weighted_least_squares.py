"""Weighted least squares over a calibration's samples: the statistics `twin calibrate`'s fit (executor.calibrate)
is built from, apart from the models it fits.

Two weightings: by each mean's standard error, floored at REL_FLOOR of the mean (the collectives'), and by the
mean alone, so every microbenchmark counts alike in relative terms (the compute fit's); and a scale that is the
samples' mean ratio to their modelled work (`mean_ratio`, the GEMM rate's), which their scatter does not bias.
"""

from __future__ import annotations

import itertools

import numpy as np

from executor.calibration_samples import Sample

REL_FLOOR = 0.05  # every mean is trusted to 5% at best, however many samples it has


def inverse_variance(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """(mean times, inverse-variance weights) with the REL_FLOOR floor on each mean's error."""
    t = np.array([s.time_s for s in samples])
    sigma = np.sqrt(np.array([s.sem_s for s in samples]) ** 2 + (REL_FLOOR * t) ** 2)
    return t, 1.0 / sigma ** 2


def relative_weights(samples: list[Sample]) -> tuple[np.ndarray, np.ndarray]:
    """(mean times, weights 1 / t^2): least squares on these is least squares on relative errors, each
    microbenchmark counting alike whatever its measured scatter (the compute fit's weighting)."""
    t = np.array([s.time_s for s in samples])
    return t, 1.0 / t ** 2


def chi2(pred: np.ndarray, t: np.ndarray, w: np.ndarray) -> float:
    """Weighted sum of squared residuals."""
    return float(np.sum(w * (pred - t) ** 2))


def rel_rms(pred: np.ndarray, t: np.ndarray, w: np.ndarray) -> float:
    """Weighted RMS relative error: what each fit achieves on its own data."""
    if not len(t):
        return 0.0
    return float(np.sqrt(np.sum(w * t ** 2 * ((pred - t) / t) ** 2) / np.sum(w * t ** 2)))


def scale_nonneg(a: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """x >= 0 minimising sum w (a x - y)^2."""
    den = float(np.sum(w * a * a))
    return max(float(np.sum(w * a * y)) / den, 0.0) if den > 0 else 0.0


def mean_ratio(a: np.ndarray, y: np.ndarray) -> float:
    """x >= 0 with a x equal to y on average, every sample's y / a counting alike: the time per unit of modelled
    work whose mean the samples' scatter does not bias. Least squares on relative errors (weights 1 / y^2) does
    not give that: it is E[r] / E[r^2] for r = a / y, short of the mean time by about twice r's squared
    coefficient of variation (a 4-rank calibration's GEMMs on this project's 2-core host scatter by a quarter, and
    their fit fell 7.5% short of their time; docs/fit.md)."""
    return max(float(np.mean(y / a)), 0.0) if len(a) else 0.0


def nnls_weighted(columns: list[np.ndarray], t: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Non-negative x minimising sum w (A x - t)^2: every subset of columns, the best feasible one."""
    sw = np.sqrt(w)
    A = np.stack(columns, axis=1) * sw[:, None]
    b = t * sw
    best, best_err = np.zeros(len(columns)), float("inf")
    for mask in itertools.product((True, False), repeat=len(columns)):
        idx = [i for i, on in enumerate(mask) if on]
        if not idx:
            continue
        x_sub, *_ = np.linalg.lstsq(A[:, idx], b, rcond=None)
        if (x_sub < 0).any():
            continue
        x = np.zeros(len(columns))
        x[idx] = x_sub
        err = float(np.sum((A @ x - b) ** 2))
        if err < best_err:
            best, best_err = x, err
    return best
