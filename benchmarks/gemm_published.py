"""The twin's A100 GEMM shape model beside published A100 GEMM timings.

    .venv/bin/python benchmarks/gemm_published.py            # the table and the summary
    .venv/bin/python benchmarks/gemm_published.py --json     # the same, as JSON
    .venv/bin/python benchmarks/gemm_published.py --fit      # gemm_k_half, then gemm_wave_quantization

Why: the twin times a GEMM at the empirical GEMM peak (280 TF/s on an A100,
a 32768^3 cuBLAS GEMM) times a shape efficiency (tile quantization x wave
quantization x k loop, twin/sim/compute.py) plus a fixed kernel overhead. The
tile size, gemm_k_half and the overhead in topologies/dgx-a100.toml are
estimates. Checking them needs GEMM rates measured on an A100 at the shapes
training runs (tokens x hidden x 3*hidden, tokens x 4h x h, few tokens), not
only the large square the peak came from. No A100 may be at hand, so this
compares with rates other people published: benchmarks/data/
gemm_published_a100.csv, one row per measurement with its source and how it
was timed (docs/gemm-shape-model.md describes each set).

For each row it prints the measured TFLOP/s, the twin's rate without the
per-kernel overhead (flops / (gemm_time_s - kernel_overhead_s): the shape
model alone) and with it (flops / gemm_time_s: what the simulator charges),
and their ratios to the measurement (> 1: the twin is optimistic). The summary
gives the mean absolute relative error (MARE) overall, for square GEMMs vs the
rest ("training": non-square or batched), for small (< 1 GFLOP) vs large ones,
for cuBLAS vs Triton kernels and for batched GEMMs (unfused attention). The
model ignores dtype, so fp16 rows are compared as they are (the A100's fp16
and bf16 tensor-core peaks are equal).

--fit measures the one shape number these rows can tell: gemm_k_half, the
inner dimension at which the k loop halves a GEMM's rate. It uses the cuBLAS
rows at training shapes (non-square or batched, >= 1 GFLOP: where tile and
wave waste are small and the k loop is what varies), gives each source and GPU its
own free rate (their clocks, parts and timing methods differ: "best of a
search", "slowest of 200 calls"), and picks the k_half that leaves the least
squared log error within sources: rates measured by one source at several k
are what pin it. Leaving each row out in turn gives its spread. The A100
machine files carry the value with this command as its source. It then fits
gemm_wave_quantization (how much of a last wave's idle SMs a GEMM pays) at
that k_half, again with a free rate per source, to the same training-shape
rows (which the A100 files follow) and, apart, to the small or square cuBLAS
rows (where a tail wave costs most).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass, replace
from math import log
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.ir import GEMM_LAYOUTS, Gemm  # noqa: E402
from twin.sim.compute import ComputeModel  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CSV_PATH = ROOT / "benchmarks" / "data" / "gemm_published_a100.csv"
COLUMNS = ("m", "n", "k", "batch", "layout", "dtype", "tflops", "gpu", "library", "source", "note")
K_HALF_GRID = tuple(2 ** (i / 40) for i in range(0, 481))  # 1 .. 4096, 1.7% apart
SMALL_FLOPS = 1e9  # below this a GEMM is "small": a few microseconds, where the fixed overhead matters
TERA = 1e12


@dataclass(frozen=True)
class Measurement:
    """One published GEMM rate (one CSV row)."""

    m: int
    n: int
    k: int
    batch: int  # > 1: a batched GEMM (torch.bmm), e.g. unfused attention per head
    layout: str
    dtype: str
    tflops: float
    gpu: str
    library: str
    source: str
    note: str

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def gemm(self) -> Gemm:
        """The GEMM the twin times for this row (no layout given: NN, which cuBLAS runs at the same rate)."""
        return Gemm(self.m, self.n, self.k, layout=self.layout or "NN", dtype=self.dtype, batch=self.batch)

    @property
    def shape(self) -> str:
        return f"{self.m}x{self.n}x{self.k}" + (f" b{self.batch}" if self.batch > 1 else "")


def load(path: Path = CSV_PATH) -> list[Measurement]:
    """The CSV's rows; a row with a missing source, a non-positive number or an unknown layout is an error."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: columns {reader.fieldnames}, expected {list(COLUMNS)}")
        rows = []
        for line, r in enumerate(reader, start=2):
            try:
                row = Measurement(int(r["m"]), int(r["n"]), int(r["k"]), int(r["batch"]), r["layout"].strip(),
                                  r["dtype"].strip(),
                                  float(r["tflops"]), r["gpu"].strip(), r["library"].strip(), r["source"].strip(),
                                  r["note"].strip())
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line}: {e}") from e
            if min(row.m, row.n, row.k, row.batch) <= 0 or not row.tflops > 0:
                raise ValueError(f"{path}:{line}: m, n, k, batch and tflops must be positive")
            if not row.source or not row.gpu:
                raise ValueError(f"{path}:{line}: every measurement needs its gpu and source")
            if row.layout and row.layout not in GEMM_LAYOUTS:
                raise ValueError(f"{path}:{line}: layout {row.layout!r} is not one of {GEMM_LAYOUTS} or empty")
            rows.append(row)
    return rows


