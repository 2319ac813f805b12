"""How much a predicted step depends on each number of the machine file.

Some of a machine file's numbers are estimates (a flash-attention efficiency,
a per-kernel overhead). Before a user trusts a prediction they should know
which of them it hangs on, and before anyone spends GPU time measuring, which
measurement would settle the most. `sensitivity` moves one number at a time
by a factor each way (through the same path as `--set`, so range checks
apply), re-simulates the step, and reports the elasticity

    e = d ln(step) / d ln(value)  ~  ln(step+ / step-) / ln(value+ / value-)

(-1 for a rate the step is wholly bound by, 0 for a number the step never
touches). Given a target step (a measured one), it also extrapolates the
value each number alone would need, value * (target / step) ** (1 / e): a
first-order answer to "could this estimate alone explain the gap?", not a
fit; the model is never changed by it.
"""

from __future__ import annotations

import math
import multiprocessing
import textwrap
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Callable

from topologies.machine import Machine, load_machine
from twin.errors import TwinError
from twin.micro_batches import simulate_step
from twin.model import ModelSpec
from twin.plan import ParallelPlan
from twin.search.rank import worker_count

DEFAULT_FACTOR = 0.2
FIRST_ORDER_REACH = 4.0  # a needed value further than this factor away is shown as out of reach, not as a number


@dataclass(frozen=True)
class FieldSensitivity:
    path: str
    value: float
    note: str  # the file's estimate or source text
    estimate: bool
    low_value: float | None  # None: that side was not simulated (see `skipped`)
    low_step_s: float | None
    high_value: float | None
    high_step_s: float | None
    elasticity: float
    skipped: str = ""  # why a side was left out (a range check, an integer that would not move)
    needed_value: float | None = None  # the value alone that would give the target step (first order)
    needed_allowed: bool | None = None  # whether the machine file's range checks would accept needed_value

    def to_json_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Sensitivity:
    machine: str
    step_time_s: float
    factor: float
    target_step_s: float | None
    fields: tuple[FieldSensitivity, ...]  # by |elasticity|, largest first

    def to_json_dict(self) -> dict:
        return {"machine": self.machine, "step_time_s": self.step_time_s, "factor": self.factor,
                "target_step_s": self.target_step_s, "fields": [f.to_json_dict() for f in self.fields]}


def estimated_fields(machine: Machine) -> list[str]:
    """The machine's numbers that carry an estimate note (set with --set ones included) or were fitted, nonzero
    ones only: a zero cannot be scaled."""
    return [path for path, s in machine.sources.items() if (s.estimate or s.fitted) and s.value != 0]


def _variant(machine: Machine, path: str, value: float) -> tuple[float, Machine | None, str]:
    """(value, the machine with `path` set to it, "") with the value rounded for an integer field and the other
    --set overrides kept, or (value, None, why) when the file's checks reject it."""
    if machine.sources[path].integral:
        value = float(round(value))
    others = tuple(o for o in machine.overrides if o[0] != path)
    try:
        return value, load_machine(machine.path, others + ((path, value),)), ""
    except TwinError as e:
        return value, None, str(e).split(": field ", 1)[-1]


def _moved(machine: Machine, path: str, value: float) -> tuple[float | None, Machine | None, str]:
    """(value, machine with it) for one side of a move, or (None, None, why) when the side cannot be taken."""
    value, variant, why = _variant(machine, path, value)
    if value == machine.sources[path].value:  # only an integer rounds back (the factor is in (0, 1))
        return None, None, "an integer the factor does not move"
    return (value, variant, "") if variant is not None else (None, None, why)


Step = tuple[ModelSpec, ParallelPlan, Machine, int]  # what one simulation needs
Outcome = tuple[float | None, str]  # (step time, "") or (None, why the variant cannot run the plan)


def _step_s(task: Step) -> Outcome:
    model, plan, machine, gpus = task
    try:
        return simulate_step(model, plan, machine, gpus).step_time_s, ""
    except TwinError as e:  # a variant with less memory may not fit the plan
        return None, str(e)


def _run_steps(tasks: list[Step], jobs: int | None, progress: Callable[[int, int], None] | None) -> list[Outcome]:
    """Every task's outcome, in `jobs` forked processes (default every core; each simulation is independent),
    or inline with one job."""
    jobs = worker_count(jobs)
    pooled = jobs > 1 and len(tasks) > 1 and "fork" in multiprocessing.get_all_start_methods()
    pool = (ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=multiprocessing.get_context("fork"))
            if pooled else None)
    try:
        results = pool.map(_step_s, tasks) if pool else map(_step_s, tasks)
        out = []
        for r in results:
            out.append(r)
            if progress:
                progress(len(out), len(tasks))
        return out
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)


