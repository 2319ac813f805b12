"""A lower bound on a plan's simulated step time, in milliseconds of CPU.

The simulator runs each stream's ops in order, an op after its
dependencies; a compute op takes at least its time alone (twin.sim.compute:
communication only slows it); a collective takes at least its latency plus
its bytes over the bottleneck of its own links, which is what it would take
with the fabric to itself (other instances and other traffic only share
those links), with the fastest algorithm NCCL's tuner has for it; a
collective's rendezvous and a receive's wait for its send only add time.
So the longest path through one program's ops, with those durations, is a
lower bound on the step the simulator reports: exact on a program with no
communication, and as tight as the plan's communication is uncontended. Two
more bounds hold and the largest is taken: the compute stream's work plus
the part communication must slow (program_terms_s), and the busiest link's
bytes over its capacity (_busiest_link_s). A 1F1B pipeline adds one bound
per stage, the chain of earlier stages and the transfers between them plus the
stage's own work on every micro-batch (twin.search.pipeline_bound): the bubble
no single program's ops show.

`twin search` simulates plans in the order of this bound and stops once the
next bound exceeds the k-th best simulated step: the plans it never simulates
provably could not enter the top k, so the ranking is the one simulating
every plan would give.

Contention the bound does count: every instance of a collective within one
pipeline stage runs at once (the stage's ranks are symmetric), so every link
carries at least the loads of the stage's instances with a member on the
representative's node (on that node's own links, exactly theirs). Other
stages' instances on the node are left out: a pipeline's stages reach the
same collective at different times (with dpouter's order a node holds
consecutive stages, whose gradient sums cross the network one after
another). Per phase the bound takes the larger of (a) the
representative's instance alone and (b) those instances summed, on the
busiest link. Every instance's load on the network links would need every
instance lowered, which is the simulator's own (expensive) work.
The latency is the cheaper of the instance holding the representative and
the axis's first instance (the one whose latency the simulator charges a
whole symmetric family), so it holds whichever the symmetry reduction uses.
A pipeline's transfer counts every instance of its axis where every program
is one whole stage: the simulator then types the transfers of all pipelines
at one position as one family (BoundModel._p2p_s).
"""

from __future__ import annotations

import numpy as np

from topologies.fabric import Fabric
from topologies.machine import Machine
from topologies.placement import place_ranks
from twin.builders.program import COMPUTE_STREAM
from twin.ir import P2P, Collective, Program, Schedule
from twin.mesh import dp_outermost, rank_gpus
from twin.search.pipeline_bound import pipeline_terms_s
from twin.sim.collectives import CollectiveModel
from twin.sim.compute import ComputeModel


LAYOUTS_KEPT = 64  # axis layouts whose durations are kept (each holds its instances: up to ~1 MB at 32,768 ranks)


def _shared_phases_s(own, others: list, capacity: np.ndarray, end: int | None = None) -> float:
    """Seconds per byte of `own`'s phases, each on its busiest link (of the links below `end`, where given) at the
    larger of its own load and every instance's of `others` together there."""
    total = 0.0
    for phase, loads in enumerate(own.phases):
        shared: dict[int, float] = {}
        for other in others:
            for link, load in other.phases[phase].items():
                shared[link] = shared.get(link, 0.0) + load
        total += max((load / capacity[link] for link, load in (*loads.items(), *shared.items())
                      if end is None or link < end), default=0.0)
    return total


class _Layout:
    """What the bound learned about one group axis's layout under one placement of the ranks: its instances (the
    very tuple: twin.mesh memoises it per mesh and axis, so the schedules of one plan's bound, and plans on the same
    mesh, share it; held here so that its id stays its own), the GPU each rank runs on, and per representative rank
    its instances as GPUs, each collective kind's cost lines and each collective's duration."""

    __slots__ = ("instances", "gpu_of", "by_rank", "lines", "durations", "hops")

    def __init__(self, instances: tuple[tuple[int, ...], ...], gpu_of: list[int]) -> None:
        self.instances = instances
        self.gpu_of = gpu_of
        self.by_rank: dict[int, tuple] = {}  # rank -> BoundModel._instances
        self.lines: dict[tuple[int, str], list[tuple[float, float]]] = {}  # (rank, kind) -> BoundModel._cost_lines
        self.durations: dict[tuple[int, str, float], float] = {}  # (rank, kind, bytes) -> the collective's bound
        self.hops: dict[tuple[int, int], tuple[float, float]] | None = None  # BoundModel._hop_s, shared by content


