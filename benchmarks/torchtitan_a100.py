"""torchtitan's FSDP2 runs of Llama 2 and Llama 3 on 64 A100 80 GB, predicted; never fitted.

    .venv/bin/python benchmarks/torchtitan_a100.py [--out out] [--json]     # a few seconds

The runs are benchmarks/data/torchtitan-a100-2024.csv (its README section
says where they come from and what is assumed): the eight rows of
torchtitan's performance page of 2024, each a fixed plan (FSDP over the 64
GPUs, gz=64, with FULL_SHARD's resharding, reshard=1, FSDP2's copies out of
its gather buffers, fsdp2=1, and its gradients reduced in fp32,
gradfp32=1), its activation checkpointing stated (none, full, every second
layer: rcl of half the layers, or "selective op", torchtitan's per-operator
checkpointing: recompute=op), and its Llama's element-wise work op by op as
eager PyTorch launches it (kernels=eager; the 70B runs' RMSNorm too,
norm=eager, as their configs set it).

Three machine columns on topologies/dgx-a100.toml (the cluster is not
described beyond "64 A100 (80GB)": a DGX A100 fabric, 8 x 200 Gb/s HDR a
node, is assumed): first principles (the file as it is); the A100 GEMM rate
`make fit` learned from MosaicML's one-node A100 40 GB runs carried over
(only that, as benchmarks/megatron_h100.py carries the H100's: their
attention kernel was Triton's, these runs' PyTorch's SDPA); and that rate
with MosaicML's attention efficiency carried too, which the page has no
one-node run to fit, but which torchtitan's one-node H100 runs say carries
(fitted there, PyTorch's SDPA asks 0.300 of the GEMM rate where MosaicML's
Triton kernel asked 0.302: benchmarks/torchtitan_h100.py). The carried files
are written by `twin fit --from` to OUT/tt-a100-carried.toml and
OUT/tt-a100-carried-attention.toml; the table is `twin validate --runs`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from twin.cli import main as twin  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "benchmarks" / "data" / "torchtitan-a100-2024.csv"
MACHINE = "dgx-a100"
FITTED = REPO / "topologies" / "fitted" / "mpt-a100-40g.toml"
CARRIED = ("device.empirical_gemm_bf16_tflop_per_s",)
ATTENTION = "device.attention_efficiency"  # carried in the third column (module docstring)


def main(argv: list[str] | None = None) -> int:
    args = parse_out_args(argv, __doc__, "the carried machine files", "twin validate's JSON instead of the table")
    columns = []
    for name, params in (("tt-a100-carried.toml", CARRIED), ("tt-a100-carried-attention.toml", (*CARRIED, ATTENTION))):
        columns.append(str(Path(args.out) / name))
        # the fit's own report is not this table: kept off the screen
        rc = _quietly(["fit", "--machine", MACHINE, "--from", str(FITTED), "--params", ",".join(params),
                       "-o", columns[-1]])
        if rc:
            return rc
    return twin(["validate", "--runs", str(RUNS), "--machine", MACHINE,
                 *[arg for path in columns for arg in ("--machine", path)], *(["--json"] if args.json else [])])


def parse_out_args(argv: list[str] | None, doc: str, written: str, json_output: str) -> argparse.Namespace:
    """A torchtitan benchmark's command line (--out, where `written` go, created; --json, printing `json_output`)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", default="out", help=f"folder for {written} (default out)")
    parser.add_argument("--json", action="store_true", help=f"print {json_output}")
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args


def _quietly(argv: list[str]) -> int:
    """A twin command whose standard output is dropped (its errors still reach standard error)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return twin(argv)


if __name__ == "__main__":
    sys.exit(main())
