"""Simulation processes that outlive a pass: each owns a fixed share of the runs and keeps their schedules.

A fit simulates the same runs pass after pass, each time at other machine
numbers. A run's schedule (every rank's ops) depends on its model and plan
alone: building it reads no number of the machine (twin.build), so a number a
fit moves cannot change it. Building is a third of simulating one of the
single-node A100 runs, so each process keeps the schedules it built, and
every run goes to the same process in every pass: the first process to be
given it. A pool's processes take whatever task comes next, which would
rebuild most schedules in a process that had not seen them.

Each process keeps schedules up to OPS_KEPT ops in all (about 480 bytes an
op: 1.9 GB), then builds the rest each time without keeping them: the passes
go through the runs in the same order, so dropping old schedules for new ones
would drop each just before it is wanted again. Callers that simulate once
(`twin validate --runs`) keep none.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_all_start_methods, get_context
from typing import Iterator

from topologies.fabric import Fabric
from topologies.machine import Machine, load_machine
from topologies.overrides import Override
from twin.errors import TwinError
from twin.fit.paths import PathCosts, path_costs, simulate_plan
from twin.ir import Schedule
from twin.ir_io import load_schedule
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate

OPS_KEPT = 4_000_000  # per process (module docstring)
_CACHED = 32  # machines (each pass has its own overrides) and collective models kept per process

_MACHINES: dict[tuple, Machine] = {}
_COLLECTIVES: dict[tuple, CollectiveModel] = {}


class _Kept(dict):
    """Schedules by (model, resolved plan), as twin.build.build_step reads and adds them; a schedule is added
    only while the whole stays under OPS_KEPT ops (module docstring)."""

    ops = 0

    def __setitem__(self, key: tuple, schedule: Schedule) -> None:
        ops = sum(len(p.ops) for p in schedule.programs)
        if self.ops + ops <= OPS_KEPT:
            super().__setitem__(key, schedule)
            self.ops += ops

    def clear(self) -> None:
        super().clear()
        self.ops = 0


_SCHEDULES = _Kept()


def cached_machine(name: str, overrides: tuple[Override, ...]) -> Machine:
    """The machine at these overrides, loaded once per process while the pass uses it."""
    key = (name, overrides)
    if key not in _MACHINES:
        if len(_MACHINES) >= _CACHED:
            _MACHINES.clear()
        _MACHINES[key] = load_machine(name, overrides)
    return _MACHINES[key]


def _collectives(name: str, overrides: tuple[Override, ...], gpus: int) -> CollectiveModel:
    """One CollectiveModel per machine and size in this process: its ring packings are reused across plans."""
    key = (name, overrides, gpus)
    if key not in _COLLECTIVES:
        if len(_COLLECTIVES) >= _CACHED:
            _COLLECTIVES.clear()
        _COLLECTIVES[key] = CollectiveModel(Fabric(cached_machine(name, overrides), gpus))
    return _COLLECTIVES[key]


def simulate_task(task: tuple, keep: bool = False) -> PathCosts | str:
    """One plan (or executed schedule file) simulated in this process: its PathCosts, or the TwinError's text.
    A schedule this process kept is reused, and with `keep` a new one is kept; the plan is checked against this
    machine every time (its memory may be what a what-if changed)."""
    machine_name, overrides, model, plan, gpus = task
    machine = cached_machine(machine_name, overrides)
    try:
        if isinstance(plan, str):
            schedule = load_schedule(plan)
            return path_costs(simulate(schedule, machine, collectives=_collectives(machine_name, overrides,
                                                                                  schedule.world_size)))
        return simulate_plan(model, plan, machine, gpus, _collectives(machine_name, overrides, gpus),
                             built=_SCHEDULES if keep else None)
    except TwinError as e:
        return str(e)


class SimulationWorkers:
    """`jobs` single-process pools (forked on first use), each given the same runs in every call; inline for one.
    With `keep_schedules` each process keeps the schedules it builds (module docstring)."""

    def __init__(self, jobs: int, keep_schedules: bool = False) -> None:
        self.jobs = max(1, jobs) if "fork" in get_all_start_methods() else 1
        self.keep = keep_schedules  # for callers that simulate the same runs again (a fit's passes)
        self._pools: list[ProcessPoolExecutor] = []
        self._owner: dict[tuple, int] = {}  # a task without its overrides -> the process that simulates it

    def __enter__(self) -> "SimulationWorkers":
        return self

    def __exit__(self, *exc) -> None:
        for pool in self._pools:  # their processes end, and what they kept with them
            pool.shutdown(cancel_futures=True)
        self._pools = []
        if self.keep and self.jobs == 1:  # kept in this process: the caller goes on without them
            _SCHEDULES.clear()

    def simulate(self, tasks: list[tuple]) -> Iterator[PathCosts | str]:
        """simulate_task of every task, in their order (a generator: results arrive a share at a time)."""
        if self.jobs == 1 or len(tasks) <= 1:
            yield from _simulate_chunk(tasks, self.keep)
            return
        if not self._pools:
            self._pools = [ProcessPoolExecutor(1, mp_context=get_context("fork")) for _ in range(self.jobs)]
        shares: list[list[int]] = [[] for _ in self._pools]
        for i, (machine_name, _, model, plan, gpus) in enumerate(tasks):
            owner = self._owner.setdefault((machine_name, model, plan, gpus), len(self._owner) % self.jobs)
            shares[owner].append(i)
        chunks: dict[Future, list[int]] = {}
        for pool, share in zip(self._pools, shares):
            size = max(1, len(share) // 8)
            for start in range(0, len(share), size):
                part = share[start:start + size]
                chunks[pool.submit(_simulate_chunk, [tasks[i] for i in part], self.keep)] = part
        results: list = [None] * len(tasks)
        ready = 0  # results are yielded in order as soon as every task before them is done
        pending = set(chunks)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                for i, result in zip(chunks[future], future.result()):
                    results[i] = result
            while ready < len(tasks) and results[ready] is not None:
                yield results[ready]
                ready += 1


def _simulate_chunk(tasks: list[tuple], keep: bool) -> list[PathCosts | str]:
    return [simulate_task(t, keep) for t in tasks]
