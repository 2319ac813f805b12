"""Figures (matplotlib, headless): the timeline of one simulated step, scaling curves."""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from twin.ir import Program, op_class  # noqa: E402
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
    "send": "#bcbd22",
    "recv": "#bcbd22",
}


def timeline_figure(path: str, program: Program, timeline: RankTimeline, title: str) -> None:
    """One row per stream of one rank; ops coloured by class. Written atomically."""
    streams = sorted({op.stream for op in program.ops}, key=lambda s: (s != "compute", s))
    row = {s: i for i, s in enumerate(streams)}
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for op in program.ops:
        start = float(timeline.start_s[op.id])
        bars.setdefault((op.stream, op_class(op.work)), []).append((start, float(timeline.end_s[op.id]) - start))
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.55 * len(streams)))
    seen = set()
    for (stream, cls), spans in sorted(bars.items()):
        label = cls if cls not in seen else None
        seen.add(cls)
        ax.broken_barh(spans, (row[stream] - 0.4, 0.8), facecolors=CLASS_COLORS.get(cls, "#333333"), label=label)
    ax.set_yticks(range(len(streams)), streams)
    ax.invert_yaxis()
    ax.set_xlabel("time in step (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=min(len(seen), 7), fontsize=8, frameon=False)
    fig.tight_layout()
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
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.path.basename(path)}")
    fig.savefig(tmp, dpi=120, format=os.path.splitext(path)[1].lstrip(".") or "png")
    plt.close(fig)
    os.replace(tmp, path)
