"""Which form of the twin's GEMM shape model a GPU's measured GEMMs support: wave quantisation and the k loop.

    .venv/bin/python benchmarks/gemm_shape_fit.py benchmarks/results/2026-12-04-nvidia-h200/gemm-shapes.json \\
        [--machine alps] [--set FIELD=VALUE ...] [--json]

Reads what benchmarks/gemm_shapes.py timed on a GPU (its --out) and times
every shape again with the twin's own compute model (twin/sim/compute.py:
tile and wave quantisation, the k loop, the HBM floor, the per-kernel
overhead) on --machine's device, for each `gemm_wave_quantization` (how
much of the last wave's idle units a GEMM pays: 1 all, 0 none) and
`gemm_k_half` of a grid, the GEMM level (empirical_gemm_bf16_tflop_per_s)
chosen per pair to fit best. It prints the RMS of log(twin time / measured
time) over the shapes, the FLOP-weighted mean |log ratio| and the level,
for the best k_half at each wave setting and for --machine's file as it is.
The level is another chip's where the GPU is not the machine's (an H200 for
Alps's GH200): what carries is the form, not the level.

The results may instead be a CSV of efficiencies (benchmarks/tensile_logic.py's:
rocBLAS's own benchmarks of the MI250X, `efficiency_pct` per m, n, k): each is
timed as its efficiency of the device's peak, one product each (batch 1) of at
least EFFICIENCY_MIN_FLOP, every one in the NN layout (the fit asks how the rate
varies with the shape, not with the layout), and the level is searched as a
fraction of the peak. Only the form is read from it: an efficiency of an
unstated clock is no rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.ir import Gemm  # noqa: E402
from twin.sim.compute import ComputeModel  # noqa: E402

from rocblas_efficiencies import load as load_rocblas_sizes  # noqa: E402

WAVES = (1.0, 0.5, 0.0)
K_HALVES = (0.0, 32.0, 64.0, 128.0, 192.0, 256.0, 384.0)
LEVELS_TFLOP = np.arange(500.0, 1200.0, 5.0)
LEVELS_OF_PEAK = np.arange(0.3, 1.2, 0.0025)  # for efficiencies: the level as a fraction of the device's peak
EFFICIENCY_MIN_FLOP = 1e10  # efficiencies of smaller GEMMs hang on the per-kernel cost at an unknown clock


def load_efficiencies(path: str, peak_flop_per_s: float) -> tuple[list[Gemm], np.ndarray]:
    """A CSV of GEMM efficiencies (tensile_logic.py's) as shapes in the NN layout and times at the peak; a file
    without its columns is a one-line error (exit 2)."""
    try:
        sizes = load_rocblas_sizes(path)
    except ValueError as e:
        print(f"gemm_shape_fit: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    kept = [(Gemm(s.m, s.n, s.k, "NN", tunable=False), s.efficiency_pct) for s in sizes
            if s.batch == 1 and s.efficiency_pct > 0 and s.flop >= EFFICIENCY_MIN_FLOP]
    if not kept:
        print(f"gemm_shape_fit: {path} holds no GEMM of at least {EFFICIENCY_MIN_FLOP:.0e} FLOP", file=sys.stderr)
        raise SystemExit(2)
    return [g for g, _ in kept], np.array([g.flops / (pct / 100 * peak_flop_per_s) for g, pct in kept])


def load_measured(path: str) -> tuple[list[Gemm], np.ndarray]:
    """The timed shapes (bf16, untuned, in their layout) and their measured times in seconds; a file that is not
    gemm_shapes.py's --out is a one-line error (exit 2)."""
    try:
        doc = json.loads(Path(path).read_text())
        shapes = doc["shapes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"gemm_shape_fit: cannot read {path} as benchmarks/gemm_shapes.py --out ({e.__class__.__name__}: {e}); "
              "give a timed run's results", file=sys.stderr)
        raise SystemExit(2) from None
    gemms, times = [], []
    for s in shapes:
        if s.get("measured_tflop_per_s"):
            g = Gemm(s["m"], s["n"], s["k"], s["layout"], batch=s.get("batch", 1), tunable=False)
            gemms.append(g)
            times.append(g.flops / (s["measured_tflop_per_s"] * 1e12))
    if not gemms:
        print(f"gemm_shape_fit: {path} holds no measured rates (a --dry-run's output); give a timed run's",
              file=sys.stderr)
        raise SystemExit(2)
    return gemms, np.array(times)


def score(device, gemms: list[Gemm], measured_s: np.ndarray, level_flop_per_s: float | None = None,
          levels_flop_per_s: np.ndarray = LEVELS_TFLOP * 1e12) -> dict:
    """The twin's times against the measured ones on `device`; with no level given, the best of levels_flop_per_s.
    A GEMM's time is max(FLOPs / (level x efficiency), HBM floor) + kernel overhead, as in ComputeModel."""
    model = ComputeModel(device)
    flops = np.array([g.flops for g in gemms])
    eff = np.array([model.gemm_efficiency(g) for g in gemms])
    floor = np.array([model.gemm_memory_s(g) for g in gemms])
    levels = [level_flop_per_s] if level_flop_per_s else levels_flop_per_s
    best = None
    for level in levels:
        twin_s = np.maximum(flops / (level * eff), floor) + device.kernel_overhead_s
        err = np.log(twin_s / measured_s)
        row = dict(rms_log_error=float(np.sqrt(np.mean(err ** 2))),
                   flop_weighted_abs_log_error=float(np.sum(flops * np.abs(err)) / flops.sum()),
                   median_log_error=float(np.median(err)), level_tflop_per_s=level / 1e12)
        if best is None or row["rms_log_error"] < best["rms_log_error"]:
            best = row
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="benchmarks/gemm_shapes.py --out of a timed run, or a CSV of efficiencies "
                    "(benchmarks/tensile_logic.py's)")
    ap.add_argument("--machine", default="alps", help="the machine file whose device form is tried (default alps)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="replace one number of --machine's file first (repeatable), e.g. device.gemm_k_half=256")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    try:
        device = load_machine(args.machine, tuple(parse_override(t) for t in args.set)).device
    except TwinError as e:
        ap.error(str(e))
    efficiencies = args.results.endswith(".csv")
    if efficiencies:
        gemms, measured_s = load_efficiencies(args.results, device.peak_flop_per_s)
        levels = LEVELS_OF_PEAK * device.peak_flop_per_s
    else:
        gemms, measured_s = load_measured(args.results)
        levels = LEVELS_TFLOP * 1e12
    form = f"{args.machine} as it is" + (" (--set)" if args.set else "")
    own_level = None if efficiencies else device.empirical_gemm_flop_per_s  # an efficiency's level is unknown
    rows = [dict(form=form, wave_quantization=device.gemm_wave_quantization,
                 k_half=device.gemm_k_half, **score(device, gemms, measured_s, own_level, levels))]
    for waves in WAVES:
        tried = [dict(form="fitted", wave_quantization=waves, k_half=k_half,
                      **score(replace(device, gemm_wave_quantization=waves, gemm_k_half=k_half), gemms, measured_s,
                              levels_flop_per_s=levels))
                 for k_half in K_HALVES]
        rows.append(min(tried, key=lambda r: r["rms_log_error"]))
    if args.json:
        print(json.dumps(dict(results=args.results, machine=args.machine, shapes=len(gemms), efficiencies=efficiencies,
                              rows=rows), indent=2))
        return 0
    print(f"{len(gemms)} GEMMs of {args.results}, timed again by the twin on {args.machine}'s device "
          f"(tiles {device.gemm_tile_m}x{device.gemm_tile_n}, {device.compute_units} units, "
          f"{device.kernel_overhead_s * 1e6:g} us per kernel); error = log(twin time / measured time)")
    if efficiencies:
        print(f"(efficiencies, timed at the peak's {device.peak_flop_per_s / 1e12:g} TF/s: a level is the rate that "
              "efficiency would mean at the peak's clock, not a measured rate)")
    print(f"{'form':<22}{'waves':>6}{'k_half':>8}{'level TF/s':>12}{'RMS':>8}{'FLOP-wtd':>10}{'median':>9}")
    for r in rows:
        print(f"{r['form']:<22}{r['wave_quantization']:>6g}{r['k_half']:>8g}{r['level_tflop_per_s']:>12.0f}"
              f"{r['rms_log_error']:>8.3f}{r['flop_weighted_abs_log_error']:>10.3f}{r['median_log_error']:>+9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
