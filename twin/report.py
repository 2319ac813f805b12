"""What a simulated (or measured) step amounts to: the numbers a user asks for.

Two throughputs, because they answer two questions:

- achieved (`pflops_total`, `tflops_per_gpu`, `pct_peak_advertised`,
  `pct_peak_empirical`): the FLOPs the schedule's compute ops actually execute
  (every rank's GEMMs, attention and element-wise work: `flops_executed`) over
  the step time. It counts recompute only where the plan recomputes and the
  model's real ffn width, so no plan can report more than the device does.
  The percentages are of the bf16 (or fp16) peaks: a plan's FP8 linears
  (fp8=1) run on a faster peak and can take them past 100.
- by formula (`formula_pflops_total`, `formula_tflops_per_gpu`,
  `formula_pct_peak_advertised`, `formula_pct_peak_empirical`, from
  `flops_by_formula`): the FLOPs of Narayanan et al.'s formula named in
  `flops_formula` ("hardware", the recompute form the AxoNN and Frontier papers
  report, or "model": useful work, which over the peak is MFU) over the same
  step time. It is what published TFLOP/s figures are, so comparisons with
  papers (twin.validate) use it; it assumes full recompute and ffn = 4h, so
  it can exceed the peak on plans that differ.

Exposed communication is the time on the critical rank when a communication op
is in flight and no compute op is: what overlap did not hide. JSON carries only
finite numbers (to_json_dict refuses others: a NaN there is a bug upstream).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from topologies.overrides import describe_overrides
from twin.errors import TwinError
from twin.ir import PHASES, Program, Schedule, op_class
from twin.sim.engine import RankTimeline, SimRun


COMPUTE_CLASSES = ("gemm", "attention", "elementwise")  # the op classes of compute work (twin.ir.op_class)


@dataclass(frozen=True)
class Summary:
    machine: str
    model: str
    plan: str
    gpus: int
    global_batch: int
    seq: int
    step_time_s: float
    flops_executed: float  # the step's compute ops, every rank: what the achieved figures divide
    pflops_total: float  # achieved, all GPUs
    tflops_per_gpu: float  # achieved
    pct_peak_advertised: float  # achieved
    pct_peak_empirical: float  # achieved
    flops_formula: str  # "hardware" or "model": the formula of the formula_* figures
    flops_by_formula: float
    formula_pflops_total: float
    formula_tflops_per_gpu: float
    formula_pct_peak_advertised: float  # MFU when flops_formula is "model"
    formula_pct_peak_empirical: float
    exposed_comm_s: float
    memory_per_gpu_gb: float
    time_by_class_s: dict[str, float]
    simulated_ranks: int
    sim_wall_s: float
    machine_overrides: dict[str, float] = field(default_factory=dict)  # --set FIELD=VALUE over the machine file
    # How a step that was not simulated in full was obtained, where that leaves some numbers approximate
    # (twin.pipeline_depth); empty when every number is the simulation's own
    continued: str = ""
    # exposed_comm_s split by the pass (fwd, rc, bwd, step) of the compute op each idle stretch delays, "end"
    # after the last one (exposed_comm_by_pass); a measured step's from its measured timeline
    exposed_comm_by_pass_s: dict[str, float] = field(default_factory=dict)

    @property
    def compute_s(self) -> float:
        """The critical rank's busy compute time (its GEMMs, attention and element-wise work, overlapping nothing
        of each other): what the AxoNN paper calls a batch's compute time."""
        return sum(v for k, v in self.time_by_class_s.items() if k in COMPUTE_CLASSES)

    def to_json_dict(self) -> dict:
        """The fields as a dict that JSON can hold: NonFiniteSummary if any number is NaN or infinite."""
        doc = asdict(self)
        _check_finite(doc, "")
        return doc

    def to_json(self, indent: int | None = 2) -> str:
        """Strict JSON text (no NaN or Infinity literals, which JSON does not have)."""
        return json.dumps(self.to_json_dict(), indent=indent, allow_nan=False)


class NonFiniteSummary(ValueError):
    """A summary number is NaN or infinite: a bug in whatever produced it, not something to print as JSON."""


