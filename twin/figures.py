"""Figures (matplotlib, headless): the timeline of one simulated step, scaling curves."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter  # noqa: E402

from twin.ir import Program, op_class  # noqa: E402
from twin.outputs import atomic_path  # noqa: E402
from twin.sim.engine import RankTimeline  # noqa: E402

CLASS_COLORS = {
    "gemm": "#1f77b4",
    "attention": "#9467bd",
    "elementwise": "#8c8c8c",
    "all_reduce": "#d62728",
    "all_gather": "#2ca02c",
    "reduce_scatter": "#ff7f0e",
    "broadcast": "#17becf",
    "all_to_all": "#e377c2",
    "shift": "#8c564b",
    "send": "#bcbd22",
    "recv": "#bcbd22",
}


MAX_TIMELINE_RANKS = 32


def timeline_figure(path: str, rows: list[tuple[str, Program, RankTimeline, str | None]], title: str) -> None:
    """A timeline, one row per (label, program, timeline, stream); stream None = every stream of that rank.

    Ops are coloured by class. Written atomically.
    """
    lanes: list[tuple[str, Program, RankTimeline, str]] = []
    for label, program, timeline, stream in rows:
        streams = [stream] if stream else sorted({op.stream for op in program.ops}, key=lambda s: (s != "compute", s))
        lanes.extend((f"{label}{s}" if not stream else label, program, timeline, s) for s in streams)
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for lane, (_, program, timeline, stream) in enumerate(lanes):
        for op in program.ops:
            if op.stream == stream:
                start = float(timeline.start_s[op.id])
                bars.setdefault((lane, op_class(op.work)), []).append((start, float(timeline.end_s[op.id]) - start))
    height = 1.5 + 0.42 * len(lanes)
    fig, ax = plt.subplots(figsize=(12, height))
    seen = set()
    for (lane, cls), spans in sorted(bars.items()):
        label = cls if cls not in seen else None
        seen.add(cls)
        ax.broken_barh(spans, (lane - 0.4, 0.8), facecolors=CLASS_COLORS.get(cls, "#333333"), label=label)
    ax.set_yticks(range(len(lanes)), [lane[0] for lane in lanes], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time in step (s)")
    ax.set_title(title, fontsize=10)
    fig.legend(loc="lower center", ncol=min(len(seen), 8), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.3 / height, 1, 1))  # a 0.3-inch band for the legend
    _save(fig, path)


def scaling_figure(path: str, gpus: list[int], tflops_per_gpu: list[float], efficiency: list[float],
                   mode: str, title: str) -> None:
    """Per-GPU throughput and scaling efficiency against GPU count. Written atomically."""
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax_t.plot(gpus, tflops_per_gpu, "o-", color="#1f77b4")
    ax_t.set_xscale("log", base=2)
    ax_t.set_xlabel("GPUs")
    ax_t.set_ylabel("TF/s per GPU (hardware FLOPs)")
    ax_t.set_ylim(bottom=0)
    ax_e.plot(gpus, [100 * e for e in efficiency], "o-", color="#d62728")
    ax_e.axhline(100, color="#888888", linewidth=0.8, linestyle="--")
    ax_e.set_xscale("log", base=2)
    ax_e.set_xlabel("GPUs")
    ax_e.set_ylabel(f"{mode} scaling efficiency (%)")
    ax_e.set_ylim(0, 110)
    for ax in (ax_t, ax_e):
        ax.set_xticks(gpus, [str(g) for g in gpus])
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: str) -> None:
    """Atomically (twin.outputs), into a folder that exists (commands check their outputs before any work)."""
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=120, format=os.path.splitext(path)[1].lstrip(".") or "png")
    finally:
        plt.close(fig)


def landscape_figure(path: str, points: list, title: str) -> None:
    """Every valid plan of a search: step time (filled, simulated) or its lower bound (hollow, never
    simulated because the bound ruled it out), against tensor-parallel size, coloured by memory per GPU."""
    fig, ax = plt.subplots(figsize=(9, 4.8))
    sim = [p for p in points if p.step_time_s is not None]
    rest = [p for p in points if p.step_time_s is None]
    mems = [p.memory_per_gpu_gb for p in points]
    norm = matplotlib.colors.Normalize(vmin=min(mems), vmax=max(mems))
    cmap = matplotlib.colormaps["viridis"]

    from twin.plan import parse_plan

    def tp(plan: str) -> int:
        return parse_plan(plan).tensor_parallel_size

    if rest:
        ax.scatter([tp(p.plan) for p in rest], [p.bound_s for p in rest], s=18, facecolors="none",
                   edgecolors=[cmap(norm(p.memory_per_gpu_gb)) for p in rest], linewidths=0.8,
                   label=f"lower bound only ({len(rest)} plans ruled out)")
    sc = ax.scatter([tp(p.plan) for p in sim], [p.step_time_s for p in sim], s=26, c=[p.memory_per_gpu_gb for p in sim],
                    cmap=cmap, norm=norm, label=f"simulated ({len(sim)} plans)")
    best = min(sim, key=lambda p: p.step_time_s)
    ax.scatter([tp(best.plan)], [best.step_time_s], s=120, marker="*", color="#d62728", label="best", zorder=3)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("gx * gy * gz (3D tensor-parallel size)")
    ax.set_ylabel("step time (s)")
    ax.grid(alpha=0.3, which="both")
    fig.colorbar(sc, ax=ax, label="memory per GPU (GB)")
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=9, wrap=True)
    fig.tight_layout()
    _save(fig, path)


def weak_scaling_validation_figure(path: str, machine: str, gpus: list[int], published_pflops: list[float],
                                   predicted_pflops: list[float], models: list[str]) -> None:
    """Published and predicted total PF/s against GPU count (AxoNN Table III), one machine."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(gpus, published_pflops, "o-", color="#333333", label="published (AxoNN SC'24 Table III)")
    ax.plot(gpus, predicted_pflops, "s--", color="#d62728", label="twin (the plan AxoNN's way picks)")
    ideal = [published_pflops[0] * g / gpus[0] for g in gpus]
    ax.plot(gpus, ideal, ":", color="#999999", label="ideal weak scaling from the first published point")
    for g, p, q, m in zip(gpus, published_pflops, predicted_pflops, models):
        ax.annotate(f"{m}\n{100 * (q / p - 1):+.0f}%", (g, q), textcoords="offset points", xytext=(6, -14), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(gpus, [str(g) for g in gpus])
    ax.set_xlabel("GPUs (GCDs on Frontier)")
    ax.set_ylabel("sustained bf16 PF/s (total)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title(f"{machine}: weak scaling, predicted vs published", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def measured_vs_predicted_figure(path: str, panels: list[tuple[str, list[float], dict[str, list[float]]]],
                                 title: str) -> None:
    """Predicted against measured step time, one panel per set of runs and one marker per column (machine
    file), on log axes around the line of perfect prediction and its +-10% band; at most four panels a row, so
    that many sets stay readable."""
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.6 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    markers = ["o", "s", "^", "D"]
    for ax, (name, measured, columns) in zip(axes.flat, panels):
        lo = min(min(measured), *(min(v) for v in columns.values())) * 0.8
        hi = max(max(measured), *(max(v) for v in columns.values())) * 1.25
        line = [lo, hi]
        ax.plot(line, line, "-", color="#333333", lw=1, label="predicted = measured")
        ax.fill_between(line, [0.9 * x for x in line], [1.1 * x for x in line], color="#999999", alpha=0.2,
                        label="+-10%")
        for (label, predicted), marker in zip(columns.items(), markers):
            ax.scatter(measured, predicted, s=12, marker=marker, alpha=0.6, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1, 2 and 5 of each decade, none between (they crowd)
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("measured step (s)")
        ax.set_ylabel("predicted step (s)")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def collectives_figure(path: str, panels: list[tuple[str, dict[int, list[tuple[float, float, float, bool]]]]],
                       title: str) -> None:
    """Measured (markers on solid lines; hollow where the fit left a stall out) and the twin's (dashed) time of a
    collective alone against its buffer, one line pair per group width, one panel per machine and collective:
    panels are (name, {gpus: [(bytes, measured_s, twin_s, kept), ...]})."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False)
    for ax, (name, widths) in zip(axes.flat, panels):
        for gpus, points in sorted(widths.items()):
            points = sorted(points)
            sizes = [p[0] / 2**20 for p in points]
            line, = ax.plot(sizes, [p[1] * 1e3 for p in points], "-", lw=1, label=f"{gpus} GPUs, measured")
            ax.plot(sizes, [p[2] * 1e3 for p in points], "--", lw=1, color=line.get_color(), label=f"{gpus}, twin")
            for size, p in zip(sizes, points):
                ax.plot(size, p[1] * 1e3, "o", ms=4, color=line.get_color(),
                        markerfacecolor=line.get_color() if p[3] else "none")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("buffer (MB)")
        ax.set_ylabel("time (ms)")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def sensitivity_figure(path: str, result, title: str, top: int = 12, notable: float = 0.005) -> None:
    """Tornado chart of a twin.sensitivity.Sensitivity: the step's change when each number moves down and up,
    the numbers with the largest elasticity on top; estimates and sourced figures marked apart."""
    fields = [f for f in result.fields if abs(f.elasticity) >= notable][:top][::-1]
    pct = round(100 * result.factor)
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(fields), 2) + 1.4))
    ys = range(len(fields))
    for offset, attr, color, label in ((-0.2, "low_step_s", "#1f77b4", f"number -{pct}%"),
                                       (0.2, "high_step_s", "#ff7f0e", f"number +{pct}%")):
        widths = [100 * (getattr(f, attr) / result.step_time_s - 1) if getattr(f, attr) is not None else 0.0
                  for f in fields]
        ax.barh([y + offset for y in ys], widths, height=0.4, color=color, alpha=0.9, label=label)
    ax.set_yticks(list(ys), [f"{f.path}{'' if f.estimate else '  (sourced)'}" for f in fields], fontsize=8)
    ax.axvline(0, color="#333333", linewidth=0.8)
    ax.set_xlabel(f"change of the step time (%), base {result.step_time_s:.3g} s")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=9, wrap=True)
    fig.tight_layout()
    _save(fig, path)


def trace_comparison_figure(path: str, comparison, title: str) -> None:
    """Per op class, the twin's busy time per step beside a profiler trace's (a twin.trace_comparison
    TraceComparison), the step last: which class a prediction misses, at a glance."""
    rows = [r for r in comparison.rows if r.measured_s > 0 or (r.twin_s or 0) > 0]
    labels = [r.op_class for r in rows] + ["step"]
    twin = [r.twin_s or 0.0 for r in rows] + [comparison.twin_step_s]
    measured = [r.measured_s for r in rows] + [comparison.run.step_s]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(labels) + 1.4))
    ys = list(range(len(labels)))[::-1]
    ax.barh([y + 0.2 for y in ys], twin, height=0.4, color="#1f77b4", label="twin")
    ax.barh([y - 0.2 for y in ys], measured, height=0.4, color="#ff7f0e", label="measured (trace)")
    for row, y in zip(rows, ys):
        if row.twin_s is None:
            ax.text(0, y + 0.2, " not modelled", va="center", fontsize=7, color="#555555")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel("seconds per step (busy time per class; overlapping streams summed)")
    ax.grid(alpha=0.3, axis="x")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(title, fontsize=9, wrap=True)
    fig.tight_layout()
    _save(fig, path)
