"""Rank every valid plan by simulated step time, simulating as few as the ranking allows.

1. twin.search.space lists every valid plan that fits in memory;
2. twin.search.screen gives each a cheap lower bound, its layers' compute
   (microseconds a plan, milliseconds a tensor-parallel grid);
3. plans are taken in order of their best known bound. A plan bounded by
   its layers' compute alone gets the whole screening bound (its grid's
   collectives too, lowered once per grid when a plan of it first comes
   up); a plan with only its screening bound gets the full one
   (twin.search.bound, 0.1-0.3 s: the longest path, communication, the
   busiest link, the pipeline's bubble), and each goes back in line under
   the largest bound it has; a plan with its full bound
   is simulated. A plan with many micro-batches is bounded and simulated at
   two short micro-batch counts and continued linearly (twin.micro_batches),
   and the full bound's terms, each linear in micro-batches and in layers,
   are computed on models of 2 and 3 layers per stage and continued
   (_layer_continued);
4. once the next bound in line exceeds the k-th best simulated step, no plan
   left can enter the top k, and the search stops (branch and bound). With
   `exhaustive` every plan is bounded and simulated.

Because both bounds are true lower bounds of the same simulator, the top k
is the one exhaustive simulation gives (tests/test_search.py checks it); the
result says how many plans got the full bound, how many were simulated, and
so how many were ruled out by a bound alone. Results are cached on disk
(twin.search.cache).
"""

from __future__ import annotations

import heapq
import multiprocessing
import os
import time
from bisect import bisect_right, insort
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from topologies.machine import Machine
from twin.build import build_stages, build_step
from twin.collector import infrequent
from twin.errors import TwinError
from twin.micro_batches import continued, extended, simulate_step
from twin.model import ModelSpec
from twin.pipeline_split import extra_slots
from twin.plan import ParallelPlan
from twin.search import cache
from twin.search.bound import BoundModel
from twin.search.screen import ScreenModel, grid_plan, screen_bound_s
from twin.search.space import SearchSpace, enumerate_space, explain_empty

STOP_SLACK = 1e-9  # bounds and steps are sums in different orders: equal within rounding


@dataclass(frozen=True)
class RankedPlan:
    plan: str
    step_time_s: float
    pflops_total: float
    tflops_per_gpu: float
    memory_per_gpu_gb: float
    exposed_comm_s: float
    bound_s: float


@dataclass(frozen=True)
class PlanPoint:
    """One valid plan of the landscape: its bound, and its simulated step when it was simulated."""

    plan: str
    bound_s: float
    memory_per_gpu_gb: float
    step_time_s: float | None


@dataclass(frozen=True)
class SearchResult:
    machine: str
    model: str
    gpus: int
    global_batch: int
    seq: int
    space: str
    candidates: int
    simulated: int
    ranked: list[RankedPlan]  # the top k, best first
    exhaustive: bool
    wall_s: float
    landscape: list[PlanPoint] = field(default_factory=list)
    cached: bool = False
    bounded: int = 0  # plans given the full bound (the others were ruled out by the screening bound)

    def to_json_dict(self, landscape: bool = False) -> dict:
        doc = asdict(self)
        if not landscape:
            doc.pop("landscape")
        return doc

    @staticmethod
    def from_json_dict(doc: dict) -> "SearchResult":
        doc = dict(doc)
        doc["ranked"] = [RankedPlan(**r) for r in doc["ranked"]]
        doc["landscape"] = [PlanPoint(**p) for p in doc.get("landscape", [])]
        return SearchResult(**doc)


Progress = Callable[[str, int, int], None]  # (phase, done, total)


