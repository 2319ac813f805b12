"""NVIDIA Megatron-Bridge's published FP8 runs of Llama 3 70B and 3.1 405B on DGX H100, predicted; never fitted.

    .venv/bin/python benchmarks/megatron_bridge_fp8.py [--carry both|bf16|fp8] [--fp8 1|0] [--json]   # 90 s, 2 cores

The runs are benchmarks/data/megatron-bridge-h100-fp8.csv (its README section
says where they come from): the performance recipes' tokens per second per
GPU on 64 and 1,024 H100s in five NeMo container releases, with FP8 current
scaling (Transformer Engine), each release's row as published. The recipes
(Megatron-Bridge's perf_recipes/llama/h100) give every parallel degree, the
micro-batch (1), the interleaved chunks, sequence parallelism with
--tp-comm-overlap (userbuffers), the data-parallel overlaps and no recompute;
the plans here are those (`fp8=1` with `fp8pg=1`, the recipes' FP8 current
scaling sets --fp8-param-gather, `tpo=1`, `odp=1`, ZeRO-1 as Megatron's
distributed optimizer, `recompute=none`, and for 126 layers in 64 chunks the
embedding's and the loss's slots, pemb=1 and ploss=1). Where the twin's memory
count says a plan does not fit, the least recompute that does is taken and
shown (benchmarks/open_settings.py).

Two machine columns, both the DGX H100 SuperPOD of topologies/mpt-h100-80g.toml
grown to the 128 nodes the largest run needs: first principles (the file's
bf16 and FP8 GEMM rates, 813 and 1,507 TF/s), and the two GEMM rates `make
fit` learned on one node of MosaicML's H100 cluster carried over (the bf16
rate from its 37 bf16 MPT runs, the FP8 rate from its 7 FP8 runs:
topologies/fitted/mpt-h100-80g.toml; not their attention rate, which is
Triton's kernel). Prints one row per run and the mean absolute error of each
column. What-ifs, not the protocol: `--carry bf16` or `--carry fp8` carries
one of the two rates and leaves the other as the file has it; `--fp8 0` runs
the same plans with bf16 linears (what FP8 buys, by the twin).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.runs import MeasuredRun, load_runs  # noqa: E402
from open_settings import predict_table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RUNS = REPO / "benchmarks" / "data" / "megatron-bridge-h100-fp8.csv"
MACHINE = "mpt-h100-80g"
FITTED = REPO / "topologies" / "fitted" / "mpt-h100-80g.toml"
NODES = 128  # the 1,024-GPU runs' nodes
RECIPE = "mbs=1,zero=1,odp=1,sp=1,tpo=1"  # what every recipe here sets, with fp8=1 (module docstring)


def machines(carry: str = "both") -> dict[str, object]:
    """The two columns: the machine file grown to NODES nodes, and the same with the fitted GEMM rates carried
    (`carry`: both, or only the bf16 or only the FP8 one)."""
    grown = (parse_override(f"network.n_nodes={NODES}"),)
    fitted = load_machine(str(FITTED)).device
    bf16, fp8 = fitted.empirical_gemm_flop_per_s / 1e12, fitted.empirical_gemm_fp8_flop_per_s / 1e12
    rates = {"bf16": (f"device.empirical_gemm_bf16_tflop_per_s={bf16}", f"bf16 GEMMs {bf16:.0f} TF/s"),
             "fp8": (f"device.empirical_gemm_fp8_tflop_per_s={fp8}", f"FP8 GEMMs {fp8:.0f} TF/s")}
    kept = rates if carry == "both" else {carry: rates[carry]}
    carried = grown + tuple(parse_override(setting) for setting, _ in kept.values())
    return {"first principles": load_machine(MACHINE, grown),
            " + ".join(name for _, name in kept.values()) + " carried": load_machine(MACHINE, carried)}


def settings(run: MeasuredRun, fp8: bool = True) -> list[str]:
    """The recipe's plan for `run` (its degrees from the data file, the rest from RECIPE), without the recompute."""
    plan, model = run.plan, run.model
    slots = "" if model.layers % (plan.pp * plan.vpp) == 0 else ",pemb=1,ploss=1"
    degrees = f"tp={plan.gx},pp={plan.pp},cp={plan.cp},dp={plan.gdata},vpp={plan.vpp}"
    precision = "fp8=1,fp8pg=1" if fp8 else "fp8=0"  # the current-scaling recipe's --fp8-param-gather
    return [f"{degrees}{slots},{RECIPE},{precision}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--carry", choices=("both", "bf16", "fp8"), default="both",
                        help="which fitted GEMM rate the second column carries (both: the protocol; one: a what-if)")
    parser.add_argument("--fp8", type=int, choices=(0, 1), default=1,
                        help="the recipes' FP8 linears (1, as the runs did) or bf16 ones (0: a what-if)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = parser.parse_args(argv)
    return predict_table(load_runs(str(RUNS)), machines(args.carry), lambda run: settings(run, bool(args.fp8)),
                         args.json, {"runs": str(RUNS.relative_to(REPO)), "carry": args.carry, "fp8": args.fp8})


if __name__ == "__main__":
    sys.exit(main())
