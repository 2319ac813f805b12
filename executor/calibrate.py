"""`twin calibrate`: microbenchmarks run by the executor, fitted to the simulator's parameters, as a machine file.

The microbenchmarks are themselves a schedule (one program, every rank the
same), executed by `twin run`'s machinery on `nproc` ranks of this host, so
they are timed exactly as a training step is: same kernels, same channels,
every rank busy at once (on a CPU host with more ranks than cores that
sharing is part of what a "device" is here). Sections, each opened by a
small all-reduce over all ranks so the ranks enter it together:

- GEMM: every (m, n, k) of GEMM_SHAPES in each layout NN, NT, TN;
- element-wise: copies moving ELEMENTWISE_BYTES bytes;
- attention: forward and backward of ATTENTION_SHAPES (causal);
- collectives: all_reduce, all_gather, reduce_scatter over groups of 2, 4, ... up to nproc
  consecutive ranks, COLLECTIVE_BYTES each, each one after a synchronisation
  (COLLECTIVES_AFTER) and waited for (a blocking collective, as most of a step's are);
- point-to-point: a send of each P2P_BYTES from the first rank of every pair of the 2-rank
  groups to the second, after a synchronisation so that both arrive together (the
  schedule's second program, the pairs' second ranks, receives where the first sends);
- time-slicing (executor.calibrate_sharing.lag_section): GEMMs of SKEW_LEADS' sizes, then
  phases of SKEW_LONG of the largest, each followed by a 4-byte all-reduce of every rank;
- overlap: a large all-reduce alone, a GEMM alone, then the same GEMM
  while the same all-reduce runs;
- latency under compute: a small all-reduce of every rank alone, then
  issued before LATENCY_GEMMS that every rank runs and waited for after;
- core share (4k ranks): the first program's ranks run BESIDE_GEMMS GEMMs
  while the second's wait at the next synchronisation, then again while
  the second's run all-reduces of BESIDE_BYTES in their own pairs, back to
  back, for longer than the GEMMs take (the second program runs a tiny op
  at each id where the first runs a GEMM, and the first a tiny op where the
  second runs an all-reduce; `_beside_section`).

Each op is repeated; its time is the mean over repeats, steps and ranks
(executor.calibration_samples.collect).

The fit (`fit`) targets exactly the formulas of twin.sim.compute and
twin.sim.collectives for a one-node machine whose "devices" are the ranks:

- kernel_overhead_s, GEMM rate R, tile sizes, k_half (compute_units = 1: one process is one stream of
  kernels, no waves) by a grid search minimising the RMS relative error of element-wise, GEMM and attention
  times together, every time weighted alike (`relative_weights`): not by its standard error, which with more
  ranks than cores comes from a few launches' scatter and is too noisy to decide a discrete choice of tiles
  by (on this project's 2-core host, weighted so, 4-rank launches of one calibration chose tiles from 1x1
  to 32x32, and two calibrations' GEMM rates were 21% apart where the measured GEMM times were within 4%;
  docs/fit.md); at each grid point a layout's GEMM rate is its samples' mean time over modelled work
  (`mean_ratio`: least squares on relative errors falls short of their mean time by about twice their
  scatter squared, 7.5% of a 4-rank calibration's GEMM time there; docs/fit.md); the element-wise
  bandwidth (hbm_bw, efficiency 1) by least squares; layout efficiencies as each layout's fitted rate
  over the best one's;
- attention: a fixed time per call plus flops at attention_efficiency x R (both non-negative, weighted LSQ);
- the collective model on one node is ring latency + bytes x traffic / B,
  latency = base + steps x hop (NCCL's tuning model with one protocol,
  "simple"), with a base and a bandwidth per kind (gloo's kinds differ: its
  reduce-scatter costs about an all-reduce): bases, hop and per-kind
  bandwidths by non-negative weighted least squares over all kinds, sizes
  and group sizes; the fastest kind's bandwidth is the per-rank port B (a
  "loopback" node switch), the others kind_bw_fraction of it;
- p2p_latency_s: a transfer's time less its bytes at the port bandwidth,
  the weighted mean over P2P_BYTES (a gloo send is one message, not a ring:
  on this project's 2-core host 0.47 ms with 2 ranks and 0.88 ms with 4,
  where the ring's base latency and one hop give 1.5 and 5.4 ms;
  docs/fit.md). None where no pair was measured (an odd number of ranks):
  the simulator then keeps its estimate, the ring's base plus one hop;
- comm_compute_slowdown = 1 - (GEMM time alone) / (GEMM time under an all-reduce)
  of 64 MB, nearly all bytes: on a CPU host the simulator slows compute by it
  while a collective moves bytes, not while it waits out its latency;
- comm_stretch_under_compute = (the all-reduce's time while every rank
  computes) / (its time alone), at least 1: on a host with at least as many
  ranks as cores gloo's threads then wait for cores (2.6-3.4 with 4 ranks on this
  project's 2-core host, 1.1-1.2 with 2; docs/fit.md);
- comm_latency_pace_under_compute: how much of the small all-reduce's time
  alone went by while the GEMMs over it ran, per second of them: 0 where
  it ended its time alone after them (4 ranks on this project's 2-core
  host: its threads barely run while their ranks compute;
  benchmarks/overlap_sizes.py), 0.5 or so with 2 ranks, where it ended
  inside them (its time alone over its time);
- timeslice_skew: the least-squares slope of the synchronising all-reduce's
  time over the GEMM's before it (3-32 ms of compute on a 2-core host with
  4 ranks): how far the last rank lags the mean, per second of compute,
  where the OS shares the cores unevenly (0.14-0.28 there; with 2 ranks on
  its 2 cores 0.03-0.14, which the simulator now lags too: every core held
  leaves none for gloo's and the executor's own threads; docs/fit.md);
- timeslice_lag_s: the same line's value at no compute less the time of
  the small all-reduce of every rank right after a synchronisation (the
  latency microbenchmark alone): the lag that does not grow with the
  compute, 2-5 ms there, reached at timeslice_lag_after_s, the shortest
  GEMM measured (linearly from 0 below it: benchmarks/collective_after.py
  finds no lag after a 1 MB copy); the line's range timeslice_lag_span_s, the
  longest, past which timeslice_skew_beyond_span is the slope of the longer
  phases' all-reduces from the line's value there (0.001-0.2 here; None in a
  calibration without them: held); the simulator adds the lag to the
  transfer after compute (twin.sim.compute_unit.NodeCores). A calibration saved
  before 2026-12-07 ran a LEAD_GEMM before each collective: where ranks >=
  cores its lag is taken out of each (`lead_skew_s`);
- comm_core_share: the share of a core a rank moving bytes takes from the
  ranks computing beside it, from the core-share GEMMs' time beside the
  all-reduces over their time beside waiting ranks (0.67-0.83 with 4 ranks on
  this project's 2-core host; waiting takes none); None where the
  computing half leaves a core free (the movers' threads run there unseen)
  or fewer than 4k ranks ran.

The last six come from executor.calibrate_sharing: ratios of two microbenchmarks each, and the lag's
line over four GEMM sizes beside the synchronised all-reduce. executor.machinefile writes the machine file
(each number "measured on <host> by twin calibrate on <date>") and, beside it, NAME.calibration.json with
every measurement, the fitted value and what the simulator predicts from the written file (an audit);
executor.calibrate_host runs the three on this host.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np

from executor.calibrate_collectives import fit_collectives, fit_p2p_latency
from executor.calibrate_sharing import (LEAD_GEMM, comm_compute_slowdown, comm_stretch, fit_skew, lag_section,
                                        latency_pace, mover_share)
from executor.calibration_samples import Sample
from executor.microbenchmark_ops import DTYPE, TINY_BYTES, synchronise
from executor.weighted_least_squares import (chi2, mean_ratio, nnls_weighted, rel_rms, relative_weights,
                                             scale_nonneg)
from twin.builders.program import ProgramWriter
from twin.ir import P2P, Attention, Collective, Elementwise, Gemm, GroupAxis, Op, Program, Schedule, StepInfo

GEMM_SHAPES = [(m, n, k) for m in (128, 512, 1024) for n in (128, 512, 2048) for k in (128, 512, 2048) if m * n * k <= 1 << 30]
GEMM_SHAPES += [(192, 384, 256), (320, 96, 512), (1000, 200, 300), (384, 768, 192), (96, 1536, 384)]  # tile quantization
ELEMENTWISE_BYTES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
# (batch, heads, seq, head_dim): what models that fit a small host run (seq 128-512, 2-32 heads x sequences)
ATTENTION_SHAPES = [(1, 2, 128, 64), (2, 2, 128, 64), (8, 2, 128, 64), (4, 4, 128, 64), (2, 8, 128, 64),
                    (2, 4, 256, 64), (8, 4, 256, 64), (1, 8, 512, 64)]
COLLECTIVE_BYTES = [1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
REPEATS = 4
OVERLAP_GEMM = (512, 1024, 1024)
OVERLAP_BYTES = 64 << 20
LATENCY_BYTES = 4 << 10  # an all-reduce that is nearly all latency
LATENCY_GEMMS = (4, (256, 512, 512))  # (how many, which shape) run while it is in flight
# What precedes each collective microbenchmark: a synchronisation, so that its time holds no time-slicing lag.
# Until 2026-12-07 it was a LEAD_GEMM whose lag (2-4 ms with 4 ranks on 2 cores) the fit took out of every
# collective, and the two estimates traded off launch by launch (docs/fit.md); samples without "after" are such.
COLLECTIVES_AFTER = "sync"
P2P_BYTES = [1 << 10, 16 << 10, 64 << 10, 256 << 10]  # a pipeline's activations on a small host: 64-128 KB
P2P_TAG = "calibration"
# Half the ranks run BESIDE_GEMMS GEMMs while the other half waits, then while it runs BESIDE_ALL_REDUCES all-reduces
# of BESIDE_BYTES in pairs, back to back (they outlast the GEMMs): what a rank moving bytes takes of the cores
BESIDE_GEMMS, BESIDE_ALL_REDUCES, BESIDE_BYTES = 4, 200, 64 << 10


def group_sizes(nproc: int) -> list[int]:
    sizes = [s for s in (2, 4, 8, 16) if s <= nproc and nproc % s == 0]
    return sizes + ([nproc] if nproc not in sizes and nproc > 1 else [])


def calibration_schedule(nproc: int, repeats: int = REPEATS) -> tuple[Schedule, dict[int, tuple[str, dict]]]:
    """The microbenchmark schedule and, per measured op id, (kind, params); each op `repeats` times."""
    w = ProgramWriter()
    what: dict[int, tuple[str, dict]] = {}
    sizes = group_sizes(nproc)
    everyone = f"g{nproc}" if nproc > 1 else None

    def sync(name: str) -> None:
        if everyone:
            synchronise(w, name, everyone)

    sync("sync.gemm")
    for rep in range(repeats):
        for (m, n, k), layout in itertools.product(GEMM_SHAPES, ("NN", "NT", "TN")):
            op = w.compute(f"gemm.{m}x{n}x{k}.{layout}.r{rep}", Gemm(m, n, k, layout, DTYPE))
            what[op] = ("gemm", {"m": m, "n": n, "k": k, "layout": layout})
    sync("sync.elementwise")
    for rep in range(repeats):
        for nbytes in ELEMENTWISE_BYTES:
            op = w.compute(f"ew.{nbytes}.r{rep}", Elementwise(nbytes))
            what[op] = ("elementwise", {"nbytes": nbytes})
    sync("sync.attention")
    for rep in range(repeats):
        for (b, h, s, d), backward in itertools.product(ATTENTION_SHAPES, (False, True)):
            work = Attention(b, s, h, d, backward=backward, causal=True, dtype=DTYPE)
            op = w.compute(f"attn.{b}x{h}x{s}x{d}.{'bwd' if backward else 'fwd'}.r{rep}", work)
            what[op] = ("attention", {"batch": b, "heads": h, "seq": s, "head_dim": d, "backward": backward})
    for size in sizes:
        axis = f"g{size}"
        sync(f"sync.{axis}")
        for rep in range(repeats):
            for kind, nbytes in itertools.product(COLLECTIVE_KINDS, COLLECTIVE_BYTES):
                sync(f"{kind}.{axis}.{nbytes}.r{rep}.before")  # together: no lag to take out (COLLECTIVES_AFTER)
                op = w.collective(f"{kind}.{axis}.{nbytes}.r{rep}", axis, Collective(kind, axis, nbytes, DTYPE))
                w.wait(op)
                w.compute(f"{kind}.{axis}.{nbytes}.r{rep}.done", Elementwise(TINY_BYTES))
                what[op] = ("collective", {"kind": kind, "group_size": size, "nbytes": nbytes,
                                           "after": COLLECTIVES_AFTER})
    if 2 in sizes:
        for rep in range(repeats):
            for nbytes in P2P_BYTES:
                sync(f"sync.p2p.{nbytes}.r{rep}")
                op = w.collective(f"p2p.{nbytes}.r{rep}", "g2", P2P("send", "g2", 1, nbytes, P2P_TAG),
                                  stream=f"p2p:{P2P_TAG}")
                w.wait(op)
                w.compute(f"p2p.{nbytes}.r{rep}.done", Elementwise(TINY_BYTES))
                what[op] = ("p2p", {"nbytes": nbytes})
    if everyone:
        sync("sync.skew")
        lag_section(w, what, everyone, repeats)
        m, n, k = OVERLAP_GEMM
        sync("sync.overlap")
        alone = w.collective("overlap.all_reduce.alone", everyone, Collective("all_reduce", everyone, OVERLAP_BYTES,
                                                                               DTYPE))
        w.wait(alone)
        w.compute("overlap.all_reduce.alone.done", Elementwise(TINY_BYTES))
        what[alone] = ("overlap_comm_alone", {"nbytes": OVERLAP_BYTES, "group_size": nproc})
        for rep in range(repeats):
            op = w.compute(f"overlap.alone.r{rep}", Gemm(m, n, k, "NN", DTYPE))
            what[op] = ("overlap_alone", {"m": m, "n": n, "k": k})
        big = w.collective("overlap.all_reduce", everyone, Collective("all_reduce", everyone, OVERLAP_BYTES, DTYPE))
        what[big] = ("overlap_comm", {"nbytes": OVERLAP_BYTES, "group_size": nproc})
        for rep in range(4 * repeats):
            op = w.compute(f"overlap.during.r{rep}", Gemm(m, n, k, "NN", DTYPE))
            what[op] = ("overlap_during", {"m": m, "n": n, "k": k})
        w.wait(big)
        w.compute("overlap.done", Elementwise(TINY_BYTES))
        count, (m, n, k) = LATENCY_GEMMS
        params = {"nbytes": LATENCY_BYTES, "group_size": nproc}
        for rep in range(repeats):
            sync(f"sync.latency.alone.r{rep}")
            alone = w.collective(f"latency.alone.r{rep}", everyone, Collective("all_reduce", everyone, LATENCY_BYTES,
                                                                                DTYPE))
            w.wait(alone)
            w.compute(f"latency.alone.r{rep}.done", Elementwise(TINY_BYTES))
            sync(f"sync.latency.r{rep}")
            during = w.collective(f"latency.r{rep}", everyone, Collective("all_reduce", everyone, LATENCY_BYTES, DTYPE))
            for g in range(count):
                op = w.compute(f"latency.gemm{g}.r{rep}", Gemm(m, n, k, "NN", DTYPE))
                what[op] = ("latency_gemm", {"m": m, "n": n, "k": k})
            w.wait(during)
            w.compute(f"latency.r{rep}.done", Elementwise(TINY_BYTES))
            what[alone], what[during] = ("latency_comm_alone", params), ("latency_comm", {**params, "gemms": count})
    groups = tuple(GroupAxis(f"g{s}", tuple(tuple(range(i, i + s)) for i in range(0, nproc, s))) for s in sizes)
    info = StepInfo(model="calibration", plan=None, label=f"microbenchmarks on {nproc} ranks", global_batch=1, seq=1,
                    flops_hardware=0.0, flops_model=0.0, memory_per_gpu_bytes=0.0)
    if 2 not in sizes:
        return Schedule(nproc, groups, (Program(tuple(range(nproc)), tuple(w.ops)),), info), what
    second = _beside_section(w, what, sync, nproc, repeats) if nproc % 4 == 0 else {}
    if second:
        pairs = tuple(pair for i in range(0, nproc, 4) for pair in ((i, i + 2), (i + 1, i + 3)))
        groups += (GroupAxis(BESIDE_AXIS, pairs),)
    programs = (Program(tuple(range(0, nproc, 2)), tuple(w.ops)),
                Program(tuple(range(1, nproc, 2)), tuple(second.get(op.id, _receiving(op)) for op in w.ops)))
    return Schedule(nproc, groups, programs, info), what


BESIDE_AXIS = "h"  # the pairs of the second program's ranks (1-3, 5-7, ...) that move bytes beside the first's GEMMs


def _beside_section(w: ProgramWriter, what: dict, sync, nproc: int, repeats: int) -> dict[int, Op]:
    """The core-share microbenchmark (BESIDE_GEMMS): written as the first program's ops, the even ranks, which
    compute; returns the second program's (the odd ranks') op at each id where it differs: a tiny op where the
    first computes, an all-reduce in its pairs where the first has a tiny op. Its GEMMs count only on the first
    program's ranks (`what`'s "program")."""
    second: dict[int, Op] = {}
    params = {"m": OVERLAP_GEMM[0], "n": OVERLAP_GEMM[1], "k": OVERLAP_GEMM[2], "computing": nproc // 2, "program": 0}
    work = Collective("all_reduce", BESIDE_AXIS, BESIDE_BYTES, DTYPE)
    for rep in range(repeats):
        for phase in ("idle", "moving"):
            sync(f"sync.beside.{phase}.r{rep}")
            for g in range(BESIDE_GEMMS):
                op = w.compute(f"beside.{phase}.r{rep}.gemm{g}", Gemm(*OVERLAP_GEMM, "NN", DTYPE))
                what[op] = (f"beside_{phase}", params)
                second[op] = replace(w.ops[op], name=f"beside.{phase}.r{rep}.tiny{g}", work=Elementwise(TINY_BYTES))
            for i in range(BESIDE_ALL_REDUCES if phase == "moving" else 0):
                op = w.compute(f"beside.r{rep}.tiny{i}", Elementwise(TINY_BYTES))
                second[op] = replace(w.ops[op], name=f"beside.r{rep}.ar{i}", stream=f"comm:{BESIDE_AXIS}", work=work)
                w.wait(op)
                w.compute(f"beside.r{rep}.ar{i}.done", Elementwise(TINY_BYTES))
    return second


def _receiving(op: Op) -> Op:
    """The pair's second rank's op where the first's is a send: the receive from it, at the same id (so one
    `what` names both programs' ops, and a sample is the mean of the send and the receive)."""
    if not (isinstance(op.work, P2P) and op.work.kind == "send"):
        return op
    return replace(op, work=replace(op.work, kind="recv", peer=-op.work.peer))


