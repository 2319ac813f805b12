"""A simulated rank's compute stream, and the cores a CPU host's ranks share.

A ComputeUnit runs one op (or one fused run of ops, twin.sim.engine) at a
time as a single SimPy timeout, at a rate that changes while communication
runs (the device's comm-compute slowdown) and, on a host whose ranks share
its cores, with how many of them compute (NodeCores); a change re-arms the
running op with its remaining work at the new rate. On such a host the
transfers' pace follows how many ranks move data the same way, and whether
computing ranks hold every core (NodeCores, twin.sim.network's paced flows).
"""

from __future__ import annotations

from math import comb, inf
from typing import Callable

import simpy


def timeslice_lag_s(crowded_s: float, skew: float, floor_s: float = 0.0, floor_after_s: float = 0.0,
                    span_s: float = inf, beyond: float = 0.0) -> float:
    """How far the last rank reaches a synchronisation behind the mean after `crowded_s` seconds of compute
    whose ranks held every core: `skew` per second, plus `floor_s` (the part that does not grow with the compute)
    once they reach `floor_after_s`, linearly from 0 below it; none without such compute. twin calibrate
    measures the three (executor.calibrate_sharing.fit_skew) on phases up to `span_s` long, and past it the
    lag grows `beyond` per second, which it measures on longer phases: the line is not extrapolated
    (benchmarks/lag_growth.py measures the lag growing slower than the line past its range)."""
    if crowded_s <= 0:
        return 0.0
    past = max(crowded_s - span_s, 0.0)
    crowded_s = min(crowded_s, span_s)
    ramp = min(1.0, crowded_s / floor_after_s) if floor_after_s > 0 else 1.0
    return skew * crowded_s + floor_s * ramp + beyond * past


