"""Each GEMM of a profiled one-GPU step, as it ran inside the step, beside the twin and beside its isolated timing.

    .venv/bin/python benchmarks/gpu_step_gemms.py TRACE --schedule STEP.json [--shapes gemm-shapes.json]
        [--machine alps] [--set FIELD=VALUE ...] [--json]

`twin compare-trace` sums a step's GEMM kernels into one class; when that
class is off, this says which GEMMs are. The executor (`twin run
--profile-steps`) issues one cuBLAS call per GEMM op of the schedule, in the
program's order, and each call is one kernel, so the k-th GEMM kernel of a
step is the k-th GEMM op: the script pairs them (it refuses a trace whose
GEMM kernels are not a whole number of steps of the schedule's GEMM ops) and
prints, per GEMM shape, the rate inside the step, the rate the same shape
reached timed alone (benchmarks/gemm_shapes.py's --out, when given; the
fastest layout, as the executor tunes) and the twin's, and the step's GEMM
time with and without the GEMMs that have a dimension not a multiple of 8
(cuBLAS runs those on other kernels: an unpadded vocabulary).
Reads files only; the results it was written for are in
benchmarks/results/2026-12-04-nvidia-h200/ (docs/gpu-h200.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.ir import Gemm  # noqa: E402
from twin.ir_io import load_schedule  # noqa: E402
from twin.profiler_trace import kernels_of_class  # noqa: E402
from twin.sim.compute import ComputeModel  # noqa: E402

ALIGN = 8  # elements: 16 bytes of a 2-byte type, what cuBLAS's tensor-core kernels want of every dimension


def aligned(g: Gemm) -> bool:
    return all(d % ALIGN == 0 for d in (g.m, g.n, g.k))


def pair_kernels(trace: str, schedule_path: str) -> tuple[list[Gemm], list[list[float]], list[str]]:
    """The schedule's GEMM ops (rank 0's program), each op's kernel durations (one per profiled step) and one
    kernel name per op."""
    schedule = load_schedule(schedule_path)
    gemms = [op.work for op in schedule.programs[0].ops if isinstance(op.work, Gemm)]
    kernels = kernels_of_class(trace, "gemm")
    if not gemms or not kernels or len(kernels) % len(gemms):
        raise TwinError(f"{trace}: {len(kernels)} GEMM kernels are not whole steps of the schedule's {len(gemms)} "
                        "GEMM ops; profile the same schedule with twin run --profile-steps")
    durations: list[list[float]] = [[] for _ in gemms]
    for i, kernel in enumerate(kernels):
        durations[i % len(gemms)].append(kernel.duration_s)
    return gemms, durations, [kernels[i].name for i in range(len(gemms))]


def isolated_rates(path: str | None) -> dict[tuple, float]:
    """gemm_shapes.py's measured rate (flop/s) per (m, n, k, batch), the fastest layout."""
    if not path:
        return {}
    best: dict[tuple, float] = {}
    for s in json.loads(Path(path).read_text())["shapes"]:
        if s.get("measured_tflop_per_s"):
            key = (s["m"], s["n"], s["k"], s.get("batch", 1))
            best[key] = max(best.get(key, 0.0), s["measured_tflop_per_s"] * 1e12)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="one rank's torch.profiler trace (twin run --profile-steps), .json or .json.gz")
    ap.add_argument("--schedule", required=True, help="the schedule IR the trace ran (twin export)")
    ap.add_argument("--shapes", help="benchmarks/gemm_shapes.py --out of the same GPU: isolated rates per shape")
    ap.add_argument("--machine", default="alps", help="machine whose device the twin times the GEMMs on")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a machine number")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    try:
        machine = load_machine(args.machine, tuple(parse_override(text) for text in args.set))
        gemms, durations, names = pair_kernels(args.trace, args.schedule)
        isolated = isolated_rates(args.shapes)
    except (TwinError, OSError, ValueError, KeyError) as e:
        print(f"gpu_step_gemms: {e}", file=sys.stderr)
        return 2
    model = ComputeModel(machine.device)
    groups: dict[tuple, dict] = defaultdict(lambda: dict(ops=0, measured_s=0.0, twin_s=0.0, name=""))
    for g, ds, name in zip(gemms, durations, names):
        key = (g.m, g.n, g.k, g.layout, g.batch)
        row = groups[key]
        row["ops"] += 1
        row["measured_s"] += statistics.median(ds)
        row["twin_s"] += model.gemm_time_s(g)
        row["name"] = row["name"] or name
    rows = []
    for (m, n, k, layout, batch), r in sorted(groups.items(), key=lambda kv: -kv[1]["measured_s"]):
        flops = 2.0 * m * n * k * batch * r["ops"]
        alone = isolated.get((m, n, k, batch))
        rows.append(dict(m=m, n=n, k=k, layout=layout, batch=batch, ops=r["ops"], measured_s=r["measured_s"],
                         twin_s=r["twin_s"], in_step_tflop_per_s=flops / r["measured_s"] / 1e12,
                         isolated_tflop_per_s=alone / 1e12 if alone else None,
                         twin_tflop_per_s=flops / r["twin_s"] / 1e12, aligned=aligned(Gemm(m, n, k)),
                         kernel=r["name"]))
    totals = {}
    for label, keep in (("every GEMM", lambda r: True), ("dimensions multiples of 8", lambda r: r["aligned"])):
        chosen = [r for r in rows if keep(r)]
        measured, twin = sum(r["measured_s"] for r in chosen), sum(r["twin_s"] for r in chosen)
        totals[label] = dict(measured_s=measured, twin_s=twin, error=twin / measured - 1 if measured else None)
    doc = dict(trace=args.trace, schedule=args.schedule, machine=machine.name, overrides=args.set,
               steps=len(durations[0]), shapes=rows, per_step=totals)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"GEMMs of one step of {args.schedule} ({doc['steps']} profiled steps, median per op), the twin on "
          f"{machine.name}" + (f" ({', '.join(args.set)})" if args.set else ""))
    print(f"{'m x n x k layout batch':<32}{'ops':>4}{'in step ms':>11}{'TF/s':>7}{'alone':>7}{'twin':>7}  kernel")
    for r in rows:
        shape = f"{r['m']}x{r['n']}x{r['k']} {r['layout']}" + (f" b{r['batch']}" if r["batch"] > 1 else "")
        alone = f"{r['isolated_tflop_per_s']:7.0f}" if r["isolated_tflop_per_s"] else f"{'-':>7}"
        flag = "" if r["aligned"] else "  (a dimension not a multiple of 8)"
        print(f"{shape:<32}{r['ops']:>4}{r['measured_s'] * 1e3:11.2f}{r['in_step_tflop_per_s']:7.0f}{alone}"
              f"{r['twin_tflop_per_s']:7.0f}  {r['kernel'][:40]}{flag}")
    for label, t in totals.items():
        err = f"{100 * t['error']:+.1f}%" if t["error"] is not None else "-"
        print(f"per step, {label}: measured {t['measured_s'] * 1e3:.1f} ms, twin {t['twin_s'] * 1e3:.1f} ms ({err})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
