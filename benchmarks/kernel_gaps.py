"""A GPU's fixed cost per kernel, read from a profiled step: the idle time between queued kernels, and a copy's
time beyond what its bytes take.

    .venv/bin/python benchmarks/kernel_gaps.py TRACE [--hbm-peak-gb-per-s 4800] [--json]

The twin charges every GPU kernel `device.kernel_overhead_us` on top of its
work (twin.sim.compute); this measures what a queued stream of kernels pays.
TRACE is one rank's torch.profiler trace of `twin run --profile-steps` (.json
or .json.gz), whose kernels run back to back while the host stays ahead.

- Gaps: from each kernel's end to the next one's start, split by whether the
  two came from one host call (Kineto's "External id": a cuBLAS call's
  workspace memset and its GEMM) or from two. Between two of the executor's
  ops the gap also holds the CUDA events it records around every op to time
  it, which a training framework does not; inside one call it holds nothing
  but the GPU's own kernel-to-kernel time. Gaps over GAP_LIMIT_US are the host
  falling behind (or a step's end), not a queued stream's, and are left out.
- Copies: the step's device-to-device copies (the executor's element-wise
  ops), time against the bytes each moves (read and written, twice the bytes
  Kineto records): a least-squares line through them, relative errors
  weighed alike; its intercept is a copy's fixed time, its slope the HBM
  bandwidth copies stream at.

Their sum, the in-call gap and the copy's intercept, is the per-kernel
overhead a machine file may take for this GPU. Reads files only; the results
it was written for are in benchmarks/results/2026-12-04-nvidia-h200/
(docs/gpu-h200.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twin.errors import TwinError  # noqa: E402
from twin.profiler_trace import Kernel, trace_kernels  # noqa: E402

GAP_LIMIT_US = 50.0
MIN_COPIES = 3


def gaps_us(kernels: list[Kernel]) -> dict[str, list[float]]:
    """Idle microseconds between consecutive kernels, {"inside one call": [...], "between calls": [...]}, each
    gap at most GAP_LIMIT_US (longer ones are the host's, not the stream's)."""
    out: dict[str, list[float]] = {"inside one call": [], "between calls": []}
    for a, b in zip(kernels, kernels[1:]):
        gap = b.start_us - a.end_us
        if 0 <= gap <= GAP_LIMIT_US:
            same = a.host_op is not None and a.host_op == b.host_op
            out["inside one call" if same else "between calls"].append(gap)
    return out


def copy_line(kernels: list[Kernel]) -> tuple[float, float, int]:
    """(intercept s, bandwidth bytes/s, copies) of time = intercept + moved / bandwidth over the device-to-device
    copies, moved = 2 x the bytes Kineto records; relative least squares (each copy's equation over its time)."""
    copies = [k for k in kernels if k.op_class == "elementwise" and k.nbytes and "DtoD" in k.name]
    if len(copies) < MIN_COPIES:
        raise TwinError(f"only {len(copies)} device-to-device copies with bytes in the trace; profile a step of "
                        "twin run (its element-wise ops are such copies)")
    t = np.array([k.duration_s for k in copies])
    moved = np.array([2 * k.nbytes for k in copies])
    (intercept, inverse_bw), *_ = np.linalg.lstsq(np.stack([np.ones_like(t), moved], 1) / t[:, None],
                                                   np.ones_like(t), rcond=None)
    if inverse_bw <= 0:
        raise TwinError("the copies' times do not grow with their bytes: no bandwidth to fit")
    return float(intercept), float(1 / inverse_bw), len(copies)


def _quartiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    p25, p50, p75 = np.percentile(values, [25, 50, 75])
    return {"n": len(values), "p25_us": float(p25), "median_us": float(p50), "p75_us": float(p75)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="one rank's torch.profiler trace (twin run --profile-steps), .json or .json.gz")
    ap.add_argument("--hbm-peak-gb-per-s", type=float, help="the GPU's HBM peak, to print the copies' share of it")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    try:
        kernels = trace_kernels(args.trace)
        gaps = gaps_us(kernels)
        intercept_s, bandwidth, n_copies = copy_line(kernels)
    except (TwinError, OSError) as e:
        print(f"kernel_gaps: {e}", file=sys.stderr)
        return 2
    inside = _quartiles(gaps["inside one call"])
    doc = {"trace": args.trace, "kernels": len(kernels),
           "gaps": {"inside one call": inside, "between calls": _quartiles(gaps["between calls"])},
           "copies": {"n": n_copies, "intercept_us": 1e6 * intercept_s, "bandwidth_gb_per_s": bandwidth / 1e9,
                      "share_of_peak": bandwidth / 1e9 / args.hbm_peak_gb_per_s if args.hbm_peak_gb_per_s else None},
           "per_kernel_overhead_us": (inside["median_us"] + 1e6 * intercept_s) if inside["n"] else None}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{args.trace}: {len(kernels)} GPU kernels")
    print(f"{'gap between consecutive kernels':<36}{'n':>6}{'p25 us':>9}{'median':>9}{'p75':>9}")
    for label, q in doc["gaps"].items():
        row = f"{q['p25_us']:9.2f}{q['median_us']:9.2f}{q['p75_us']:9.2f}" if q["n"] else f"{'-':>9}" * 3
        print(f"  {label:<34}{q['n']:>6}{row}")
    c = doc["copies"]
    share = f" ({c['share_of_peak']:.3f} of {args.hbm_peak_gb_per_s:g})" if c["share_of_peak"] else ""
    print(f"copies: time = {c['intercept_us']:.2f} us + bytes moved / {c['bandwidth_gb_per_s']:.0f} GB/s{share}, "
          f"over {c['n']} device-to-device copies")
    if doc["per_kernel_overhead_us"] is not None:
        print(f"per-kernel overhead of a queued stream (in-call gap + copy intercept): "
              f"{doc['per_kernel_overhead_us']:.2f} us")
    print(f"(gaps over {GAP_LIMIT_US:g} us left out: the host's, not the stream's; between two calls the executor's "
          "timing events sit in the gap)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
