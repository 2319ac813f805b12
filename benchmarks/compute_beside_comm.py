"""How much of a core a rank in a collective takes from the ranks computing beside it (issue 13).

    .venv/bin/python benchmarks/compute_beside_comm.py [--nproc 4] [--out out/compute_beside_comm] [--json]

On a host whose ranks share its cores the simulator gives a computing rank
its share of the cores among the ranks that compute, as if a rank in a
collective took none (twin.sim.compute_unit.NodeCores). gloo's all-reduces
move their bytes through the kernel's loopback sockets and reduce them on
the CPU, so they do take some. This schedule measures how much: the second
half of the ranks run GEMMs of calibrate's OVERLAP_GEMM, first while the
first half waits at the next synchronisation (idle) and then while the
first half, in its pairs of the x axis, runs all-reduces of one size back
to back (beside), REPEATS times per size. Per size: the mean GEMM idle and
beside (only the GEMMs that lie wholly inside the all-reduces' span), their
ratio, and the share of a core one rank in the all-reduces takes, from the
ratio: with h ranks computing on `cores` cores, each gets min(1, cores / h)
of a core idle and cores / (h + h * share) beside. benchmarks/rank_phases.py
--comm-share takes it. Nothing is simulated or fitted. `twin calibrate` now
measures one size of it (64 KB, executor.calibrate's BESIDE_GEMMS) into
node.comm_core_share, which the simulator uses; this benchmark keeps the
three sizes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.calibrate import DTYPE, OVERLAP_GEMM, TINY_BYTES  # noqa: E402
from executor.calibrate_sharing import core_share  # noqa: E402
from local_microbenchmark import Halves, parse_args, run_microbenchmark  # noqa: E402
from twin.ir import Collective, Elementwise, Gemm, Schedule  # noqa: E402

# all-reduce size -> how many back to back: enough to outlast the GEMMs beside them on this host
SIZES = {4 << 10: 150, 256 << 10: 80, 4 << 20: 16}
GEMMS = 12  # the computing half's GEMMs per phase
REPEATS = 3


def beside_schedule(nproc: int) -> Schedule:
    """Two programs (module docstring): the first half's all-reduces, the second half's GEMMs; both pass the
    same synchronisations of every rank, so the phases line up. Ops named size.phase.repeat.index."""
    halves = Halves(nproc)
    pairs, computers = halves.first, halves.second
    for nbytes, count in SIZES.items():
        for rep in range(REPEATS):
            for phase in ("idle", "beside"):
                halves.sync(f"{nbytes}.sync-{phase}.{rep}")
                for g in range(GEMMS):
                    computers.compute(f"{nbytes}.{phase}.{rep}.gemm{g}", Gemm(*OVERLAP_GEMM, "NN", DTYPE))
                if phase == "beside":
                    for i in range(count):
                        op = pairs.collective(f"{nbytes}.beside.{rep}.ar{i}", "x",
                                              Collective("all_reduce", "x", nbytes, DTYPE))
                        pairs.wait(op)
                        pairs.compute(f"{nbytes}.beside.{rep}.ar{i}.done", Elementwise(TINY_BYTES))
        halves.sync(f"{nbytes}.sync-end")
    half = nproc // 2
    return halves.schedule("compute beside comm", f"{half} ranks' GEMMs beside {half} in all-reduces")


def summarize(schedule: Schedule, steps: list[list[tuple[np.ndarray, np.ndarray]]], cores: float) -> list[dict]:
    """Per size: the computing half's mean GEMM idle and beside the all-reduces (those wholly inside the span from
    the first all-reduce's start to the last one's end, over the pair ranks), over ranks, steps and repeats."""
    half = schedule.world_size // 2
    ids = [{op.name: op.id for op in program.ops} for program in schedule.programs]
    rows = []
    for nbytes, count in SIZES.items():
        idle, beside = [], []
        for step in range(len(steps[0])):
            for rep in range(REPEATS):
                spans = [(steps[r][step][0][ids[0][f"{nbytes}.beside.{rep}.ar0"]],
                          steps[r][step][1][ids[0][f"{nbytes}.beside.{rep}.ar{count - 1}"]]) for r in range(half)]
                window = (max(s for s, _ in spans), min(e for _, e in spans))
                for rank in range(half, schedule.world_size):
                    start, end = steps[rank][step]
                    for g in range(GEMMS):
                        op = ids[1][f"{nbytes}.idle.{rep}.gemm{g}"]
                        idle.append(end[op] - start[op])
                        op = ids[1][f"{nbytes}.beside.{rep}.gemm{g}"]
                        if window[0] <= start[op] and end[op] <= window[1]:
                            beside.append(end[op] - start[op])
        idle_s = float(np.mean(idle))
        beside_s = float(np.mean(beside)) if beside else float("nan")
        ratio = beside_s / idle_s
        rows.append({"nbytes": nbytes, "gemm_idle_s": idle_s, "gemm_beside_s": beside_s, "ratio": ratio,
                     "gemms_beside": len(beside), "core_share": core_share(ratio, half, cores) if beside else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0], "out/compute_beside_comm", 4,
                      "half of them in pairs, half computing")
    schedule = beside_schedule(args.nproc)
    cores = float(os.cpu_count() or 1)
    rows = summarize(schedule, run_microbenchmark(schedule, args.out, "compute-beside-comm"), cores)
    if args.json:
        print(json.dumps({"cores": cores, "rows": rows}, indent=1))
        return 0
    half = args.nproc // 2
    print(f"{half} ranks' GEMMs while the other {half} wait, and while they run all-reduces in pairs ({cores:g} cores)")
    print(f"{'size':>9}{'GEMM idle':>11}{'beside':>9}{'ratio':>7}{'GEMMs':>7}{'core share':>12}")
    for r in rows:
        share = f"{r['core_share']:.2f}" if r["core_share"] is not None else "-"
        print(f"{r['nbytes'] >> 10:>6} KB{1e3 * r['gemm_idle_s']:>9.1f}ms{1e3 * r['gemm_beside_s']:>7.1f}ms"
              f"{r['ratio']:>7.2f}{r['gemms_beside']:>7}{share:>12}")
    print("(core share: of one core, what one rank in the all-reduces takes from the computing ranks; '-' where no "
          "GEMM lay wholly inside the all-reduces' span)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
