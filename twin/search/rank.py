"""Rank every valid plan by simulated step time, simulating as few as the ranking allows.

1. twin.search.space lists every valid plan that fits in memory;
2. twin.search.bound gives each a lower bound on its simulated step (ms each);
   a plan with many micro-batches is bounded and simulated at two short
   micro-batch counts and continued linearly (twin.micro_batches), which
   keeps a 128-GPU search of a 16.8M-token batch fast; the bound's terms,
   each linear in micro-batches and in layers, are also computed on models
   of 2 and 3 layers per stage and continued (_layer_continued), before the
   largest is taken;
3. plans are simulated in order of their bound; once the next bound exceeds
   the k-th best simulated step, no plan left can enter the top k, and the
   search stops (branch and bound). With `exhaustive` every plan is simulated.

Because the bound is a true lower bound of the same simulator, the top k is
the one exhaustive simulation gives (tests/test_search.py checks it); the
result says how many plans were simulated and how many were ruled out by
their bound alone. Results are cached on disk (twin.search.cache).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from topologies.machine import Machine
from twin.build import build_step
from twin.errors import TwinError
from twin.micro_batches import continued, extended, simulate_step
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.search import cache
from twin.search.bound import BoundModel
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


def search(model: ModelSpec, gpus: int, global_batch: int, machine: Machine, space: SearchSpace | None = None,
           top: int = 10, exhaustive: bool = False, progress: Progress | None = None,
           use_cache: bool = True, jobs: int | None = None) -> SearchResult:
    """The `top` fastest valid plans (fewer if fewer exist), best first; `jobs` processes (default: every core)."""
    jobs = jobs or os.cpu_count() or 1
    space = space or SearchSpace()
    if top < 1:
        raise TwinError(f"--top {top} must be at least 1")
    if gpus > machine.max_gpus:
        raise TwinError(f"--gpus {gpus} exceeds {machine.name}'s {machine.max_gpus} GPUs; use at most that many")
    inputs = {"model": asdict(model), "gpus": gpus, "global_batch": global_batch, "space": asdict(space),
              "top": top, "exhaustive": exhaustive}
    key = cache.cache_key("search", inputs, cache.machine_text(machine))
    if use_cache:
        hit = cache.load("search", key)
        if hit is not None:
            return replace(SearchResult.from_json_dict(hit), cached=True)
    start = time.perf_counter()
    found = enumerate_space(model, gpus, global_batch, machine.device.hbm_bytes, space)
    if not found.candidates:
        raise TwinError(explain_empty(found, model, gpus, global_batch, machine.device.hbm_bytes / 1e9))
    plans = [c.plan for c in found.candidates]
    with _Workers(model, machine, gpus, jobs) as workers:
        bounds = workers.bounds(plans, progress)
        order = sorted(range(len(plans)), key=lambda i: (bounds[i], i))
        results = workers.branch_and_bound(plans, bounds, order, top, exhaustive, progress)
    ranked = sorted((RankedPlan(r.plan, r.step_time_s, r.pflops_total, r.tflops_per_gpu,
                                found.candidates[i].memory_bytes / 1e9, r.exposed_comm_s, bounds[i])
                     for i, r in results.items()), key=lambda r: (r.step_time_s, r.plan))
    landscape = [PlanPoint(plans[i].describe(), bounds[i], found.candidates[i].memory_bytes / 1e9,
                           results[i].step_time_s if i in results else None) for i in order]
    result = SearchResult(machine.name, model.name, gpus, global_batch, model.seq, space.describe(),
                          len(plans), len(results), ranked[:top], exhaustive, time.perf_counter() - start, landscape)
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


# Each worker process evaluates plans for one (model, machine, GPU count); its BoundModel (and the
# CollectiveModel inside, whose lowerings simulations share) lives as long as the worker.
_WORKER: dict = {}


def _init_worker(model: ModelSpec, machine: Machine, gpus: int) -> None:
    _WORKER.update(model=model, machine=machine, gpus=gpus, bounds=BoundModel(machine, gpus))


def _layer_continued(model: ModelSpec, plan: ParallelPlan,
                     terms: Callable[[ModelSpec], tuple[float, ...]]) -> tuple[float, ...]:
    """`terms` of the full model, from models of 2 and 3 layers per pipeline stage continued linearly.

    Each bound term is a sum over a program's ops (the longest path, compute
    and communication time, a link's bytes), and every further layer adds the
    same ops, so the terms grow by the same amount per layer: exactly, to
    rounding (tests/test_search.py checks it). Building and bounding 5 layers
    instead of 96 is what keeps bounding every plan of a 32,768-GPU search cheap.
    """
    unit = plan.pp * plan.vpp
    short, longer = 2 * unit, 3 * unit
    if model.layers % unit or model.layers <= longer + unit:
        return terms(model)
    return extended(terms(replace(model, layers=short)), terms(replace(model, layers=longer)),
                    (model.layers - longer) // unit)


def _bound_terms(plan: ParallelPlan) -> tuple[float, ...]:
    """Every program's bound terms for `plan`, continued over micro-batches and layers; the bound is their largest
    (each term is continued on its own: the largest of several lines is not itself a line)."""
    w = _WORKER
    # A long 1F1B pipeline's middle stages repeat the second stage's work: only the first, second and last
    # stages are built (the bound of a subset of programs still bounds the step; see pipeline_terms_s).
    stages = (0, 1, plan.pp - 1) if plan.pp > 3 and plan.vpp == 1 else None

    def terms(p: ParallelPlan) -> tuple[float, ...]:
        return _layer_continued(w["model"], p, lambda model: w["bounds"].terms_s(
            build_step(model, p, w["machine"], w["gpus"], stages).schedule))

    return continued(plan, terms)


def _bound_of(plan: ParallelPlan) -> float:
    return max(_bound_terms(plan))


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

    def bounds(self, plans: list[ParallelPlan], progress: Progress | None) -> list[float]:
        if self._pool is None:
            out = []
            for plan in plans:
                out.append(_bound_of(plan))
                if progress:
                    progress("bounding", len(out), len(plans))
            return out
        out = []
        chunk = max(1, len(plans) // (8 * self.jobs))
        for value in self._pool.map(_bound_of, plans, chunksize=chunk):
            out.append(value)
            if progress:
                progress("bounding", len(out), len(plans))
        return out

    def branch_and_bound(self, plans, bounds, order, top, exhaustive, progress) -> dict[int, _Simulated]:
        """Simulate in bound order until the next bound exceeds the top-th best step (all of them if exhaustive).

        Up to `jobs` simulations run at once; a plan is skipped only when its
        bound exceeds the top-th best step found so far, which only falls,
        so running ahead never drops a plan that belongs in the top.
        """
        results: dict[int, _Simulated] = {}

        def kth_best() -> float:
            if len(results) < top:
                return float("inf")
            return sorted(r.step_time_s for r in results.values())[top - 1] * (1 + STOP_SLACK)

        queue = list(order)
        if self._pool is None:
            for i in queue:
                if not exhaustive and bounds[i] > kth_best():
                    break
                results[i] = _simulate_plan(plans[i])
                if progress:
                    progress("simulating", len(results), len(plans))
            return results
        running: dict = {}
        while queue or running:
            while queue and len(running) < self.jobs and (exhaustive or bounds[queue[0]] <= kth_best()):
                i = queue.pop(0)
                running[self._pool.submit(_simulate_plan, plans[i])] = i
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = future.result()
                if progress:
                    progress("simulating", len(results), len(plans))
        return results
