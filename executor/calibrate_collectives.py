"""The collective library's costs from `twin calibrate`'s collective and point-to-point microbenchmarks.

Apart from executor.calibrate's compute fit: the collectives are fitted as the simulator times them
(twin.sim.lowerings' ring steps, twin.sim.collectives' transfers), each sample weighed by its standard error.
"""

from __future__ import annotations

import numpy as np

from executor.calibration_samples import Sample
from executor.weighted_least_squares import inverse_variance, nnls_weighted, rel_rms


def fit_p2p_latency(transfers: list[Sample], port_bw: float, errors: dict) -> float | None:
    """A point-to-point transfer's latency: the weighted mean of each size's time less its bytes at the port
    bandwidth (twin.sim.collectives times a transfer so), at least 0; None without transfers."""
    if not transfers:
        return None
    t, w = inverse_variance(transfers)
    wire = np.array([s.params["nbytes"] for s in transfers], float) / port_bw
    latency = max(float(np.average(t - wire, weights=w)), 0.0)
    errors["p2p"] = rel_rms(latency + wire, t, w)
    return latency


def fit_collectives(cm: list[Sample], errors: dict) -> tuple[float, float, float, dict, dict]:
    """(port bandwidth, base latency, hop latency, extra latency per kind, bandwidth fraction per kind).

    Each kind gets its own base latency and bandwidth, one hop latency shared:
    a library's kinds need not be alike (gloo's reduce-scatter moves about an
    all-reduce's bytes, not an all-gather's). The fastest kind's bandwidth is
    the port's; the others are fractions of it; the lowest base is the base.
    """
    if not cm:
        return 1e12, 0.0, 0.0, {}, {}
    c_t, c_w = inverse_variance(cm)
    n = np.array([s.params["group_size"] for s in cm], float)
    kind = np.array([s.params["kind"] for s in cm])
    ar = kind == "all_reduce"
    steps = np.where(ar, 2 * (n - 1), n - 1)  # NCCL's ring steps (twin.sim.lowerings.ring_steps)
    traffic = np.where(ar, 2 * (n - 1) / n, (n - 1) / n) * np.array([s.params["nbytes"] for s in cm], float)
    kinds = sorted(set(kind))
    masks = [(kind == k).astype(float) for k in kinds]
    x = nnls_weighted([*masks, steps, *(m * traffic for m in masks)], c_t, c_w)
    bases, hop, inv = x[:len(kinds)], x[len(kinds)], x[len(kinds) + 1:]
    errors["collective"] = rel_rms(sum(m * (b + i * traffic) for m, b, i in zip(masks, bases, inv)) + steps * hop, c_t, c_w)
    base = float(min(bases))
    positive = [i for i in inv if i > 0]
    fastest = min(positive) if positive else 1e-12
    kind_latency = {k: float(b - base) for k, b in zip(kinds, bases)}
    kind_fraction = {k: float(fastest / i) if i > 0 else 1.0 for k, i in zip(kinds, inv)}
    return 1.0 / fastest, base, float(hop), kind_latency, kind_fraction
