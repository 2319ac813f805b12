"""Collective algorithms, lowered onto the links their members actually use (the lowerings: twin.sim.lowerings).

A Lowering says how many bytes cross each directed link of the fabric per
byte of the collective's buffer, in one or more phases run one after the
other, and how many latency steps it takes. Its time alone is latency +
nbytes * sum_phases max_link(load / capacity) / protocol_efficiency; shared with other traffic, the simulator's flow network
(twin.sim.network) decides.

Algorithms, in a registry by name (what NCCL/RCCL would choose between):

- "ring": the ranks form rings; the buffer is split evenly over the rings
  (NCCL channels). Inside one node the rings are packed greedily from the
  direct links, each directed ring claiming one physical link of each GPU
  pair it uses and chosen to maximise its slowest link (on Frontier's 8 GCDs
  this finds machines.md's two Hamiltonian rings, in both directions). Across
  nodes there is one channel per NIC the node's members sit near: each
  channel enters a node at the member nearest its NIC, walks the node's
  members on links packed the same way, and leaves through that NIC to the
  next node.
- "tree": all-reduce only, across nodes: a chain inside each node and
  NCCL's double binary tree across nodes, each tree carrying half the buffer.
- "hierarchical": all-reduce only, across nodes with several members each:
  reduce-scatter inside each node, all-reduce of each shard across nodes
  (every NIC busy at once), all-gather inside each node (machines.md), as
  three phases one after the other.
- all_to_all is lowered pairwise (every rank sends nbytes / n to each other).
- "neighbour": shift only (ring attention's K/V exchange), every rank sends
  its whole buffer to the next member of the group, the last to the first,
  on the route between the two, all at once. No other algorithm carries a
  shift: their traffic is a reduction's, a gather's or an all-to-all's.

Which algorithms apply to a group depends only on its shape (GroupShape: how
many members sit on each node it touches), so each algorithm in the registry
carries its own test, and the tuner only ever times algorithms whose test
passes. The simulator runs every instance of a symmetric family (twin.sim.
symmetry) with one algorithm: a family's instances can have different shapes
(tensor-parallel degree 3 on 8-GPU nodes puts ranks 6-8 across two nodes and
ranks 9-11 on one), so `choose` takes the other instances as `peers` and picks
among the algorithms that apply to every one of them.

Per rank and per byte of buffer a ring all-reduce sends 2(n-1)/n, an
all-gather or reduce-scatter (n-1)/n (buffer = the gathered output / the
scattered input), a broadcast 1 (pipelined); a shift sends 1, to its one
neighbour (buffer = what each rank sends).

Latency follows NCCL's tuning model (machines.md; NVIDIA/nccl
src/graph/tuning.cc): ring = base + (steps - inter) intra_hop + inter inter_hop,
tree = base + 2((ppn-1) intra_hop + log2(nodes) inter_hop), a point-to-point
send and a shift base + one hop [estimate]; the protocol
(LL, LL128, Simple) trades latency for bandwidth, and the fastest
(algorithm, protocol) for the buffer size is chosen, as NCCL's tuner does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from math import log2
from typing import Callable, Iterable

import numpy as np

from topologies.fabric import Fabric
from twin.sim.lowerings import Lowering, _Lowerer, ring_steps

ROWS_KEPT = 512  # flow types' rows a CollectiveModel keeps for later simulations (cached_rows)


@dataclass(frozen=True)
class GroupShape:
    """Where a group's members sit: all that decides which algorithms apply to it."""

    n_ranks: int
    per_node: tuple[int, ...]  # members on each node the group touches, in node order

    @property
    def n_nodes(self) -> int:
        return len(self.per_node)


def _ring_applies(shape: GroupShape, kind: str) -> bool:
    """Rings carry every kind but all_to_all and shift, on any group (one rank: a ring that moves nothing)."""
    return kind not in ("all_to_all", "shift")


def _tree_applies(shape: GroupShape, kind: str) -> bool:
    """All-reduce across nodes, as the twin models the tree (NCCL can also run it inside one node, as a bare
    chain; the twin leaves one node to the ring, as it always has)."""
    return kind == "all_reduce" and shape.n_nodes >= 2


def _hierarchical_applies(shape: GroupShape, kind: str) -> bool:
    """Shard i of every node meets shard i of every other: the nodes need equal, plural member counts."""
    return (kind == "all_reduce" and shape.n_nodes >= 2 and len(set(shape.per_node)) == 1
            and shape.per_node[0] >= 2)


def _pairwise_applies(shape: GroupShape, kind: str) -> bool:
    return kind == "all_to_all"


def _neighbour_applies(shape: GroupShape, kind: str) -> bool:
    """A shift, and nothing else, is one send to the next member: on any group (one rank: a send to itself)."""
    return kind == "shift"


