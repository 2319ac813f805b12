"""Run a Schedule on a machine model with SimPy.

Each simulated rank has one SimPy process per stream; an op starts when its
dependencies have completed and the previous op on its stream has. Compute
ops take their time from the device model (twin.sim.compute), slowed by the
device's comm_compute_slowdown while a collective the rank takes part in is
running (NCCL/RCCL kernels occupy SMs/CUs and HBM bandwidth from launch to
end; on a CPU host, gloo's threads take the cores only while they move
bytes, so there the slowdown holds for the transfer's phases, not its
latency). A collective
starts when every class that takes part has issued it (a rendezvous), pays
its latency, then moves its bytes as one flow of the flow network
(twin.sim.network), which shares link bandwidth with every other transfer in
flight. On a CPU host whose ranks share its cores (node.shared_cores), a
rank computes faster while fewer of the others do (twin.sim.compute_unit).
Which ranks are simulated, and which collective instances run as one flow,
is twin.sim.symmetry's business. Consecutive compute ops that nothing on
another stream waits for run as one timeout (_compute_runs), their own
times placed afterwards: the same times, a fraction of the events.

The host (twin.sim.host_thread): with the device's `launch_interval_s` > 0 a
host thread issues each rank's ops in program order, and an op cannot start
before it is issued; with 0 there is no host and nothing changes.

A schedule that cannot finish (collectives nobody else issues, a dependency
cycle that validation missed) ends the run with a TwinError naming the stuck
ops, never a hang.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from math import nan

import numpy as np
import simpy

from topologies.fabric import Fabric
from topologies.machine import Machine
from topologies.placement import place_ranks
from twin.collector import frozen, infrequent
from twin.errors import TwinError
from twin.ir import P2P, Program, Schedule
from twin.mesh import rank_gpus
from twin.sim.collectives import CollectiveModel
from twin.sim.compute import ComputeModel
from twin.sim.compute_unit import ComputeUnit, NodeCores
from twin.sim.flowtypes import CommCall, FlowTypes
from twin.sim.host_thread import HostThread
from twin.sim.network import FlowNetwork
from twin.sim.symmetry import Symmetry, classify


@dataclass
class Rendezvous:
    """One communication call: starts when every class taking part has issued it."""

    expected: int
    arrived: int
    done: simpy.Event
    members: list[tuple[int, int]]  # (class, op id) of each arrival so far
    ready_s: float  # when the last rank of each arrival so far has issued it (time-slicing's lag, ComputeUnit.lag)


@dataclass(frozen=True)
class RankTimeline:
    """What one simulated rank did: per op of its program, start and end times (and issue times, with a host)."""

    rank: int
    program: int
    start_s: np.ndarray
    end_s: np.ndarray
    host: HostThread | None = None


@dataclass(frozen=True)
class SimRun:
    schedule: Schedule
    machine: Machine
    symmetry: Symmetry
    timelines: tuple[RankTimeline, ...]
    step_time_s: float
    wall_s: float
    full: bool
    # (class, op id) of each communication op -> the (class, op id) whose arrival started its
    # transfer (the last member to issue it): what twin.sim.critical_path follows back.
    started_by: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    # What each communication op did (latency, phases, their bottleneck levels): twin.fit.paths splits a
    # communication op's time on the critical path by the links that set it.
    flow_types: FlowTypes | None = None
    # (class, op id) of each communication op -> when its transfer began: its last member had issued it and, on a
    # host whose ranks share cores, that rank's time-slicing lag had passed (ComputeUnit.lag). From the op's start
    # to here a rank waits for the others: benchmarks/collective_split.py sets it beside the measured waits.
    transfer_begin_s: dict[tuple[int, int], float] = field(default_factory=dict)


class Simulator:
    def __init__(self, schedule: Schedule, machine: Machine, full: bool = False,
                 collectives: CollectiveModel | None = None, fuse: bool = True,
                 gpus: Sequence[int] | None = None, others_duty: float | None = None) -> None:
        """`fuse=False` runs every compute op as its own timeout (see _compute_runs): the tests' reference.
        `gpus`: the GPU of each rank on the collectives' fabric, where the job is not that fabric's GPUs in rank
        order (twin.pipeline_depth's short pipelines, on the full job's fabric and some of its nodes).
        `others_duty`: on shared cores, the ranks' phases scattered (NodeCores; twin.sim.phases)."""
        self.schedule, self.machine, self.full, self.fuse = schedule, machine, full, fuse
        self.others_duty = others_duty
        placed = rank_gpus(schedule.info.plan) if gpus is None else None  # dpouter's order, else rank r on GPU r
        self.gpu_of = list(gpus if gpus is not None else placed or place_ranks(schedule.world_size, machine))
        if len(self.gpu_of) != schedule.world_size:
            raise ValueError("gpus must name one GPU per rank")
        needed = max(self.gpu_of) + 1  # the fabric's GPUs the job uses: its world size without `gpus`
        if collectives is not None:
            n = collectives.fabric.n_gpus
            holds = n >= needed if gpus is not None else n == needed  # with `gpus`, a larger job's fabric will do
            if collectives.fabric.machine is not machine or not holds:
                raise ValueError("a shared CollectiveModel must be for this machine and world size "
                                 "(with gpus: hold them all)")
        self.collectives = collectives or CollectiveModel(Fabric(machine, needed))
        self.fabric = self.collectives.fabric
        self.compute = ComputeModel(machine.device)
        self.symmetry = classify(schedule, full)

    def run(self) -> SimRun:
        wall = time.perf_counter()
        env = simpy.Environment()
        sym = self.symmetry
        flow_types = FlowTypes.build(self.schedule, sym, self.collectives, self.gpu_of)
        network = FlowNetwork(env, flow_types.n_classes)
        units = self._compute_units(env)
        shared = self.machine.node.shared_cores > 0
        latency_last = shared and self.machine.node.comm_latency_pace_under_compute is not None
        for unit in units:
            for cores, _ in unit.shares:
                cores.on_comm_change = network.repace
        rendezvous: dict[tuple, Rendezvous] = {}
        started_by: dict[tuple[int, int], tuple[int, int]] = {}
        began: dict[tuple[int, int], float] = {}
        written: list[tuple] = []  # per class: rank, program, starts, ends, host
        durations: dict[int, list[float]] = {}  # by program: its ops' times alone
        timelines = []

        def communicate(call: CommCall, member: tuple[int, int]):
            """A stream's communication op: it waits for the call's other members; the last to arrive runs the
            transfer in its own process (a process per transfer cost an event and a generator more). On a host
            whose ranks share cores a class's last rank issues it the class's time-slicing lag later (gathered
            since a transfer last realigned the class: _stream); a lag that ends while the class waits for
            others costs nothing."""
            ready_s = env.now + units[member[0]].lag() if shared else env.now
            rv = rendezvous.get(call.key)
            if rv is None:
                if call.expected == 1:  # nobody to wait for, nobody waiting
                    started_by[member] = member
                    yield from transfer(call.members, call.type_id, call.nbytes, None, ready_s, (member,))
                    return
                rv = rendezvous[call.key] = Rendezvous(call.expected, 0, env.event(), [], ready_s)
            rv.arrived += 1
            rv.members.append(member)
            rv.ready_s = max(rv.ready_s, ready_s)
            if rv.arrived == rv.expected:
                del rendezvous[call.key]
                for m in rv.members:
                    started_by[m] = member
                yield from transfer(call.members, call.type_id, call.nbytes, rv.done, rv.ready_s, rv.members)
            else:
                yield rv.done

        def transfer(members, type_id, nbytes, done, ready_s, arrivals):
            """A collective or point-to-point transfer, from `ready_s` on (its members' last rank has issued it):
            latency, then its phases as flows; on a host whose ranks share cores, at the pace their cores allow,
            re-rated as it changes, and where the latency's pace under compute is measured, the bytes first:
            they move while the ranks compute, the latency waits (twin.sim.compute_unit.NodeCores). `arrivals`:
            the (class, op id) of each member's op, whose begin it records."""
            if ready_s > env.now:
                yield env.timeout(ready_s - env.now)
            for arrival in arrivals:
                began[arrival] = env.now
            for c in members:
                units[c].comm_changed(+1, slows=not shared)
            latency, phases = flow_types.cost(type_id)
            pacer = (lambda: min(units[c].comm_factor() for c in members)) if shared else None
            if latency > 0 and not latency_last:
                yield network.delay(latency, pacer) if shared else env.timeout(latency)
            if shared:  # the collective library's threads take the cores while they move bytes, not while they wait
                for c in members:
                    units[c].slowed(+1)
            for index, loads, s_per_byte in phases:
                yield network.start(index, loads, nbytes * s_per_byte, pacer)
            if shared:
                for c in members:
                    units[c].slowed(-1)
            if latency > 0 and latency_last:
                yield network.delay(latency, lambda: min(units[c].latency_factor() for c in members))
            for c in members:
                units[c].comm_changed(-1, slows=not shared)
            if done is not None:
                done.succeed()

        interval = self.machine.device.launch_interval_s
        for cls, rank in enumerate(sym.representatives):
            program = self.schedule.programs[sym.programs[cls]]
            # lists while the run writes them op by op (a list item costs less to set than an array's), arrays after
            starts, ends = [nan] * len(program.ops), [nan] * len(program.ops)
            done = _completion_events(env, program, host_waits=interval > 0)
            host = HostThread(env, program, interval, done, ends) if interval > 0 else None
            if host is not None:
                env.process(host.run())
            written.append((rank, sym.programs[cls], starts, ends, host))
            calls = flow_types.per_op[cls]
            if sym.programs[cls] not in durations:
                durations[sym.programs[cls]] = self.compute.op_durations_s(program.ops)
            for stream_ops in _by_stream(program).values():
                env.process(self._stream(env, cls, stream_ops, done, starts, ends, units[cls], calls, communicate,
                                         host, durations[sym.programs[cls]]))

        env.run()
        for rank, program_index, starts, ends, host in written:
            timeline = RankTimeline(rank, program_index, np.array(starts), np.array(ends), host)
            if host is not None:
                host.ends = timeline.end_s
            timelines.append(timeline)
        self._check_finished(timelines)
        step = max(float(np.nanmax(t.end_s)) if len(t.end_s) else 0.0 for t in timelines)
        return SimRun(
            self.schedule, self.machine, sym, tuple(timelines), step, time.perf_counter() - wall, self.full, started_by,
            flow_types, began
        )

    def _compute_units(self, env: simpy.Environment) -> list[ComputeUnit]:
        """One ComputeUnit per simulated class; on a machine whose nodes' ranks share cores, each node's
        NodeCores, which a class occupies with its ranks there while it computes (module docstring)."""
        slowdown, node = self.machine.device.comm_compute_slowdown, self.machine.node
        sym = self.symmetry
        if node.shared_cores <= 0:
            return [ComputeUnit(env, slowdown) for _ in sym.representatives]
        node_of = self.fabric.node_of
        cores: dict[int, NodeCores] = defaultdict(lambda: NodeCores(
            node.shared_cores, node.gpus_per_node, node.timeslice_skew, node.comm_stretch_under_compute,
            node.comm_latency_pace_under_compute, self.others_duty, node.timeslice_lag_s, node.timeslice_lag_after_s,
            node.comm_core_share, node.timeslice_lag_span_s, node.timeslice_skew_beyond_span))
        ranks_on: list[dict[int, int]] = [defaultdict(int) for _ in sym.representatives]
        for rank, cls in sym.class_of.items():
            ranks_on[cls][node_of(self.gpu_of[rank])] += 1
        units = []
        for cls, rank in enumerate(sym.representatives):
            home = cores[node_of(self.gpu_of[rank])]
            unit = ComputeUnit(env, slowdown, home, tuple((cores[n], k) for n, k in sorted(ranks_on[cls].items())))
            home.units.append(unit)
            units.append(unit)
        return units

    def _stream(self, env, cls, ops, done, starts, ends, unit, calls, communicate, host, durations):
        runs = _compute_runs(ops, done, calls, fuse=self.fuse and (host is None or not unit.shares))
        runs.reverse()  # a stack: a run the host has not issued to its end goes back on it, cut (below)
        computes = any(o.id not in calls for o in ops)  # a transfer on this stream blocks the rank's compute
        while runs:
            run = runs.pop()
            op = run[0]
            for dep in op.deps:
                event = done[dep]
                if event is not None and not event.processed:
                    yield event
                    if computes and dep in calls:  # its ranks waited for a transfer: back in step
                        unit.realigned()
            if host is not None:
                while np.isnan(host.issue_s[op.id]):
                    yield host.progressed()
                if host.issue_s[op.id] > env.now:
                    yield env.timeout(host.issue_s[op.id] - env.now)
                if len(run) > 1:  # (a run of one op, or a transfer, is timed without its ids)
                    ids = [o.id for o in run]
                    waiting = np.flatnonzero(np.isnan(host.issue_s[ids]))
                    if len(waiting):  # the rest waits for the host: a run of its own
                        runs.append(run[waiting[0]:])
                        run, ids = run[:waiting[0]], ids[:waiting[0]]
            starts[op.id] = env.now
            if op.id in calls:
                yield from communicate(calls[op.id], (cls, op.id))
                if computes:  # a blocking transfer: the ranks go on together
                    unit.realigned()
            elif len(run) == 1:
                yield from unit.run(durations[op.id])
            elif host is not None:
                placed = yield from unit.run_issued([durations[o.id] for o in run], list(host.issue_s[ids]))
                for i, start_s, end_s in zip(ids, *placed):
                    starts[i], ends[i] = start_s, end_s
            else:
                works = [durations[o.id] for o in run]
                pieces = yield from unit.run(sum(works))
                _place_fused(run, works, pieces, starts, ends, env.now)
            last = run[-1]
            ends[last.id] = env.now
            if done[last.id] is not None:
                done[last.id].succeed()

    def _check_finished(self, timelines: list[RankTimeline]) -> None:
        stuck = []
        for timeline in timelines:
            program = self.schedule.programs[timeline.program]
            pending = np.flatnonzero(np.isnan(timeline.end_s))
            if len(pending):
                op = program.ops[pending[0]]
                stuck.append(f"rank {timeline.rank} at op {op.id} '{op.name}'")
        if stuck:
            more = f" (and {len(stuck) - 3} more ranks)" if len(stuck) > 3 else ""
            raise TwinError(
                "schedule cannot finish, collectives are never matched: "
                + "; ".join(stuck[:3]) + more + "; check that every group member issues the same collectives"
            )