def predict(rows: list[Measurement], machine: str = "dgx-a100") -> list[dict]:
    """The twin's rate for each row, without and with the per-kernel overhead."""
    compute = ComputeModel(load_machine(machine).device)
    overhead_s = compute.device.kernel_overhead_s
    out = []
    for r in rows:
        gemm = r.gemm
        t = compute.gemm_time_s(gemm)
        kernel, with_overhead = r.flops / (t - overhead_s) / TERA, r.flops / t / TERA
        out.append(dict(shape=r.shape, m=r.m, n=r.n, k=r.k, batch=r.batch, gflop=r.flops / 1e9, library=r.library, gpu=r.gpu,
                        source=r.source, measured=r.tflops, twin=kernel, twin_with_overhead=with_overhead,
                        ratio=kernel / r.tflops, ratio_with_overhead=with_overhead / r.tflops,
                        efficiency=compute.gemm_efficiency(gemm), square=r.m == r.n == r.k and r.batch == 1,
                        small=r.flops < SMALL_FLOPS, triton=r.library.lower().startswith("triton")))
    return out


def fit_rows(rows: list[Measurement]) -> list[Measurement]:
    """The rows --fit learns from: cuBLAS GEMMs at training shapes (non-square or batched), >= 1 GFLOP."""
    return [r for r in rows if not r.library.lower().startswith("triton")
            and not (r.m == r.n == r.k and r.batch == 1) and r.flops >= SMALL_FLOPS]


def _source_group(r: Measurement) -> str:
    """Rows of one source measured on one GPU share a rate: the repository (or issue) without its commit, and GPU."""
    return f"{r.source.split('@')[0].split(':')[0]} / {r.gpu}"


def _within_source_error(rows: list[Measurement], compute: ComputeModel) -> float:
    """Sum of squared log(twin / measured) about each source's mean: the error a free rate per source leaves."""
    by_group: dict[str, list[float]] = {}
    for r in rows:
        t = compute.gemm_time_s(r.gemm) - compute.device.kernel_overhead_s
        by_group.setdefault(_source_group(r), []).append(log(r.flops / t / TERA / r.tflops))
    return sum(sum((x - statistics.fmean(v)) ** 2 for x in v) for v in by_group.values())


def _best_k_half(rows: list[Measurement], models: dict[float, ComputeModel]) -> float:
    return min(K_HALF_GRID, key=lambda kh: _within_source_error(rows, models[kh]))


def fit_k_half(rows: list[Measurement], machine: str = "dgx-a100") -> dict:
    """gemm_k_half fitted to the training-shape cuBLAS rows (module docstring), with its leave-one-out range."""
    device = load_machine(machine).device
    used = fit_rows(rows)
    groups = sorted({_source_group(r) for r in used})
    if len(used) - len(groups) < 2:
        raise ValueError(f"--fit needs at least two rows more than sources; has {len(used)} rows in {len(groups)}")
    models = {kh: ComputeModel(replace(device, gemm_k_half=kh)) for kh in K_HALF_GRID}
    best = _best_k_half(used, models)
    left_out = [_best_k_half(used[:i] + used[i + 1:], models) for i in range(len(used))]
    file_model = ComputeModel(device)
    rms = lambda model: (_within_source_error(used, model) / len(used)) ** 0.5  # noqa: E731
    return dict(k_half=best, leave_one_out=(min(left_out), max(left_out)), file_k_half=device.gemm_k_half,
                rows=len(used), groups=groups, rms_log_error=rms(models[best]), file_rms_log_error=rms(file_model))


WAVE_GRID = tuple(i / 20 for i in range(21))  # gemm_wave_quantization 0, 0.05, .. 1


def _best_wave(rows: list[Measurement], models: dict[float, ComputeModel]) -> float:
    return min(WAVE_GRID, key=lambda q: _within_source_error(rows, models[q]))


def fit_wave_quantization(rows: list[Measurement], machine: str = "dgx-a100") -> dict:
    """gemm_wave_quantization (how much of the last wave's idle units a GEMM pays) fitted at the machine file's
    gemm_k_half, a free rate per source, to two sets of cuBLAS rows apart: the training shapes --fit takes
    k_half from, and the small or square rest (where a tail wave costs most); each with its leave-one-out range
    and its error at full wave quantisation and at none."""
    device = load_machine(machine).device
    models = {q: ComputeModel(replace(device, gemm_wave_quantization=q)) for q in WAVE_GRID}
    training = fit_rows(rows)
    rest = [r for r in rows if not r.library.lower().startswith("triton") and r not in training]
    out = dict(file_wave_quantization=device.gemm_wave_quantization, k_half=device.gemm_k_half)
    for name, used in (("training", training), ("small_or_square", rest)):
        rms = lambda q: (_within_source_error(used, models[q]) / len(used)) ** 0.5  # noqa: E731
        best = _best_wave(used, models)
        left_out = [_best_wave(used[:i] + used[i + 1:], models) for i in range(len(used))]
        out[name] = dict(wave_quantization=best, leave_one_out=(min(left_out), max(left_out)), rows=len(used),
                         rms_log_error=rms(best), full_waves_rms_log_error=rms(1.0), no_waves_rms_log_error=rms(0.0))
    return out


