"""Simulated versus measured: per op class and per step, with figures. Torch-free.

One rank is compared op by op: the rank the simulator finds critical (it is
always a simulated representative), measured on the same rank. Per op class
(GEMM, attention, element-wise, each collective kind, send/recv) the busy
time of that rank's ops of the class, simulated against measured (measured
per op = mean over the measured steps: what a step pays on average); per step
the simulated step time against the median measured one. Errors are
(simulated - measured) / measured.

Figures: a scatter of simulated against measured time of every op of that
rank, coloured by class (log-log, with the y = x line), and the two
timelines of that rank stacked (simulated above, measured below) on one time
axis.
"""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from twin.ir import Schedule, op_class
from twin.outputs import atomic_path


@dataclass(frozen=True)
class ClassRow:
    op_class: str
    ops: int
    simulated_s: float
    measured_s: float

    @property
    def error(self) -> float:
        return (self.simulated_s - self.measured_s) / self.measured_s if self.measured_s > 0 else float("nan")


@dataclass(frozen=True)
class Comparison:
    schedule: Schedule
    rank: int
    rows: tuple[ClassRow, ...]
    simulated_step_s: float
    measured_step_s: float
    measured_steps_s: tuple[float, ...]
    sim_durations: np.ndarray  # per op of `rank`
    measured_durations: np.ndarray

    @property
    def step_error(self) -> float:
        return (self.simulated_step_s - self.measured_step_s) / self.measured_step_s

    def to_json_dict(self) -> dict:
        return {
            "model": self.schedule.info.model, "plan": self.schedule.info.plan_text, "ranks": self.schedule.world_size,
            "rank_compared": self.rank, "step": {"simulated_s": self.simulated_step_s, "measured_s": self.measured_step_s,
                                                 "error": self.step_error, "measured_steps_s": list(self.measured_steps_s)},
            "by_class": [{"op_class": r.op_class, "ops": r.ops, "simulated_s": r.simulated_s, "measured_s": r.measured_s,
                          "error": r.error} for r in self.rows],
        }


def compare(schedule: Schedule, sim_run, measured) -> Comparison:
    """`sim_run`: a twin.sim.engine.SimRun; `measured`: an executor.measured.Measured of the same schedule."""
    from twin.report import critical_timeline

    sim_tl = critical_timeline(sim_run)
    rank = sim_tl.rank
    program = schedule.programs[sim_tl.program]
    sim_d = np.asarray(sim_tl.end_s - sim_tl.start_s, float)
    meas_d = np.asarray(measured.op_mean_s[rank], float)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for op in program.ops:
        row = totals[op_class(op.work)]
        row[0] += 1
        row[1] += sim_d[op.id]
        row[2] += meas_d[op.id]
    rows = tuple(ClassRow(cls, int(v[0]), float(v[1]), float(v[2])) for cls, v in sorted(totals.items()))
    return Comparison(schedule, rank, rows, float(sim_run.step_time_s), float(measured.step_time_s),
                      tuple(measured.step_times_s), sim_d, meas_d)


def simulate_and_execute(schedule: Schedule, schedule_path: str, machine: str, nproc: int, out_dir: str, opts,
                         wall_limit_s: float = 900.0):
    """Simulate `schedule` on `machine`, execute it on `nproc` local ranks (`opts`: WorkerOptions), compare.

    Returns (Comparison, SimRun, Measured) and writes OUT/compare.json.
    """
    import json

    from executor.launch import run_local
    from executor.measured import load_measured
    from topologies.machine import load_machine
    from twin.sim.engine import simulate

    sim_run = simulate(schedule, load_machine(machine))
    run_local(schedule, schedule_path, nproc, out_dir, opts, wall_limit_s)
    measured = load_measured(out_dir, schedule)
    c = compare(schedule, sim_run, measured)
    with open(os.path.join(out_dir, "compare.json"), "w") as f:
        json.dump(c.to_json_dict(), f, indent=2)
    return c, sim_run, measured


