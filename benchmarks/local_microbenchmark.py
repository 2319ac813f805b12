"""What the hand-written microbenchmark schedules of this host share (overlap_sizes.py, pair_under_compute.py,
compute_beside_comm.py).

Each is one schedule of the IR, run once on this host's ranks by the executor
(torchrun, gloo), its measured steps read back on the ranks' common clock.
"""

from __future__ import annotations

import argparse
import os

from executor.microbenchmark_ops import synchronise
from twin.builders.program import ProgramWriter
from twin.ir import GroupAxis, Program, Schedule, StepInfo


def parse_args(argv: list[str] | None, description: str, default_out: str, multiple: int,
               why: str) -> argparse.Namespace:
    """--nproc (a multiple of `multiple`, `why` says why), --out and --json; a bad --nproc exits 2 with one line."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--nproc", type=int, default=4, help=f"ranks on this host (default 4; a multiple of {multiple})")
    ap.add_argument("--out", default=default_out, help=f"the ranks' files (default {default_out})")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    if not multiple <= args.nproc <= 64 or args.nproc % multiple:
        ap.error(f"--nproc {args.nproc}: give {multiple}..64 ranks, a multiple of {multiple} ({why})")
    return args


def run_microbenchmark(schedule: Schedule, out_dir: str, name: str, steps: int = 3, warmup: int = 1,
                       wall_limit_s: float = 900.0) -> list[list[tuple]]:
    """The schedule saved to OUT/NAME.json, run once on this host with torchrun, and its measured steps read back:
    per rank, per step, (op start times, op end times) on the ranks' common clock (executor.measured)."""
    from executor.launch import WorkerOptions, run_local
    from executor.measured import load_measured
    from twin.ir_io import save_schedule

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    save_schedule(schedule, path)
    run_local(schedule, path, schedule.world_size, out_dir, WorkerOptions(steps=steps, warmup=warmup), wall_limit_s)
    return list(load_measured(out_dir, schedule).steps)


class Halves:
    """Two programs on the two halves of `nproc` ranks (`first`, `second`: their writers) that pass the same
    synchronisations of every rank (`sync`), so their phases line up; the first half's ranks pair up on the x
    axis (0-1, 2-3, ...)."""

    def __init__(self, nproc: int) -> None:
        self.nproc, self.axis = nproc, f"g{nproc}"
        self.first, self.second = ProgramWriter(), ProgramWriter()

    def sync(self, name: str) -> None:
        """Every rank waits for a 4-byte all-reduce of all of them, then a tiny op makes its host wait too."""
        for w in (self.first, self.second):
            synchronise(w, name, self.axis)

    def schedule(self, model: str, label: str) -> Schedule:
        n, half = self.nproc, self.nproc // 2
        info = StepInfo(model=model, plan=None, label=label, global_batch=1, seq=1, flops_hardware=0.0,
                        flops_model=0.0, memory_per_gpu_bytes=0.0)
        groups = (GroupAxis(self.axis, (tuple(range(n)),)), GroupAxis("x", tuple((i, i + 1) for i in range(0, n, 2))))
        return Schedule(n, groups, (Program(tuple(range(half)), tuple(self.first.ops)),
                                    Program(tuple(range(half, n)), tuple(self.second.ops))), info)
