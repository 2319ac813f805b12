"""Bounded least squares for `twin fit`: Levenberg-Marquardt projected on box bounds, numpy only.

The fit's residuals are cheap (twin.fit.solve's surrogate: sums over path
costs, no simulation), so forward differences serve for the Jacobian, and a
few parameters on physical bounds need no more than projecting each step on
them. scipy's least_squares would do the same; it is not worth a dependency.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

_JACOBIAN_STEP = 1e-4  # in log-parameter space: a 0.01% move


def jacobian(residuals: Callable[[np.ndarray], np.ndarray], x: np.ndarray, r: np.ndarray,
             hi: np.ndarray) -> np.ndarray:
    """Forward differences (backward at an upper bound) of the residuals in log-parameter space."""
    J = np.empty((len(r), len(x)))
    for j in range(len(x)):
        h = -_JACOBIAN_STEP if x[j] + _JACOBIAN_STEP > hi[j] else _JACOBIAN_STEP
        moved = x.copy()
        moved[j] += h
        J[:, j] = (residuals(moved) - r) / h
    return J


def least_squares(residuals: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, lo: np.ndarray,
                  hi: np.ndarray, max_iterations: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levenberg-Marquardt projected on [lo, hi]: (x, residuals at x, Jacobian at x)."""
    x = np.clip(x0, lo, hi)
    r = residuals(x)
    cost = float(r @ r)
    damping = 1e-3
    J = jacobian(residuals, x, r, hi)
    for _ in range(max_iterations):
        A, g = J.T @ J, J.T @ r
        for _ in range(12):
            step = np.linalg.solve(A + damping * np.diag(np.diag(A) + 1e-12), -g)
            x_new = np.clip(x + step, lo, hi)
            r_new = residuals(x_new)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                break
            damping *= 4
        else:
            break  # no step lowers the cost: a minimum within the bounds
        gain = cost - cost_new
        x, r, cost = x_new, r_new, cost_new
        damping = max(damping / 3, 1e-9)
        J = jacobian(residuals, x, r, hi)
        if gain < 1e-10 * max(cost, 1e-30):
            break
    return x, r, J