def format_comparison(c: Comparison) -> str:
    lines = [
        f"{c.schedule.info.model}, plan {c.schedule.info.plan_text}, {c.schedule.world_size} ranks: "
        f"simulated vs measured (rank {c.rank}, measured = mean over steps)",
        f"  {'op class':<16}{'ops':>6}{'simulated s':>14}{'measured s':>13}{'error':>9}",
    ]
    for r in sorted(c.rows, key=lambda r: -r.measured_s):
        lines.append(f"  {r.op_class:<16}{r.ops:>6}{r.simulated_s:>14.4f}{r.measured_s:>13.4f}{100 * r.error:>8.1f}%")
    steps = ", ".join(f"{s:.4f}" for s in c.measured_steps_s)
    lines.append(f"  {'step time':<22}{c.simulated_step_s:>14.4f}{c.measured_step_s:>13.4f}{100 * c.step_error:>8.1f}%"
                 f"   (measured steps: {steps}; median)")
    return "\n".join(lines)


def comparison_figures(prefix: str, c: Comparison, sim_timeline, measured_timeline) -> list[str]:
    """PREFIX-scatter.png and PREFIX-timeline.png; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from twin.figures import CLASS_COLORS

    program = c.schedule.programs[sim_timeline.program]
    classes = [op_class(op.work) for op in program.ops]
    paths = []

    fig, ax = plt.subplots(figsize=(6, 5.5))
    for cls in sorted(set(classes)):
        idx = [i for i, k in enumerate(classes) if k == cls]
        x, y = c.measured_durations[idx] * 1e3, c.sim_durations[idx] * 1e3
        ax.scatter(x, y, s=14, alpha=0.7, color=CLASS_COLORS.get(cls, "#333333"), label=cls)
    both = np.concatenate([c.measured_durations, c.sim_durations]) * 1e3
    both = both[both > 0]
    lo, hi = (float(both.min()) / 1.5, float(both.max()) * 1.5) if len(both) else (1e-3, 1.0)
    ax.plot([lo, hi], [lo, hi], color="#888888", linewidth=0.8, linestyle="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured op time (ms, mean over steps)")
    ax.set_ylabel("simulated op time (ms)")
    ax.set_title(f"{c.schedule.info.model} {c.schedule.world_size} ranks, rank {c.rank}: "
                 f"step {1e3 * c.simulated_step_s:.0f} vs {1e3 * c.measured_step_s:.0f} ms ({100 * c.step_error:+.1f}%)",
                 fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(_save(fig, f"{prefix}-scatter.png"))

    streams = sorted({op.stream for op in program.ops}, key=lambda s: (s != "compute", s))
    lanes = [(f"sim {s}", sim_timeline, s) for s in streams] + [(f"measured {s}", measured_timeline, s) for s in streams]
    height = 1.6 + 0.4 * len(lanes)
    fig, ax = plt.subplots(figsize=(12, height))
    seen = set()
    for lane, (_, timeline, stream) in enumerate(lanes):
        spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for op in program.ops:
            if op.stream == stream:
                start = float(timeline.start_s[op.id])
                spans[classes[op.id]].append((start * 1e3, float(timeline.end_s[op.id] - start) * 1e3))
        for cls, bars in spans.items():
            ax.broken_barh(bars, (lane - 0.4, 0.8), facecolors=CLASS_COLORS.get(cls, "#333333"),
                           label=cls if cls not in seen else None)
            seen.add(cls)
    ax.axhline(len(streams) - 0.5, color="#444444", linewidth=0.8)
    ax.set_yticks(range(len(lanes)), [name for name, _, _ in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time in step (ms)")
    ax.set_title(f"rank {c.rank}: simulated (top) and measured (bottom, median step)", fontsize=9)
    fig.legend(loc="lower center", ncol=min(len(seen), 8), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1))  # a band below the axes for the legend
    paths.append(_save(fig, f"{prefix}-timeline.png"))
    return paths


def _save(fig, path: str) -> str:
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path
