"""Bandwidth sharing among concurrent transfers: a max-min fair fluid model.

Each active flow f has a load vector v_f over link classes, normalised so that
its busiest link has v = 1 (its time alone is `work_s`, in seconds). Flows
progress at a speed s_f in (0, 1] (the fraction of their speed alone), subject
to sum_f s_f v_f[L] <= 1 on every link class L. Speeds are max-min fair
(progressive filling: all unfrozen flows speed up together until a link
saturates; flows on it freeze). So two identical collectives on one NIC each
run at half speed, and a collective whose busiest link is idle otherwise is
slowed only where it actually shares.

Event-driven on top of SimPy, and local: max-min fairness decomposes over
connected components of the flow-link graph, so when flows start or end only
the component they touch is recomputed: at once when a flow starts (another
flow starting at the same instant re-rates it again with no time passed, so
no flow's progress changes), once per timer for the flows that end. A
component with no saturated link runs every flow at full speed without any
filling. A flow's remaining work is advanced lazily, only when its speed
changes; completions sit in a heap with generation numbers, since SimPy
timeouts cannot be cancelled. This keeps a pipeline of 128 stages, each with
its own collectives and transfers in flight, cheap.

On a CPU host whose ranks share cores a flow (and a transfer's latency, a
flow on no link: `delay`) also has a pace, its ranks' share of the cores
over the calibrated one (twin.sim.compute_unit.NodeCores), re-rated when it
changes (`repace`); elsewhere the pace is 1 and the arithmetic unchanged.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Callable

import numpy as np
import simpy

_EPS = 1e-12


@dataclass(eq=False)
class Flow:
    index: np.ndarray  # link classes it loads
    loads: np.ndarray  # its loads there, max = 1
    work_s: float  # remaining time at full speed, as of `since`
    since: float
    done: simpy.Event
    speed: float = 0.0
    generation: int = 0
    pace: float = 1.0  # its time alone is work_s / pace: on a CPU host whose ranks share cores, their share (pacer)
    pacer: Callable[[], float] | None = None


class FlowNetwork:
    def __init__(self, env: simpy.Environment, n_classes: int) -> None:
        self.env = env
        self.demand = np.zeros(n_classes)  # sum of active flows' loads per link class
        self.users: dict[int, set[Flow]] = {}  # link class -> active flows on it
        self.active: set[Flow] = set()
        self._dirty: set[Flow] = set()
        self._heap: list[tuple[float, int, int, Flow]] = []  # (finish time, generation, tiebreak, flow)
        self._tiebreak = 0
        self._timer_at: float | None = None  # when the armed timer fires; only the latest armed one counts
        self._timer_token = 0
        self.paced: dict[Flow, None] = {}  # active flows with a pacer, in start order (a deterministic repace)

    def start(self, index: np.ndarray, loads: np.ndarray, work_s: float,
              pacer: Callable[[], float] | None = None) -> simpy.Event:
        """Start a flow that alone would take `work_s` seconds (divided by `pacer()`, which may change: repace);
        returns its completion event."""
        done = self.env.event()
        if work_s <= 0 or len(index) == 0:
            done.succeed()
            return done
        flow = Flow(index=index, loads=loads, work_s=work_s, since=self.env.now, done=done)
        self._add_pacer(flow, pacer)
        self.active.add(flow)
        self.demand[index] += loads
        for c in index.tolist():
            self.users.setdefault(c, set()).add(flow)
        self._dirty.add(flow)
        self._recompute()  # at once: a flow started at the same instant re-rates its component again, at no cost in time
        return done

    def delay(self, work_s: float, pacer: Callable[[], float]) -> simpy.Event:
        """A wait of `work_s` seconds at the pace `pacer()` gives it, which may change while it runs (repace): a
        transfer's latency on a CPU host whose ranks share cores. A flow on no link: nothing shares it. At pace 0
        it stalls until a repace gives it one."""
        done = self.env.event()
        if work_s <= 0:
            done.succeed()
            return done
        flow = Flow(index=np.zeros(0, dtype=np.int64), loads=np.zeros(0), work_s=work_s, since=self.env.now,
                    done=done, speed=1.0)
        self._add_pacer(flow, pacer)
        self.active.add(flow)
        self._push(flow, self.env.now)
        self._arm_timer()
        return done

    def repace(self) -> None:
        """Re-rate every paced flow whose pacer now says otherwise (twin.sim.compute_unit.NodeCores calls it when
        the number of ranks moving data changes, or computing ranks start or stop holding every core)."""
        now = self.env.now
        for flow in self.paced:
            pace = flow.pacer()
            if pace != flow.pace:
                flow.work_s = self._remaining(flow, now)
                flow.since, flow.pace = now, pace
                flow.generation += 1
                if flow.speed > 0:
                    self._push(flow, now)
        self._arm_timer()

    # ---- internals ---------------------------------------------------------
    def _add_pacer(self, flow: Flow, pacer: Callable[[], float] | None) -> None:
        if pacer is not None:
            flow.pacer, flow.pace = pacer, pacer()
            self.paced[flow] = None

    def _push(self, flow: Flow, now: float) -> None:
        """Schedule the flow's end at its present rate; a stalled flow (pace 0) has none until repace."""
        if flow.pace <= 0:
            return
        self._tiebreak += 1
        heapq.heappush(self._heap, (now + flow.work_s / (flow.speed * flow.pace), flow.generation, self._tiebreak, flow))

    def _remaining(self, flow: Flow, now: float) -> float:
        return flow.work_s - flow.speed * flow.pace * (now - flow.since)

    def _recompute(self, _event: simpy.Event | None = None) -> None:
        now = self.env.now
        self._finish_due(now)
        if self._dirty:
            component = self._component(self._dirty)
            self._dirty = set()
            self._assign_speeds(component, now)
        self._arm_timer()

    def _finish_due(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now + _EPS * max(1.0, now):
            _, generation, _, flow = heapq.heappop(heap)
            if generation != flow.generation or flow not in self.active:
                continue
            self.active.discard(flow)
            self.paced.pop(flow, None)
            self.demand[flow.index] -= flow.loads
            for c in flow.index.tolist():
                users = self.users[c]
                users.discard(flow)
                self._dirty.update(users)
            flow.done.succeed()
        if not self.active:
            self.demand[:] = 0.0  # no drift from millions of adds and subtracts
        self._dirty &= self.active

    def _component(self, seeds: set[Flow]) -> list[Flow]:
        """Every active flow connected to `seeds` through shared link classes."""
        seen = set(seeds)
        frontier = list(seeds)
        while frontier:
            flow = frontier.pop()
            for c in flow.index.tolist():
                for other in self.users[c]:
                    if other not in seen:
                        seen.add(other)
                        frontier.append(other)
        return list(seen)

    def _assign_speeds(self, flows: list[Flow], now: float) -> None:
        # a lone flow's classes are its own (np.flatnonzero: sorted, unique): most components are one flow
        classes = flows[0].index if len(flows) == 1 else np.unique(np.concatenate([f.index for f in flows]))
        if self.demand[classes].max() <= 1 + 1e-9:  # nothing saturates: all at full speed
            speeds = [1.0] * len(flows)
        else:
            speeds = _max_min(flows, classes).tolist()
        for flow, speed in zip(flows, speeds):
            speed = min(speed, 1.0)
            if speed == flow.speed:
                continue
            flow.work_s = self._remaining(flow, now)
            flow.since, flow.speed = now, speed
            flow.generation += 1
            if speed > 0:
                self._push(flow, now)

    def _arm_timer(self) -> None:
        heap = self._heap
        while heap and (heap[0][1] != heap[0][3].generation or heap[0][3] not in self.active):
            heapq.heappop(heap)
        if not heap:
            return
        at = heap[0][0]
        if self._timer_at is not None and self._timer_at <= at:
            return  # the armed timer comes first; it re-arms when it fires
        self._timer_at = at
        self._timer_token += 1
        token = self._timer_token
        timer = self.env.timeout(max(at - self.env.now, 0.0))
        timer.callbacks.append(lambda _event: self._on_timer(token))

    def _on_timer(self, token: int) -> None:
        if token != self._timer_token:
            return  # superseded by an earlier timer, which has already fired or will
        self._timer_at = None
        self._recompute()


def _max_min(flows: list[Flow], classes: np.ndarray) -> np.ndarray:
    """Progressive filling over the flows of one component, on their link classes."""
    column = {c: j for j, c in enumerate(classes.tolist())}
    matrix = np.zeros((len(flows), len(classes)))
    for i, flow in enumerate(flows):
        matrix[i, [column[c] for c in flow.index.tolist()]] = flow.loads
    headroom = np.ones(len(classes))
    speeds = np.zeros(len(flows))
    unfrozen = np.ones(len(flows), dtype=bool)
    while unfrozen.any():
        demand = matrix[unfrozen].sum(axis=0)
        live = demand > 0
        step = np.min(headroom[live] / demand[live])
        speeds[unfrozen] += step
        headroom -= step * demand
        saturated = live & (headroom <= 1e-9)
        touching = (matrix[:, saturated] > 0).any(axis=1)
        newly_frozen = unfrozen & touching
        if not newly_frozen.any():  # numerical safety
            newly_frozen = unfrozen.copy()
        unfrozen &= ~newly_frozen
    return speeds