def worker_count(jobs: int | None) -> int:
    """--jobs as a process count: every core this process may use when not given, and never more (more
    processes than cores only slow the simulations down, and a thousand forks exhaust memory); a one-line error
    below 1."""
    if jobs is not None and jobs < 1:
        raise TwinError(f"--jobs {jobs} must be at least 1 (or leave it out: every core)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(jobs or cores, cores)


@infrequent()
def search(model: ModelSpec, gpus: int, global_batch: int, machine: Machine, space: SearchSpace | None = None,
           top: int = 10, exhaustive: bool = False, progress: Progress | None = None,
           use_cache: bool = True, jobs: int | None = None) -> SearchResult:
    """The `top` fastest valid plans (fewer if fewer exist), best first; `jobs` processes (default: every core)."""
    jobs = worker_count(jobs)
    space = space or SearchSpace()
    if top < 1:
        raise TwinError(f"--top {top} must be at least 1")
    if gpus > machine.max_gpus:
        raise TwinError(f"--gpus {gpus} exceeds {machine.name}'s {machine.max_gpus} GPUs; use at most that many")
    inputs = {"model": asdict(model), "gpus": gpus, "global_batch": global_batch, "space": asdict(space),
              "top": top, "exhaustive": exhaustive}
    key = cache.cache_key("search", inputs, cache.machine_text(machine))
    if use_cache:
        hit = cache.load("search", key, shape=SearchResult)
        if hit is not None:
            return replace(SearchResult.from_json_dict(hit), cached=True)
    start = time.perf_counter()
    found = enumerate_space(model, gpus, global_batch, machine.device.hbm_bytes, space)
    if not found.candidates:
        raise TwinError(explain_empty(found, model, gpus, global_batch, machine.device.hbm_bytes / 1e9))
    plans = [c.plan for c in found.candidates]
    with _Workers(model, machine, gpus, jobs) as workers:
        searched = workers.branch_and_bound(plans, workers.work_s(plans, progress), top, exhaustive, progress)
    results = searched.results
    best_bound = [searched.best_bound(i) for i in range(len(plans))]
    order = sorted(range(len(plans)), key=lambda i: (best_bound[i], i))
    ranked = sorted((RankedPlan(r.plan, r.step_time_s, r.pflops_total, r.tflops_per_gpu,
                                found.candidates[i].memory_bytes / 1e9, r.exposed_comm_s, best_bound[i])
                     for i, r in results.items()), key=lambda r: (r.step_time_s, r.plan))
    landscape = [PlanPoint(plans[i].describe(), best_bound[i], found.candidates[i].memory_bytes / 1e9,
                           results[i].step_time_s if i in results else None) for i in order]
    result = SearchResult(machine.name, model.name, gpus, global_batch, model.seq, space.describe(),
                          len(plans), len(results), ranked[:top], exhaustive, time.perf_counter() - start, landscape,
                          bounded=len(searched.bounds))
    if use_cache:
        cache.store("search", key, result.to_json_dict(landscape=True))
    return result


@dataclass(frozen=True)
class _Simulated:
    plan: str
    step_time_s: float
    pflops_total: float
    tflops_per_gpu: float
    exposed_comm_s: float


@dataclass
class _Searched:
    """What the lazy search learned, by plan index: each plan's bound by its layers' compute alone (`firsts`),
    and the screening bounds, full bounds and simulations it went on to compute."""

    firsts: list[float]
    screens: dict[int, float] = field(default_factory=dict)
    bounds: dict[int, float] = field(default_factory=dict)
    results: dict[int, _Simulated] = field(default_factory=dict)

    def best_bound(self, i: int) -> float:
        return max(self.firsts[i], self.screens.get(i, 0.0), self.bounds.get(i, 0.0))


# Each worker process evaluates plans for one (model, machine, GPU count); its BoundModel (and the
# CollectiveModel inside, whose lowerings simulations share) lives as long as the worker.
_WORKER: dict = {}


def _init_worker(model: ModelSpec, machine: Machine, gpus: int) -> None:
    bounds = BoundModel(machine, gpus)
    _WORKER.update(model=model, machine=machine, gpus=gpus, bounds=bounds, screen=ScreenModel(model, bounds))


def _work_s(grid: ParallelPlan) -> float:
    return _WORKER["screen"].work_s(grid)


def _chains_s(grid: ParallelPlan) -> tuple[float, float, float]:
    return _WORKER["screen"].chains_s(grid)


def _layer_continued(model: ModelSpec, plan: ParallelPlan,
                     terms: Callable[[ModelSpec], tuple[float, ...]]) -> tuple[float, ...]:
    """`terms` of the full model, from models of 2 and 3 layers per model chunk continued linearly (slots, where
    the embedding and the loss count as layers: twin.pipeline_split; rcl + 1 and rcl + 2 where only the first rcl
    layers of each chunk recompute, cache + 2 and cache + 3 where the first `cache` keep their gathered weights).

    Each bound term is a sum over a program's ops (the longest path, compute
    and communication time, a link's bytes), and every further layer adds the
    same ops, so the terms grow by the same amount per layer: exactly, to
    rounding (tests/test_search.py checks it). Building and bounding 5 layers
    instead of 96 is what keeps bounding every plan of a 32,768-GPU search cheap.
    """
    unit, extra = plan.pp * plan.vpp, extra_slots(plan)  # extra: the embedding's and the loss's slots (pemb, ploss)
    # per chunk at least one layer more than recompute (rcl), two more than cache (the busiest link of one
    # uncached layer can be another than of many): the layers added from there on recompute and cache nothing
    base = max(2, plan.rcl + 1, plan.cache + 2 if plan.cache else 0)
    short, longer = base * unit - extra, (base + 1) * unit - extra
    if (model.layers + extra) % unit or model.layers <= longer + unit:
        return terms(model)
    return extended(terms(replace(model, layers=short)), terms(replace(model, layers=longer)),
                    (model.layers - longer) // unit)


def bound_terms(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int,
                bounds: BoundModel) -> tuple[float, ...]:
    """Every program's bound terms for `plan`, continued over micro-batches and layers; the bound is their largest
    (each term is continued on its own: the largest of several lines is not itself a line)."""
    # A long 1F1B pipeline's middle stages repeat the second stage's work: only the first, second and last
    # stages are built (the bound of a subset of programs still bounds the step; see pipeline_terms_s).
    stages = (0, 1, plan.pp - 1) if plan.pp > 3 and plan.vpp == 1 else None

    def built(short: ModelSpec, p: ParallelPlan):
        if stages is None:
            return build_step(short, p, machine, gpus).schedule
        return build_stages(short, p, machine, gpus, stages).schedule

    def terms(p: ParallelPlan) -> tuple[float, ...]:
        return _layer_continued(model, p, lambda short: bounds.terms_s(built(short, p)))

    return continued(plan, terms)


def bound_s(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int, bounds: BoundModel) -> float:
    """The full lower bound of `plan`'s simulated step (module docstring, 3): never above what
    twin.micro_batches.simulate_step gives, to STOP_SLACK."""
    return max(bound_terms(model, plan, machine, gpus, bounds))


def _bound_of(plan: ParallelPlan) -> float:
    w = _WORKER
    return bound_s(w["model"], plan, w["machine"], w["gpus"], w["bounds"])


def _simulate_plan(plan: ParallelPlan) -> _Simulated:
    w = _WORKER
    s = simulate_step(w["model"], plan, w["machine"], w["gpus"], collectives=w["bounds"].collectives)
    return _Simulated(plan.describe(), s.step_time_s, s.pflops_total, s.tflops_per_gpu, s.exposed_comm_s)


class _Workers:
    """Bounds and simulations in `jobs` processes (forked: the inputs are inherited, not pickled), or inline."""

    def __init__(self, model: ModelSpec, machine: Machine, gpus: int, jobs: int) -> None:
        self.jobs = max(1, jobs)
        self._args = (model, machine, gpus)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> "_Workers":
        if self.jobs > 1 and "fork" in multiprocessing.get_all_start_methods():
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("fork"),
                                             initializer=_init_worker, initargs=self._args)
        else:
            _init_worker(*self._args)
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)

    def _submit(self, fn: Callable, arg) -> Future:
        if self._pool is not None:
            return self._pool.submit(fn, arg)
        future: Future = Future()
        future.set_result(fn(arg))
        return future

    def work_s(self, plans: list[ParallelPlan], progress: Progress | None) -> dict[ParallelPlan, float]:
        """W of every plan's tensor-parallel grid (twin.search.screen), by grid."""
        grids = list(dict.fromkeys(grid_plan(p) for p in plans))
        if self._pool is None:
            values = map(_work_s, grids)
        else:
            values = self._pool.map(_work_s, grids, chunksize=max(1, len(grids) // (8 * self.jobs)))
        work: dict[ParallelPlan, float] = {}
        for grid, value in zip(grids, values):
            work[grid] = value
            if progress:
                progress("screening", len(work), len(grids))
        return work

    def branch_and_bound(self, plans: list[ParallelPlan], work: dict[ParallelPlan, float], top: int,
                         exhaustive: bool, progress: Progress | None) -> _Searched:
        """The lazy search of the module docstring, from each plan's bound by its grid's W alone.

        Up to `jobs` grids' collective chains, bounds and simulations run at
        once. A plan is passed over only when its best known bound exceeds
        the top-th best step found so far, which only falls, so running
        ahead never drops a plan that belongs in the top.
        """
        model, gpn = self._args[0], self._args[1].node.gpus_per_node
        out = _Searched([screen_bound_s(model, plan, (work[grid_plan(plan)], 0.0, 0.0, 0.0), gpn) for plan in plans])
        chains: dict[ParallelPlan, tuple[float, float, float]] = {}
        waiting: dict[ParallelPlan, list[int]] = {}  # grid -> plans waiting for a worker's C, S and K of it
        line = [(first, i) for i, first in enumerate(out.firsts)]
        heapq.heapify(line)
        screen_keys: list[float] = []  # best known bounds once screened, and once fully bounded: progress totals
        full_keys: list[float] = []
        steps: list[float] = []

        def kth_best() -> float:
            return steps[top - 1] * (1 + STOP_SLACK) if len(steps) >= top else float("inf")

        def screened(i: int) -> None:
            grid = grid_plan(plans[i])
            out.screens[i] = screen_bound_s(model, plans[i], (work[grid], *chains[grid]), gpn)
            insort(screen_keys, out.best_bound(i))
            heapq.heappush(line, (out.best_bound(i), i))

        running: dict[Future, tuple[str, Any]] = {}
        while line or running:
            while line and len(running) < self.jobs and (exhaustive or line[0][0] <= kth_best()):
                _, i = heapq.heappop(line)
                if i in out.bounds:
                    running[self._submit(_simulate_plan, plans[i])] = ("step", i)
                elif i in out.screens:
                    running[self._submit(_bound_of, plans[i])] = ("bound", i)
                elif (grid := grid_plan(plans[i])) in chains:
                    screened(i)
                elif grid in waiting:
                    waiting[grid].append(i)
                else:
                    waiting[grid] = [i]
                    running[self._submit(_chains_s, grid)] = ("chains", grid)
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                (kind, what), value = running.pop(future), future.result()
                if kind == "chains":
                    chains[what] = value
                    for i in waiting.pop(what):
                        screened(i)
                elif kind == "step":
                    out.results[what] = value
                    insort(steps, value.step_time_s)
                else:
                    out.bounds[what] = value
                    insort(full_keys, out.best_bound(what))
                    heapq.heappush(line, (out.best_bound(what), what))
            if progress:  # totals: the plans whose bound is still within reach of the top
                cut = kth_best()
                progress("bounding", len(out.bounds), max(len(out.bounds), bisect_right(screen_keys, cut)))
                progress("simulating", len(out.results), max(len(out.results), bisect_right(full_keys, cut)))
        return out