def _check_finite(value, path: str) -> None:
    """Raise NonFiniteSummary naming the first non-finite number under `value` (dicts and lists walked)."""
    if isinstance(value, dict):
        for key, item in value.items():
            _check_finite(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_finite(item, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise NonFiniteSummary(f"summary field {path} is {value}: a bug upstream (the simulation or measurement "
                               "that produced it); refusing to write it as JSON")


def _union_length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in _merged(intervals))


def _intervals(program: Program, timeline: RankTimeline, comm: bool) -> list[tuple[float, float]]:
    return [
        (float(timeline.start_s[op.id]), float(timeline.end_s[op.id]))
        for op in program.ops
        if op.is_comm == comm
    ]


def compute_busy_s(program: Program, timeline: RankTimeline) -> float:
    """Time with some compute op running (compute on two streams at once counts once)."""
    return _union_length(_intervals(program, timeline, comm=False))


def exposed_comm_s(program: Program, timeline: RankTimeline) -> float:
    """Time with communication in flight and the compute stream idle."""
    return exposed_s(program, timeline, _intervals(program, timeline, comm=True))


def exposed_s(program: Program, timeline: RankTimeline, spans: list[tuple[float, float]]) -> float:
    """Time inside `spans` (start, end) with no compute op of the rank running: exposed_comm_s for spans of
    the caller's choosing (twin.sim.phases counts only the part of each transfer after its rendezvous)."""
    compute = _intervals(program, timeline, comm=False)
    return _union_length(list(spans) + compute) - _union_length(compute)


def exposed_comm_by_pass(program: Program, timeline: RankTimeline) -> dict[str, float]:
    """exposed_comm_s split by what the idle compute stream waits to run: the pass (OpTag.phase) of the compute op
    that starts when the idle stretch ends, "end" after the last compute op ("untagged" for an op without a tag).

    Why: the total says how much of the communication fails to hide; this says where, which is what a plan or a
    code change acts on (AxoNN's forward gathers block, its recompute's are prefetched one linear ahead, a data-
    parallel all-reduce before the optimizer waits whole). The parts sum to exposed_comm_s."""
    comm = _merged(_intervals(program, timeline, comm=True))
    compute = sorted(((float(timeline.start_s[op.id]), float(timeline.end_s[op.id]), op) for op in program.ops
                      if not op.is_comm), key=lambda t: (t[0], t[1]))
    idle: list[tuple[float, float, str]] = []  # stretches with no compute, each with the pass it delays
    covered = -np.inf
    for start, end, op in compute:
        if start > covered:
            idle.append((covered, start, op.tag.phase if op.tag is not None else "untagged"))
        covered = max(covered, end)
    idle.append((covered, np.inf, "end"))
    parts: dict[str, float] = defaultdict(float)
    i = 0
    for a, b, label in idle:
        while i < len(comm) and comm[i][1] <= a:
            i += 1
        j = i
        while j < len(comm) and comm[j][0] < b:
            overlap = min(b, comm[j][1]) - max(a, comm[j][0])
            if overlap > 0:
                parts[label] += overlap
            j += 1
    return dict(sorted(parts.items()))


def _in_pass_order(by_pass: dict[str, float]) -> list[tuple[str, float]]:
    """exposed_comm_by_pass_s's items in the order a step runs its passes (then "end", then anything else)."""
    order = (*PHASES, "end")
    return sorted(by_pass.items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0]))


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of `intervals` as sorted, disjoint intervals."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def time_by_class(program: Program, timeline: RankTimeline) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    durations = timeline.end_s - timeline.start_s
    for op in program.ops:
        totals[op_class(op.work)] += float(durations[op.id])
    return dict(sorted(totals.items()))


def rank_time_by_class(run: SimRun, rank: int | None) -> dict[str, float]:
    """Busy time per op class of `rank` (the timeline of the rank simulated for its class), or of the critical
    rank when `rank` is None."""
    if rank is None:
        timeline = critical_timeline(run)
    elif not 0 <= rank < run.schedule.world_size:
        raise TwinError(f"--rank {rank}: the step has ranks 0..{run.schedule.world_size - 1}")
    else:
        timeline = run.timelines[run.symmetry.class_of[rank]]
    return time_by_class(run.schedule.programs[timeline.program], timeline)