def _completion_events(env: simpy.Environment, program: Program, host_waits: bool = False
                       ) -> list[simpy.Event | None]:
    """An event per op that an op on *another* stream waits for (or, `host_waits`, that the host thread
    waits for: every transfer an op depends on); None where stream order suffices."""
    stream = [op.stream for op in program.ops]
    needed = {dep for op in program.ops for dep in op.deps
              if stream[dep] != op.stream or (host_waits and isinstance(program.ops[dep].work, P2P))}
    return [env.event() if i in needed else None for i in range(len(program.ops))]


def _compute_runs(ops: list, done: list, calls: dict, fuse: bool) -> list[list]:
    """A stream's ops cut into runs that each take one SimPy timeout: a communication op alone, and consecutive
    compute ops fused while nothing outside the stream waits for one of them but the last (no completion event)
    and none of them but the first waits for an op of another stream. A fused run takes the sum of its ops'
    work at the unit's rate, which changes with communication (and, on shared cores, the other ranks' compute)
    whether or not the run is one op, so it ends when its last op would have, and
    its ops' own ends are placed from the rates it ran at (_place_fused): timelines and critical paths are those
    of the op-by-op run, to round-off. Fewer events per step: most of a pipeline stage's ops are such runs.
    With a host thread each op of a run also waits for its own issue time (ComputeUnit.run_issued), and a run
    goes only as far as the host has issued when it starts (_stream); not on shared cores."""
    if not fuse:
        return [[op] for op in ops]
    runs: list[list] = []
    on_stream = {op.id for op in ops}
    open_run = False  # whether the last run is compute that nothing outside the stream waits for
    for op in ops:
        compute = op.id not in calls
        if open_run and compute and on_stream.issuperset(op.deps):
            runs[-1].append(op)
        else:
            runs.append([op])
        open_run = compute and done[op.id] is None
    return runs