class NodeCores:
    """The cores a CPU host's ranks share (the machine's node.shared_cores), as a processor-sharing resource.

    A calibrated device rate is what each rank got with every rank of the node computing at once (twin
    calibrate runs its microbenchmarks so). With `busy` ranks computing, each gets min(1, cores / load) of a
    core where calibration gave it min(1, cores / ranks), so its rate is scaled by the ratio: on 2 cores
    shared by 4 ranks, a rank computing while its pipeline neighbour waits runs twice as fast as calibrated.
    The load is `busy` plus `mover_share` (node.comm_core_share) for each rank that moves bytes in a transfer
    and computes nothing meanwhile (`movers`): gloo's threads copy and reduce on the same cores, where a rank
    that waits for a collective's other members takes none (twin calibrate measures the share with half the
    ranks computing beside the other half's all-reduces). So a rank computing while its pipeline neighbour's
    transfers run gets less than the neighbour's core. A change of either count re-arms every running unit
    whose rate it sets (`units`).

    Time-slicing (`skew`, node.timeslice_skew): with the ranks' load holding every core the OS shares the
    cores unevenly (among the ranks, and with the collective library's and the executor's own threads), and
    a phase of compute ends, at the collective that synchronises it, when its last rank is done: `skew`
    later per second of the mean's compute (twin calibrate measures it as the slope of a 4-byte all-reduce
    over the GEMM before it; 2 ranks on 2 cores lag too, 0.13 s per second on this project's host). The
    ranks compute at their fair share meanwhile (a rank's own GEMMs measure so), and the time is lost only
    where ranks wait for the last: each unit counts the seconds it computes while load >= cores
    (ComputeUnit.crowded_s) since a transfer last realigned its ranks (a stream of theirs waited for one to
    end), and its last rank issues each transfer `lag_after` of them later (twin.sim.engine): `skew` per
    second, plus `lag_floor` (node.timeslice_lag_s, the lag that does not grow with the compute) once they
    reach `lag_floor_after`, linearly from 0 below it, and past `lag_span` (node.timeslice_lag_span_s, the
    line's calibrated range) `lag_beyond` per second (node.timeslice_skew_beyond_span). An asynchronous
    transfer issued beside compute does not realign the ranks: they drift on through a layer's overlapped
    weight gathers until one is waited for. The transfer waits for the lag unless other members arrive later
    still, and compute beside the transfer may hide it. With load < cores a core is free for the other
    threads and nothing lags.

    Communication the same way: a calibrated latency and link bandwidth are what each rank's transfers got
    with every rank of the node in one collective at once and none computing, so while ranks are in
    `communicating` transfers (a rank in two at once counts twice) a transfer runs at comm_factor() times
    that pace (gloo's threads wake, copy and reduce on the cores): on 2 cores and 4 ranks, a pipeline stage's
    all-reduce while the other stage waits takes half its calibrated time, and two all-reduces of every rank
    on two groups at once take as long as one after the other, as measured (benchmarks/overlap_sizes.py).
    While computing ranks hold every core, gloo's threads also wait for cores: a transfer then takes
    `comm_stretch` times as long (node.comm_stretch_under_compute, which twin calibrate measures on an
    all-reduce with and without every rank computing: the condition busy >= cores, where the ranks lag too).
    A change of either count re-rates the transfers in flight (`on_comm_change`: twin.sim.network.
    FlowNetwork.repace). Compute under communication keeps the device's
    own comm_compute_slowdown (ComputeUnit.rate).

    A transfer's latency, where `latency_pace` is measured (node.comm_latency_pace_under_compute), goes at
    that pace instead while its own ranks compute and computing ranks hold every core: gloo's small
    collectives barely move while their ranks run GEMMs, and run once they stop (benchmarks/overlap_sizes.py),
    while ranks that wait for a collective as others compute see only the stretch. Every start and end of
    compute then re-rates the transfers in flight, whether or not the counts' factors change.

    `others_duty` (None: the above) asks the other bound: that the OS has scattered the ranks' phases, so
    while one rank computes each other rank of the node holds a core with probability `others_duty` (the
    fraction of the step it computes, and what collectives take: twin.sim.phases), independently of the
    simulated ranks, which still move in step. A computing rank then runs at the expected share of a core
    over that binomial count, and lags at `skew` times the chance the count exceeds the cores. Compute's
    share only: transfers keep the counts above. twin.sim.phases finds the duty that is consistent with the
    step it gives."""

    def __init__(self, cores: float, ranks: int, skew: float = 0.0, comm_stretch: float = 1.0,
                 latency_pace: float | None = None, others_duty: float | None = None, lag_floor: float = 0.0,
                 lag_floor_after: float = 0.0, mover_share: float = 0.0, lag_span: float = inf,
                 lag_beyond: float = 0.0) -> None:
        self.cores, self.busy, self.communicating = cores, 0, 0
        self.movers, self.mover_share = 0, mover_share
        self.calibrated_share = min(1.0, cores / ranks)
        self.skew, self.comm_stretch, self.latency_pace = skew, comm_stretch, latency_pace
        self.lag_floor, self.lag_floor_after = lag_floor, lag_floor_after
        self.lag_span, self.lag_beyond = lag_span, lag_beyond
        self.units: list[ComputeUnit] = []
        self.on_comm_change: Callable[[], None] | None = None
        self._scattered: tuple[float, float] | None = None  # (factor, crowding) with independent phases
        if others_duty is not None:
            if not 0.0 <= others_duty <= 1.0:
                raise ValueError(f"others_duty {others_duty}: a fraction of the step, from 0 to 1")
            chances = [comb(ranks - 1, k) * others_duty ** k * (1 - others_duty) ** (ranks - 1 - k)
                       for k in range(ranks)]
            share = sum(p * min(1.0, cores / (1 + k)) for k, p in enumerate(chances))
            crowded = sum(p for k, p in enumerate(chances) if 1 + k >= cores)
            self._scattered = (share / self.calibrated_share, crowded)

    def factor(self) -> float:
        """A computing rank's rate over the calibrated one, at the present load (computing and moving ranks)."""
        if self._scattered is not None:
            return self._scattered[0]
        return min(1.0, self.cores / max(self.load(), 1)) / self.calibrated_share

    def load(self) -> float:
        """Cores' worth the ranks ask for: each computing rank one, each rank that moves bytes and does not
        compute `mover_share` (gloo's threads copying and reducing on the cores)."""
        return self.busy + self.mover_share * self.movers

    def crowding(self) -> float:
        """How much of a second a computing rank counts toward its lag per second: 1 while the load holds every
        core (the OS time-slices the ranks, and they drift apart), else 0; scattered, the chance of that."""
        if self._scattered is not None:
            return self._scattered[1]
        return 1.0 if self.oversubscribed() else 0.0

    def lag_after(self, crowded_s: float) -> float:
        """The last rank's lag after `crowded_s` seconds of oversubscribed compute (timeslice_lag_s)."""
        return timeslice_lag_s(crowded_s, self.skew, self.lag_floor, self.lag_floor_after, self.lag_span,
                               self.lag_beyond)

    def oversubscribed(self) -> bool:
        """Whether ranks compute and the ranks' demand holds every core: the OS time-slices them with each other
        and with the collective library's threads, and they drift apart."""
        return self.busy > 0 and self.load() >= self.cores

    def comm_factor(self) -> float:
        """A transfer's rate over the calibrated one, at the present numbers of ranks moving data and computing."""
        share = min(1.0, self.cores / max(self.communicating, 1)) / self.calibrated_share
        return share / self.comm_stretch if self.busy >= self.cores else share

    def latency_factor(self, computing: bool) -> float:
        """A transfer's latency pace over the calibrated one for a member rank that is (or is not) computing."""
        if self.latency_pace is None or not computing or self.busy < self.cores:
            return self.comm_factor()
        return min(1.0, self.cores / max(self.communicating, 1)) / self.calibrated_share * self.latency_pace

    def change(self, delta: int, source: "ComputeUnit", movers: int = 0) -> None:
        """`delta` ranks start (+) or stop (-) computing and `movers` ranks start or stop moving bytes beside
        no compute of their own: the running units re-arm where their rate or crowding changes."""
        before, comm_before = (self.factor(), self.crowding()), self.comm_factor()
        self.busy += delta
        self.move(movers, source, before)
        if (self.comm_factor() != comm_before or self.latency_pace is not None) and self.on_comm_change is not None:
            self.on_comm_change()

    def move(self, movers: int, source: "ComputeUnit", before: tuple[float, float] | None = None) -> None:
        """`movers` ranks start (+) or stop (-) moving bytes beside no compute of their own; the running units
        whose rate or crowding that changes (from `before`, the state before a change in progress) re-arm. The
        transfers' pace does not depend on it: nothing to re-pace."""
        before = before or (self.factor(), self.crowding())
        self.movers += movers
        if (self.factor(), self.crowding()) != before:
            for unit in self.units:
                if unit is not source:
                    unit.rate_changed()


