"""What rocBLAS's own MI250X GEMM benchmarks say of training shapes against the large squares.

    .venv/bin/python benchmarks/rocblas_efficiencies.py [CSV] [--json]

Why: docs/gemm-shape-model.md argues that the Frontier first-principles gap is
not in the GEMM shapes because rocBLAS's tuned kernels run training-shaped
products at or above the large squares the file's GEMM level came from. The
numbers behind that sentence are read here from the committed CSV
(benchmarks/tensile_logic.py's extraction of rocBLAS's Tensile exact logic),
so a reader can reproduce them:

- the squares (m = n = k, one product) of at least LARGE_FLOP, by layout;
- the other one-product sizes of at least LARGE_FLOP: median and 10th-90th
  percentile of the efficiency, and the largest one tuned in the NN layout;
- every layout at SQUARE_EVERY_LAYOUT^3, the one large size tuned in all three
  of NN, NT and TN.

The values are efficiencies in percent of an unstated clock (tensile_logic.py
says why), so only comparisons between them are meaningful.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import asdict, dataclass

import numpy as np

DEFAULT_CSV = "benchmarks/data/rocblas-gfx90a-bf16-gemms.csv"
LARGE_FLOP = 1e11
SQUARE_EVERY_LAYOUT = 8192


@dataclass(frozen=True)
class Size:
    m: int
    n: int
    k: int
    batch: int
    layout: str
    efficiency_pct: float

    @property
    def flop(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.batch

    @property
    def square(self) -> bool:
        return self.m == self.n == self.k


def load(path: str) -> list[Size]:
    """The CSV's rows; a missing file or column raises ValueError with a one-line reason."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        raise ValueError(f"cannot read {path} ({e.strerror}); give benchmarks/tensile_logic.py's CSV") from None
    try:
        return [Size(int(r["m"]), int(r["n"]), int(r["k"]), int(r["batch"]), r["layout"], float(r["efficiency_pct"]))
                for r in rows]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: needs the columns m, n, k, batch, layout, efficiency_pct "
                         "(benchmarks/tensile_logic.py writes them)") from None


def summary(sizes: list[Size]) -> dict:
    """The comparisons docs/gemm-shape-model.md quotes, computed from the sizes."""
    large = [s for s in sizes if s.batch == 1 and s.flop >= LARGE_FLOP]
    squares = sorted((s for s in large if s.square), key=lambda s: (s.m, s.layout))
    others = [s for s in large if not s.square]
    if not squares or not others:
        raise ValueError(f"no square and non-square sizes of at least {LARGE_FLOP:.0e} FLOP to compare")
    effs = np.array([s.efficiency_pct for s in others])
    best_nn = max((s for s in others if s.layout == "NN"), key=lambda s: s.efficiency_pct)
    return {
        "large_flop": LARGE_FLOP,
        "squares": [asdict(s) for s in squares],
        "squares_range_pct": [min(s.efficiency_pct for s in squares), max(s.efficiency_pct for s in squares)],
        "non_square_count": len(others),
        "non_square_median_pct": float(np.median(effs)),
        "non_square_p10_p90_pct": [float(np.percentile(effs, 10)), float(np.percentile(effs, 90))],
        "best_non_square_nn": asdict(best_nn),
        "every_layout_at": SQUARE_EVERY_LAYOUT,
        "every_layout_pct": {s.layout: s.efficiency_pct for s in squares if s.m == SQUARE_EVERY_LAYOUT},
    }


def print_table(result: dict) -> None:
    print(f"one-product sizes of at least {result['large_flop']:.0e} FLOP (efficiency, % of an unstated clock)")
    print(f"{'m':>7} {'n':>7} {'k':>7} layout  efficiency")
    for s in result["squares"]:
        print(f"{s['m']:>7} {s['n']:>7} {s['k']:>7} {s['layout']:>6}  {s['efficiency_pct']:9.1f}%")
    lo, hi = result["squares_range_pct"]
    p10, p90 = result["non_square_p10_p90_pct"]
    best = result["best_non_square_nn"]
    print(f"squares: {lo:.1f}-{hi:.1f}%")
    print(f"the other {result['non_square_count']} sizes: median {result['non_square_median_pct']:.1f}% "
          f"(10th-90th percentile {p10:.1f}-{p90:.1f}%)")
    print(f"the best of them in NN: {best['m']} x {best['n']} x {best['k']}: {best['efficiency_pct']:.1f}%")
    every = ", ".join(f"{k} {v:.1f}%" for k, v in sorted(result["every_layout_pct"].items()))
    print(f"at {result['every_layout_at']}^3, every layout: {every}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="?", default=DEFAULT_CSV, help=f"tensile_logic.py's CSV (default {DEFAULT_CSV})")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    try:
        result = summary(load(args.csv))
    except ValueError as e:
        print(f"rocblas_efficiencies: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
