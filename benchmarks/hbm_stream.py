"""The device's memory bandwidth as element-wise work sees it: a large tensor copied and scaled in place.

    python3 benchmarks/hbm_stream.py [--device cuda] [--gib 2] [--json]

The twin streams element-wise bytes at hbm_efficiency x hbm_bw_gb_per_s
(twin/sim/compute.py); this measures what such a kernel reaches on a lent
GPU, as a fraction of the bandwidth --peak-gb-per-s names (the datasheet's),
so that a machine file can carry a measured efficiency with its source.
Needs only torch (no simulator): it runs on the GPU machine as it is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def stream_gb_per_s(kind: str, nbytes: int, device: str, reps: int = 10) -> float:
    """Median GB/s (bytes read plus bytes written) of one element-wise kernel over a tensor of `nbytes`."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    elements = nbytes // torch.tensor([], dtype=dtype).element_size()
    a = torch.ones(elements, device=device, dtype=dtype)
    b = torch.empty_like(a)
    ops = {"copy": (lambda: b.copy_(a), 2), "scale": (lambda: a.mul_(1.0), 2),
           "add": (lambda: torch.add(a, b, out=b), 3)}  # (kernel, tensors it reads or writes)
    op, touched = ops[kind]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def once() -> float:
        sync()
        t0 = time.perf_counter()
        op()
        sync()
        return time.perf_counter() - t0

    once()
    return touched * elements * a.element_size() / statistics.median(once() for _ in range(reps)) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--gib", type=float, default=2.0, help="size of each tensor in GiB (default 2)")
    ap.add_argument("--peak-gb-per-s", type=float, default=0.0, help="the datasheet's bandwidth, for the efficiency")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    if args.gib <= 0:
        print("hbm_stream: --gib must be positive, e.g. --gib 2", file=sys.stderr)
        return 2
    import torch

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("hbm_stream: --device cuda, but torch sees no GPU here; use --device cpu or auto", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    nbytes = int(args.gib * 2 ** 30)
    rates = {kind: stream_gb_per_s(kind, nbytes, device) for kind in ("copy", "scale", "add")}
    doc = dict(device=name, torch=torch.__version__, bytes_per_tensor=nbytes, gb_per_s=rates,
               peak_gb_per_s=args.peak_gb_per_s or None,
               efficiency={k: v / args.peak_gb_per_s for k, v in rates.items()} if args.peak_gb_per_s else None)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"element-wise streaming on {name} (torch {torch.__version__}), {args.gib:g} GiB tensors, median of 10")
    for kind, rate in rates.items():
        eff = f"  {rate / args.peak_gb_per_s:.3f} of {args.peak_gb_per_s:g}" if args.peak_gb_per_s else ""
        print(f"  {kind:<6}{rate:10.1f} GB/s{eff}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
