"""torchtitan's FSDP2 runs of Llama 3.1 8B on H100, eager and compiled: fitted on one node, the 16-node runs predicted.

    .venv/bin/python benchmarks/torchtitan_h100.py [--out out] [--json]     # a few seconds

The runs are torchtitan's performance page of January 2025 (the data README
says where they come from and what is assumed): Llama 3.1 8B with FSDP alone
(gz = the GPUs, reshard=1, its copies out of the gather buffers, fsdp2=1,
gradients reduced in fp32, gradfp32=1), local batch 2, its 8B config's
per-operator checkpointing (recompute=op), once in eager PyTorch, the Llama
layer's element-wise work and its RMSNorms op by op (kernels=eager,
norm=eager: that config's norm_type is torch's "rmsnorm"), and once under
torch.compile, which fuses them (the twin's fused count, the plan's
default): on one node (benchmarks/data/torchtitan-h100-2025-one-node.csv,
calibration) and on 16 (-multi-node.csv, validation: never fitted).

Three machine columns on topologies/mpt-h100-80g.toml (a DGX H100: 8 H100 on
NVSwitch, 8 x 400 Gb/s a node, which the page's Grand Teton hosts match),
each with the page's HBM (96 GB of HBM2e at 2.4 TB/s): first principles;
carried, the H100 GEMM rate `make fit` learned from MosaicML's one-node H100
runs (only that, as benchmarks/megatron_h100.py carries it: cuBLAS's GEMMs
are the same, the attention kernel is not, theirs Triton's, these PyTorch's
SDPA); and fitted, the carried file with its attention efficiency fitted by
`twin fit` on the two one-node runs (one number, 2-fold cross-validated),
which predicts the multi-node runs. The files are written to OUT. The page's
GPUs ran at 500 W, not the 700 W of an H100 SXM; no file says what that
costs.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torchtitan_a100 import CARRIED, REPO, _quietly, parse_out_args, twin  # noqa: E402

DATA = REPO / "benchmarks" / "data"
ONE_NODE = DATA / "torchtitan-h100-2025-one-node.csv"
MULTI_NODE = DATA / "torchtitan-h100-2025-multi-node.csv"
MACHINE = "mpt-h100-80g"
FITTED = REPO / "topologies" / "fitted" / "mpt-h100-80g.toml"
# The page's H100: "96GB HBM2e with 2.4 TB/sec peak memory bandwidth" (torchtitan docs/performance.md, d4c86e375)
PAGE_HBM = ("device.hbm_bw_gb_per_s=2400", "device.hbm_gb=96")
FIT = ("device.attention_efficiency",)  # PyTorch's SDPA kernel: what the one-node runs can tell, one number
FOLDS = 2  # one plan a fold: the eager run and the compiled one


def main(argv: list[str] | None = None) -> int:
    args = parse_out_args(argv, __doc__, "the carried and fitted machine files",
                          "the two validations and the fit as JSON")
    carried, fitted = (str(Path(args.out) / name) for name in ("tt-h100-carried.toml", "tt-h100-fitted.toml"))
    sets = [arg for field in PAGE_HBM for arg in ("--set", field)]
    rc = _quietly(["fit", "--machine", MACHINE, "--from", str(FITTED), "--params", ",".join(CARRIED), *sets,
                   "-o", carried])
    if rc:
        return rc
    steps = {"fit": ["fit", "--machine", carried, "--runs", str(ONE_NODE), "--params", ",".join(FIT),
                     "--folds", str(FOLDS), "-o", fitted],
             "one_node": ["validate", "--runs", str(ONE_NODE), "--machine", MACHINE, "--machine", carried, *sets],
             "multi_node": ["validate", "--runs", str(MULTI_NODE), "--machine", MACHINE, "--machine", carried,
                            "--machine", fitted, *sets]}
    if not args.json:
        for name, step in steps.items():
            print(f"\n== {name.replace('_', ' ')} ==")
            rc = twin(step)
            if rc:
                return rc
        return 0
    doc = {}
    for name, step in steps.items():
        rc, out = _captured([*step, "--json"])
        if rc:
            return rc
        doc[name] = json.loads(out)
    print(json.dumps(doc, indent=2))
    return 0


def _captured(argv: list[str]) -> tuple[int, str]:
    """A twin command's exit code and standard output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = twin(argv)
    return rc, out.getvalue()


if __name__ == "__main__":
    sys.exit(main())