def _mare(preds: list[dict], key: str) -> float:
    return statistics.fmean(abs(p[key] - 1.0) for p in preds)


def summarize(preds: list[dict]) -> list[dict]:
    """MARE (kernel only and with overhead) and the median ratio, per group of rows."""
    groups = {
        "all": preds,
        "square": [p for p in preds if p["square"]],
        "training (the rest)": [p for p in preds if not p["square"]],
        "small (< 1 GFLOP)": [p for p in preds if p["small"]],
        "large (>= 1 GFLOP)": [p for p in preds if not p["small"]],
        "cuBLAS rows": [p for p in preds if not p["triton"]],
        "Triton rows": [p for p in preds if p["triton"]],
        "cuBLAS, large": [p for p in preds if not p["triton"] and not p["small"]],
        "batched (bmm)": [p for p in preds if p["batch"] > 1],
    }
    return [dict(group=name, rows=len(g), mare=_mare(g, "ratio"), mare_with_overhead=_mare(g, "ratio_with_overhead"),
                 median_ratio=statistics.median(p["ratio"] for p in g),
                 median_ratio_with_overhead=statistics.median(p["ratio_with_overhead"] for p in g))
            for name, g in groups.items() if g]


def main(argv: list[str] | None = None) -> dict:
    """Print the comparison; return it ({"rows": one prediction per CSV row, "summary": per group})."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--csv", type=Path, default=CSV_PATH, help="published measurements (default: %(default)s)")
    ap.add_argument("--machine", default="dgx-a100", help="machine file of the GPU measured (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--fit", action="store_true",
                    help="fit gemm_k_half to the training-shape cuBLAS rows (a free rate per source) and print it")
    args = ap.parse_args(argv)
    if args.fit:
        rows = load(args.csv)
        fit = dict(fit_k_half(rows, args.machine), waves=fit_wave_quantization(rows, args.machine))
        return _print_fit(fit, args.json)
    preds = predict(load(args.csv), args.machine)
    where = args.csv.resolve()
    shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where
    report = dict(machine=args.machine, csv=str(shown), rows=preds, summary=summarize(preds))
    if args.json:
        print(json.dumps(report, indent=1))
        return report
    print(f"{'m x n x k [batch]':<22}{'GFLOP':>8} {'kernel':<8}{'measured':>9}{'twin':>7}{'+ovh':>7}"
          f"{'ratio':>7}{'+ovh':>7}  gpu")
    for p in preds:
        print(f"{p['shape']:<22}{p['gflop']:>8.2f} {'Triton' if p['triton'] else 'cuBLAS':<8}{p['measured']:>9.1f}"
              f"{p['twin']:>7.1f}{p['twin_with_overhead']:>7.1f}{p['ratio']:>7.2f}{p['ratio_with_overhead']:>7.2f}"
              f"  {p['gpu']}")
    print("\nratio = twin / measured TFLOP/s; MARE = mean |ratio - 1|; +ovh includes kernel_overhead_us")
    print(f"{'group':<24}{'rows':>5}{'MARE':>7}{'+ovh':>7}{'median ratio':>14}{'+ovh':>7}")
    for s in report["summary"]:
        print(f"{s['group']:<24}{s['rows']:>5}{s['mare']:>7.2f}{s['mare_with_overhead']:>7.2f}"
              f"{s['median_ratio']:>14.2f}{s['median_ratio_with_overhead']:>7.2f}")
    return report


def _print_fit(fit: dict, as_json: bool) -> dict:
    if as_json:
        print(json.dumps(fit, indent=1))
        return fit
    low, high = fit["leave_one_out"]
    print(f"gemm_k_half = {fit['k_half']:.0f} (leaving one row out: {low:.0f}-{high:.0f}; the machine file has "
          f"{fit['file_k_half']:g})")
    print(f"  from {fit['rows']} cuBLAS rows at training shapes (non-square or batched, >= 1 GFLOP), a free rate per "
          "source:")
    for g in fit["groups"]:
        print(f"    {g}")
    print(f"  rms log error within sources: {fit['rms_log_error']:.3f} fitted, {fit['file_rms_log_error']:.3f} "
          f"with the file's value")
    waves = fit["waves"]
    print(f"gemm_wave_quantization at gemm_k_half {waves['k_half']:g} (the machine file has "
          f"{waves['file_wave_quantization']:g}), a free rate per source:")
    for name, label in (("training", "the training-shape rows above"), ("small_or_square", "the small or square rest")):
        w = waves[name]
        low, high = w["leave_one_out"]
        print(f"  {label} ({w['rows']}): {w['wave_quantization']:g} (leaving one row out {low:g}-{high:g}); rms log "
              f"error {w['rms_log_error']:.3f}, {w['full_waves_rms_log_error']:.3f} at 1, "
              f"{w['no_waves_rms_log_error']:.3f} at 0")
    return fit


if __name__ == "__main__":
    main()
