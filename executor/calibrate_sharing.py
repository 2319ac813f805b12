"""The calibration's numbers for ranks that share a host's cores: how compute and communication disturb each other.

Apart from executor.calibrate's fit of kernels and collectives alone because
each is a ratio of two of the calibration's own microbenchmarks (executor.
calibrate's module docstring says which), not a model fitted over many:
the GEMM's slowdown under an all-reduce, the all-reduce's stretch under
GEMMs, a small all-reduce's latency pace under its ranks' GEMMs, and the
time-slicing lag of the last rank at a synchronisation (a line over four
GEMM sizes, less the synchronisation right after another), and the share of
a core a rank moving bytes takes from the ranks computing beside it. Each takes the
samples by kind (`by`) and says what it is without its measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import inf

import numpy as np

from executor.calibration_samples import Sample
from executor.microbenchmark_ops import DTYPE, TINY_BYTES
from twin.builders.program import ProgramWriter
from twin.ir import Collective, Elementwise, Gemm
from twin.sim.compute_unit import timeslice_lag_s


def _mean(by: dict[str, list[Sample]], kind: str) -> float | None:
    times = [s.time_s for s in by.get(kind, [])]
    return float(np.mean(times)) if times else None


def comm_compute_slowdown(by: dict[str, list[Sample]]) -> float:
    """1 - (GEMM time alone) / (GEMM time under a large all-reduce), in [0, 0.9]; 0 unmeasured."""
    alone, during = _mean(by, "overlap_alone"), _mean(by, "overlap_during")
    return float(np.clip(1 - alone / during, 0.0, 0.9)) if alone and during else 0.0


def comm_stretch(by: dict[str, list[Sample]]) -> float:
    """(a large all-reduce's time while every rank computes) / (its time alone), in [1, 20]; 1 unmeasured."""
    alone, during = _mean(by, "overlap_comm_alone"), _mean(by, "overlap_comm")
    return float(np.clip(during / alone, 1.0, 20.0)) if alone and during else 1.0


def latency_pace(by: dict[str, list[Sample]]) -> float | None:
    """The pace of a small all-reduce's latency while every rank computes, over its pace alone, in [0, 1];
    None without the measurements (one rank, or an older schedule). With `span` the GEMMs' time: where the
    all-reduce ended inside them it went at (time alone) / (its time) throughout; where it ended
    `during - span` after them, at its pace alone from then on, the rest of its time alone went by under
    them."""
    alone, during, gemm = _mean(by, "latency_comm_alone"), _mean(by, "latency_comm"), _mean(by, "latency_gemm")
    if alone is None or during is None or gemm is None:
        return None
    span = by["latency_comm"][0].params["gemms"] * gemm
    pace = alone / during if during <= span else (alone - (during - span)) / span
    return float(np.clip(pace, 0.0, 1.0))


def core_share(ratio: float, computing: int, cores: float) -> float:
    """The share of a core one rank moving bytes takes, from the computing ranks' GEMM time beside as many such
    ranks over their time beside idle ones: each computing rank gets min(1, cores / computing) of a core beside
    idle ranks and cores / (computing + computing x share) beside moving ones (where that is under a core:
    twin.sim.compute_unit.NodeCores.load). 0 where the GEMMs were no slower."""
    demand = ratio * cores / min(1.0, cores / computing)
    return max(0.0, demand / computing - 1.0)


def mover_share(by: dict[str, list[Sample]], cores: float | None) -> float | None:
    """The share of a core a rank takes while its transfers move bytes and it computes nothing (core_share of
    the beside microbenchmark), in [0, 1]; None unmeasured, or where the computing half of the ranks leaves a
    core free (then the moving ranks' threads run there and the GEMMs cannot show what they take)."""
    idle, moving = _mean(by, "beside_idle"), _mean(by, "beside_moving")
    if not idle or not moving or not cores:
        return None
    computing = by["beside_idle"][0].params["computing"]
    if computing < cores:
        return None
    return float(np.clip(core_share(moving / idle, computing, cores), 0.0, 1.0))


LEAD_GEMM = (512, 512, 512)  # the first SKEW_LEADS; a calibration before 2026-12-07 ran one before each collective
SKEW_LEADS = [LEAD_GEMM, (1024, 512, 512), (1024, 1024, 512), (1024, 1024, 1024)]  # 1:2:4:8 in work
SKEW_LONG = (2, 4, 8)  # phases of this many of the largest SKEW_LEADS: how the lag grows beyond the line's range


def lag_section(w: ProgramWriter, what: dict, everyone: str, repeats: int) -> None:
    """The calibration's time-slicing section (its ranks enter it together): each SKEW_LEADS GEMM, then each
    phase of SKEW_LONG of the largest, each phase followed by a 4-byte all-reduce of every rank (a
    synchronisation) that the next phase waits for; the GEMMs and the all-reduces timed into `what`."""
    def phase(name: str, shape: tuple[int, int, int], gemms: int, kinds: tuple[str, str], params: dict) -> None:
        for i in range(gemms):
            what[w.compute(f"{name}.lead{i}" if gemms > 1 else f"{name}.lead", Gemm(*shape, "NN", DTYPE))] = (
                kinds[0], params)
        op = w.collective(name, everyone, Collective("all_reduce", everyone, 4, DTYPE))
        w.wait(op)
        w.compute(f"{name}.done", Elementwise(TINY_BYTES))
        what[op] = (kinds[1], params)

    for rep in range(repeats):
        for m, n, k in SKEW_LEADS:
            phase(f"skew.{m}x{n}x{k}.r{rep}", (m, n, k), 1, ("skew_lead", "skew_sync"), {"m": m, "n": n, "k": k})
        for gemms in SKEW_LONG:
            phase(f"skew.long{gemms}.r{rep}", SKEW_LEADS[-1], gemms, ("skew_long_gemm", "skew_long_sync"),
                  {"gemms": gemms})


@dataclass(frozen=True)
class Lag:
    """How far the last rank reaches a synchronisation behind the mean after a phase of compute on an
    oversubscribed host: `floor_s` once the phase is `floor_after_s` long (linearly from 0 below it), plus
    `skew` per second of the phase, measured on phases up to `span_s` long (0: none), and `beyond` per second
    of a longer phase past it. `lead_s`: the lead GEMM's time before each collective microbenchmark."""

    skew: float = 0.0
    lead_s: float = 0.0
    floor_s: float = 0.0
    floor_after_s: float = 0.0
    span_s: float = 0.0
    beyond: float | None = None  # None: no longer phases measured (held at the span)

    def after(self, compute_s: float) -> float:
        """The lag after `compute_s` of compute, as the simulator takes it (twin.sim.compute_unit)."""
        return timeslice_lag_s(compute_s, self.skew, self.floor_s, self.floor_after_s, self.span_s or inf,
                               self.beyond or 0.0)


def fit_skew(leads: list[Sample], syncs: list[Sample], lead_shape: tuple[int, int, int],
             synchronised: list[Sample] = (), long_gemms: list[Sample] = (), long_syncs: list[Sample] = ()) -> Lag:
    """The lag (Lag) from the synchronising all-reduces after GEMMs of several sizes: `skew` their time's
    least-squares slope over the GEMM's, the floor the line's value at no GEMM less the time of a small
    all-reduce of every rank right after a synchronisation (`synchronised`: the latency microbenchmark alone,
    where the last rank has nothing to lag behind), reached at the shortest GEMM measured, its span the longest.
    Beyond the span, from the all-reduces after the long phases (`long_gemms`: one GEMM's mean time in each,
    `long_syncs`), the slope of a line from the first line's value at the span (least squares; None without
    them: the simulator then holds the lag at the span's). Nothing without the measurements (one rank, or an
    older schedule); never below 0."""
    lead_of = {(s.params["m"], s.params["n"], s.params["k"]): s.time_s for s in leads}
    pairs = [(lead_of[key], s.time_s) for s in syncs if (key := (s.params["m"], s.params["n"], s.params["k"])) in lead_of]
    if len(pairs) < 2:
        return Lag()
    lead, sync = np.array(pairs).T
    slope, intercept = np.polyfit(lead, sync, 1) if np.ptp(lead) > 0 else (0.0, float(np.mean(sync)))
    slope, span = max(float(slope), 0.0), float(lead.max())
    alone = float(np.mean([s.time_s for s in synchronised])) if synchronised else None
    floor = max(float(intercept) - alone, 0.0) if alone is not None else 0.0
    gemm_of = {s.params["gemms"]: s.time_s for s in long_gemms}
    longer = np.array([(s.params["gemms"] * gemm_of[s.params["gemms"]] - span, s.time_s - intercept - slope * span)
                       for s in long_syncs if s.params["gemms"] in gemm_of]).reshape(-1, 2)
    past, rise = longer[longer[:, 0] > 0].T
    beyond = max(float(past @ rise / (past @ past)), 0.0) if len(past) else None
    return Lag(slope, lead_of.get(lead_shape, 0.0), floor, float(lead.min()) if floor else 0.0, span, beyond)
