"""A profiled run beside the twin's prediction of the same step, per op class (`twin compare-trace`).

twin.profiler_trace reads the trace and classes its kernels; this sets each
class's busy time per step beside the twin's for the same rank. The twin's
send, recv and shift are one point-to-point row (NCCL runs a shift as
SendRecv kernels); where the trace has collectives of unknown kind, every
collective of both sides is one row; copies other than device to device and
memsets are listed as not modelled.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from twin.ir import COLLECTIVE_KINDS
from twin.profiler_trace import UNKNOWN_COLLECTIVE, ProfiledRun

NOT_MODELLED = ("memcpy", "memset")
# The twin's classes a trace shows as point to point: NCCL runs a shift (all_to_all_single with one peer each
# way, or batched isend/irecv) as SendRecv kernels, so it is compared with them.
P2P_TWIN_CLASSES = ("send", "recv", "shift")


@dataclass(frozen=True)
class TraceRow:
    op_class: str
    twin_s: float | None  # None: the twin does not model this class
    measured_s: float
    kernels_per_step: float

    @property
    def error(self) -> float | None:
        if self.twin_s is None or self.measured_s <= 0:
            return None
        return (self.twin_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class TraceComparison:
    run: ProfiledRun
    rows: tuple[TraceRow, ...]
    twin_step_s: float
    twin_side: str  # what the twin's side is (which rank, which plan)

    @property
    def step_error(self) -> float:
        return (self.twin_step_s - self.run.step_s) / self.run.step_s

    def to_json_dict(self) -> dict:
        return {
            "trace": self.run.path, "device": self.run.device, "trace_rank": self.run.rank,
            "steps_from": self.run.steps_from,
            "step": {"twin_s": self.twin_step_s, "measured_s": self.run.step_s, "error": self.step_error,
                     "measured_steps_s": list(self.run.steps_s)},
            "by_class": [{"op_class": r.op_class, "twin_s": r.twin_s, "measured_s": r.measured_s,
                          "kernels_per_step": r.kernels_per_step, "error": r.error,
                          "examples": list(self.run.examples.get(r.op_class, ()))} for r in self.rows],
            "twin_side": self.twin_side,
        }


def compare_trace(twin_by_class_s: dict[str, float], twin_step_s: float, run: ProfiledRun,
                  twin_side: str = "the critical rank") -> TraceComparison:
    """Per class: the twin's busy time per step beside the trace's. The twin's send, recv and shift are one p2p row;
    where the trace has collectives of unknown kind, all collectives are one row on both sides."""
    twin = defaultdict(float)
    for cls, s in twin_by_class_s.items():
        twin["p2p" if cls in P2P_TWIN_CLASSES else cls] += s
    measured = {cls: (t.seconds_per_step, t.kernels_per_step) for cls, t in run.by_class.items()}
    if UNKNOWN_COLLECTIVE in measured:
        kinds = [k for k in measured if k in COLLECTIVE_KINDS]
        parts = [measured.pop(k) for k in kinds] + [measured[UNKNOWN_COLLECTIVE]]
        measured[UNKNOWN_COLLECTIVE] = (sum(p[0] for p in parts), sum(p[1] for p in parts))
        twin[UNKNOWN_COLLECTIVE] = sum(twin.pop(k) for k in [k for k in twin if k in COLLECTIVE_KINDS])
    rows = []
    for cls in sorted(set(twin) | set(measured), key=lambda c: -max(measured.get(c, (0.0,))[0], twin.get(c, 0.0))):
        s, k = measured.get(cls, (0.0, 0.0))
        rows.append(TraceRow(cls, None if cls in NOT_MODELLED else twin.get(cls, 0.0), s, k))
    return TraceComparison(run, tuple(rows), twin_step_s, twin_side)


def format_trace_comparison(c: TraceComparison, title: str) -> str:
    run = c.run
    how = {"annotations": "its ProfilerStep annotations", "CPU annotations": "its CPU-side ProfilerStep annotations",
           "--steps": "--steps"}[run.steps_from]
    lines = [title,
             f"  trace {run.path}: device {run.device}, {len(run.steps_s)} step(s) by {how}; twin: {c.twin_side}",
             f"  {'op class':<16}{'kernels/step':>13}{'twin s':>14}{'measured s':>12}{'error':>9}"]
    for r in c.rows:
        twin = "not modelled" if r.twin_s is None else f"{r.twin_s:.4f}"
        err = "" if r.error is None else f"{100 * r.error:+.1f}%"
        lines.append(f"  {r.op_class:<16}{r.kernels_per_step:>13.0f}{twin:>14}{r.measured_s:>12.4f}{err:>9}")
    steps = ", ".join(f"{s:.4f}" for s in run.steps_s[:8]) + (", ..." if len(run.steps_s) > 8 else "")
    lines.append(f"  {'step time':<29}{c.twin_step_s:>14.4f}{run.step_s:>12.4f}{100 * c.step_error:>+8.1f}%"
                 f"   (measured steps: {steps}; median)")
    lines.append("  error = (twin - measured) / measured; busy time per class per step, overlapping streams summed")
    return "\n".join(lines)
