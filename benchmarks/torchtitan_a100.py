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

Two machine columns on topologies/dgx-a100.toml (the cluster is not
described beyond "64 A100 (80GB)": a DGX A100 fabric, 8 x 200 Gb/s HDR a
node, is assumed): first principles (the file as it is), and the A100 GEMM
rate `make fit` learned from MosaicML's one-node A100 40 GB runs carried
over (only that, as benchmarks/megatron_h100.py carries the H100's: their
attention kernel was Triton's, these runs' PyTorch's SDPA). The carried file
is written by `twin fit --from` to OUT/tt-a100-carried.toml;
the table is `twin validate --runs`'s.
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


def main(argv: list[str] | None = None) -> int:
    return predict_runs(argv, __doc__, RUNS, MACHINE, FITTED, "tt-a100-carried.toml")


def predict_runs(argv: list[str] | None, doc: str, runs: Path, machine: str, fitted: Path, carried_name: str,
                 sets: tuple[str, ...] = ()) -> int:
    """A torchtitan benchmark's command line: `runs` predicted by `twin validate --runs` on `machine` as it is and
    with the GEMM rate fitted in `fitted` carried over (written to OUT/`carried_name`), each with the `sets`
    (FIELD=VALUE: what the runs' machine states beside the file's)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", default="out", help="folder for the carried machine file (default out)")
    parser.add_argument("--json", action="store_true", help="print twin validate's JSON instead of the table")
    args = parser.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    carried = str(Path(args.out) / carried_name)
    # the fit's own report is not this table: kept off the screen
    rc = _quietly(["fit", "--machine", machine, "--from", str(fitted), "--params", ",".join(CARRIED), "-o", carried])
    if rc:
        return rc
    set_args = [arg for field in sets for arg in ("--set", field)]
    return twin(["validate", "--runs", str(runs), "--machine", machine, "--machine", carried, *set_args,
                 *(["--json"] if args.json else [])])


def _quietly(argv: list[str]) -> int:
    """A twin command whose standard output is dropped (its errors still reach standard error)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return twin(argv)


if __name__ == "__main__":
    sys.exit(main())