@dataclass(frozen=True)
class Algorithm:
    """An algorithm the tuner may pick: whether it applies to a group, and its lowering where it does."""

    applies: Callable[[GroupShape, str], bool]
    lower: Callable[[_Lowerer, tuple[int, ...], str], Lowering]


ALGORITHMS: dict[str, Algorithm] = {
    "ring": Algorithm(_ring_applies, lambda lowerer, gpus, kind: lowerer.ring(gpus, kind)),
    "tree": Algorithm(_tree_applies, lambda lowerer, gpus, kind: lowerer.tree(gpus, kind)),
    "hierarchical": Algorithm(_hierarchical_applies, lambda lowerer, gpus, kind: lowerer.hierarchical(gpus, kind)),
    "pairwise": Algorithm(_pairwise_applies, lambda lowerer, gpus, kind: lowerer.pairwise(gpus, kind)),
    "neighbour": Algorithm(_neighbour_applies, lambda lowerer, gpus, kind: lowerer.neighbour(gpus, kind)),
}


class NotApplicable(KeyError):
    """An algorithm asked of a group it does not apply to (a KeyError: the algorithm is not among the group's)."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0])


class CollectiveModel:
    """Lowers and times collectives on one fabric."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.tuning = fabric.machine.collectives
        self._lowerer = _Lowerer(fabric)
        self._lowering = lru_cache(maxsize=None)(self._lower)
        self._shape = lru_cache(maxsize=65536)(self._shape_of)
        self._choice: dict[tuple, tuple[Lowering, str]] = {}
        self._rows: OrderedDict[tuple, tuple] = OrderedDict()

    def cached_rows(self, key: tuple, compute: Callable[[], tuple]) -> tuple:
        """A flow type's (latency, per phase: loaded links, seconds per byte on each) (twin.sim.flowtypes),
        kept for the next simulation on this model: the short steps twin.micro_batches and twin.pipeline_depth
        simulate share their families' routes. Keyed by what determines them (the kind, algorithm, protocol
        and every instance's GPUs); the least recently used go beyond ROWS_KEPT (a family's row can hold
        10^5 links)."""
        if key in self._rows:
            self._rows.move_to_end(key)
            return self._rows[key]
        rows = self._rows[key] = compute()
        if len(self._rows) > ROWS_KEPT:
            self._rows.popitem(last=False)
        return rows

    def _shape_of(self, gpus: tuple[int, ...]) -> GroupShape:
        counts: dict[int, int] = {}
        for g in gpus:
            node = self.fabric.node_of(g)
            counts[node] = counts.get(node, 0) + 1
        return GroupShape(len(gpus), tuple(counts[node] for node in sorted(counts)))

    def shape(self, gpus: tuple[int, ...]) -> GroupShape:
        """How the group's members spread over nodes (memoised: every instance of a family is asked)."""
        return self._shape(gpus)

    def applicable(self, gpus: tuple[int, ...], kind: str) -> tuple[str, ...]:
        """The names of the algorithms that apply to this collective on this group, in registry order."""
        shape = self._shape(gpus)
        return tuple(name for name, algorithm in ALGORITHMS.items() if algorithm.applies(shape, kind))

    def _lower(self, gpus: tuple[int, ...], kind: str, algorithm: str) -> Lowering:
        return ALGORITHMS[algorithm].lower(self._lowerer, gpus, kind)

    def lowerings(self, gpus: tuple[int, ...], kind: str) -> tuple[Lowering, ...]:
        """Every algorithm that applies to this collective."""
        return tuple(self._lowering(gpus, kind, algorithm) for algorithm in self.applicable(gpus, kind))

    def lowering(self, gpus: tuple[int, ...], kind: str, algorithm: str) -> Lowering:
        """One algorithm's lowering (only it is computed: the simulator lowers every instance).

        NotApplicable (a KeyError) when the algorithm does not apply to this
        group: a caller that lowers several groups with one choice must have
        named them all to `choose` as peers."""
        if algorithm not in self.applicable(gpus, kind):
            shape = self._shape(gpus)
            raise NotApplicable(f"{algorithm} does not apply to {kind} on {shape.n_ranks} rank(s) spread "
                                f"{list(shape.per_node)} over {shape.n_nodes} node(s); applicable: "
                                f"{', '.join(self.applicable(gpus, kind))} (pass every group lowered with one "
                                "choice to CollectiveModel.choose as peers)")
        return self._lowering(gpus, kind, algorithm)

    def family_loads(self, instances: tuple[tuple[int, ...], ...], kind: str, algorithm: str
                     ) -> tuple[np.ndarray, ...]:
        """Per phase, every instance's link loads summed (bytes per buffer byte), as a vector over the fabric's
        links, routed in one batch (twin.sim.lowerings). The algorithm must apply to every instance (`choose`
        with the others as peers)."""
        self.lowering(instances[0], kind, algorithm)  # NotApplicable, with its message, where it does not apply
        return self._lowerer.family_loads(instances, kind, algorithm)

    def transfer(self, src_gpu: int, dst_gpu: int) -> Lowering:
        """A point-to-point send: one byte on every link of the route per byte sent."""
        loads = {link: 1.0 for link in self.fabric.route(src_gpu, dst_gpu)}
        nodes = len({self.fabric.node_of(src_gpu), self.fabric.node_of(dst_gpu)})
        return Lowering("p2p", "send", (loads,), 2, nodes, 1)

    def latency_s(self, lowering: Lowering, protocol: str) -> float:
        if lowering.n_ranks < 2:
            return 0.0
        return self._algorithm_latency_s(lowering, protocol) + self.tuning.kind_latency_s.get(lowering.kind, 0.0)

    def _algorithm_latency_s(self, lowering: Lowering, protocol: str) -> float:
        t = self.tuning
        intra, inter = t.intra_hop_latency_s[protocol], t.inter_hop_latency_s[protocol]
        if lowering.algorithm == "p2p" and lowering.n_nodes == 1 and protocol in t.p2p_latency_s:
            return t.p2p_latency_s[protocol]  # measured inside one node (twin calibrate)
        if lowering.algorithm in ("p2p", "neighbour"):  # [estimate] NCCL's ring base latency plus one hop
            # (a shift's sends all run at once: one hop, inter-node where the group spans nodes)
            return t.base_latency_s[("ring", protocol)] + (inter if lowering.n_nodes > 1 else intra)
        if lowering.algorithm == "tree":
            base = t.base_latency_s[("tree", protocol)]
            return base + 2 * ((lowering.ranks_per_node - 1) * intra + log2(lowering.n_nodes) * inter)
        base = t.base_latency_s[("ring", protocol)]
        if lowering.algorithm == "hierarchical":
            base = t.base_latency_s[("ring", protocol)]
            return base + 2 * (lowering.ranks_per_node - 1) * intra + 2 * (lowering.n_nodes - 1) * inter
        if lowering.algorithm == "pairwise":
            return base + (lowering.n_ranks - 1) * (inter if lowering.n_nodes > 1 else intra)
        steps = ring_steps(lowering.kind, lowering.n_ranks)
        if lowering.n_nodes > 1:
            inter_steps = min(steps, (2 if lowering.kind == "all_reduce" else 1) * lowering.n_nodes)
        else:
            inter_steps = 0
        return base + (steps - inter_steps) * intra + inter_steps * inter

    def bw_fraction(self, kind: str, protocol: str) -> float:
        """Achieved / link bandwidth for this protocol and collective kind."""
        return self.tuning.protocol_bw_fraction[protocol] * self.tuning.kind_fraction(kind)

    def time_alone_s(self, lowering: Lowering, protocol: str, nbytes: float) -> float:
        bandwidth_term = nbytes * lowering.bottleneck_s_per_byte(self.fabric) / self.bw_fraction(lowering.kind, protocol)
        return self.latency_s(lowering, protocol) + bandwidth_term

    def choose(self, gpus: tuple[int, ...], kind: str, nbytes: float,
               peers: Iterable[tuple[int, ...]] = (), candidates: tuple[str, ...] | None = None
               ) -> tuple[Lowering, str]:
        """The (algorithm, protocol) NCCL's tuner would pick for `gpus`: the fastest alone.

        `peers`: the other groups that will run this collective with the same
        choice (the instances of a symmetric family, twin.sim.symmetry). Only
        algorithms that apply to `gpus` and to every peer are candidates; they
        are timed on `gpus` alone, as before, so where the peers add no
        restriction the choice is the one `gpus` would get by itself.
        Memoised: a step asks for the same collective once per layer.
        `candidates`: common(gpus, kind, peers), where the caller has it (a
        family's collectives of every size share it).
        """
        if candidates is None:
            candidates = self.common(gpus, kind, peers)
        key = (gpus, kind, nbytes, candidates)
        if key in self._choice:
            return self._choice[key]
        best = None
        for algorithm in candidates:
            lowering = self._lowering(gpus, kind, algorithm)
            for protocol in self.tuning.protocols:
                t = self.time_alone_s(lowering, protocol, nbytes)
                if best is None or t < best[0]:
                    best = (t, lowering, protocol)
        if best is None:  # every group has ring, pairwise or neighbour: a kind outside the IR's
            raise ValueError(f"no collective algorithm applies to {kind!r}")
        self._choice[key] = best[1], best[2]
        return best[1], best[2]

    def common(self, gpus: tuple[int, ...], kind: str, peers: Iterable[tuple[int, ...]]) -> tuple[str, ...]:
        """The algorithms that apply to `gpus` and to every peer, in registry order."""
        common = self.applicable(gpus, kind)
        shapes = {self._shape(peer) for peer in peers}
        return tuple(name for name in common if all(ALGORITHMS[name].applies(shape, kind) for shape in shapes))