class BoundModel:
    """Lower bounds for schedules on one machine and GPU count; its caches serve every plan of a search."""

    def __init__(self, machine: Machine, gpus: int) -> None:
        self.machine = machine
        self.compute = ComputeModel(machine.device)
        self.collectives = CollectiveModel(Fabric(machine, gpus))
        self.gpu_of = place_ranks(gpus, machine)
        self._by_layout: dict[tuple[int, int], _Layout] = {}  # by the id of its instances tuple and of its placement
        self._transfer: dict[tuple, float] = {}  # across plans: keyed by GPUs
        self._lines: dict[tuple, list[tuple[float, float]]] = {}  # across plans: keyed by GPUs, not axis names
        self._node_lines: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._stage_line_cache: dict[tuple, list[tuple[float, float]]] = {}  # across plans: keyed by GPUs
        # across plans: a point-to-point axis's instances (the same for every plan of one pipeline depth) -> per
        # (from, to) position, a transfer's latency and seconds per byte with every instance on the links
        self._hops_by_instances: dict[tuple, dict[tuple[int, int], tuple[float, float]]] = {}
        # placements other than rank r on GPU r (dpouter's), by (ranks, inner ranks, stages), and each one's inverse
        self._placements: dict[tuple[int, int, int], list[int]] = {}
        self._rank_of_gpu: dict[int, dict[int, int]] = {}  # by the id of a placement

    def _placement(self, schedule: Schedule) -> list[int]:
        """The GPU each rank of `schedule` runs on, as the simulator places them (twin.mesh.rank_gpus): the same
        list for every schedule of one placement, so that its id keys the caches that depend on it."""
        plan = schedule.info.plan
        if not dp_outermost(plan):
            return self.gpu_of
        key = (plan.world_size, plan.world_size // (plan.gdata * plan.pp), plan.pp)
        if key not in self._placements:
            self._placements[key] = rank_gpus(plan)
        return self._placements[key]

    def _layout(self, schedule: Schedule, axis: str) -> _Layout:
        instances = schedule.group(axis).instances
        gpu_of = self._placement(schedule)
        key = (id(instances), id(gpu_of))
        layout = self._by_layout.get(key)
        if layout is None or layout.instances is not instances or layout.gpu_of is not gpu_of:
            if len(self._by_layout) >= LAYOUTS_KEPT:
                self._by_layout.clear()
            layout = self._by_layout[key] = _Layout(instances, gpu_of)
        return layout

    def _collective_s(self, schedule: Schedule, axis: str, rank: int, kind: str, nbytes: float) -> float:
        layout = self._layout(schedule, axis)
        key = (rank, kind, nbytes)
        if key not in layout.durations:
            if (rank, kind) not in layout.lines:
                layout.lines[(rank, kind)] = self._cost_lines(self._instances(schedule, axis, rank), kind)
            layout.durations[key] = min(latency + nbytes * s_per_byte
                                        for latency, s_per_byte in layout.lines[(rank, kind)])
        return layout.durations[key]

    def _instances(self, schedule: Schedule, axis: str, rank: int) -> tuple[tuple[int, ...], tuple, tuple, int]:
        """(representative's instance, axis's first instance, instances of its pipeline stage on the representative's
        node), as GPUs, and the representative's node."""
        layout = self._layout(schedule, axis)
        if rank not in layout.by_rank:
            fabric, gpu_of = self.collectives.fabric, layout.gpu_of
            node = fabric.node_of(gpu_of[rank])
            stage = schedule.world_size // (schedule.info.plan.pp if schedule.info.plan else 1)  # ranks a stage
            local = {r for r in self._ranks_on_node(gpu_of, node) if r // stage == rank // stage}
            mine, touching = None, []
            for members in layout.instances:
                hit = local.intersection(members)
                if hit:
                    touching.append(tuple(gpu_of[r] for r in members))
                    local -= hit
                if rank in members:
                    mine = tuple(gpu_of[r] for r in members)
                if not local and mine is not None:
                    break
            first = tuple(gpu_of[r] for r in layout.instances[0])
            layout.by_rank[rank] = (mine, first, tuple(touching), node)
        return layout.by_rank[rank]

    def _ranks_on_node(self, gpu_of: list[int], node: int) -> list[int]:
        """The ranks placed on the node's GPUs."""
        if id(gpu_of) not in self._rank_of_gpu:
            self._rank_of_gpu[id(gpu_of)] = {g: r for r, g in enumerate(gpu_of)}
        rank_of = self._rank_of_gpu[id(gpu_of)]
        gpn = self.machine.node.gpus_per_node
        return [rank_of[g] for g in range(node * gpn, (node + 1) * gpn) if g in rank_of]

    def _cost_lines(self, instances, kind: str) -> list[tuple[float, float]]:
        """(latency, seconds per byte) of each (algorithm, protocol): the bound is the lowest line at nbytes."""
        mine, first, touching, node = instances
        key = (mine, first, touching, node, kind)
        if key in self._lines:
            return self._lines[key]
        model, fabric = self.collectives, self.collectives.fabric
        capacity = fabric.capacity_for(kind)
        lines = []
        for own in model.lowerings(mine, kind):
            try:
                others = [model.lowering(g, kind, own.algorithm) for g in touching]
                head = model.lowering(first, kind, own.algorithm)
            except KeyError:
                continue
            per_byte = _shared_phases_s(own, others, capacity)
            for protocol in model.tuning.protocols:
                latency = min(model.latency_s(own, protocol), model.latency_s(head, protocol))
                lines.append((latency, per_byte / model.bw_fraction(kind, protocol)))
        self._lines[key] = lines
        return lines

    def _transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        key = (src, dst, nbytes)
        if key not in self._transfer:
            self._transfer[key] = self.collectives.time_alone_s(self.collectives.transfer(src, dst), "simple", nbytes)
        return self._transfer[key]

    def _op_s(self, schedule: Schedule, rank: int, work) -> float:
        """An op's duration in the bound: compute alone, a collective or transfer with the fabric to itself."""
        if isinstance(work, Collective):
            return self._collective_s(schedule, work.group, rank, work.kind, work.nbytes)
        if isinstance(work, P2P):
            return self._p2p_s(schedule, rank, work)
        return self.compute.duration_s(work)

    def _p2p_s(self, schedule: Schedule, rank: int, work: P2P) -> float:
        """A transfer's duration in the bound: alone, or, where every program of the schedule is one whole
        pipeline stage, with every instance of its axis on the links. The simulator types a transfer by its
        family (twin.sim.flowtypes: the sum of every instance's route) and runs it at most at that load's pace;
        with one program per stage every instance of the axis meets the same classes, so they are one family
        (twin.sim.symmetry), and on a network the stages' boundaries funnel through the same few global links.
        Elsewhere (stages of several programs) the family is not known here, and the transfer counts alone."""
        layout = self._layout(schedule, work.group)
        members = next(m for m in layout.instances if rank in m)
        position = members.index(rank)
        src, dst = (position, position + work.peer) if work.kind == "send" else (position + work.peer, position)
        return self._hop_s(schedule, layout, members, src, dst, work.nbytes)

    def _hop_s(self, schedule: Schedule, layout: _Layout, members: tuple[int, ...], src: int, dst: int,
               nbytes: float) -> float:
        """_p2p_s of a transfer from position `src` to `dst` of the axis instance `members`."""
        gpu_of = layout.gpu_of
        alone = self._transfer_s(gpu_of[members[src]], gpu_of[members[dst]], nbytes)
        stage_ranks = schedule.world_size // len(members)
        if any(len(program.ranks) != stage_ranks for program in schedule.programs):
            return alone
        if layout.hops is None:  # the axis's instances hashed once per layout, not per op
            if len(self._hops_by_instances) >= LAYOUTS_KEPT:
                self._hops_by_instances.clear()
            layout.hops = self._hops_by_instances.setdefault((layout.instances, id(gpu_of)), {})
        if (src, dst) not in layout.hops:
            first = layout.instances[0]
            loads = self.collectives.fabric.route_dense(
                (gpu_of[m[src]], gpu_of[m[dst]], 1.0, None) for m in layout.instances)
            per_byte = float((loads / self.collectives.fabric.capacity_bytes_per_s).max())
            transfer = self.collectives.transfer(gpu_of[first[src]], gpu_of[first[dst]])
            layout.hops[(src, dst)] = (self.collectives.latency_s(transfer, "simple"), per_byte)
        latency, per_byte = layout.hops[(src, dst)]
        return max(alone, min(latency, alone) + nbytes * per_byte)

    def op_durations_s(self, schedule: Schedule, program: Program) -> list[float]:
        """Every op's duration in the bound, for the program's first rank (and twin.search.screen's chains)."""
        return [self._op_s(schedule, program.ranks[0], op.work) for op in program.ops]

    def stage_op_durations_s(self, schedule: Schedule, program: Program) -> list[float]:
        """Every op's duration at most what the full bound gives the same op on any pipeline stage laid out on
        whole nodes like this program's (twin.search.screen's pipeline term): compute alone; a collective at its
        latency plus its bytes over the busiest of the nodes' own links (on-node and NIC links), shared with the
        instances of its axis on its node, without network links, over every algorithm that applies to its
        instance. Network links depend on where a stage sits; the nodes' own links repeat on every node, so a
        stage shifted by whole nodes loads the same ones, with the same instances of each axis on them (or more:
        on a node the grid does not fill, the plan's other replicas), and its instances have the same shape,
        latency and algorithms. Only for schedules without pipeline transfers (the screen's grid)."""
        rank, out = program.ranks[0], []
        for op in program.ops:
            work = op.work
            if isinstance(work, P2P):
                raise ValueError("stage_op_durations_s: the schedule has pipeline transfers; give the grid's")
            if isinstance(work, Collective):
                mine, _, touching, _ = self._instances(schedule, work.group, rank)
                out.append(min(latency + work.nbytes * s_per_byte
                               for latency, s_per_byte in self._stage_lines(mine, touching, work.kind)))
            else:
                out.append(self.compute.duration_s(work))
        return out

    def _stage_lines(self, mine: tuple[int, ...], touching: tuple, kind: str) -> list[tuple[float, float]]:
        """(latency, seconds per byte on the nodes' busiest own link, shared with the axis's instances on the node)
        of each (algorithm, protocol); one that not every instance there has (the full bound's skip) counts alone."""
        key = (mine, touching, kind)
        if key not in self._stage_line_cache:
            model = self.collectives
            capacity, end = model.fabric.capacity_for(kind), model.fabric.node_link_count
            lines = []
            for own in model.lowerings(mine, kind):
                try:
                    others = [model.lowering(g, kind, own.algorithm) for g in touching]
                except KeyError:
                    others = [own]
                per_byte = _shared_phases_s(own, others, capacity, end)
                lines += [(model.latency_s(own, protocol), per_byte / model.bw_fraction(kind, protocol))
                          for protocol in model.tuning.protocols]
            self._stage_line_cache[key] = lines
        return self._stage_line_cache[key]

    def program_terms_s(self, schedule: Schedule, program: Program, durations: list[float] | None = None
                        ) -> tuple[float, ...]:
        """The bounds of one program: its longest path, its compute slowed by each communication stream's (one term
        a stream, in the streams' order), and its busiest link. Each is a sum over the program's ops, so it grows
        linearly with repeated layers and micro-batches (twin.search.rank continues each one separately before
        taking the largest; one slowed term for the busiest stream alone would not be a line where which stream
        is busiest changes with the layers, as AxoNN's gathers and reduce-scatters over Z on two streams do)."""
        rank = program.ranks[0]
        if durations is None:
            durations = self.op_durations_s(schedule, program)
        end = [0.0] * len(program.ops)
        busy: dict[str, float] = {}  # per stream: the sum of its ops' durations
        traffic: dict[tuple, int] = {}  # (axis, kind, bytes) -> collectives issued
        stream_free: dict[str, float] = {}
        for op in program.ops:
            start = stream_free.get(op.stream, 0.0)
            for dep in op.deps:
                if end[dep] > start:
                    start = end[dep]
            work = op.work
            t = durations[op.id]
            if isinstance(work, Collective):
                traffic[(work.group, work.kind, work.nbytes)] = traffic.get((work.group, work.kind, work.nbytes), 0) + 1
            end[op.id] = stream_free[op.stream] = start + t
            busy[op.stream] = busy.get(op.stream, 0.0) + t
        compute = busy.pop(COMPUTE_STREAM, 0.0)
        # Compute slowed while communication runs: with W of compute and at least U of communication, doing
        # x of the compute under communication takes (W - x) + x / r and leaves U + (W - x) of the step
        # outside it (r = 1 - slowdown); the larger of the two is smallest at x = r U: W + (1 - r) U.
        slowdown = self.machine.device.comm_compute_slowdown
        slowed = tuple(compute + slowdown * busy[stream] for stream in sorted(busy)) or (compute,)
        return max(end, default=0.0), *slowed, self._busiest_link_s(schedule, rank, traffic)

    def _busiest_link_s(self, schedule: Schedule, rank: int, traffic: dict[tuple, int]) -> float:
        """The busiest link: every byte the step's collectives (their instances on the representative's node) put
        on it, over its capacity.

        Collectives of different streams overlap in time but share these links;
        with the simulator's own choice of algorithm and protocol per collective,
        no schedule moves the step's bytes through a link faster than its capacity.
        """
        weights: dict[tuple, float] = {}  # per node-lines key: bytes moved with that lowering
        for (axis, kind, nbytes), count in traffic.items():
            mine, first, touching, node = self._instances(schedule, axis, rank)
            lowering, protocol = self.collectives.choose(first, kind, nbytes, peers=touching)
            key = (touching, node, kind, lowering.algorithm, protocol)
            weights[key] = weights.get(key, 0.0) + nbytes * count
        if not weights:
            return 0.0
        lines = [self._node_seconds_per_byte(*key) for key in weights]
        links = np.concatenate([line[0] for line in lines])
        seconds = np.concatenate([line[1] * w for line, w in zip(lines, weights.values())])
        return float(np.bincount(links, weights=seconds).max()) if len(links) else 0.0

    def _node_seconds_per_byte(self, touching, node: int, kind: str, algorithm: str, protocol: str
                               ) -> tuple[np.ndarray, np.ndarray]:
        """(link ids, seconds per byte on each) of the instances on the node, all phases together."""
        key = (touching, node, kind, algorithm, protocol)
        if key not in self._node_lines:
            model, fabric = self.collectives, self.collectives.fabric
            capacity, fraction = fabric.capacity_for(kind), model.bw_fraction(kind, protocol)
            out: dict[int, float] = {}
            for gpus in touching:
                for phase in model.lowering(gpus, kind, algorithm).phases:
                    for link, load in phase.items():
                        out[link] = out.get(link, 0.0) + load / (capacity[link] * fraction)
            self._node_lines[key] = (np.fromiter(out.keys(), dtype=np.int64, count=len(out)),
                                     np.fromiter(out.values(), dtype=float, count=len(out)))
        return self._node_lines[key]

    def bound_s(self, schedule: Schedule) -> float:
        """The largest program's bound: no rank, and so no step, can finish sooner."""
        return max(self.terms_s(schedule))

    def terms_s(self, schedule: Schedule) -> tuple[float, ...]:
        """Every program's bounds (program_terms_s), then the pipeline's, one after the other; the bound is their
        largest."""
        durations = [self.op_durations_s(schedule, p) for p in schedule.programs]  # each op costed once
        own = tuple(t for p, d in zip(schedule.programs, durations) for t in self.program_terms_s(schedule, p, d))
        return own + self.pipeline_terms_s(schedule, durations)

    def pipeline_terms_s(self, schedule: Schedule, durations: list[list[float]] | None = None) -> tuple[float, ...]:
        """One bound per stage of a 1F1B pipeline: twin.search.pipeline_bound."""
        return pipeline_terms_s(self, schedule, durations)

    def stage_hops_s(self, schedule: Schedule, stages: int) -> list[float]:
        """Per stage s, what its boundary with s + 1 adds to the chain of micro-batch 0's forward and the last
        micro-batch's backward (twin.search.pipeline_bound): the activation's transfer to s + 1 (stage s + 1's forward
        waits for it to arrive) and the gradient's back (stage s's backward waits for it), each at its bound
        (_hop_s); sized by stage 0's own transfers to and from stage 1. 0 after the last stage, and where the
        schedule has no such transfers."""
        hops = [0.0] * stages
        first = schedule.programs[0]
        sizes = {kind: min((op.work.nbytes for op in first.ops if isinstance(op.work, P2P) and op.work.group == "pp"
                            and op.work.kind == kind and op.work.peer == 1), default=None) for kind in ("send", "recv")}
        if None in sizes.values():
            return hops
        layout = self._layout(schedule, "pp")
        members = next(m for m in layout.instances if first.ranks[0] in m)
        for stage in range(stages - 1):
            hops[stage] = (self._hop_s(schedule, layout, members, stage, stage + 1, sizes["send"])
                           + self._hop_s(schedule, layout, members, stage + 1, stage, sizes["recv"]))
        return hops
