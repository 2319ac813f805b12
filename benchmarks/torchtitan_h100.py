"""torchtitan's FSDP2 runs of Llama 3.1 8B on 8 and 128 H100, eager and compiled, predicted; never fitted.

    .venv/bin/python benchmarks/torchtitan_h100.py [--out out] [--json]     # a few seconds

The runs are benchmarks/data/torchtitan-h100-2025.csv (its README section
says where they come from and what is assumed): the four bf16 rows of
torchtitan's performance page of January 2025, Llama 3.1 8B with FSDP alone
(gz = the GPUs, reshard=1, its copies out of the gather buffers, fsdp2=1,
gradients reduced in fp32, gradfp32=1), local
batch 2, its 8B config's per-operator checkpointing (recompute=op), once in
eager PyTorch, the Llama layer's element-wise work and its RMSNorms op by op
(kernels=eager, norm=eager: that config's norm_type is torch's "rmsnorm"),
and once under torch.compile, which fuses them (the twin's fused count, the
plan's default).

Two machine columns on topologies/mpt-h100-80g.toml (a DGX H100: 8 H100 on
NVSwitch, 8 x 400 Gb/s a node, which the page's Grand Teton hosts match),
each with the page's HBM (96 GB of HBM2e at 2.4 TB/s) set: first principles,
and the H100 GEMM rate `make fit` learned from MosaicML's one-node H100 runs
carried over (only that, as benchmarks/megatron_h100.py carries it: their
attention kernel was Triton's, these runs' PyTorch's SDPA). The page's GPUs
ran at 500 W, not the 700 W of an H100 SXM; no file says what that costs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchtitan_a100 import REPO, predict_runs  # noqa: E402

RUNS = REPO / "benchmarks" / "data" / "torchtitan-h100-2025.csv"
MACHINE = "mpt-h100-80g"
FITTED = REPO / "topologies" / "fitted" / "mpt-h100-80g.toml"
# The page's H100: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth" (torchtitan docs/performance.md, d4c86e375)
PAGE_HBM = ("device.hbm_bw_gb_per_s=2400", "device.hbm_gb=96")


def main(argv: list[str] | None = None) -> int:
    return predict_runs(argv, __doc__, RUNS, MACHINE, FITTED, "tt-h100-carried.toml", PAGE_HBM)


if __name__ == "__main__":
    sys.exit(main())