def critical_timeline(run: SimRun) -> RankTimeline:
    """The simulated rank that finishes last."""
    return _last_to_finish(run.timelines)


def _last_to_finish(timelines) -> RankTimeline:
    return max(timelines, key=lambda t: float(np.nanmax(t.end_s)) if len(t.end_s) else 0.0)


def summarize(run: SimRun, flops_formula: str = "hardware") -> Summary:
    summary = summarize_timelines(run.schedule, list(run.timelines), run.step_time_s, run.machine.name,
                                  run.machine.device, run.wall_s, flops_formula)
    return replace(summary, machine_overrides=dict(run.machine.overrides))


def format_summary(s: Summary) -> str:
    """A human-readable block; the same numbers as to_json_dict."""
    # a measured run with no machine for its peaks has none (throughput_fields: percentages 0 though FLOPs ran)
    peaks = s.pct_peak_advertised > 0 or s.tflops_per_gpu == 0
    shown_passes = [(k, v) for k, v in _in_pass_order(s.exposed_comm_by_pass_s) if v >= 5e-4]  # as printed, 3 places
    lines = [
        f"{s.model} on {s.gpus} x {s.machine} GPUs, plan {s.plan}",
        f"  global batch {s.global_batch} sequences x {s.seq} tokens",
        *([f"  {describe_overrides(s.machine_overrides)}"] if s.machine_overrides else []),
        f"  step time              {s.step_time_s:10.3f} s",
        f"  throughput             {s.pflops_total:10.1f} PF/s total, {s.tflops_per_gpu:.1f} TF/s per GPU "
        "(FLOPs executed)",
        f"  % of peak              {s.pct_peak_advertised:10.1f} % advertised, {s.pct_peak_empirical:.1f} % empirical"
        + (" (of the bf16 peaks; the FP8 linears' is higher)" if "fp8=1" in s.plan.split(",") else "")
        if peaks else "  % of peak                     - (no machine file for the peaks: --machine NAME)",
        f"{'  by ' + s.flops_formula + ' formula':<25}{s.formula_pflops_total:10.1f} PF/s total, "
        f"{s.formula_tflops_per_gpu:.1f} TF/s per GPU"
        + (f", {s.formula_pct_peak_advertised:.1f} % advertised" if peaks else "")
        + f" ({formula_note(s)})",
        f"  exposed communication  {s.exposed_comm_s:10.3f} s ({100 * s.exposed_comm_s / s.step_time_s:.1f} % of step)"
        if s.step_time_s > 0 else "  exposed communication  0",
        *(["    by the pass it delays: " + ", ".join(f"{k} {v:.3f} s" for k, v in shown_passes)] if shown_passes else []),
        f"  memory per GPU         {s.memory_per_gpu_gb:10.1f} GB",
        "  time by op class (critical rank, busy time per stream, overlapping):",
    ]
    for name, seconds in sorted(s.time_by_class_s.items(), key=lambda kv: -kv[1]):
        lines.append(f"    {name:<16} {seconds:10.3f} s")
    lines.append(f"  simulated {s.simulated_ranks} rank(s) in {s.sim_wall_s:.2f} s of wall time")
    if s.continued:
        lines.append(f"  {s.continued}")
    return "\n".join(lines)


# What the formula figure means, on its line of the text summary.
_FORMULA_NOTE = {"hardware": "as papers report", "model": "MFU"}


def formula_note(s: Summary) -> str:
    """What the formula figure means; for the hardware formula on a plan that does not recompute every layer in
    full, that the formula still counts it (so its % of peak is the formula's, not the GPU's: the executed line
    is)."""
    note = _FORMULA_NOTE.get(s.flops_formula, "Narayanan et al.")
    words = s.plan.split(",")
    if s.flops_formula == "hardware" and ("recompute=full" not in words or any(w.startswith("rcl=") for w in words)):
        note += "; it counts a full recompute this plan does not run"
    return note


