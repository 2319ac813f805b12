"""A pair's small all-reduce, alone and while the other ranks compute: the turn-taking case, measured (issue 13).

    .venv/bin/python benchmarks/pair_under_compute.py [--nproc 4] [--out out/pair_under_compute] [--json]

On a host whose ranks share its cores the simulator slows a transfer by
`node.comm_stretch_under_compute` whenever computing ranks hold every core
(twin.sim.compute_unit.NodeCores), a factor `twin calibrate` measures with
every rank computing and every rank in the collective. The 4-rank plans the
twin predicts too slow are the ones whose groups take turns: about one other
rank computes beside each GEMM (benchmarks/rank_drift.py), so a group's
collectives run while the other group computes (docs/fit.md, "Blocking
plans too fast, overlapped ones too slow"). This schedule times that case:
the first half of the ranks, in their pairs of the x axis (0-1, 2-3, ...),
run all-reduces of SIZES back to back, PER_PHASE of them, first while the
other half waits at the next synchronisation (alone) and then while the
other half runs GEMMS of calibrate's OVERLAP_GEMM (under compute), REPEATS
times. Per size: the pair's all-reduce alone and under compute, their ratio
(what the simulator takes to be the stretch on such a host), and the other
half's GEMM span, which the all-reduces under compute must fit inside to
have been timed under it. Nothing is simulated or fitted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.calibrate import DTYPE, OVERLAP_GEMM, TINY_BYTES  # noqa: E402
from local_microbenchmark import Halves, parse_args, run_microbenchmark  # noqa: E402
from twin.ir import Collective, Elementwise, Gemm, Schedule  # noqa: E402

SIZES = [4 << 10, 256 << 10]
PER_PHASE = 4  # all-reduces of the pair per phase, back to back
GEMMS = 24  # the other half's GEMMs under them
REPEATS = 3


def pair_schedule(nproc: int) -> Schedule:
    """Two programs (module docstring): the first half's all-reduces, the second half's GEMMs; both pass the
    same synchronisations of every rank, so the phases line up. Ops named size.phase.repeat[.index]."""
    halves = Halves(nproc)
    pairs = halves.first
    for nbytes in SIZES:
        for rep in range(REPEATS):
            for phase in ("alone", "under"):
                halves.sync(f"{nbytes}.sync-{phase}.{rep}")
                for i in range(PER_PHASE):
                    op = pairs.collective(f"{nbytes}.{phase}.{rep}.{i}", "x", Collective("all_reduce", "x", nbytes,
                                                                                          DTYPE))
                    pairs.wait(op)
                    pairs.compute(f"{nbytes}.{phase}.{rep}.{i}.done", Elementwise(TINY_BYTES))
                if phase == "under":
                    for g in range(GEMMS):
                        halves.second.compute(f"{nbytes}.gemm{g}.{rep}", Gemm(*OVERLAP_GEMM, "NN", DTYPE))
        halves.sync(f"{nbytes}.sync-end")
    return halves.schedule("pair under compute", f"a pair's all-reduce while {nproc // 2} ranks compute")


def summarize(schedule: Schedule, steps: list[list[tuple[np.ndarray, np.ndarray]]]) -> list[dict]:
    """Per size, the pair's all-reduce alone and under the other half's GEMMs (means over the pair ranks, steps,
    repeats and the PER_PHASE of each phase) and the GEMM span (mean over the computing ranks)."""
    half = schedule.world_size // 2
    ids = [{op.name: op.id for op in program.ops} for program in schedule.programs]
    rows = []
    for nbytes in SIZES:
        times: dict[str, list[float]] = {"alone": [], "under": []}
        span = []
        for rank, rank_steps in enumerate(steps):
            named = ids[0] if rank < half else ids[1]
            for start, end in rank_steps:
                for rep in range(REPEATS):
                    if rank >= half:
                        first, last = named[f"{nbytes}.gemm0.{rep}"], named[f"{nbytes}.gemm{GEMMS - 1}.{rep}"]
                        span.append(end[last] - start[first])
                        continue
                    for phase, seconds in times.items():
                        ops = [named[f"{nbytes}.{phase}.{rep}.{i}"] for i in range(PER_PHASE)]
                        seconds += [end[op] - start[op] for op in ops]
        alone, under = float(np.mean(times["alone"])), float(np.mean(times["under"]))
        rows.append({"nbytes": nbytes, "alone_s": alone, "under_compute_s": under, "ratio": under / alone,
                     "all_under_s": PER_PHASE * under, "gemm_span_s": float(np.mean(span))})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0], "out/pair_under_compute", 4,
                      "half of them in pairs, half computing")
    schedule = pair_schedule(args.nproc)
    rows = summarize(schedule, run_microbenchmark(schedule, args.out, "pair-under-compute"))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    half = args.nproc // 2
    print(f"a pair's all-reduce ({half} ranks in pairs), alone and while the other {half} ranks run GEMMs (means, ms)")
    print(f"{'size':>8}{'alone':>9}{'under compute':>15}{'ratio':>7}{f'{PER_PHASE} of them':>12}{'GEMM span':>11}")
    for r in rows:
        print(f"{r['nbytes'] >> 10:>5} KB{1e3 * r['alone_s']:>9.2f}{1e3 * r['under_compute_s']:>15.2f}"
              f"{r['ratio']:>7.2f}{1e3 * r['all_under_s']:>12.2f}{1e3 * r['gemm_span_s']:>11.2f}")
    print("(the simulator takes the ratio to be node.comm_stretch_under_compute whenever computing ranks hold every "
          "core; the all-reduces were timed under compute where the 'of them' column is below the GEMM span)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