# ---- fitting ------------------------------------------------------------------------


@dataclass(frozen=True)
class Fit:
    kernel_overhead_s: float
    hbm_bw_bytes_per_s: float
    gemm_flop_per_s: float
    gemm_tile_m: int
    gemm_tile_n: int
    gemm_k_half: float
    layout_efficiency: dict
    attention_efficiency: float
    comm_compute_slowdown: float
    port_bw_bytes_per_s: float
    base_latency_s: float
    hop_latency_s: float
    rms_relative_error: dict  # per category, of the fit itself (rel_rms)
    attention_overhead_s: float = 0.0
    kind_latency_s: dict = field(default_factory=dict)  # collective kind -> latency above base_latency_s
    kind_bw_fraction: dict = field(default_factory=dict)  # collective kind -> bandwidth / port_bw
    timeslice_skew: float = 0.0  # the last rank's lag at a synchronisation per second of compute before it
    lead_skew_s: float = 0.0  # taken out of each collective sample: that lag behind LEAD_GEMM (oversubscribed)
    comm_stretch_under_compute: float = 1.0  # a collective's time while every rank computes / alone
    comm_latency_pace_under_compute: float | None = None  # a small collective's pace under its ranks' GEMMs; None: not measured
    p2p_latency_s: float | None = None  # a point-to-point transfer's latency; None: not measured (no pairs)
    timeslice_lag_s: float = 0.0  # the last rank's lag at a synchronisation beyond the skew's, after compute ...
    timeslice_lag_after_s: float = 0.0  # ... this long (linearly from 0 below it)
    comm_core_share: float | None = None  # of a core, a rank moving bytes beside others' compute; None: not measured
    timeslice_lag_span_s: float = 0.0  # the longest phase the line above was fitted on; 0: not measured ...
    timeslice_skew_beyond_span: float | None = None  # ... and the lag's growth per second of a phase past it


