"""Megatron-LM's published H100 weak scaling (1.7B-462B on 48-6,144 GPUs), predicted; never fitted.

    .venv/bin/python benchmarks/megatron_h100.py [--tpo 0|1] [--odp 0|1] [--gradfp32 0|1] [--json]
                                                                                    # about 5 minutes on 2 cores

The runs are benchmarks/data/megatron-h100-2024.csv (its README section says
where they come from). What the table states: each model's shape, the
vocabulary (131,072) and sequence (4,096), the tensor, pipeline and data
parallel degrees, the GPUs, the global batch, and the overlaps the README
names: data-parallel gradient reduce-scatter and parameter all-gather
(--overlap-grad-reduce, --overlap-param-gather, which need Megatron's
distributed optimizer: zero=1, odp=1 here), tensor-parallel communication
(--tp-comm-overlap, which needs sequence parallelism: sp=1, tpo=1 wherever
tp > 1), and the pipeline's. What it does not state: the micro-batch size,
the interleaved pipeline's chunks and the recompute. The authors tuned those
for throughput, so each run is predicted as the fastest, by the twin, of the
settings it leaves open (mbs 1, 2 or 4 dividing the sequences per data-parallel
rank; vpp 1 or any divisor of the layers per stage up to MAX_CHUNKS, with the
micro-batches a multiple of pp as Megatron requires; the least recompute that
fits: none, selective, full of the first 1, 2, ... layers of each chunk, then
full), as the AxoNN rows are the fastest of
AxoNN's candidates. Flash attention (Transformer Engine's), bf16, GPT-style
layers with the LM head untied (`tied=0`: the table's parameter counts say
so, tests/test_model.py), which adds one V x h table's gradient and
optimizer traffic. Gradients accumulated and reduced in fp32 (gradfp32=1):
Megatron-LM turns --accumulate-allreduce-grads-in-fp32 on under --bf16
(megatron/training/arguments.py), which makes Megatron-Core's gradient
buffers and their reduce-scatters fp32.

Two machine columns, both the DGX H100 SuperPOD of topologies/mpt-h100-80g.toml
(8 H100 per node, NVSwitch, 8 x 400 Gb/s NDR on a rail-optimised full-bisection
fat tree) grown to the 768 nodes the largest run needs: first principles (the
file as it is) and the H100 GEMM rate `make fit` learned from MosaicML's
one-node H100 runs carried over (only that: their attention kernel was
Triton's, not this code's). Prints one row per run and the mean absolute
error of each column.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.runs import MeasuredRun, load_runs  # noqa: E402
from open_settings import chunk_counts, predict_table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "benchmarks" / "data" / "megatron-h100-2024.csv"
MACHINE = "mpt-h100-80g"
FITTED = REPO / "topologies" / "fitted" / "mpt-h100-80g.toml"
NODES = 768  # the 6,144-GPU run's nodes
MICRO_BATCHES = (1, 2, 4)
MAX_CHUNKS = 32  # model chunks per pipeline rank tried (Megatron allows any divisor of the layers per stage)


def machines() -> dict[str, object]:
    """The two columns: the machine file grown to NODES nodes, and the same with the fitted H100 GEMM rate."""
    grown = (parse_override(f"network.n_nodes={NODES}"),)
    gemm = load_machine(str(FITTED)).device.empirical_gemm_flop_per_s / 1e12
    carried = grown + (parse_override(f"device.empirical_gemm_bf16_tflop_per_s={gemm}"),)
    return {"first principles": load_machine(MACHINE, grown),
            f"GEMM {gemm:.0f} TF/s carried": load_machine(MACHINE, carried)}


def settings(run: MeasuredRun, tpo: bool, odp: bool, gradfp32: bool = True) -> list[str]:
    """Every setting the table leaves open for `run` but the recompute, as plan texts (module docstring)."""
    plan, model = run.plan, run.model
    per_rank = plan.global_batch // plan.gdata
    texts = []
    tp_flags = f"sp=1,tpo={int(tpo)}" if plan.gx > 1 else "sp=0"
    for mbs in MICRO_BATCHES:
        if per_rank % mbs:
            continue
        for vpp in chunk_counts(model.layers // plan.pp, per_rank // mbs, plan.pp, MAX_CHUNKS):
            texts.append(f"tp={plan.gx},pp={plan.pp},dp={plan.gdata},vpp={vpp},zero=1,odp={int(odp)},{tp_flags},"
                         f"gradfp32={int(gradfp32)},mbs={mbs}")
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tpo", type=int, choices=(0, 1), default=1,
                        help="model --tp-comm-overlap (1, as the runs did) or not (0: what the twin did before tpo)")
    parser.add_argument("--odp", type=int, choices=(0, 1), default=1,
                        help="model --overlap-grad-reduce and --overlap-param-gather (1, as the runs did) or not (0)")
    parser.add_argument("--gradfp32", type=int, choices=(0, 1), default=1,
                        help="gradients accumulated and reduced in fp32 (1, Megatron-LM's default under --bf16) or "
                        "in bf16 (0: what the twin did before gradfp32)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    tpo, odp, gradfp32 = bool(args.tpo), bool(args.odp), bool(args.gradfp32)
    return predict_table(load_runs(str(RUNS), assume="tied=0"), machines(),
                         lambda run: settings(run, tpo, odp, gradfp32), args.json,
                         {"runs": str(RUNS.relative_to(REPO)), "tpo": tpo, "odp": odp, "gradfp32": gradfp32})


if __name__ == "__main__":
    sys.exit(main())