def executed_flops_by_class(schedule: Schedule) -> dict[str, float]:
    """FLOPs of every compute op the schedule runs, summed over all ranks, per op class (gemm, attention,
    elementwise). A Program is run by each of its ranks, so its ops count once per rank."""
    totals: dict[str, float] = defaultdict(float)
    class_of: dict[type, str | None] = {}  # by the work's type: a pipeline step has ~10^6 ops
    for program in schedule.programs:
        per_program: dict[str, float] = defaultdict(float)
        for op in program.ops:
            work = op.work
            kind = type(work)
            if kind not in class_of:
                class_of[kind] = None if op.is_comm else op_class(work)
            name = class_of[kind]
            if name is not None:
                per_program[name] += work.flops
        for name, flops in per_program.items():
            totals[name] += len(program.ranks) * flops
    return dict(sorted(totals.items()))


def executed_flops(schedule: Schedule) -> float:
    """FLOPs the step's compute ops execute, all ranks together: the work behind the achieved throughput."""
    return sum(executed_flops_by_class(schedule).values())


def throughput_fields(step_time_s: float, gpus: int, flops_executed: float, flops_by_formula: float,
                      device=None) -> dict[str, float]:
    """The Summary's throughput fields, achieved and by formula, for a step of `step_time_s` on `gpus` GPUs.

    `device` (a topologies DeviceSpec) gives the peaks the percentages are of;
    without one they are 0. A step of no time has no throughput (0), not an
    infinite one."""
    peak = device.peak_flop_per_s if device is not None else 0.0
    empirical = device.empirical_gemm_flop_per_s if device is not None else 0.0
    out: dict[str, float] = {"flops_executed": flops_executed, "flops_by_formula": flops_by_formula}
    for prefix, flops in (("", flops_executed), ("formula_", flops_by_formula)):
        per_gpu = flops / step_time_s / gpus if step_time_s > 0 else 0.0
        out[f"{prefix}pflops_total"] = per_gpu * gpus / 1e15
        out[f"{prefix}tflops_per_gpu"] = per_gpu / 1e12
        out[f"{prefix}pct_peak_advertised"] = 100 * per_gpu / peak if peak else 0.0
        out[f"{prefix}pct_peak_empirical"] = 100 * per_gpu / empirical if empirical else 0.0
    return out


def with_step(s: Summary, step_time_s: float, flops_executed: float, flops_by_formula: float,
              device=None) -> Summary:
    """`s` for another step time and amount of work, every throughput figure recomputed from them (what
    twin.micro_batches needs when it continues a short step to the full batch)."""
    return replace(s, step_time_s=step_time_s,
                   **throughput_fields(step_time_s, s.gpus, flops_executed, flops_by_formula, device))


def summarize_timelines(schedule, timelines: list[RankTimeline], step_time_s: float, machine_name: str,
                        device=None, wall_s: float = 0.0, flops_formula: str = "hardware") -> Summary:
    """The Summary of a step from its timelines, simulated (`summarize`) or measured (the executor).

    The critical timeline is the rank that finishes last. `device` (a
    topologies DeviceSpec) gives the peaks the percentages are of; without one
    they are 0. `flops_formula` names the formula of the formula_* figures
    (the achieved ones count the schedule's own ops). `simulated_ranks` counts
    the timelines, `sim_wall_s` is the wall time of the simulation or
    measurement.
    """
    info = schedule.info
    by_formula = info.flops_hardware if flops_formula == "hardware" else info.flops_model
    timeline = _last_to_finish(timelines)
    program = schedule.programs[timeline.program]
    return Summary(
        machine=machine_name,
        model=info.model,
        plan=info.plan_text,
        gpus=schedule.world_size,
        global_batch=info.global_batch,
        seq=info.seq,
        step_time_s=step_time_s,
        flops_formula=flops_formula,
        **throughput_fields(step_time_s, schedule.world_size, executed_flops(schedule), by_formula, device),
        exposed_comm_s=exposed_comm_s(program, timeline),
        exposed_comm_by_pass_s=exposed_comm_by_pass(program, timeline),
        memory_per_gpu_gb=info.memory_per_gpu_bytes / 1e9,
        time_by_class_s=time_by_class(program, timeline),
        simulated_ranks=len(timelines),
        sim_wall_s=wall_s,
    )