class ComputeUnit:
    """The compute stream's engine on one rank: one op at a time, slowed while comms run.

    A running op is a single SimPy timeout; when the rank's communication
    starts or stops mid-op (or, on a host whose ranks share cores, another
    rank starts or stops computing), the waiting stream process is
    interrupted and re-arms with the remaining work at the new rate.
    `shares`: on such a host, the NodeCores this rank's class occupies while
    it computes, with how many of its ranks each holds; `home` is the one
    whose share sets its rate (its representative's node).
    """

    def __init__(self, env: simpy.Environment, slowdown: float, home: NodeCores | None = None,
                 shares: tuple[tuple[NodeCores, int], ...] = ()) -> None:
        self.env, self.slowdown = env, slowdown
        self.home, self.shares = home, shares
        self.comm_active = 0
        self.transfers = 0  # its transfers in flight, from when their last member issued them (comm_changed)
        self.computing = False  # in run(): what a transfer's latency pace asks of its ranks
        self.crowded_s = 0.0  # its oversubscribed compute since a transfer last realigned its ranks (NodeCores)
        self._running: simpy.Process | None = None

    def rate(self) -> float:
        rate = 1.0 - self.slowdown if self.comm_active > 0 else 1.0
        return rate * self.home.factor() if self.home is not None else rate

    def run(self, work_s: float):
        """Generator: `yield from unit.run(seconds)` inside the compute stream's process. Returns the pieces it
        ran at one rate, (start time, rate, work done before it), which place the ends of fused ops."""
        self.computing = True
        moving = self.transfers > 0  # it stops counting as a rank that moves bytes beside compute
        for cores, ranks in self.shares:
            cores.change(+ranks, self, -ranks if moving else 0)
        remaining, pieces = work_s, []
        while True:
            rate, start = self.rate(), self.env.now
            crowding = self.home.crowding() if self.home is not None else 0.0
            pieces.append((start, rate, work_s - remaining))
            self._running = self.env.active_process
            try:
                yield self.env.timeout(max(remaining, 0.0) / rate)
            except simpy.Interrupt:
                remaining -= (self.env.now - start) * rate
                self.crowded_s += (self.env.now - start) * crowding
                continue
            self._running = None
            self.crowded_s += (self.env.now - start) * crowding
            self.computing = False
            moving = self.transfers > 0
            for cores, ranks in self.shares:
                cores.change(-ranks, self, ranks if moving else 0)
            return pieces

    def run_issued(self, works: list[float], issue_s: list[float]):
        """Generator: the ops of one fused run (twin.sim.engine) where a host thread issues them, op i starting
        no earlier than issue_s[i], as one SimPy timeout re-armed when the rate changes. Returns each op's
        (start, end), as the op-by-op run would time them. Not on shared cores: there a unit waiting for its
        host would count as computing."""
        if self.shares:
            raise ValueError("a run waiting for its host cannot hold shared cores")
        run = _IssuedRun(works, issue_s, self.env.now)
        while True:
            rate, start = self.rate(), self.env.now
            self._running = self.env.active_process
            try:
                yield self.env.timeout(run.end_at(rate) - start)
                self._running = None
                run.advance(rate, inf)
                return run.starts, run.ends
            except simpy.Interrupt:
                run.advance(rate, self.env.now)

    def lag(self) -> float:
        """How far behind the mean its last rank issues a transfer now: the lag gathered over its oversubscribed
        compute since a transfer last realigned its ranks (NodeCores.lag_after, `realigned`)."""
        return self.home.lag_after(self.crowded_s) if self.home is not None else 0.0

    def realigned(self) -> None:
        """Its ranks are back in step: a stream of theirs waited for a transfer to end, which every member's
        last rank had issued. An asynchronous transfer issued beside compute realigns nothing: the ranks drift
        on through it (twin.sim.engine)."""
        self.crowded_s = 0.0

    def comm_changed(self, delta: int, slows: bool = True) -> None:
        """A transfer of this rank starts (+1) or ends (-1). `slows`: whether it slows compute from now on
        (False where the caller marks the span that does, with `slowed`)."""
        for cores, ranks in self.shares:  # every transfer of a rank counts: they share its progress
            cores.communicating += delta * ranks
        was_moving = self.transfers > 0
        self.transfers += delta
        if not self.computing and (self.transfers > 0) != was_moving:
            for cores, ranks in self.shares:
                cores.move(ranks if delta > 0 else -ranks, self)
        for cores, _ in self.shares:
            if cores.on_comm_change is not None:
                cores.on_comm_change()
        if slows:
            self.slowed(delta)

    def slowed(self, delta: int) -> None:
        """A transfer of this rank starts (+1) or stops (-1) moving bytes: compute runs at 1 - slowdown meanwhile."""
        before = self.rate()
        self.comm_active += delta
        if self.rate() != before:
            self.rate_changed()

    def comm_factor(self) -> float:
        """A transfer's pace over the calibrated one on this rank's node (NodeCores.comm_factor)."""
        return self.home.comm_factor()

    def latency_factor(self) -> float:
        """A transfer's latency pace over the calibrated one on this rank's node (NodeCores.latency_factor)."""
        return self.home.latency_factor(self.computing)

    def rate_changed(self) -> None:
        """Re-arm the running op (if any) at the present rate."""
        if self._running is not None:
            running, self._running = self._running, None
            running.interrupt()