def _allowed(machine: Machine, path: str, value: float) -> bool:
    """Would the machine file accept `value` at `path` (an efficiency above 1 or a negative latency would not)?"""
    return math.isfinite(value) and _variant(machine, path, value)[1] is not None


def sensitivity(model: ModelSpec, plan: ParallelPlan, machine: Machine, gpus: int, fields: list[str] | None = None,
                factor: float = DEFAULT_FACTOR, target_step_s: float | None = None,
                progress: Callable[[int, int], None] | None = None, jobs: int | None = None) -> Sensitivity:
    """Elasticity of the step time to each of `fields` (default: every estimate of the machine file).

    `progress(done, total)` counts simulations; they run in `jobs` processes (default every core, as a search).
    """
    _check_factor(factor)
    paths = estimated_fields(machine) if fields is None else fields
    unknown = [p for p in paths if p not in machine.sources]
    if unknown:
        raise TwinError(f"--fields {unknown[0]}: {machine.name} has no such number; `twin machines {machine.name}` "
                        "lists them")
    sides = {(path, d): _moved(machine, path, machine.sources[path].value * (1 + d))
             for path in paths for d in (-factor, factor)}
    taken = [key for key, (_, variant, _) in sides.items() if variant is not None]
    outcomes = _run_steps([(model, plan, machine, gpus)] + [(model, plan, sides[k][1], gpus) for k in taken],
                          jobs, progress)
    base, why = outcomes[0]
    if base is None:
        raise TwinError(why)
    for key, (step, why) in zip(taken, outcomes[1:]):
        if step is None:  # the side was taken but the plan does not run on it
            sides[key] = (None, None, why)
    step_of = {key: step for key, (step, _) in zip(taken, outcomes[1:]) if step is not None}
    rows = []
    for path in paths:
        s = machine.sources[path]
        (lo_v, _, lo_why), (hi_v, _, hi_why) = sides[(path, -factor)], sides[(path, factor)]
        lo_t, hi_t = step_of.get((path, -factor)), step_of.get((path, factor))
        points = [(v, t) for v, t in ((lo_v, lo_t), (s.value, base), (hi_v, hi_t)) if v is not None]
        (v0, t0), (v1, t1) = points[0], points[-1]
        elasticity = math.log(t1 / t0) / math.log(v1 / v0) if v1 != v0 and t0 > 0 else 0.0
        needed, allowed = None, None
        if target_step_s is not None and abs(elasticity) > 1e-3:
            needed = s.value * (target_step_s / base) ** (1 / elasticity)
            allowed = _allowed(machine, path, needed)
        rows.append(FieldSensitivity(path, s.value, s.fitted or s.estimate or s.source or "", bool(s.estimate or s.fitted), lo_v, lo_t,
                                     hi_v, hi_t, elasticity, "; ".join(w for w in (lo_why, hi_why) if w), needed,
                                     allowed))
    rows.sort(key=lambda r: -abs(r.elasticity))
    return Sensitivity(machine.name, base, factor, target_step_s, tuple(rows))


def _check_factor(factor: float) -> None:
    if not 0 < factor < 1:
        raise TwinError(f"--factor {factor} must be between 0 and 1 (0.2 moves each number by 20% each way)")


def needed_text(f: FieldSensitivity) -> str:
    """The value a number alone would need, as a reader should take it: a value and its ratio to the file's,
    "impossible" (the file's range checks reject it) or out of first-order reach."""
    if f.needed_value is None:
        return "-"
    if not f.needed_allowed:
        return "impossible"
    ratio = f.needed_value / f.value
    if not 1 / FIRST_ORDER_REACH <= ratio <= FIRST_ORDER_REACH:
        return f"beyond x{FIRST_ORDER_REACH:g}" if ratio > 1 else f"below x1/{FIRST_ORDER_REACH:g}"
    return f"{f.needed_value:.4g} (x{ratio:.2g})"


