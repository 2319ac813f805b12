"""From the ranks' measurement files to the simulator's formats: timelines, trace, summary.

Torch-free, so a measured run can be read back and compared anywhere.

Time base. Every rank records, per measured step, the host clock at its
step start (after a barrier) and its ops' times after it. When all ranks ran
on one host the clock is shared (CLOCK_MONOTONIC), so a step starts at the
earliest rank's t0 and every rank's ops are placed on that common axis;
across hosts each rank keeps its own t0 (skew = the barrier's exit spread).
A step's time is the last op end of any rank on that axis, the simulator's
definition with every rank starting together.

Of the measured steps the one with the median step time is written as the
trace (the same Chrome trace JSON the simulator writes, twin.trace) and
summarised (the keys of `twin simulate --json`, twin.report); per-op
durations for comparisons are medians over all measured steps.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from twin.errors import TwinError
from twin.ir import Schedule
from twin.sim.engine import RankTimeline


@dataclass(frozen=True)
class Measured:
    schedule: Schedule
    ranks: tuple[dict, ...]  # the rank files, steps removed
    step_times_s: tuple[float, ...]
    median_step: int
    timelines: tuple[RankTimeline, ...]  # the median step, one per rank
    op_median_s: tuple[np.ndarray, ...]  # per rank, per op: median duration over the measured steps
    op_mean_s: tuple[np.ndarray, ...]  # per rank, per op: mean duration over the measured steps
    steps: tuple[tuple[tuple[np.ndarray, np.ndarray], ...], ...]  # per rank, per step: (start, end) on the step's axis

    @property
    def step_time_s(self) -> float:
        return self.step_times_s[self.median_step]

    @property
    def dtype(self) -> str:
        return self.ranks[0]["dtype"]

    def timeline_of(self, rank: int) -> RankTimeline:
        return self.timelines[rank]


def read_rank_files(out_dir: str, world: int) -> list[dict]:
    ranks = []
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.json")
        try:
            with open(path) as f:
                ranks.append(json.load(f))
        except (OSError, json.JSONDecodeError) as e:
            raise TwinError(f"measurement file {path} is missing or unreadable ({e}); run `twin run` again") from None
    return ranks


def load_measured(out_dir: str, schedule: Schedule) -> Measured:
    ranks = read_rank_files(out_dir, schedule.world_size)
    n_steps = min(len(r["steps"]) for r in ranks)
    if n_steps == 0:
        raise TwinError(f"{out_dir}: the run measured no step; use --steps 1 or more")
    one_host = len({r["host"] for r in ranks}) == 1
    per_step: list[list[tuple[np.ndarray, np.ndarray]]] = []
    step_times = []
    for s in range(n_steps):
        t0s = [r["steps"][s]["t0"] for r in ranks]
        base = min(t0s)
        rows = []
        for r, t0 in zip(ranks, t0s):
            offset = (t0 - base) if one_host else 0.0
            rows.append((np.asarray(r["steps"][s]["start"]) + offset, np.asarray(r["steps"][s]["end"]) + offset))
        per_step.append(rows)
        step_times.append(max(float(end.max()) if len(end) else 0.0 for _, end in rows))
    order = sorted(range(n_steps), key=lambda s: step_times[s])
    median = order[(n_steps - 1) // 2]
    timelines = tuple(
        RankTimeline(r["rank"], r["program"], *per_step[median][i]) for i, r in enumerate(ranks)
    )
    durations = [np.stack([per_step[s][i][1] - per_step[s][i][0] for s in range(n_steps)]) for i in range(len(ranks))]
    op_median = tuple(np.median(d, axis=0) for d in durations)
    op_mean = tuple(np.mean(d, axis=0) for d in durations)
    meta = tuple({k: v for k, v in r.items() if k != "steps"} for r in ranks)
    by_rank = tuple(tuple(per_step[s][i] for s in range(n_steps)) for i in range(len(ranks)))
    return Measured(schedule, meta, tuple(step_times), median, timelines, op_median, op_mean, by_rank)


def finish_run(out_dir: str, schedule: Schedule, schedule_path: str, machine: str | None) -> dict:
    """Write OUT/trace.json, OUT/summary.json and OUT/run.json; return the summary dict."""
    from twin.report import summarize_timelines
    from twin.trace import write_trace

    m = load_measured(out_dir, schedule)
    device, machine_name = None, f"measured@{m.ranks[0]['host']}"
    if machine:
        from topologies.machine import load_machine

        try:
            device = load_machine(machine).device
        except TwinError:
            device = None
    wall = sum(m.step_times_s)
    summary = summarize_timelines(schedule, list(m.timelines), m.step_time_s, machine_name, device, wall).to_json_dict()
    meta = {
        "schedule": os.path.abspath(schedule_path), "machine_for_peaks": machine if device is not None else None,
        "step_times_s": list(m.step_times_s), "median_step": m.median_step,
        "dtype": m.dtype, "dtype_note": m.ranks[0]["dtype_note"], "device": m.ranks[0]["device"],
        "device_name": m.ranks[0]["device_name"], "backend": m.ranks[0]["backend"],
        "hosts": sorted({r["host"] for r in m.ranks}), "torch": m.ranks[0]["torch"],
        "threads_per_rank": m.ranks[0]["threads"], "compile_s": max(r["compile_s"] for r in m.ranks),
    }
    programs = [schedule.programs[t.program] for t in m.timelines]
    write_trace(os.path.join(out_dir, "trace.json"), programs, list(m.timelines),
                {**summary, "measured": True, "dtype": m.dtype, "device": meta["device"]})
    for name, data in (("summary.json", summary), ("run.json", meta)):
        with open(os.path.join(out_dir, name), "w") as f:
            json.dump(data, f, indent=2)
    return summary