class _IssuedRun:
    """Where a fused run waiting for its host is: op `i`, whether it has started, its work `left`, at time `t`."""

    def __init__(self, works: list[float], issue_s: list[float], t: float) -> None:
        self.works, self.issue_s, self.t = works, issue_s, t
        self.starts, self.ends = [0.0] * len(works), [0.0] * len(works)
        self.i, self.started, self.left = 0, False, works[0]

    def end_at(self, rate: float) -> float:
        """When the run would end at `rate` from here: advance's arithmetic, step for step, recording nothing."""
        works, issue_s, n = self.works, self.issue_s, len(self.works)
        i, t = self.i, self.t
        if i >= n:
            return t
        if not self.started:
            t = max(t, issue_s[i])
        t += self.left / rate
        for j in range(i + 1, n):
            t = max(t, issue_s[j]) + works[j] / rate
        return t

    def advance(self, rate: float, until: float) -> None:
        """Run at `rate` up to time `until`, recording the starts and ends reached."""
        n = len(self.works)
        while self.i < n:
            i = self.i
            if not self.started:
                start = max(self.t, self.issue_s[i])
                if start > until:
                    self.t = until
                    return
                self.starts[i], self.t, self.started = start, start, True
            end = self.t + self.left / rate
            if end > until:
                self.left -= (until - self.t) * rate
                self.t = until
                return
            self.ends[i], self.t = end, end
            self.i, self.started = i + 1, False
            self.left = self.works[i + 1] if i + 1 < n else 0.0