def format_sensitivity(result: Sensitivity, notable: float = 0.005) -> str:
    """A table of the numbers that move the step, largest effect first; the rest named on one line."""
    pct = round(100 * result.factor)
    lines = [f"step {result.step_time_s:.3f} s on {result.machine}; each number moved by {pct}% each way"
             + (f"; target step {result.target_step_s:.3f} s" if result.target_step_s else "")]
    head = f"  {'field':<46}{'value':>10}{f'-{pct}%':>10}{f'+{pct}%':>10}{'elasticity':>11}"
    lines.append(head + (f"  {'needed alone':<22}" if result.target_step_s else "") + "  kind")

    def step(v: float | None) -> str:
        return f"{100 * (v / result.step_time_s - 1):+.1f}%" if v is not None else "-"

    quiet = []
    for f in result.fields:
        if abs(f.elasticity) < notable:
            quiet.append(f.path)
            continue
        mark = "estimate" if f.estimate else "sourced"
        needed = ""
        if result.target_step_s:
            needed = f"  {needed_text(f):<22}"
        lines.append(f"  {f.path:<46}{f.value:>10.4g}{step(f.low_step_s):>10}{step(f.high_step_s):>10}"
                     f"{f.elasticity:>11.3f}{needed}  {mark}" + (f" ({f.skipped})" if f.skipped else ""))
    if quiet:
        lines.extend(textwrap.wrap(f"no effect (|elasticity| < {notable}): {', '.join(quiet)}", width=110,
                                   initial_indent="  ", subsequent_indent="    "))
    return "\n".join(lines)


# ---- is the winner of a search robust to the estimates? ----------------------------------------------------------


@dataclass(frozen=True)
class RankingMove:
    """One estimate moved one way, and the best of the ranked plans under it."""

    path: str
    value: float  # the moved value
    winner: int  # index into the ranked plans of the best one under this value (0: the winner holds)
    regret_pct: float  # how much slower the original winner is than the new one under this value

    def to_json_dict(self) -> dict:
        return asdict(self)


def ranking_robustness(model: ModelSpec, plans: list[ParallelPlan], machine: Machine, gpus: int,
                       fields: list[str] | None = None, factor: float = DEFAULT_FACTOR,
                       progress: Callable[[int, int], None] | None = None,
                       jobs: int | None = None) -> list[RankingMove]:
    """Would the first of `plans` (a search's ranking, best first) still win if an estimate were off?

    Each number (default: every estimate of the machine file) is moved by
    `factor` each way and every plan re-simulated under it: a number the
    winner does not touch can still speed up a rival. Plans outside `plans`
    are not re-simulated, so the answer is about those plans. Sides the file
    rejects (an efficiency above 1) are left out.
    """
    _check_factor(factor)
    paths = estimated_fields(machine) if fields is None else fields
    sides = [(path, value, variant) for path in paths for d in (-factor, factor)
             for value, variant, _ in [_moved(machine, path, machine.sources[path].value * (1 + d))]
             if variant is not None]
    outcomes = iter(_run_steps([(model, p, variant, gpus) for _, _, variant in sides for p in plans], jobs, progress))
    moves = []
    for path, value, _ in sides:
        times = [next(outcomes)[0] for _ in plans]
        if times[0] is None:  # the winner itself does not run on this side (it no longer fits): not a reordering
            continue
        best = min((j for j in range(len(plans)) if times[j] is not None), key=lambda j: times[j])
        moves.append(RankingMove(path, value, best, 100 * (times[0] / times[best] - 1)))
    return moves


def format_robustness(moves: list[RankingMove], plans: list[str], factor: float, shown: int = 5) -> str:
    """One line when the winner holds; otherwise how much keeping it would cost at worst, and the moves."""
    pct = round(100 * factor)
    changed = sorted((m for m in moves if m.winner != 0), key=lambda m: -m.regret_pct)
    head = f"robustness: each estimate moved by {pct}% each way, the top {len(plans)} re-simulated"
    if not changed:
        return f"{head}: the winner stays first under every move ({len(moves)} moves)"
    lines = [f"{head}: {len(changed)} of {len(moves)} moves put another plan first; keeping the winner costs at "
             f"most {changed[0].regret_pct:.2f}% of a step"]
    for m in changed[:shown]:
        lines.append(f"  {m.path} = {m.value:.4g}: #{m.winner + 1} wins by {m.regret_pct:.2f}% ({plans[m.winner]})")
    if len(changed) > shown:
        lines.append(f"  ... and {len(changed) - shown} more (--json lists every move)")
    return "\n".join(lines)
