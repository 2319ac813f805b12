"""rocBLAS's own GEMM benchmarks for the MI250X (gfx90a), out of its Tensile library logic, as a CSV.

    .venv/bin/python benchmarks/tensile_logic.py ROCBLAS_CHECKOUT [-o benchmarks/data/rocblas-gfx90a-bf16-gemms.csv]

Why: the Frontier file's GEMM shape numbers (the tile, how much of a last wave
a GEMM pays, the k loop) were estimates, for want of MI250X GEMM timings at
training shapes. rocBLAS ships, for each GPU it supports, the kernel it picks
for each size Tensile tuned, and beside each size the performance that kernel
measured when it was tuned: in the "exact logic" of
library/src/blas3/Tensile/Logic/asm_full/aldebaran/aldebaran_Cijk_<A>_<B>_BBS_BH.yaml
(bf16 operands and result, fp32 accumulation: what torch.matmul in bf16 calls
on an MI250X), one entry per size, `[M, N, batch, K]` then `[kernel, value]`.
The value is an efficiency in percent, not a rate: the same files for the
MI100 (arcturus) reach 96.6, above the MI100's bf16 peak in TF/s, and for the
MI50 (vega20, an older Tensile) they are GFLOP/s up to 20,781. So only how the
efficiency varies with the shape is read from them (benchmarks/gemm_shape_fit.py),
never a rate.

Keeps the sizes of at least MIN_FLOP, in the four layouts (Tensile's index
names: Ailk = A not transposed, Alik = transposed; Bljk = B not transposed,
Bjlk = transposed; column-major, as BLAS).
"""

from __future__ import annotations

import argparse
import csv
import re
import subprocess
import sys
from pathlib import Path

LOGIC_DIR = "library/src/blas3/Tensile/Logic/asm_full/aldebaran"
LAYOUTS = {"Ailk_Bljk": "NN", "Ailk_Bjlk": "NT", "Alik_Bljk": "TN", "Alik_Bjlk": "TT"}
ENTRY = re.compile(r"- - \[(\d+), (\d+), (\d+), (\d+)\]\n\s+- \[\d+, ([\d.eE+-]+)\]")
MIN_FLOP = 1e9
COLUMNS = ("m", "n", "k", "batch", "layout", "efficiency_pct")


def entries(text: str, layout: str) -> list[dict]:
    """The exact-logic sizes of one logic file of at least MIN_FLOP, as CSV rows."""
    rows = []
    for m, n, batch, k, value in ENTRY.findall(text):
        m, n, batch, k = int(m), int(n), int(batch), int(k)
        if 2.0 * m * n * k * batch >= MIN_FLOP:
            rows.append(dict(m=m, n=n, k=k, batch=batch, layout=layout, efficiency_pct=float(value)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkout", help="a clone of github.com/ROCm/rocBLAS (its git directory or work tree)")
    ap.add_argument("-o", "--out", default="benchmarks/data/rocblas-gfx90a-bf16-gemms.csv")
    args = ap.parse_args()
    rows, commit = [], None
    for names, layout in LAYOUTS.items():
        path = f"{LOGIC_DIR}/aldebaran_Cijk_{names}_BBS_BH.yaml"
        try:
            text = subprocess.run(["git", f"--git-dir={args.checkout}", "show", f"HEAD:{path}"], check=True,
                                  capture_output=True, text=True).stdout
            commit = commit or subprocess.run(["git", f"--git-dir={args.checkout}", "rev-parse", "HEAD"],
                                              check=True, capture_output=True, text=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            try:
                text = (Path(args.checkout) / path).read_text()
            except OSError as e:
                print(f"tensile_logic: cannot read {path} in {args.checkout} ({e.strerror}); give a rocBLAS clone",
                      file=sys.stderr)
                return 2
        rows += entries(text, layout)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} sizes of at least {MIN_FLOP:.0e} FLOP from rocBLAS {commit or args.checkout} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
