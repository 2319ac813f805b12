"""GEMM efficiency at the shapes of the validated runs: the twin's shape model beside a GPU's measurement.

    .venv/bin/python benchmarks/gemm_shapes.py --dry-run [--out shapes.json]   # shapes, twin's efficiencies
    python3 benchmarks/gemm_shapes.py --shapes shapes.json --machine alps      # on a GPU: time every shape
    .venv/bin/python benchmarks/gemm_shapes.py --report results.json [--toml F]  # a timed run's tables again

`--runs CSV --assume ...` (repeatable) adds the GEMMs of a measured-runs file
(twin fit's, e.g. the A100 runs in benchmarks/data), one group per hidden size.
A shape is (m, n, k, layout, batch): a batched GEMM (unfused attention's
score and context products) is timed as one batched launch.

The second form reads the shapes a dry run wrote and needs only torch,
numpy and networkx (no simulator, no simpy): that is how it runs on a lent
GPU machine, which has no simpy. Without --shapes it finds them itself.

The twin runs a GEMM at the measured square-GEMM peak times a shape
efficiency (tile and wave quantisation, the k loop: twin/sim/compute.py)
and a layout efficiency; the estimates behind the shape model are what the
accuracy investigation (docs/accuracy.md, docs/accuracy-investigation.md) suspects. This collects every distinct GEMM
(m, n, k, layout) of the runs `twin validate` predicts with a plan (AxoNN
Table III at the plans the search chose; the Frontier paper's script plans),
weighted by the FLOPs each run spends in it, and:

- always: the twin's efficiency of each shape relative to its 32768^3
  reference, from --machine's device (for a GPU other than the machine's,
  pick the machine with the same chip: alps for H100/H200);
- with a GPU (torch with CUDA): times each shape in bf16, in its layout,
  and the 32768^3 square GEMM, and prints the measured efficiency relative to
  that square beside the twin's, per shape and flop-weighted per run ("GEMM
  time measured / twin" > 1 means the shape model is optimistic there).

Results go to --out (default $OUT/gemm-shapes.json when $OUT is set). With
--toml FILE the measured rates (the square included) are also written as
``[[device.gemm_measured]]`` entries, each with its source (this script, the
GPU, torch, the date): pasted into the machine file of the same chip, they
replace the shape model's estimates at those shapes (twin/sim/compute.py).
A CPU run (--device cpu, float32) only checks the script: CPU GEMMs say
nothing about a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.ir import Gemm  # noqa: E402
from twin.sim.compute import REFERENCE_GEMM_DIM, ComputeModel  # noqa: E402

Shape = tuple[int, int, int, str, int]  # m, n, k, layout, batch (a batched GEMM is one launch over `batch` products)


def validated_runs(quick: bool) -> list[dict]:
    """(label, machine, model, gpus, plan, batch) of the runs twin validate predicts with a plan."""
    from twin.presets import PRESETS
    from twin.published import AXONN_BATCH_SEQUENCES, AXONN_TABLE_III
    from twin.validate_tasks import axonn_plan

    runs = []
    for name in ("frontier-22b", "frontier-175b") + (() if quick else ("frontier-1t",)):
        p = PRESETS[name]
        runs.append(dict(label=name, machine=p.machine, model=p.model, gpus=p.gpus, plan=p.plan, batch=p.global_batch))
    for pub in ([] if quick else AXONN_TABLE_III):
        b = axonn_plan(pub.machine, pub.model, pub.gpus, AXONN_BATCH_SEQUENCES)
        runs.append(dict(label=f"{pub.machine} {pub.gpus} {pub.model}", machine=pub.machine, model=pub.model,
                         gpus=pub.gpus, plan=b["plan"], batch=AXONN_BATCH_SEQUENCES))
    return runs


def gemm_flops(run: dict) -> dict[Shape, float]:
    """FLOPs of one micro-batch per GEMM shape, over every program of the run (pipeline stages included)."""
    from twin.model import get_model
    from twin.plan import parse_plan

    plan = parse_plan(f"{run['plan']},global_batch={run['batch']}")
    return step_gemm_flops(get_model(run["model"]), plan, run["machine"], run["gpus"])


def step_gemm_flops(model, plan, machine_name: str, gpus: int, measured: bool = False) -> dict[Shape, float]:
    """FLOPs of one micro-batch of (model, plan) per GEMM shape, over every program of the schedule (pipeline
    stages included)."""
    from twin.build import build_step, resolve_step
    from twin.micro_batches import shortened

    machine = load_machine(machine_name)
    resolved, _ = resolve_step(model, plan, machine, gpus, measured)
    schedule = build_step(model, shortened(resolved, 1), machine, gpus, measured).schedule
    flops: dict[Shape, float] = defaultdict(float)
    for program in schedule.programs:
        for op in program.ops:
            if isinstance(op.work, Gemm):
                g = op.work
                flops[(g.m, g.n, g.k, g.layout, g.batch)] += g.flops
    return dict(flops)


def measured_run_groups(path: str, assume: str, machine_name: str) -> dict[str, dict[Shape, float]]:
    """The GEMM FLOPs of every run of a measured-runs CSV (twin.runs), a whole step each, summed per group: the
    file's stem, the model's hidden size and the row's label where the file has one. Runs that differ only in
    the global batch are built once (one micro-batch, scaled by the step's micro-batches)."""
    from twin.runs import load_runs

    groups: dict[str, dict[Shape, float]] = defaultdict(lambda: defaultdict(float))
    built: dict[tuple, dict[Shape, float]] = {}
    for run in load_runs(path, assume):
        plan = run.plan
        key = (run.model, replace(plan, global_batch=0), run.gpus)
        if key not in built:
            built[key] = step_gemm_flops(run.model, plan, machine_name, run.gpus, measured=True)
        micro_batches = plan.global_batch // (plan.mbs * plan.batch_split)
        label = " ".join(filter(None, (Path(path).stem, f"h={run.model.hidden}", run.label)))
        for shape, fl in built[key].items():
            groups[label][shape] += fl * micro_batches
    return {label: dict(f) for label, f in groups.items()}


def by_weight(per_run: dict[str, dict[Shape, float]], shapes: list[Shape]) -> list[Shape]:
    """The shapes, the largest share of any one run's GEMM FLOPs first: what a time limit leaves untimed matters
    least to every run."""
    share: dict[Shape, float] = defaultdict(float)
    for flops in per_run.values():
        total = sum(flops.values())
        for s, f in flops.items():
            share[s] = max(share[s], f / total)
    return sorted(shapes, key=lambda s: -share[s])


def _shape(row: list) -> Shape:
    """A shape as the JSON stores it: m, n, k, layout and batch (files before batched shapes have no batch)."""
    m, n, k, layout, *batch = row
    return int(m), int(n), int(k), str(layout), int(batch[0]) if batch else 1


def twin_efficiency(model: ComputeModel, shape: Shape, reference_dim: int = REFERENCE_GEMM_DIM) -> float:
    """The twin's rate for the shape (its FLOPs over the whole time the twin gives it: the HBM floor and the
    per-kernel overhead included) relative to its rate on the square GEMM of `reference_dim` (layout
    included, tuning off), to compare with a measured rate relative to the measured square."""
    m, n, k, layout, batch = shape
    d = reference_dim
    gemm, square = Gemm(m, n, k, layout, batch=batch, tunable=False), Gemm(d, d, d, "NN", tunable=False)
    return (gemm.flops / model.gemm_time_s(gemm)) / (square.flops / model.gemm_time_s(square))


def measure_gemm_s(shape: Shape, device: str, dtype, budget_s: float = 0.2, max_reps: int = 7,
                   min_batch_s: float = 0.002) -> float:
    """Median time per GEMM of `shape` in its layout (NT: A[m,k] @ B[n,k]^T, TN: A[k,m]^T @ B[k,n]); a batched
    shape is one batched matmul over its `batch` products, as cuBLAS runs them."""
    import torch

    m, n, k, layout, batch = shape
    lead = (batch,) if batch > 1 else ()
    a = torch.randn(lead + ((k, m) if layout[0] == "T" else (m, k)), device=device, dtype=dtype)
    b = torch.randn(lead + ((n, k) if layout[1] == "T" else (k, n)), device=device, dtype=dtype)
    a_op = a.transpose(-1, -2) if layout[0] == "T" else a
    b_op = b.transpose(-1, -2) if layout[1] == "T" else b
    out = torch.empty(lead + (m, n), device=device, dtype=dtype)
    gpu = device == "cuda"
    sleep = getattr(torch.cuda, "_sleep", None) if gpu else None

    def batch_s(count: int) -> float:
        """Seconds per GEMM over `count` launched back to back: in training the host runs ahead and small GEMMs
        queue on the stream, so one synchronisation per GEMM would time the host's round trip, not the kernel.
        On a GPU the stream is first held busy (a spin kernel, ~20 us per GEMM to queue) while the host queues
        them, and CUDA events time the GEMMs alone."""
        if not gpu:
            t0 = time.perf_counter()
            for _ in range(count):
                torch.matmul(a_op, b_op, out=out)
            return (time.perf_counter() - t0) / count
        torch.cuda.synchronize()
        if sleep is not None:
            sleep(40_000 * count)  # clock cycles: ~20 us at 2 GHz per GEMM to queue
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(count):
            torch.matmul(a_op, b_op, out=out)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / count

    batch_s(1)  # warm-up: kernel selection, allocation
    first = batch_s(1)
    count = max(1, min(200, int(min_batch_s / max(first, 1e-7))))
    reps = max(3, min(max_reps, int(budget_s / max(first * count, 1e-7))))
    return statistics.median(batch_s(count) for _ in range(reps))


def toml_block(rates: dict[Shape, float], source: str) -> str:
    """``[[device.gemm_measured]]`` entries for measured rates (flop/s), largest FLOP count first; a batched
    GEMM's entry says its batch."""
    lines = [f"# {len(rates)} GEMMs timed by {source}.",
             "# Paste under [device] of the machine file whose device this is (twin/sim/compute.py uses them)."]
    for (m, n, k, layout, batch), rate in sorted(rates.items(), key=lambda item: -item[0][0] * item[0][1] * item[0][2]
                                                 * item[0][4]):
        lines += ["", "[[device.gemm_measured]]", f"m = {m}", f"n = {n}", f"k = {k}"] + (
            [f"batch = {batch}"] if batch > 1 else []) + [
            f'layout = "{layout.lower()}"', f'tflop_per_s = {{ value = {rate / 1e12:.4g}, source = "{source}" }}',
            f'source = "{source}"']
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--machine", default="alps", help="machine file whose device the twin's efficiencies use")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="replace one number of --machine's file (repeatable), e.g. device.gemm_k_half=256")
    ap.add_argument("--quick", action="store_true", help="the Frontier paper's 22B and 175B runs only")
    ap.add_argument("--runs", action="append", default=[], metavar="CSV",
                    help="also the GEMMs of a measured-runs file (twin fit's CSV), grouped by hidden size; repeatable")
    ap.add_argument("--assume", default="", help="what --runs files do not say (as twin fit --assume)")
    ap.add_argument("--runs-machine", default="dgx-a100-800g", help="machine whose memory checks --runs rows pass")
    ap.add_argument("--dry-run", action="store_true", help="list shapes and the twin's efficiencies; time nothing")
    ap.add_argument("--shapes", help="the JSON (--out) of an earlier run: its runs' shapes, instead of building them")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--reference-dim", type=int, default=REFERENCE_GEMM_DIM,
                    help=f"square GEMM the measured efficiencies are relative to (default {REFERENCE_GEMM_DIM})")
    ap.add_argument("--max-dim", type=int, default=0, help="skip shapes with a dimension above this (CPU smoke runs)")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="stop timing new shapes after this many seconds (the heaviest are timed first); 0: none")
    ap.add_argument("--out", help="JSON results (default $OUT/gemm-shapes.json when $OUT is set)")
    ap.add_argument("--toml", help="also write the measured rates as [[device.gemm_measured]] machine-file entries here")
    ap.add_argument("--report", metavar="RESULTS",
                    help="an earlier timed run's --out: its rates beside --machine's model as it is now (with --toml, "
                         "its machine-file block); time nothing")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args()
    if args.toml and args.dry_run:
        ap.error("--toml needs measurements; drop --dry-run")
    try:
        compute = ComputeModel(load_machine(args.machine, tuple(parse_override(t) for t in args.set)).device)
    except TwinError as e:
        ap.error(str(e))
    t0 = time.perf_counter()
    rates: dict[Shape, float] = {}  # flop/s
    device = source = None
    if args.report:  # an earlier timed run's rates, set beside --machine's model as it is now
        try:
            with open(args.report) as f:
                saved = json.load(f)
            per_run = {label: {_shape(row[:-1]): row[-1] for row in rows} for label, rows in saved["per_run"].items()}
            rates = {_shape([r["m"], r["n"], r["k"], r["layout"], r.get("batch", 1)]): r["measured_tflop_per_s"] * 1e12
                     for r in saved["shapes"] if r.get("measured_tflop_per_s")}
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--report: cannot read {args.report} as this script's --out ({e.__class__.__name__}: {e})")
        if not rates:
            ap.error(f"--report: {args.report} has no measured rates (a --dry-run's output); give a timed run's --out")
        args.reference_dim, device, source = saved["reference_dim"], saved["device"], saved["source"]
        rates[(args.reference_dim,) * 3 + ("NN", 1)] = saved["reference_tflop_per_s"] * 1e12
    elif args.shapes:
        with open(args.shapes) as f:
            saved_runs = json.load(f)["per_run"]
        per_run = {label: {_shape(row[:-1]): row[-1] for row in rows} for label, rows in saved_runs.items()}
    else:
        per_run = {r["label"]: gemm_flops(r) for r in validated_runs(args.quick)}
        for path in args.runs:
            per_run.update(measured_run_groups(path, args.assume, args.runs_machine))
    shapes = sorted({s for f in per_run.values() for s in f if not args.max_dim or max(s[:3]) <= args.max_dim})

    ref = (args.reference_dim,) * 3 + ("NN", 1)
    if not args.dry_run and not args.report:
        import torch

        device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
        source = (f"benchmarks/gemm_shapes.py on {name}, torch {torch.__version__}, {str(dtype).split('.')[-1]}, "
                  f"median time, {datetime.date.today().isoformat()}")
        rates[ref] = 2 * args.reference_dim ** 3 / measure_gemm_s(ref, device, dtype)
        for i, s in enumerate(by_weight(per_run, shapes)):
            if args.time_limit and time.perf_counter() - t0 > args.time_limit:
                print(f"  --time-limit {args.time_limit:g} s: {i} of {len(shapes)} shapes timed, the heaviest first",
                      file=sys.stderr)
                break
            if i % 100 == 0 or i + 1 == len(shapes):
                print(f"  [{i + 1}/{len(shapes)}] {s} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            rates[s] = 2 * s[0] * s[1] * s[2] * s[4] / measure_gemm_s(s, device, dtype)
    measured = {s: rates[s] / rates[ref] for s in shapes if s in rates}  # relative to the measured square

    rows = []
    for label, flops in per_run.items():  # measured or not, a run is compared over the shapes that were timed
        kept = {s: f for s, f in flops.items() if s in (measured or shapes)}
        total = sum(kept.values())
        twin_time = sum(f / twin_efficiency(compute, s, args.reference_dim) for s, f in kept.items())
        row = dict(run=label, shapes=len(kept), twin_efficiency=total / twin_time if twin_time else 0.0)
        if measured and kept:
            measured_time = sum(f / measured[s] for s, f in kept.items())
            row.update(measured_efficiency=total / measured_time, time_ratio=measured_time / twin_time)
        elif measured:
            row.update(measured_efficiency=float("nan"), time_ratio=float("nan"))
        rows.append(row)
    shape_rows = [dict(m=s[0], n=s[1], k=s[2], layout=s[3], batch=s[4], measured_efficiency=measured.get(s),
                       measured_tflop_per_s=rates[s] / 1e12 if s in rates else None,
                       twin_efficiency=twin_efficiency(compute, s, args.reference_dim)) for s in shapes]
    doc = dict(machine=args.machine, device=device, source=source, reference_dim=args.reference_dim,
               reference_tflop_per_s=rates[ref] / 1e12 if rates else None, wall_s=time.perf_counter() - t0,
               shapes=shape_rows, runs=rows,
               per_run={label: [[*s, f] for s, f in sorted(flops.items())] for label, flops in per_run.items()})
    out = args.out or (os.path.join(os.environ["OUT"], "gemm-shapes.json")
                       if os.environ.get("OUT") and not args.report else None)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=2)
    if args.toml:
        os.makedirs(os.path.dirname(os.path.abspath(args.toml)), exist_ok=True)
        with open(args.toml, "w") as f:
            f.write(toml_block(rates, source))
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print_tables(doc)
    for path in filter(None, (out, args.toml)):
        print(f"written to {path}")
    return 0


