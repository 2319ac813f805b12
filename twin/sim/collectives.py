"""Collective algorithms, lowered onto the links their members actually use.

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

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from math import log2
from typing import Callable, Iterable

from topologies.fabric import Fabric
from twin.sim.rings import Arcs, pack_chains, pack_rings



@dataclass(frozen=True)
class Lowering:
    """Per-link bytes per buffer byte, in phases that run one after the other."""

    algorithm: str
    kind: str
    phases: tuple[dict[int, float], ...]  # per phase: link id -> bytes per byte of buffer
    n_ranks: int
    n_nodes: int
    ranks_per_node: int

    def bottleneck_s_per_byte(self, fabric: Fabric) -> float:
        """Seconds per buffer byte on the busiest link of each phase, summed; memoised per fabric (a lowering of
        a large group has thousands of links, and the tuner asks once per protocol and per call)."""
        memo = self.__dict__.get("_bottleneck")
        if memo is not None and memo[0] is fabric:
            return memo[1]
        cap = fabric.capacity_bytes_per_s
        value = sum(max((load / cap[link] for link, load in phase.items()), default=0.0) for phase in self.phases)
        self.__dict__["_bottleneck"] = (fabric, value)  # a frozen dataclass: memo beside the fields
        return value


def per_rank_traffic(kind: str, n: int) -> float:
    """Bytes each rank sends to its ring successor per byte of buffer."""
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    if kind == "broadcast":
        return 1.0
    raise ValueError(f"no ring traffic for {kind}")


def ring_steps(kind: str, n: int) -> int:
    return 2 * (n - 1) if kind == "all_reduce" else n - 1


# ---- algorithms --------------------------------------------------------------

class _Lowerer:
    """Lowers collectives on one fabric, caching the per-node searches."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        node = fabric.machine.node
        self.arcs: Arcs = fabric.ring_arcs()
        self.gpn = node.gpus_per_node
        self._rings = lru_cache(maxsize=None)(lambda members: pack_rings(members, self.arcs))
        self._chains = lru_cache(maxsize=None)(lambda members, starts: pack_chains(members, starts, self.arcs))
        self._unit_ring_loads = lru_cache(maxsize=4096)(self._ring_loads_per_unit)
        self._single_node_ring = lru_cache(maxsize=None)(self._ring_on_node_zero)

    def by_node(self, gpus: tuple[int, ...]) -> dict[int, list[int]]:
        nodes: dict[int, list[int]] = {}
        for g in gpus:
            nodes.setdefault(self.fabric.node_of(g), []).append(self.fabric.local_of(g))
        return nodes

    def channel_starts(self, locals_: tuple[int, ...], nics: list[int]) -> tuple[int, ...]:
        """Per channel (one per NIC), the member it enters the node at: the one nearest that NIC."""
        starts = []
        for nic in nics:
            near = [l for l in locals_ if self.fabric.nearest_nic(l) == nic]
            starts.append(near[0] if near else locals_[0])
        return tuple(starts)

    def ring_loads(self, gpus: tuple[int, ...], traffic: float) -> dict[int, float]:
        """Link loads of rings over `gpus`, each rank sending `traffic` bytes (per buffer byte) onward."""
        if len(gpus) < 2 or traffic == 0:
            return {}
        return {link: load * traffic for link, load in self._unit_ring_loads(gpus).items()}

    def _ring_loads_per_unit(self, gpus: tuple[int, ...]) -> dict[int, float]:
        """Ring loads for one byte sent onward per rank; cached, since every instance of every
        collective kind on the same ranks shares them. A ring inside one node is computed once
        per pattern of local GPUs and translated to its node (on-node link ids repeat per node)."""
        nodes = self.by_node(gpus)
        if len(nodes) == 1:
            (node, locals_), = nodes.items()
            base = self._single_node_ring(tuple(sorted(locals_)))
            shift = node * self.fabric.links_per_node
            return {link + shift: load for link, load in base.items()}
        transfers: list[tuple[int, int, float, int | None]] = []
        node_ids = list(nodes)
        nics = sorted({self.fabric.nearest_nic(l) for l in nodes[node_ids[0]]})
        share = 1.0 / len(nics)
        node_chains = {}
        for node in node_ids:
            members = tuple(sorted(nodes[node]))
            node_chains[node] = self._chains(members, self.channel_starts(members, nics))
        for c, nic in enumerate(nics):
            for j, node in enumerate(node_ids):
                chain = node_chains[node][c]
                base = node * self.gpn
                transfers.extend((base + a, base + b, share, None) for a, b in zip(chain, chain[1:]))
                next_node = node_ids[(j + 1) % len(node_ids)]
                entry = next_node * self.gpn + node_chains[next_node][c][0]
                transfers.append((base + chain[-1], entry, share, nic))
        return self.fabric.route_loads(transfers)

    def _ring_on_node_zero(self, locals_: tuple[int, ...]) -> dict[int, float]:
        rings = self._rings(locals_)
        return self.fabric.route_loads((ring[i], ring[(i + 1) % len(ring)], 1.0 / len(rings), None)
                                       for ring in rings for i in range(len(ring)))

    def ring(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        n = len(gpus)
        nodes = self.by_node(gpus)
        loads = self.ring_loads(gpus, per_rank_traffic(kind, n) if n > 1 else 0.0)
        ppn = max(len(v) for v in nodes.values())
        return Lowering("ring", kind, (dict(loads),), n, len(nodes), ppn)

    def hierarchical(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """All-reduce as reduce-scatter in each node, all-reduce of each shard across nodes
        over all NICs at once (local rank i with the local rank i of every other node), all-gather
        in each node: three phases, one after the other."""
        nodes = self.by_node(gpus)
        per_node, n_nodes = len(next(iter(nodes.values()))), len(nodes)
        ordered = {node: [node * self.gpn + l for l in sorted(locals_)] for node, locals_ in nodes.items()}
        intra: dict[int, float] = defaultdict(float)
        for members in ordered.values():
            for link, load in self.ring_loads(tuple(members), per_rank_traffic("reduce_scatter", per_node)).items():
                intra[link] += load
        inter: dict[int, float] = defaultdict(float)
        for i in range(per_node):
            peers = tuple(members[i] for members in ordered.values())
            for link, load in self.ring_loads(peers, per_rank_traffic("all_reduce", n_nodes) / per_node).items():
                inter[link] += load
        return Lowering("hierarchical", kind, (dict(intra), dict(inter), dict(intra)), len(gpus), n_nodes, per_node)

    def tree(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """A chain inside each node, NCCL's two mirrored binary trees across the nodes' heads."""
        nodes = self.by_node(gpus)
        transfers: list[tuple[int, int, float, int | None]] = []
        heads = []
        for node, locals_ in nodes.items():
            members = tuple(sorted(locals_))
            chain = self._chains(members, members[:1])[0]
            base = node * self.gpn
            for a, b in zip(chain, chain[1:]):  # reduce up the chain, broadcast down
                transfers += [(base + a, base + b, 1.0, None), (base + b, base + a, 1.0, None)]
            heads.append(base + chain[0])
        count = len(heads)
        for order in (list(range(count)), list(reversed(range(count)))):  # two mirrored binary trees
            for pos in range(1, count):
                child, parent = heads[order[pos]], heads[order[(pos - 1) // 2]]
                transfers += [(child, parent, 0.5, None), (parent, child, 0.5, None)]
        ppn = max(len(v) for v in nodes.values())
        return Lowering("tree", kind, (self.fabric.route_loads(transfers),), len(gpus), len(nodes), ppn)

    def neighbour(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """Every rank sends the whole buffer to the next member, in group order, the last to the first:
        one byte per buffer byte on each link of each route (one rank: moves nothing)."""
        n = len(gpus)
        loads = self.fabric.route_loads((gpus[i], gpus[(i + 1) % n], 1.0, None) for i in range(n)) if n > 1 else {}
        nodes = self.by_node(gpus)
        return Lowering("neighbour", kind, (loads,), n, len(nodes), max(len(v) for v in nodes.values()))

    def pairwise(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """Every rank sends nbytes / n straight to every other."""
        n = len(gpus)
        loads = self.fabric.route_loads((src, dst, 1.0 / n, None) for src in gpus for dst in gpus if src != dst)
        nodes = self.by_node(gpus)
        return Lowering("pairwise", kind, (loads,), n, len(nodes), max(len(v) for v in nodes.values()))


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
               peers: Iterable[tuple[int, ...]] = ()) -> tuple[Lowering, str]:
        """The (algorithm, protocol) NCCL's tuner would pick for `gpus`: the fastest alone.

        `peers`: the other groups that will run this collective with the same
        choice (the instances of a symmetric family, twin.sim.symmetry). Only
        algorithms that apply to `gpus` and to every peer are candidates; they
        are timed on `gpus` alone, as before, so where the peers add no
        restriction the choice is the one `gpus` would get by itself.
        Memoised: a step asks for the same collective once per layer.
        """
        candidates = self._common(gpus, kind, peers)
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

    def _common(self, gpus: tuple[int, ...], kind: str, peers: Iterable[tuple[int, ...]]) -> tuple[str, ...]:
        """The algorithms that apply to `gpus` and to every peer, in registry order."""
        common = self.applicable(gpus, kind)
        shapes = {self._shape(peer) for peer in peers}
        return tuple(name for name in common if all(ALGORITHMS[name].applies(shape, kind) for shape in shapes))
