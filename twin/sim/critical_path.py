"""The chain of ops that sets a simulated step's length.

Every op of a simulated rank starts when the last of its predecessors ends:
the ops it depends on and the previous op on its stream. A communication op
ends a transfer time after the last member of its group issued it (the
engine records that member, `SimRun.started_by`). Following, from the op that
ends last, the predecessor that ended last (and, for a communication op, the
member that started it) walks back to time zero along ops whose elapsed times
add up to the step: the critical path. Where the host thread (twin.sim.engine)
issued an op later than its predecessors ended, the path runs along the host:
that many issue intervals back to the transfer the host last waited for, or
to time zero.

Why it is worth having: to first order, the step changes by exactly the
change of the durations on this path. `twin fit` uses that to fit machine
parameters from many measured runs with one simulation per run and pass,
instead of one per parameter and function evaluation.
"""

from __future__ import annotations

import weakref
from bisect import bisect_right
from typing import NamedTuple

import numpy as np

from twin.ir import Program
from twin.sim.engine import SimRun

# Times on the path are sums and maxima of the same floats, so a predecessor that
# set an op's start ends exactly then; the tolerance only absorbs round-off.
_TOLERANCE_S = 1e-12


class PathStep(NamedTuple):  # a tuple: a path holds one per op, thousands per step
    """One op on the critical path of simulated class `cls` and the time it adds."""

    cls: int
    op_id: int
    elapsed_s: float  # compute: end - start; communication: end - the start of the member that started it
    kind: str  # "compute", "comm" or "host" (issue intervals up to op_id's issue)
    launches: int = 0  # host: how many ops the host issued in elapsed_s


# id(program) -> (a weak reference to it, its pairs' ops, their predecessors): as long as the program lives.
_PAIRS: dict[int, tuple[weakref.ref, np.ndarray, np.ndarray]] = {}


def _predecessor_pairs(program: Program) -> tuple[np.ndarray, np.ndarray]:
    """Every (op, predecessor) pair of the program, op by op: the ops whose ends gate an op's start (its deps,
    then the previous op on its stream). Kept while the program lives: a fit simulates the same schedules pass
    after pass."""
    kept = _PAIRS.get(id(program))
    if kept is not None and kept[0]() is program:
        return kept[1], kept[2]
    ops: list[int] = []
    preds: list[int] = []
    last_on_stream: dict[str, int] = {}
    for op in program.ops:
        prev = last_on_stream.get(op.stream)
        before = op.deps if prev is None else (*op.deps, prev)
        ops.extend([op.id] * len(before))
        preds.extend(before)
        last_on_stream[op.stream] = op.id
    key = id(program)
    _PAIRS[key] = (weakref.ref(program, lambda ref: _forget(ref, key)), np.array(ops, dtype=np.int64),
                   np.array(preds, dtype=np.int64))
    return _PAIRS[key][1], _PAIRS[key][2]


def _forget(ref: weakref.ref, key: int) -> None:
    """A program is gone: its pairs too (unless its id already names another program's)."""
    kept = _PAIRS.get(key)
    if kept is not None and kept[0] is ref:
        del _PAIRS[key]


def _latest_predecessors(program: Program, ends: np.ndarray) -> tuple[list[float], list[int]]:
    """Per op: when the last of its predecessors ended (0.0 without any) and which it was (the first of equals;
    -1 without any)."""
    ops, preds = _predecessor_pairs(program)
    ready, latest = np.zeros(len(ends)), np.full(len(ends), -1, dtype=np.int64)
    if len(ops):
        ended = ends[preds]
        order = np.lexsort((-ended, ops))  # op by op, the latest end first; stable, so the first of equals
        heads = order[np.r_[True, ops[order][1:] != ops[order][:-1]]]
        ready[ops[heads]] = ended[heads]
        latest[ops[heads]] = preds[heads]
    return ready.tolist(), latest.tolist()


def critical_path(run: SimRun) -> list[PathStep]:
    """The critical path of `run`, first op first; its elapsed times add up to the step (plus any idle gaps)."""
    timelines = run.timelines
    if not any(len(t.end_s) for t in timelines):
        return []
    # Python lists: the walk reads single elements, which numpy arrays serve slowly.
    starts = [t.start_s.tolist() for t in timelines]
    ends = [t.end_s.tolist() for t in timelines]
    gates = [_latest_predecessors(run.schedule.programs[t.program], t.end_s) for t in timelines]
    issued = [t.host.issue_s.tolist() if t.host is not None else None for t in timelines]
    cls, op_id = max(((c, int(t.end_s.argmax())) for c, t in enumerate(timelines) if len(t.end_s)),
                     key=lambda co: ends[co[0]][co[1]])
    syncs = {c: sorted(t.host.synced) for c, t in enumerate(timelines) if t.host is not None}
    steps: list[PathStep] = []
    while True:
        end = ends[cls][op_id]
        starter = run.started_by.get((cls, op_id))
        at = starter or (cls, op_id)  # whose start began this op's elapsed time
        start = starts[at[0]][at[1]]
        steps.append(PathStep(cls, op_id, end - start, "comm" if starter else "compute"))
        cls, op_id = at
        ready, latest = gates[cls]
        if issued[cls] is not None and issued[cls][op_id] > ready[op_id]:
            step, op_id = _host_steps(timelines[cls].host, syncs[cls], cls, op_id)
            steps.append(step)
            if op_id is None:
                break
            continue
        if start <= _TOLERANCE_S or latest[op_id] < 0:
            break
        op_id = latest[op_id]
    steps.reverse()
    return steps


def _host_steps(host, synced_ops: list[int], cls: int, op_id: int) -> tuple[PathStep, int | None]:
    """The host's issue intervals up to op `op_id`, back to the transfer it last waited for (returned) or to 0."""
    i = bisect_right(synced_ops, op_id)
    if i == 0:
        return PathStep(cls, op_id, float(host.issue_s[op_id]), "host", op_id + 1), None
    first = synced_ops[i - 1]
    waited = host.synced[first]
    elapsed = float(host.issue_s[op_id] - host.ends[waited])
    return PathStep(cls, op_id, elapsed, "host", op_id - first + 1), waited
