"""One calibration launch or the median of several: what it changes on fit_local's held-out plans, same measurements.

    .venv/bin/python benchmarks/calibration_launches.py [--out out/fit_local]

After `benchmarks/fit_local.py --calibration-launches K` (K >= 2; this
reads its OUT folder and measures nothing). On this project's 2-core host a
4-rank calibration's GEMM rate moved by 30% between launches minutes apart
(docs/fit.md), so fit_local fits the median of K launches of each
calibration (`twin calibrate --launches`). Here each launch alone and the
median of all are fitted again from the saved samples
(executor.calibrate_host.refit_saved), at 2 and at 4 ranks; fit_local's
fit on its 1-2 rank runs is redone on each 2-rank file and carried to the
4-rank one (fit_local.fit_and_carry), and `twin validate --runs
OUT/held-out-runs.json` predicts the held-out plans on every file: the
launches' spread of held-out error beside the median's, on identical runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor.calibrate_host import refit_saved  # noqa: E402
from fit_local import fit_and_carry, twin_json  # noqa: E402


def launch_count(calibration_json: str) -> int:
    """How many launches a calibration JSON kept (0: one launch, whose samples are the file's)."""
    return len(json.loads(Path(calibration_json).read_text()).get("launch_samples") or [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/fit_local", help="benchmarks/fit_local.py's folder (default out/fit_local)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    o = args.out
    saved = {n: os.path.join(o, f"local-{n}.calibration.json") for n in (2, 4)}
    needed = [*saved.values(), os.path.join(o, "calibration-runs.json"), os.path.join(o, "held-out-runs.json")]
    missing = next((p for p in needed if not os.path.exists(p)), None)
    if missing:
        ap.error(f"--out {o}: {missing} is missing; run benchmarks/fit_local.py --out {o} first")
    counts = {n: launch_count(path) for n, path in saved.items()}
    if min(counts.values()) < 2:
        ap.error(f"--out {o}: its calibrations kept {counts[2]} and {counts[4]} launches (2 and 4 ranks); run "
                 f"benchmarks/fit_local.py --calibration-launches 3 --out {o} first")
    k = min(counts.values())
    variants = {f"launch {i + 1} alone": [i] for i in range(k)} | {f"median of {k}": list(range(k))}
    rows = []
    for name, chosen in variants.items():
        folder = os.path.join(o, "launches", name.replace(" ", "-"))
        os.makedirs(folder, exist_ok=True)
        files = {n: os.path.join(folder, f"local-{n}.toml") for n in (2, 4)}
        fits = {n: refit_saved(saved[n], files[n], launches=chosen) for n in (2, 4)}
        fit, left_out, fitted = fit_and_carry(files, os.path.join(o, "calibration-runs.json"))
        rows.append({"variant": name, "gemm_fit_rms_relative_error": {n: f.rms_relative_error["gemm"] for n, f in fits.items()},
                     "gemm_tile": {n: f"{f.gemm_tile_m}x{f.gemm_tile_n}" for n, f in fits.items()},
                     "gemm_gflop_per_s": {n: f.gemm_flop_per_s / 1e9 for n, f in fits.items()},
                     "base_latency_ms": {n: 1e3 * f.base_latency_s for n, f in fits.items()},
                     "machines": (files[4], fitted[4]), "fitted": fit is not None, "left_out": left_out})
    every = sorted({m for row in rows for m in row["machines"]})
    table = twin_json("validate", "--runs", os.path.join(o, "held-out-runs.json"),
                      *[a for path in every for a in ("--machine", path)], "--json")
    for row in rows:
        row["held_out_mean_abs_pct"] = [table["summary"][m]["mean_abs_pct"] for m in row.pop("machines")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"held-out 4-rank plans of {o} ({len(table['rows'])}), each calibration fitted from the launches named")
    print("(GEMM fit: the calibration's RMS relative error on its own GEMM microbenchmarks, the tile it chose and "
          "its rate in GF/s; latency: the collectives' base latency; then the held-out error)")
    print(f"{'calibration':<16}{'GEMM fit 2 | 4 ranks':>44}{'latency ms 2 | 4':>20}{'microbenchmarks':>18}"
          f"{'fitted on 1-2 ranks':>22}")
    for row in rows:
        g, t, b, r = row["gemm_fit_rms_relative_error"], row["gemm_tile"], row["base_latency_ms"], row["gemm_gflop_per_s"]
        micro, fitted = row["held_out_mean_abs_pct"]
        print(f"{row['variant']:<16}{g[2]:>8.3f} {t[2]:>7} {r[2]:>5.1f} | {g[4]:.3f} {t[4]:>7} {r[4]:>5.1f}"
              f"{b[2]:>12.2f} | {b[4]:>5.2f}{micro:>17.1f}%{fitted:>21.1f}%" + ("" if row["fitted"] else "  (nothing fitted)"))
    alone = [row["held_out_mean_abs_pct"] for row in rows[:-1]]
    median = rows[-1]["held_out_mean_abs_pct"]
    for col, label in enumerate(("microbenchmarks", "fitted on 1-2 ranks")):
        spread = [a[col] for a in alone]
        print(f"{label}: single launches {min(spread):.1f}-{max(spread):.1f}% (mean {sum(spread) / len(spread):.1f}%), "
              f"the median of {k} {median[col]:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
