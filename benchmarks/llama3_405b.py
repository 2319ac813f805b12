"""Llama 3 405B as Meta trained it, on 8,192 and 16,384 H100s, predicted; never fitted.

    .venv/bin/python benchmarks/llama3_405b.py [--gradfp32 0|1] [--json]     # about 4 minutes on 2 cores

The runs are benchmarks/data/llama3-405b-meta-2024.csv (its README section
says where they come from): the two 8K-token rows of the Llama 3 paper's
Table 4 (Dubey et al. 2024, arXiv 2407.21783), tensor 8 x pipeline 16 x data
64 or 128, 16M tokens a step, 430 and 400 TF/s per GPU.

What the paper states and the plans hold: BF16; the 126 layers on 16 stages
with one layer fewer on the first and on the last (sec. 3.3.2: pemb=1,
ploss=1); fully sharded data parallelism that shards the optimizer states
and the gradients and gathers the weights without resharding them after the
forward (zero=2 with the gradients reduce-scattered, and the weights
gathered, once a step under the backward and the forward: odp=1; how often
Meta's reduce-scatter ran is not said), with the gradients accumulated and
reduce-scattered in FP32 (sec. 3.3.2, "Numerical stability": gradfp32=1); an interleaved schedule whose
micro-batches Meta tuned. What it leaves open, taken as the twin's fastest
(as the AxoNN rows of `twin validate` are the fastest of AxoNN's
candidates): the micro-batch (1 or 2 sequences), the interleaved chunks (1,
2, 4 or 8: the divisors of the 8 slots a stage), whether the sequence-
parallel gathers run under their GEMMs (tpo) and the least recompute that
fits (none, or full of the first 1, 2, ... layers of each chunk: rcl,
benchmarks/open_settings.py). Assumed, not stated: sequence parallelism over the tensor-parallel
ranks (sp=1) and flash attention.

The machine is topologies/mpt-h100-80g.toml (8 H100 SXM 80 GB a node on
NVSwitch, a 400 Gb/s NIC per GPU, NCCL) with what sec. 3.3.1 says of Meta's
RoCE cluster: 16K of its 24K GPUs used (2,048 nodes), a three-layer Clos
whose 3,072-GPU pods have full bisection (384 nodes a leaf group in the
twin's fat tree) and whose aggregation layer is oversubscribed 1:7, and
sec. 3.3.2's order of the parallel axes: tensor, context, pipeline, data,
the data-parallel replicas outermost (dpouter=1). Not modelled: NCCLX, and
the pipeline schedule's own changes (asynchronous transfers, any
micro-batch count). Two columns as in benchmarks/megatron_h100.py: the
machine file as it is, and with the H100 GEMM rate fitted on MosaicML's
one-node runs (`make fit`) carried over.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.pipeline_split import slots  # noqa: E402
from twin.runs import MeasuredRun, load_runs  # noqa: E402
from open_settings import chunk_counts, predict_table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "benchmarks" / "data" / "llama3-405b-meta-2024.csv"
MACHINE = "mpt-h100-80g"
FITTED = REPO / "topologies" / "fitted" / "mpt-h100-80g.toml"
# Llama 3 paper sec. 3.3.1: 16K GPUs of the 24K-GPU RoCE cluster; pods of 3,072 GPUs (192 racks of 16) with full
# bisection; the aggregation layer above the pods oversubscribed 1:7
META_CLUSTER = ("network.n_nodes=2048", "network.nodes_per_leaf_group=384", "network.oversubscription=7")
MICRO_BATCHES = (1, 2)
MAX_CHUNKS = 8


def machines() -> dict[str, object]:
    """The two columns: Meta's cluster on the H100 machine file, and the same with the fitted H100 GEMM rate."""
    cluster = tuple(parse_override(o) for o in META_CLUSTER)
    gemm = load_machine(str(FITTED)).device.empirical_gemm_flop_per_s / 1e12
    carried = cluster + (parse_override(f"device.empirical_gemm_bf16_tflop_per_s={gemm}"),)
    return {"first principles": load_machine(MACHINE, cluster),
            f"GEMM {gemm:.0f} TF/s carried": load_machine(MACHINE, carried)}


def settings(run: MeasuredRun, gradfp32: bool = True) -> list[str]:
    """Every setting the paper leaves open for `run` but the recompute, as plan texts (module docstring)."""
    plan, model = run.plan, run.model
    per_rank = plan.global_batch // plan.gdata
    per_stage = slots(model.layers, plan) // plan.pp
    texts = []
    for mbs in MICRO_BATCHES:
        if per_rank % mbs:
            continue
        for vpp in chunk_counts(per_stage, per_rank // mbs, plan.pp, MAX_CHUNKS):
            for tpo in (0, 1):
                texts.append(f"tp={plan.gx},pp={plan.pp},dp={plan.gdata},vpp={vpp},pemb=1,ploss=1,zero=2,odp=1,"
                             f"dpouter=1,sp=1,tpo={tpo},gradfp32={int(gradfp32)},mbs={mbs}")
    return texts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gradfp32", type=int, choices=(0, 1), default=1,
                        help="gradients accumulated and reduce-scattered in FP32 (1, as the paper says) or in bf16 "
                        "(0: what the twin did before gradfp32)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    gradfp32 = bool(args.gradfp32)
    return predict_table(load_runs(str(RUNS)), machines(), lambda run: settings(run, gradfp32), args.json,
                         {"runs": str(RUNS.relative_to(REPO)), "cluster": list(META_CLUSTER), "gradfp32": gradfp32})


if __name__ == "__main__":
    sys.exit(main())
