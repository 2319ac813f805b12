"""The searches and simulations one `twin validate` runs, each cached on disk.

Each task (one search or simulation) is cached with the search results
(twin.search.cache), keyed by its inputs, the machine file and the
simulator's source, so a second `twin validate` only prints. A task sees the
machines as the validation running it does: the package's files, or the
files and --set numbers of a what-if (module settings, set by twin.validate
for the duration of one validation).

AxoNN's plan (axonn_plan) is the fastest of its communication model's top
MEASURED_TOP, simulated in order of the search's lower bound until the next
bound exceeds the fastest step found (fastest_simulated): the plan that
simulating all of them finds, at a fraction of the cost.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict
from typing import Callable, Iterator

from topologies.machine import Machine, load_machine
from topologies.overrides import Override
from twin.build import resolve_step
from twin.errors import TwinError
from twin.micro_batches import simulate_step
from twin.model import ModelSpec, get_model
from twin.plan import ParallelPlan, parse_plan
from twin.report import Summary
from twin.scale import scaling
from twin.search import cache
from twin.search.axonn_model import MEASURED_TOP, MIN_TP, Grid, comm_time_s
from twin.search.bound import BoundModel
from twin.search.rank import STOP_SLACK, bound_s, search
from twin.search.space import AXONN_AXES, AXONN_CODE, SearchSpace, enumerate_space, fixed_words

MACHINES = ("frontier", "perlmutter")  # the machine files the published rows run on

# What-if numbers per machine (`twin validate --set`), machine files in place of the package's (`--machine-file`)
# and the processes one simulated step may use (twin.micro_batches.simulate_step's `jobs`: its two short steps at
# once), for the duration of one validation (tasks_see); empty for the table the README shows. Module settings
# rather than arguments of every task, because the tasks also run in a forked process that inherits them.
_OVERRIDES: dict[str, tuple[Override, ...]] = {}
_FILES: dict[str, str] = {}
_STEP_JOBS: dict[str, int] = {"jobs": 1}
# Within one validation, each machine is loaded once, and the searches' bound model (with its collective
# lowerings) of the latest SHARED_KEPT (machine, GPU count) pairs is kept for the next task on the same GPUs: the
# validation's simulations of one size lower the collectives their plans share once, as twin search's do.
_SEEN: dict[str, dict] = {}  # "machines": name -> Machine, "bounds": (name, gpus) -> BoundModel; empty outside
SHARED_KEPT = 2


@contextmanager
def tasks_see(overrides: dict[str, tuple[Override, ...]], files: dict[str, str], step_jobs: int) -> Iterator[None]:
    """Within the block, tasks see the machines with these --set numbers and files, and a simulated step may use
    `step_jobs` processes; after it, the package's files and one process again."""
    _OVERRIDES.update(overrides)
    _FILES.update(files)
    _STEP_JOBS["jobs"] = step_jobs
    _SEEN.update(machines={}, bounds={})
    try:
        yield
    finally:
        _OVERRIDES.clear()
        _FILES.clear()
        _STEP_JOBS["jobs"] = 1
        _SEEN.clear()


def machine_for(name: str) -> Machine:
    """A machine as this validation sees it: its file (the package's, or --machine-file's) with its --set
    overrides, if any (within a validation, the same object every time)."""
    loaded = _SEEN.get("machines")
    if loaded is None:
        return load_machine(_FILES.get(name, name), _OVERRIDES.get(name, ()))
    if name not in loaded:
        loaded[name] = load_machine(_FILES.get(name, name), _OVERRIDES.get(name, ()))
    return loaded[name]


def shared_bounds(machine: Machine, gpus: int) -> BoundModel:
    """The bound model of `machine` and `gpus` that this validation's earlier tasks on them filled (a new one
    outside a validation, or for a machine not loaded by machine_for)."""
    kept = _SEEN.get("bounds")
    if kept is None or _SEEN["machines"].get(machine.name) is not machine:
        return BoundModel(machine, gpus)
    key = (machine.name, gpus)
    bounds = kept.pop(key, None) or BoundModel(machine, gpus)
    kept[key] = bounds  # the most recent last
    while len(kept) > SHARED_KEPT:
        del kept[next(iter(kept))]
    return bounds


def check_machine_files(files: dict[str, str]) -> None:
    """Each --machine-file NAME=PATH must be a machine file of NAME (the rows run on named machines)."""
    for name, path in files.items():
        if name not in MACHINES:
            raise TwinError(f"--machine-file {name}={path}: the published rows run on {' and '.join(MACHINES)}, "
                            f"not {name!r}")
        found = load_machine(path).name
        if found != name:
            raise TwinError(f"--machine-file {name}={path}: that file describes {found!r}; give a file of {name}")


def _cached(name: str, inputs: dict, machine: Machine, compute: Callable[[], dict], shape: type | None = None
            ) -> dict:
    """compute(), or its cached result (an entry not of `shape` is discarded and computed again)."""
    key = cache.cache_key(f"validate-{name}", inputs, cache.machine_text(machine))
    hit = cache.load("validate", key, shape=shape)
    if hit is not None:
        return hit
    doc = compute()
    cache.store("validate", key, doc)
    return doc