def _place_fused(run: list, works: list[float], pieces: list[tuple[float, float, float]], starts: list[float],
                 ends: list[float], end_s: float) -> None:
    """Each op of a fused run ends where the run's work done reaches its own cumulative work, along the pieces
    the unit ran at one rate; the next op starts there. The last ends at the run's end."""
    placed, piece = [], 0
    start_s, rate, before = pieces[0]
    for done_work in accumulate(works[:-1]):
        while piece + 1 < len(pieces) and pieces[piece + 1][2] <= done_work:
            piece += 1
            start_s, rate, before = pieces[piece]
        placed.append(min(start_s + (done_work - before) / rate, end_s))
    for op, at in zip(run, placed):
        ends[op.id] = at
    for op, at in zip(run[1:], placed):
        starts[op.id] = at


def _by_stream(program: Program) -> dict[str, list]:
    streams: dict[str, list] = defaultdict(list)
    for op in program.ops:
        streams[op.stream].append(op)
    return streams


@infrequent()
@frozen()
def simulate(schedule: Schedule, machine: Machine, full: bool = False,
             collectives: CollectiveModel | None = None, gpus: Sequence[int] | None = None,
             others_duty: float | None = None) -> SimRun:
    """Simulate one training step; `full` simulates every rank instead of one per class.

    `collectives`: a CollectiveModel of this machine and world size to reuse; its
    lowerings are cached by GPU set, so simulations of many plans (twin search)
    lower each group they share once. `gpus`: each rank's GPU on that model's fabric, where the job is not all
    of the fabric's GPUs in rank order. A partial schedule (twin.build.build_stages: some pipeline stages only, for
    the search's bounds) is refused: the missing stages' ranks would never answer. `others_duty`: on a host
    whose ranks share its cores, each other rank computing that fraction of the time, independently
    (twin.sim.compute_unit.NodeCores; twin.sim.phases finds it); None, the ranks in step.
    """
    covered = sum(len(program.ranks) for program in schedule.programs)
    if covered != schedule.world_size:
        raise ValueError(f"the schedule's programs cover {covered} of its {schedule.world_size} ranks: a partial "
                         "schedule (twin.build.build_stages, for bounds) cannot be simulated")
    return Simulator(schedule, machine, full, collectives, gpus=gpus, others_duty=others_duty).run()
