"""Bandwidth sharing among concurrent transfers: a max-min fair fluid model.

Each active flow f has a load vector v_f over link classes, normalised so that
its busiest link has v = 1 (its time alone is `work_s`, in seconds). Flows
progress at a speed s_f in (0, 1] (the fraction of their speed alone), subject
to sum_f s_f v_f[L] <= 1 on every link class L. Speeds are max-min fair
(progressive filling: all unfrozen flows speed up together until a link
saturates; flows on it freeze). So two identical collectives on one NIC each
run at half speed, and a collective whose busiest link is idle otherwise is
slowed only where it actually shares.

The model is event-driven on top of SimPy: whenever a flow starts or ends, the
remaining work of every flow is advanced, speeds are recomputed (once per
simulated instant, however many flows changed at it), and the next completion
is scheduled. Stale completion timers are ignored by generation number, since
SimPy timeouts cannot be cancelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

_EPS = 1e-12


@dataclass(eq=False)
class Flow:
    loads: np.ndarray  # over link classes, max = 1
    work_s: float  # remaining time at full speed
    done: simpy.Event
    speed: float = 0.0
    on_finish: list = field(default_factory=list)


class FlowNetwork:
    def __init__(self, env: simpy.Environment, n_classes: int) -> None:
        self.env = env
        self.n_classes = n_classes
        self.active: list[Flow] = []
        self._demand = np.zeros(n_classes)  # sum of the active flows' loads, kept incrementally
        self._last_update = 0.0
        self._generation = 0
        self._recompute_pending = False

    def start(self, loads: np.ndarray, work_s: float) -> simpy.Event:
        """Start a flow that alone would take `work_s` seconds; returns its completion event."""
        done = self.env.event()
        if work_s <= 0 or not loads.any():
            done.succeed()
            return done
        self._advance()
        self.active.append(Flow(loads=loads, work_s=work_s, done=done))
        self._demand += loads
        self._request_recompute()
        return done

    # ---- internals ---------------------------------------------------------
    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last_update
        if dt > 0:
            for flow in self.active:
                flow.work_s -= flow.speed * dt
        self._last_update = now

    def _request_recompute(self) -> None:
        if not self._recompute_pending:
            self._recompute_pending = True
            self.env.timeout(0).callbacks.append(self._recompute)

    def _recompute(self, _event: simpy.Event | None = None) -> None:
        self._recompute_pending = False
        self._advance()
        finished = [f for f in self.active if f.work_s <= _EPS * max(1.0, f.work_s)]
        if finished:
            self.active = [f for f in self.active if f not in finished]
            for flow in finished:
                self._demand -= flow.loads
                flow.done.succeed()
            if not self.active:
                self._demand[:] = 0.0  # no drift from millions of adds and subtracts
        self._assign_speeds()
        self._schedule_next()

    def _assign_speeds(self) -> None:
        flows = self.active
        if not flows:
            return
        if len(flows) == 1 or self._demand.max() <= 1 + 1e-9:  # nothing saturates: all at full speed
            for flow in flows:
                flow.speed = 1.0
            return
        matrix = np.stack([f.loads for f in flows])  # flows x classes
        used_cols = matrix.any(axis=0)
        matrix = matrix[:, used_cols]
        headroom = np.ones(matrix.shape[1])
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
            if not newly_frozen.any():  # numerical safety: freeze the most loaded
                newly_frozen = unfrozen.copy()
            unfrozen &= ~newly_frozen
        for flow, speed in zip(flows, speeds):
            flow.speed = float(min(speed, 1.0))

    def _schedule_next(self) -> None:
        self._generation += 1
        if not self.active:
            return
        delay = min(f.work_s / f.speed for f in self.active if f.speed > 0)
        generation = self._generation
        timer = self.env.timeout(max(delay, 0.0))
        timer.callbacks.append(lambda _e: self._on_timer(generation))

    def _on_timer(self, generation: int) -> None:
        if generation == self._generation:
            self._recompute()