def paper_rate(model_name: str, global_batch: int, gpus: int, step_time_s: float) -> dict[str, float]:
    """A predicted step's throughput as the papers computed theirs: the recompute ("hardware") form of
    Narayanan's formula (reference/published.md, A and B) over the twin's step time.

    Not the Summary's achieved figure, which counts the FLOPs the schedule's ops
    execute (twin.report): a paper's formula figure set beside the twin's formula
    figure compares step times, which is what the twin really predicts."""
    per_gpu = get_model(model_name).flops_per_step(global_batch, "hardware") / step_time_s / gpus
    return {"pflops_total": per_gpu * gpus / 1e15, "tflops_per_gpu": per_gpu / 1e12}


def best_plan(machine_name: str, model_name: str, gpus: int, batch: int, space: SearchSpace, jobs: int | None) -> dict:
    """The search's best plan: its plan, step and throughput by the papers' formula (search results are cached
    by twin.search)."""
    result = search(get_model(model_name), gpus, batch, machine_for(machine_name), space, top=1, jobs=jobs)
    best = result.ranked[0]
    return {"plan": best.plan, "step_time_s": best.step_time_s, **paper_rate(model_name, batch, gpus, best.step_time_s),
            "candidates": result.candidates}


def axonn_plan(machine_name: str, model_name: str, gpus: int, batch: int) -> dict:
    """AxoNN's own way to a plan (module docstring): the fastest, simulated, of its model's top MEASURED_TOP."""
    machine, model = machine_for(machine_name), get_model(model_name)

    def compute() -> dict:
        space = SearchSpace(axes=AXONN_AXES, min_tp=MIN_TP.get(model_name, 1), fixed=AXONN_CODE)
        found = enumerate_space(model, gpus, batch, machine.device.hbm_bytes, space)
        by_grid = {Grid(c.plan.gx, c.plan.gy, c.plan.gz, c.plan.gdata): c.plan for c in found.candidates}
        if not by_grid:
            raise TwinError(f"no plan of {model_name} fits on {gpus} {machine_name} GPUs under AxoNN's constraints")
        ranked = sorted(by_grid, key=lambda g: (comm_time_s(model, g, batch, machine_name), g.describe()))
        top = [by_grid[g] for g in ranked[:MEASURED_TOP]]
        best = fastest_simulated(model, top, machine, gpus)
        return {"plan": best.plan, "step_time_s": best.step_time_s,
                **paper_rate(model_name, best.global_batch, gpus, best.step_time_s), "candidates": len(top)}

    inputs = {"model": model_name, "gpus": gpus, "batch": batch, "top": MEASURED_TOP, "with": fixed_words(AXONN_CODE)}
    return _cached("axonn-plan", inputs, machine, compute)


def fastest_simulated(model: ModelSpec, plans: list[ParallelPlan], machine: Machine, gpus: int) -> Summary:
    """The step of the fastest of `plans` (the earliest of equals), as simulating every one finds it.

    Plans are simulated in order of their lower bound; once the next bound
    exceeds the fastest step so far, no plan left can be as fast (a bound is
    never above its step, to STOP_SLACK), so none is simulated."""
    bounds = shared_bounds(machine, gpus)
    lower = [bound_s(model, plan, machine, gpus, bounds) for plan in plans]
    best: tuple[float, int, Summary] | None = None
    for i in sorted(range(len(plans)), key=lambda i: (lower[i], i)):
        if best is not None and lower[i] > best[0] * (1 + STOP_SLACK):
            break
        step = cached_step(model, plans[i], machine, gpus)
        if best is None or (step.step_time_s, i) < best[:2]:
            best = (step.step_time_s, i, step)
    if best is None:
        raise ValueError("fastest_simulated: no plans given")
    return best[2]


def cached_step(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int) -> Summary:
    """One simulated step, cached by its resolved plan: a row and the scaling curves that start from the same
    run (the Frontier paper's 1T on 1,024 GCDs is in three rows) simulate it once. Its collectives are lowered
    on the validation's shared model of the machine and GPU count (shared_bounds)."""
    resolved, _ = resolve_step(model, plan, machine, gpus)
    inputs = {"model": asdict(model), "gpus": gpus, "plan": resolved.describe(), "batch": resolved.global_batch}

    def compute() -> dict:
        return asdict(simulate_step(model, resolved, machine, gpus, shared_bounds(machine, gpus).collectives,
                                    jobs=_STEP_JOBS["jobs"]))

    return Summary(**_cached("step", inputs, machine, compute, shape=Summary))


def simulate_plan(machine_name: str, model_name: str, gpus: int, plan_text: str, batch: int) -> dict:
    s = cached_step(get_model(model_name), parse_plan(f"{plan_text},global_batch={batch}"),
                    machine_for(machine_name), gpus)
    return {"plan": s.plan, "step_time_s": s.step_time_s, **paper_rate(model_name, s.global_batch, gpus, s.step_time_s),
            "compute_s": s.compute_s}


def scaling_points(model_name: str, plan_text: str, batch: int, counts: list[int], mode: str) -> list[dict]:
    """The Frontier paper's scaling curves. Its weak-scaling efficiency is of its reported TF/s per GCD, a
    formula figure: each point's throughput, and the weak efficiency, are the papers' formula over the step
    (paper_rate); strong efficiency is of step times alone, as twin.scale computes it."""
    plan = parse_plan(f"{plan_text},global_batch={batch}")
    points = [asdict(p) for p in scaling(get_model(model_name), plan, machine_for("frontier"), counts, mode,
                                         step=cached_step)]
    for p in points:
        p.update(paper_rate(model_name, p["global_batch"], p["gpus"], p["step_time_s"]))
    if mode == "weak":
        for p in points:
            p["efficiency"] = p["tflops_per_gpu"] / points[0]["tflops_per_gpu"]
    return points
