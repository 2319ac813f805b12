"""How far an overlapped all-reduce gets while every rank computes, and two at once, by size (issue 13).

    .venv/bin/python benchmarks/overlap_sizes.py [--nproc 4] [--out out/overlap_sizes] [--json]

`twin calibrate` measures one overlapped collective, a 64 MB all-reduce of
every rank under GEMMs, and writes its time over its time alone as
`node.comm_stretch_under_compute`, by which the simulator slows a transfer's
latency and phases while computing ranks hold every core. Steps overlap
256 KB-1 MB collectives, and at 4 ranks on this project's 2-core host their
overlap saved -2% to +2% where the twin credits 7-20% (docs/fit.md, "Overlap
buys nothing"). This schedule (one program, every rank the same, executed
once like a calibration) times an all-reduce of every rank of SIZES, three
times each: alone, and issued before GEMMs that every rank runs (four
256x512x512 for the small sizes, sixteen of calibrate's OVERLAP_GEMM for
64 MB) and waited for after them. Per size: its time alone, its time under
the GEMMs, the GEMMs' span, and when the all-reduce ended relative to the
last GEMM's end: positive when it was still running after the compute,
which a transfer that made progress during the compute would not be.

A second table: two all-reduces of every rank on two groups of pairs
(x: 0-1, 2-3, ...; z: rank i with i + nproc / 2) of PAIR_SIZES, one after
the other and both issued at once, waited for together: whether a rank's
collectives on two streams (a plan's tensor-parallel x and z groups) go
faster at once, as the simulator once assumed (a rank in two transfers
counted once), or share the rank's progress (what it assumes now).
Nothing is simulated or fitted; the host's other load is reported as in
every executor run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.calibrate import DTYPE, OVERLAP_GEMM, TINY_BYTES  # noqa: E402
from executor.microbenchmark_ops import synchronise  # noqa: E402
from local_microbenchmark import parse_args, run_microbenchmark  # noqa: E402
from twin.builders.program import ProgramWriter  # noqa: E402
from twin.ir import Collective, Elementwise, Gemm, GroupAxis, Program, Schedule, StepInfo  # noqa: E402

SIZES = [256 << 10, 1 << 20, 4 << 20, 64 << 20]
PAIR_SIZES = [4 << 10, 256 << 10, 1 << 20]
SMALL_GEMM = (256, 512, 512)
REPEATS = 3


def gemms_under(nbytes: int) -> tuple[int, tuple[int, int, int]]:
    """(how many, which shape) of GEMMs run while an all-reduce of `nbytes` is in flight."""
    return (16, OVERLAP_GEMM) if nbytes >= 64 << 20 else (4, SMALL_GEMM)


def overlap_schedule(nproc: int) -> Schedule:
    """The microbenchmark schedule (module docstring); its ops are named size.kind.repeat."""
    axis = f"g{nproc}"
    w = ProgramWriter()

    for nbytes in SIZES:
        count, shape = gemms_under(nbytes)
        for rep in range(REPEATS):
            synchronise(w, f"{nbytes}.sync-alone.{rep}", axis)
            alone = w.collective(f"{nbytes}.alone.{rep}", axis, Collective("all_reduce", axis, nbytes, DTYPE))
            w.wait(alone)
            w.compute(f"{nbytes}.alone.{rep}.done", Elementwise(TINY_BYTES))
            synchronise(w, f"{nbytes}.sync-during.{rep}", axis)
            during = w.collective(f"{nbytes}.during.{rep}", axis, Collective("all_reduce", axis, nbytes, DTYPE))
            for g in range(count):
                w.compute(f"{nbytes}.gemm{g}.{rep}", Gemm(*shape, "NN", DTYPE))
            w.wait(during)
            w.compute(f"{nbytes}.during.{rep}.done", Elementwise(TINY_BYTES))
    for nbytes in PAIR_SIZES:
        for rep in range(REPEATS):
            synchronise(w, f"{nbytes}.sync-apart.{rep}", axis)
            for group in ("x", "z"):
                work = Collective("all_reduce", group, nbytes, DTYPE)
                w.wait(w.collective(f"{nbytes}.apart-{group}.{rep}", group, work))
                w.compute(f"{nbytes}.apart-{group}.{rep}.done", Elementwise(TINY_BYTES))
            synchronise(w, f"{nbytes}.sync-together.{rep}", axis)
            w.wait(*(w.collective(f"{nbytes}.together-{g}.{rep}", g, Collective("all_reduce", g, nbytes, DTYPE))
                     for g in ("x", "z")))
            w.compute(f"{nbytes}.together.{rep}.done", Elementwise(TINY_BYTES))
    info = StepInfo(model="overlap sizes", plan=None, label=f"overlapped all-reduces on {nproc} ranks", global_batch=1,
                    seq=1, flops_hardware=0.0, flops_model=0.0, memory_per_gpu_bytes=0.0)
    half = nproc // 2
    pairs = {"x": tuple((i, i + 1) for i in range(0, nproc, 2)), "z": tuple((i, i + half) for i in range(half))}
    return Schedule(nproc, (GroupAxis(axis, (tuple(range(nproc)),)), *(GroupAxis(g, p) for g, p in pairs.items())),
                    (Program(tuple(range(nproc)), tuple(w.ops)),), info)


def summarize(schedule: Schedule, steps: list[list[tuple[np.ndarray, np.ndarray]]]) -> list[dict]:
    """Per size, means over repeats, steps and ranks (`steps[r][s]`: rank r's (start, end) arrays of step s)."""
    ids = {op.name: op.id for op in schedule.programs[0].ops}
    rows = []
    for nbytes in SIZES:
        count = gemms_under(nbytes)[0]
        alone, during, span, after = [], [], [], []
        for rank_steps in steps:
            for start, end in rank_steps:
                for rep in range(REPEATS):
                    a, d = ids[f"{nbytes}.alone.{rep}"], ids[f"{nbytes}.during.{rep}"]
                    first, last = ids[f"{nbytes}.gemm0.{rep}"], ids[f"{nbytes}.gemm{count - 1}.{rep}"]
                    alone.append(end[a] - start[a])
                    during.append(end[d] - start[d])
                    span.append(end[last] - start[first])
                    after.append(end[d] - end[last])
        rows.append({"nbytes": nbytes, "alone_s": float(np.mean(alone)), "during_s": float(np.mean(during)),
                     "gemm_span_s": float(np.mean(span)), "ends_after_last_gemm_s": float(np.mean(after))})
    return rows


def summarize_pairs(schedule: Schedule, steps: list[list[tuple[np.ndarray, np.ndarray]]]) -> list[dict]:
    """Per PAIR_SIZES size, the two all-reduces' time from the first's start to the later end, one after the
    other and at once (means over repeats, steps and ranks)."""
    ids = {op.name: op.id for op in schedule.programs[0].ops}
    rows = []
    for nbytes in PAIR_SIZES:
        apart, together = [], []
        for rank_steps in steps:
            for start, end in rank_steps:
                for rep in range(REPEATS):
                    x, z = (ids[f"{nbytes}.apart-{g}.{rep}"] for g in ("x", "z"))
                    apart.append(end[z] - start[x])
                    x, z = (ids[f"{nbytes}.together-{g}.{rep}"] for g in ("x", "z"))
                    together.append(max(end[x], end[z]) - min(start[x], start[z]))
        rows.append({"nbytes": nbytes, "one_after_the_other_s": float(np.mean(apart)),
                     "at_once_s": float(np.mean(together))})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0], "out/overlap_sizes", 2, "the second table pairs them")
    schedule = overlap_schedule(args.nproc)
    steps = run_microbenchmark(schedule, args.out, "overlap-sizes")
    rows, pairs = summarize(schedule, steps), summarize_pairs(schedule, steps)
    if args.json:
        print(json.dumps({"under_gemms": rows, "two_groups": pairs}, indent=1))
        return 0
    print(f"an all-reduce of every rank of {args.nproc}, alone and under every rank's GEMMs (means, ms)")
    print(f"{'size':>8}{'alone':>9}{'under GEMMs':>13}{'ratio':>7}{'GEMM span':>11}{'ends after the last GEMM':>26}")
    for r in rows:
        print(f"{r['nbytes'] >> 10:>5} KB{1e3 * r['alone_s']:>9.2f}{1e3 * r['during_s']:>13.2f}"
              f"{r['during_s'] / r['alone_s']:>7.2f}{1e3 * r['gemm_span_s']:>11.2f}{1e3 * r['ends_after_last_gemm_s']:>+26.2f}")
    print("\ntwo all-reduces of every rank on two groups of pairs (x, z; means, ms)")
    print(f"{'size':>8}{'one after the other':>21}{'at once':>10}{'ratio':>7}")
    for r in pairs:
        print(f"{r['nbytes'] >> 10:>5} KB{1e3 * r['one_after_the_other_s']:>21.2f}{1e3 * r['at_once_s']:>10.2f}"
              f"{r['at_once_s'] / r['one_after_the_other_s']:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