TILES = (1, 8, 16, 32, 64, 128, 256)
K_HALVES = (0.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
OVERHEADS_S = tuple(np.concatenate([[0.0], np.geomspace(1e-6, 3e-4, 50)]))


def _shape_eff(m, n, k, tm: int, tn: int, kh: float) -> np.ndarray:
    """twin.sim.compute's shape efficiency with compute_units = 1 (no wave term), normalised at 32768^3."""
    from twin.sim.compute import REFERENCE_GEMM_DIM as D

    def raw(m, n, k):
        tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
        return (m * n) / (tiles_m * tm * tiles_n * tn) * (k / (k + kh))

    return raw(np.asarray(m, float), np.asarray(n, float), np.asarray(k, float)) / raw(D, D, D)


def fit(samples: list[Sample], oversubscribed: bool = False, cores: float | None = None) -> Fit:
    """The simulator's parameters that best explain the samples (weighted least squares; module docstring).
    `oversubscribed`: at least as many ranks as cores, where the simulator delays the transfer after compute
    by the time-slicing lag; `cores`: the host's, for the share of a core a rank moving bytes takes."""
    by = {kind: [s for s in samples if s.kind == kind] for kind in {s.kind for s in samples}}
    ew, gm, at = by.get("elementwise", []), by.get("gemm", []), by.get("attention", [])
    if not ew or not gm:
        raise ValueError("calibration needs element-wise and GEMM measurements")
    ew_t, ew_w = relative_weights(ew)
    ew_b = np.array([s.params["nbytes"] for s in ew], float)
    g_t, g_w = relative_weights(gm)
    g_m, g_n, g_k = (np.array([s.params[d] for s in gm], float) for d in "mnk")
    g_f = 2 * g_m * g_n * g_k
    g_bytes = 2 * (g_m * g_k + g_k * g_n + g_m * g_n)  # twin.sim.compute counts 2-byte operands
    g_lay = np.array([s.params["layout"] for s in gm])
    a_t, a_w = relative_weights(at)
    a_f = np.array([Attention(s.params["batch"], s.params["seq"], s.params["heads"], s.params["head_dim"],
                              s.params["backward"], True).flops for s in at])
    effs = {(tm, tn, kh): _shape_eff(g_m, g_n, g_k, tm, tn, kh) for tm, tn, kh in itertools.product(TILES, TILES, K_HALVES)}
    best = None
    for o in OVERHEADS_S:
        inv_bw = scale_nonneg(ew_b, ew_t - o, ew_w)
        if inv_bw <= 0:
            continue
        ew_pred = o + ew_b * inv_bw
        mem = g_bytes * inv_bw
        g_best = None
        for shape, eff in effs.items():
            work = g_f / eff
            inv_rates, pred = {}, np.empty_like(g_t)
            for lay in ("NN", "NT", "TN"):
                sel = g_lay == lay
                inv_rates[lay] = mean_ratio(work[sel], g_t[sel] - o) or 1e-30
                pred[sel] = np.maximum(work[sel] * inv_rates[lay], mem[sel]) + o
            chi = chi2(pred, g_t, g_w)
            if g_best is None or chi < g_best[0]:
                g_best = (chi, shape, inv_rates, pred)
        g_chi, shape, inv_rates, g_pred = g_best
        fastest = min(inv_rates.values())
        a_over, inv_ae = nnls_weighted([np.ones_like(a_t), a_f * fastest], a_t - o, a_w) if at else (0.0, 1.0)
        a_eff = float(np.clip(1.0 / inv_ae, 1e-3, 1.0)) if inv_ae > 0 else 1.0
        a_pred = a_f * fastest / a_eff + a_over + o
        total = chi2(ew_pred, ew_t, ew_w) + g_chi + chi2(a_pred, a_t, a_w)
        if best is None or total < best[0]:
            errors = {"elementwise": rel_rms(ew_pred, ew_t, ew_w), "gemm": rel_rms(g_pred, g_t, g_w),
                      "attention": rel_rms(a_pred, a_t, a_w)}
            best = (total, o, 1.0 / inv_bw, 1.0 / fastest, shape, {lay: fastest / inv for lay, inv in inv_rates.items()},
                    a_eff, float(a_over), errors)
    if best is None:
        raise ValueError("calibration: the element-wise times leave no room for any bandwidth; measurements look broken")
    _, o, bw, rate, (tm, tn, kh), layouts, a_eff, a_over, errors = best

    lag = fit_skew(by.get("skew_lead", []), by.get("skew_sync", []), LEAD_GEMM, by.get("latency_comm_alone", []),
                   by.get("skew_long_gemm", []), by.get("skew_long_sync", []))
    led = [s.params.get("after", "gemm") == "gemm" for s in by.get("collective", [])]  # an older calibration's
    lead_skew = lag.after(lag.lead_s) if oversubscribed and any(led) else 0.0
    # (a sample shorter than the lag is noise: it keeps a twentieth of itself)
    collectives = [replace(s, time_s=max(s.time_s - lead_skew, 0.05 * s.time_s)) if behind else s
                   for s, behind in zip(by.get("collective", []), led)]
    port_bw, base, hop, kind_latency, kind_fraction = fit_collectives(collectives, errors)
    return Fit(float(o), float(bw), float(rate), tm, tn, float(kh), layouts, a_eff, comm_compute_slowdown(by),
               float(port_bw), float(base), float(hop), errors, a_over, kind_latency, kind_fraction, lag.skew,
               lead_skew, comm_stretch(by), latency_pace(by), fit_p2p_latency(by.get("p2p", []), port_bw, errors),
               lag.floor_s, lag.floor_after_s, mover_share(by, cores), lag.span_s, lag.beyond)
