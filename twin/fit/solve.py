"""Fit a machine's remaining costs to measured runs: passes of simulation and least squares.

A pass simulates the runs once at the current parameters and keeps each
one's critical-path costs (twin.fit.paths); bounded least squares (Levenberg-
Marquardt on log-parameters, projected on the bounds) then moves the
parameters to minimise the squared relative step errors of that surrogate,
which is exact until the critical path itself moves. So a pass may move no
parameter by more than a factor of TRUST, and the next pass re-simulates
where it ended. Passes stop at a fixed point: when the least squares on a
pass's simulations moves no parameter by CONVERGED, that pass's parameters
are the fit, and its simulated errors are the ones reported. On a large file
the first passes simulate every SUBSET_STRIDE-th run, to within
SUBSET_CONVERGED (the passes over all of them re-solve anyway); the last
ones all.

The fit is refused, with one line saying why, when it is degenerate: a
parameter ends on its bound, a parameter has no effect on any run, two
parameters move the runs alike (their columns of the Jacobian are nearly
parallel), so the runs cannot tell them apart, or a parameter's standard
error is more than half its value, so the runs leave even its size open.
Each value comes with a standard error from the Jacobian at the solution,
and the fit with a k-fold
cross-validated error: each fold's parameters are fitted without its runs,
on the final pass's surrogate, and predict them there (the surrogate matches
simulation to a fraction of a percent near the fit; tests check it). A fold
takes whole groups of runs that repeat one micro-batch (the same model and
plan at other data-parallel degrees or batches: `repeat_key`), so a held-out
run is a plan the fit has not seen.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from topologies.machine import Machine, load_machine
from topologies.overrides import Override
from twin.collector import infrequent
from twin.errors import TwinError
from twin.fit.least_squares import jacobian, least_squares
from twin.fit.params import FitParameter, file_value
from twin.fit.paths import PathCosts, combined, step_plans
from twin.fit.workers import SimulationWorkers, cached_machine
from twin.ir import Work
from twin.runs import MeasuredRun
from twin.sim.compute import ComputeModel

CONVERGED = 0.005  # relative parameter change below which another pass would not move the path
IMPROVED = 1e-3  # a pass must lower the simulated squared error by this fraction to go on
MAX_PASSES = 8
UNDETERMINED = 0.5  # standard error / value above which a fitted number is refused (zero within 2 sigma)
PARALLEL_COLUMNS = 0.995  # |cosine| between two Jacobian columns above which the runs cannot tell them apart


@dataclass
class FitResult:
    """What a fit found, and how well it predicts."""

    machine: str
    params: tuple[FitParameter, ...]
    start: tuple[float, ...]  # the machine file's values
    values: tuple[float, ...]
    std: tuple[float, ...]  # standard errors, in the file's units
    runs: list[MeasuredRun]
    errors_before: np.ndarray  # simulated relative step errors at the file's values, of the first pass's runs
    errors_after: np.ndarray  # at the fitted values
    cv_errors: np.ndarray | None  # each run simulated at the parameters of the fold that left it out
    folds: int
    passes: int
    wall_s: float
    dropped: tuple[str, ...] = ()  # default parameters left out: no run depends on them


# ---------------------------------------------------------------- simulation passes

def simulate_runs(runs: list[MeasuredRun], machine_name: str, overrides: list[tuple[Override, ...]], jobs: int,
                  progress: Callable | None = None, workers: SimulationWorkers | None = None,
                  refused: dict[int, str] | None = None) -> list[PathCosts | None]:
    """Every run simulated at its own overrides, in `jobs` processes (or `workers`, which outlive the call: a
    fit's passes); a TwinError naming the first run that fails. With `refused` (a prediction's, never a fit's)
    a run the twin refuses (a plan its memory model says cannot fit, though it ran) is left out instead: its
    entry is None and `refused[i]` says why.

    Runs that differ only in their number of micro-batches share their short simulations (twin.fit.paths), so
    each distinct simulation runs once."""
    wanted: list[tuple[tuple, ...]] = []
    extras = []
    for i, (run, o) in enumerate(zip(runs, overrides)):
        try:
            plans, extra = ((run.schedule,), 0) if run.schedule else step_plans(run.model, run.plan,
                                                                                 cached_machine(machine_name, o),
                                                                                 run.gpus)
        except TwinError as e:
            if refused is None:
                raise TwinError(f"{run.where}: {e}") from None
            refused[i], plans, extra = str(e), (), 0
        wanted.append(tuple((machine_name, o, run.model, p, run.gpus) for p in plans))
        extras.append(extra)
    tasks = list(dict.fromkeys(t for ts in wanted for t in ts))
    with SimulationWorkers(jobs) if workers is None else nullcontext(workers) as pool:
        results = pool.simulate(tasks)
        results = list(progress(results, total=len(tasks)) if progress else results)
    done = dict(zip(tasks, results))
    out = []
    for run, ts, extra in zip(runs, wanted, extras):
        costs = tuple(done[t] for t in ts)
        failed = next((c for c in costs if isinstance(c, str)), None)
        if failed is not None:
            raise TwinError(f"{run.where}: {failed}")
        out.append(combined(costs, extra) if costs else None)  # type: ignore[arg-type]
    return out


# ---------------------------------------------------------------- the surrogate

class Surrogate:
    """Step times of many runs as functions of the fitted parameters, from the PathCosts of one or more passes.

    A critical path found at some parameters is still a chain of dependent ops at any others, so its cost
    there is a lower bound on the step: with the paths of several passes, each run's step is the largest of its
    paths' costs. Exact at every simulated point, it lets the fit see where another path takes over instead of
    overshooting past it and coming back a pass later. (For a link level the bound holds to first order: a
    transfer's share of its contended links is kept as simulated, and compute it overlaps is not slowed for
    longer; the next pass re-simulates both.)
    """

    def __init__(self, passes: list[list[PathCosts]], machine_name: str, base: tuple[Override, ...],
                 params: tuple[FitParameter, ...]) -> None:
        self.machine_name, self.base, self.params = machine_name, base, params
        self.n = len(passes[0])
        index: dict[Work, int] = {}
        rows, works, stretch = [], [], []
        flat = [p for paths in passes for p in paths]  # pass k's run i is entry k * n + i
        for i, p in enumerate(flat):
            for w, st in zip(p.works, p.stretch):
                rows.append(i)
                works.append(index.setdefault(w, len(index)))
                stretch.append(st)
        self.works = list(index)
        self.rows, self.work_of, self.stretch = np.array(rows, int), np.array(works, int), np.array(stretch)
        self.constant = np.array([p.constant_s for p in flat])
        self.launches = np.array([p.launches for p in flat])
        self.levels = list(dict.fromkeys(level for p in flat for level, _ in p.link_work))
        self.link_work = np.zeros((len(flat), len(self.levels)))
        for i, p in enumerate(flat):
            for level, work in p.link_work:
                self.link_work[i, self.levels.index(level)] += work

    def steps(self, log_values: np.ndarray) -> np.ndarray:
        """Every run's step at parameters exp(log_values)."""
        overrides = self.base + _overrides(self.params, log_values)
        machine = load_machine(self.machine_name, overrides)
        compute = ComputeModel(machine.device)
        durations = np.array([compute.duration_s(w) for w in self.works])
        inverse_efficiency = np.array([1.0 / machine.node.link_efficiency[level] for level in self.levels])
        per_path = (self.constant + self.launches * compute.device.launch_interval_s
                    + np.bincount(self.rows, self.stretch * durations[self.work_of], minlength=len(self.constant))
                    + self.link_work @ inverse_efficiency)
        return per_path.reshape(-1, self.n).max(axis=0)


def _degeneracy(params: tuple[FitParameter, ...], J: np.ndarray) -> str | None:
    """Why the runs cannot determine these parameters, or None."""
    norms = np.linalg.norm(J, axis=0)
    for p, n in zip(params, norms):
        if n < 1e-9 * max(norms.max(), 1e-30):
            return f"{p.path} has no effect on any run; leave it out of --params"
    cos = (J.T @ J) / np.outer(norms, norms)
    for a in range(len(params)):
        for b in range(a + 1, len(params)):
            if abs(cos[a, b]) > PARALLEL_COLUMNS:
                return (f"{params[a].path} and {params[b].path} move every run alike (|cos| = {abs(cos[a, b]):.4f}), "
                        "so these runs cannot tell them apart; fit one of them (--params) or add runs that separate them")
    return None


def _check_runs(runs: list[MeasuredRun], machine: Machine) -> None:
    """A one-line TwinError naming the first run whose plan the twin refuses on `machine` (it does not divide the
    model, or its memory does not fit even the whole HBM), before any pass: the early passes simulate a subset."""
    for run in runs:
        if run.schedule is None:
            try:
                step_plans(run.model, run.plan, machine, run.gpus)
            except TwinError as e:
                raise TwinError(f"{run.where}: {e}") from None


def _undetermined(params: tuple[FitParameter, ...], values: np.ndarray, std: np.ndarray) -> str | None:
    """Why a value is too uncertain to write into a machine file, or None: its standard error is more than
    UNDETERMINED of it, so the runs leave even its size open (zero within two standard errors) and the
    file's sourced or estimated value is at least as good. An exact solve (no spare run) has no standard
    error and passes."""
    for p, v, s in zip(params, values, std):
        if np.isfinite(s) and s > UNDETERMINED * v:
            return (f"{p.path} is not determined by these runs ({v:.4g} ± {s:.2g}, a standard error over "
                    f"{UNDETERMINED:.0%} of the value); leave it out (--params), or add runs that depend on it")
    return None


def _at_bound(params: tuple[FitParameter, ...], x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> str | None:
    for p, v, a, b in zip(params, x, lo, hi):
        if v <= a + 1e-6 or v >= b - 1e-6:
            side, bound = ("lower", p.lower) if v <= a + 1e-6 else ("upper", p.upper)
            return (f"{p.path} ends on its {side} bound {bound:g}: the runs ask for more than the model allows; "
                    "leave it out (--params), or look for work the twin does not model")
    return None


# ---------------------------------------------------------------- the fit

def _relative_errors(paths: list[PathCosts], runs: list[MeasuredRun]) -> np.ndarray:
    return np.array([p.step_s / r.step_time_s - 1 for p, r in zip(paths, runs)])


@infrequent()
def fit(runs: list[MeasuredRun], machine_name: str, base: tuple[Override, ...], params: tuple[FitParameter, ...],
        *, folds: int = 5, jobs: int = 1, explicit: bool = True, progress: Callable | None = None,
        say: Callable[[str], None] = lambda line: None, refuse: bool = True) -> FitResult:
    """Fit `params` of machine `machine_name` (with `base` what-ifs) to `runs` (module docstring).

    `refuse=False` returns a degenerate fit instead of refusing it: for investigating the model, never for
    writing a machine file."""
    wall = time.perf_counter()
    machine = load_machine(machine_name, base)
    if len(runs) < len(params):
        raise TwinError(f"--runs: {len(runs)} runs cannot determine {len(params)} parameters; give at least "
                        f"{len(params)} runs (more, to see how well they agree) or fewer --params")
    if folds == 1 or folds < 0 or folds > len(runs):
        raise TwinError(f"--folds must be 0 (no cross-validation) or 2..{len(runs)}, got {folds}")
    fold = fold_of(runs, folds) if folds else None  # before any simulation: too few groups is an error
    _check_runs(runs, machine)  # a run that cannot be simulated is named now, not after minutes of passes
    everything = np.arange(len(runs))
    subset = everything[::SUBSET_STRIDE] if len(runs) >= SUBSET_MIN * SUBSET_STRIDE else everything
    with SimulationWorkers(jobs, keep_schedules=True) as workers:  # across passes, each with its runs' schedules
        passes = _Passes(runs, machine_name, base, workers, progress, say)
        start = np.log([file_value(machine, p) for p in params])
        at_start = passes.simulate(subset, params, start, "at the machine file's values")
        params, dropped = _drop_idle(params, Surrogate([at_start], machine_name, base, params), start, runs, subset,
                                     explicit)
        if dropped:
            say(f"left out (no run depends on them): {', '.join(dropped)}")
            start = np.log([file_value(machine, p) for p in params])
        lo, hi = np.log([p.lower for p in params]), np.log([p.upper for p in params])
        x = np.clip(start, lo, hi)
        first: list[PathCosts] | None = at_start
        if len(subset) < len(runs):
            x, _, _, _ = passes.converge(subset, params, x, lo, hi, first=at_start, tolerance=SUBSET_CONVERGED)
            first = None
        x, paths, J, history = passes.converge(everything, params, x, lo, hi, first=first, tolerance=CONVERGED)
    after = _relative_errors(paths, runs)
    dof = len(runs) - len(params)  # none: as many runs as parameters, an exact solve with no spread to measure
    covariance = float(after @ after) / dof * np.linalg.pinv(J.T @ J) if dof else np.full((len(x), len(x)), np.nan)
    std = np.exp(x) * np.sqrt(np.clip(np.diag(covariance), 0, None))
    reason = _at_bound(params, x, lo, hi) or _degeneracy(params, J) or _undetermined(params, np.exp(x), std)
    if reason and refuse:
        raise TwinError(f"fit refused: {reason}")
    before = _relative_errors(at_start, [runs[i] for i in subset])
    cv = None
    if folds:
        say(f"cross-validation: {folds} folds, each fitted without its runs and predicting them")
        cv = _cross_validate(runs, history, machine_name, base, params, start, lo, hi, fold)
    return FitResult(machine.name, params, tuple(np.exp(start)), tuple(np.exp(x)), tuple(std), runs, before, after,
                     cv, folds, passes.count, time.perf_counter() - wall, dropped)


SUBSET_STRIDE = 8  # early passes simulate every 8th run...
SUBSET_MIN = 60  # ...when that leaves at least this many
SUBSET_CONVERGED = 0.02  # the subset's passes only bring the full ones close: they re-solve on every run anyway
TRUST = np.log(4.0)  # one pass moves no parameter by more than a factor of 4: the path may move beyond that


class _Passes:
    """Simulation passes over (some of) the runs, and least squares between them."""

    def __init__(self, runs, machine_name, base, workers: SimulationWorkers, progress, say) -> None:
        self.runs, self.machine_name, self.base = runs, machine_name, base
        self.workers, self.progress, self.say = workers, progress, say
        self.measured = np.array([r.step_time_s for r in runs])
        self.count = 0
        self._last: tuple[tuple, dict[int, PathCosts]] = ((), {})  # the last pass's parameters and paths by run

    def simulate(self, rows: np.ndarray, params, x: np.ndarray, what: str) -> list[PathCosts]:
        """The runs `rows` simulated at x; those the last pass simulated at the same x (the first pass over every
        run starts where the subset's passes ended) are taken from it."""
        self.count += 1
        at = tuple(_overrides(params, x))
        known = self._last[1] if self._last[0] == at else {}
        missing = [i for i in rows.tolist() if i not in known]
        reused = f" ({len(rows) - len(missing)} as simulated by the pass before)" if len(missing) < len(rows) else ""
        self.say(f"pass {self.count}: simulating {len(missing)} runs {what}{reused}")
        chosen = [self.runs[i] for i in missing]
        fresh = simulate_runs(chosen, self.machine_name, [self.base + at] * len(chosen), self.workers.jobs,
                              self.progress, self.workers) if chosen else []
        paths = dict(known) | dict(zip(missing, fresh))
        self._last = (at, paths)
        return [paths[i] for i in rows.tolist()]

    def converge(self, rows: np.ndarray, params, x: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 first: list[PathCosts] | None, tolerance: float
                 ) -> tuple[np.ndarray, list[PathCosts], np.ndarray, list]:
        """Passes over `rows` until one moves no parameter by `tolerance` (relative), or its simulated error is no
        better than the best pass's (by IMPROVED): (the best pass's x, its paths, the Jacobian there, every pass's
        paths)."""
        measured = self.measured[rows]
        history: list[list[PathCosts]] = []
        best: tuple[float, np.ndarray, list[PathCosts]] | None = None
        for attempt in range(MAX_PASSES):
            at = ", ".join(f"{path.split('.')[-1]}={v:.4g}" for path, v in _overrides(params, x))
            paths = first if (attempt == 0 and first is not None) else self.simulate(rows, params, x, f"at {at}")
            history.append(paths)
            errors = np.array([p.step_s for p in paths]) / measured - 1
            cost = float(errors @ errors)
            if best is not None and cost > best[0] * (1 - IMPROVED):
                break  # the last move did not pay off in simulation: the best pass is the fit
            best = (cost, x, paths)
            surrogate = Surrogate(history, self.machine_name, self.base, params)
            x_new, predicted, _ = least_squares(lambda v: surrogate.steps(v) / measured - 1, x,
                                                np.maximum(lo, x - TRUST), np.minimum(hi, x + TRUST))
            if float(np.max(np.abs(np.expm1(x_new - x)))) < tolerance or cost - predicted @ predicted < IMPROVED * cost:
                break  # another pass could not move the path, or not gain enough to be worth simulating
            x = x_new
        _, x, paths = best
        surrogate = Surrogate(history, self.machine_name, self.base, params)
        residuals = surrogate.steps(x) / measured - 1
        J = jacobian(lambda v: surrogate.steps(v) / measured - 1, x, residuals, hi)
        return x, paths, J, history


def _drop_idle(params, surrogate: Surrogate, start: np.ndarray, runs, rows: np.ndarray, explicit: bool):
    """The parameters some run depends on, and the names of those none does (an error if they were asked for)."""
    measured = np.array([runs[i].step_time_s for i in rows])
    J = jacobian(lambda x: surrogate.steps(x) / measured - 1, start, surrogate.steps(start) / measured - 1,
                  np.log([p.upper for p in params]))  # a number on its upper bound is probed downward
    idle = tuple(p.path for p, n in zip(params, np.linalg.norm(J, axis=0)) if n == 0.0)
    if idle and explicit:
        raise TwinError(f"{idle[0]} has no effect on any of these runs; leave it out of --params")
    return tuple(p for p in params if p.path not in idle), idle


def _overrides(params: tuple[FitParameter, ...], x: np.ndarray) -> tuple[Override, ...]:
    """(path, value) per parameter at log-values x, kept inside the bounds exp/log round-off may leave."""
    return tuple((p.path, min(max(float(np.exp(v)), p.lower), p.upper)) for p, v in zip(params, x))


def repeat_key(run: MeasuredRun) -> tuple:
    """What a run repeats of others: its model and plan without the data-parallel degree and the batch.

    Runs that differ only there execute the same micro-batch on each GPU, so a fold that held one of them
    while another trained the parameters would test a measurement the fit has already seen. In vTrain's
    single-node file they share it literally: every such group's steps lie on one line in the micro-batch
    count (to 1e-12 ms) with one slope whatever dp is (docs/fit.md, "What the calibration file holds"). An
    executed schedule (a `twin run` summary) is its own group."""
    if run.plan is None or run.model is None:
        return ("schedule", run.origin, run.line)
    return (run.model, replace(run.plan, gdata=1, global_batch=0, ga=0))


def fold_of(runs: list[MeasuredRun], folds: int) -> np.ndarray:
    """Each run's fold: whole groups of repeated runs (repeat_key), the groups in a fixed shuffle (seed 0)."""
    keys = list(dict.fromkeys(repeat_key(r) for r in runs))
    if len(keys) < folds:
        raise TwinError(f"--folds {folds}: the runs hold only {len(keys)} distinct model and plan shapes (runs "
                        f"that differ only in data parallelism and global batch count as one); give --folds "
                        f"{len(keys)} or fewer, or 0 for none")
    fold_of_key = dict(zip(keys, np.random.default_rng(0).permutation(len(keys)) % folds))
    return np.array([fold_of_key[repeat_key(r)] for r in runs])


def _cross_validate(runs, history, machine_name, base, params, start, lo, hi, fold: np.ndarray) -> np.ndarray:
    """Each run predicted by parameters fitted without its fold (`fold_of`; on the surrogate of the full passes)."""
    measured = np.array([r.step_time_s for r in runs])
    surrogate = Surrogate(history, machine_name, base, params)
    errors = np.empty(len(runs))
    for k in range(int(fold.max()) + 1):
        train = fold != k
        x_k, _, _ = least_squares(lambda v: (surrogate.steps(v) / measured - 1)[train], start, lo, hi)
        errors[~train] = (surrogate.steps(x_k) / measured - 1)[~train]
    return errors