SIZE_BUCKETS = (0.0, 1e9, 1e10, 1e11, 1e12, float("inf"))  # FLOPs of one GEMM launch


def print_tables(doc: dict) -> None:
    """Per run: the twin's and the measured efficiency of its GEMMs; with measurements, per GEMM size as well:
    where the shape model is off."""
    shapes, rows = doc["shapes"], doc["runs"]
    measured = any(s.get("measured_efficiency") for s in shapes)
    print(f"{len(shapes)} GEMM shapes of {len(rows)} runs; twin's efficiencies from {doc['machine']}'s device, "
          f"relative to the {doc['reference_dim']}^3 GEMM" + (f"; measured on {doc['device']}" if measured else ""))
    measured_head = f"{'measured':>10}{'time meas./twin':>17}" if measured else ""
    print(f"{'run':<44}{'shapes':>7}{'twin eff.':>11}" + measured_head)
    for r in rows:
        line = f"{r['run']:<44}{r['shapes']:>7}{r['twin_efficiency']:>11.3f}"
        if measured:
            line += f"{r['measured_efficiency']:>10.3f}{r['time_ratio']:>17.3f}"
        print(line)
    if not measured:
        return
    print(f"\nby the FLOPs of one launch (reference {doc['reference_tflop_per_s']:.0f} TF/s): measured efficiency over "
          "the twin's, median and range")
    print(f"{'GFLOP':<16}{'shapes':>7}{'median':>8}{'min':>7}{'max':>7}{'measured TF/s (median)':>24}")
    for lo, hi in zip(SIZE_BUCKETS, SIZE_BUCKETS[1:]):
        inside = [s for s in shapes if s.get("measured_efficiency")
                  and lo <= 2.0 * s["m"] * s["n"] * s["k"] * s.get("batch", 1) < hi]
        if inside:
            ratio = [s["measured_efficiency"] / s["twin_efficiency"] for s in inside]
            label = f"{lo / 1e9:g}-{hi / 1e9:g}" if hi < float("inf") else f">= {lo / 1e9:g}"
            print(f"{label:<16}{len(inside):>7}{statistics.median(ratio):>8.2f}{min(ratio):>7.2f}{max(ratio):>7.2f}"
                  f"{statistics.median(s['measured_tflop_per_s'] for s in inside):>24.0f}")


if __name__ == "__main__":
    sys.exit(main())
