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
scattered input), a broadcast 1 (pipelined).

Latency follows NCCL's tuning model (machines.md; NVIDIA/nccl
src/graph/tuning.cc): ring = base + (steps - inter) intra_hop + inter inter_hop,
tree = base + 2((ppn-1) intra_hop + log2(nodes) inter_hop); the protocol
(LL, LL128, Simple) trades latency for bandwidth, and the fastest
(algorithm, protocol) for the buffer size is chosen, as NCCL's tuner does.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations
from math import log2
from typing import Callable, Iterable

from topologies.fabric import Fabric

# NCCL's MAXCHANNELS (src/include/device.h): at most 32 rings per communicator.
MAX_CHANNELS = 32


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


# ---- intra-node ring and chain search (cached per set of local GPUs) ---------
#
# A directed arc (a, b) between two GPUs is a bundle of `count` physical links
# (Frontier's in-package pairs have 4 xGMI links, others 2 or 1). Like RCCL's
# topology search, each ring (channel) claims one link of every arc it uses,
# so a 4-link bundle can carry four rings while a 1-link arc carries one.

Arcs = dict[tuple[int, int], tuple[float, int]]  # (a, b) -> (bandwidth per link, link count)


def _score(seq: tuple[int, ...], arcs: Arcs, used: dict[tuple[int, int], int], closed: bool):
    """How good a ring or path is, or None if one of its arcs is missing or full.

    Slowest per-link bandwidth first; then the fewest links left on its most
    used arc, and the most links left in total, so rings spread over all the
    pairs of a fully connected node rather than reuse one cycle; then speed.
    """
    hops = len(seq) if closed else len(seq) - 1
    bws, left = [], []
    for i in range(hops):
        arc = (seq[i], seq[(i + 1) % len(seq)])
        if arc not in arcs or used.get(arc, 0) >= arcs[arc][1]:
            return None
        bws.append(arcs[arc][0])
        left.append(arcs[arc][1] - used.get(arc, 0))
    return (min(bws), min(left), sum(left), sum(bws)) if bws else (0.0, 0, 0, 0.0)


def _claim(seq: tuple[int, ...], used: dict[tuple[int, int], int], closed: bool) -> None:
    hops = len(seq) if closed else len(seq) - 1
    for i in range(hops):
        arc = (seq[i], seq[(i + 1) % len(seq)])
        used[arc] = used.get(arc, 0) + 1


# Up to this many GPUs, rings and chains are chosen over every ordering (at most 7! = 5,040 per ring): the
# best by _score, as NCCL's and RCCL's searches pick them on the nodes of today's machines (<= 8 GPUs). Above
# it (a 72-GPU NVLink domain, a 16-GPU node), a search polynomial in the GPUs (_polynomial_cycle) builds them.
EXHAUSTIVE_MAX = 8


def pack_rings(members: tuple[int, ...], arcs: Arcs, max_rings: int = MAX_CHANNELS) -> list[tuple[int, ...]]:
    """Directed rings over local GPUs, each claiming one free link of every arc it uses.

    Greedy: repeatedly take the ring whose slowest link is fastest (then the
    largest total). Falls back to one ring in the given order (routed over
    intermediate GPUs) when no ring of direct links exists.
    """
    if len(members) < 2:
        return [members]
    used: dict[tuple[int, int], int] = {}
    rings: list[tuple[int, ...]] = []
    first, rest = members[0], members[1:]
    while len(rings) < max_rings:
        if len(members) > EXHAUSTIVE_MAX:
            best = _polynomial_cycle(members, arcs, used, closed=True)
        else:
            best, best_score = None, None
            for perm in permutations(rest):
                cycle = (first,) + perm
                score = _score(cycle, arcs, used, closed=True)
                if score is not None and (best_score is None or score > best_score):
                    best, best_score = cycle, score
        if best is None:
            break
        rings.append(best)
        _claim(best, used, closed=True)
    return rings or [members]


def _polynomial_cycle(members: tuple[int, ...], arcs: Arcs, used: dict[tuple[int, int], int], closed: bool,
                      ) -> tuple[int, ...] | None:
    """A Hamiltonian ring (closed) or path from members[0] over arcs with a free link, in polynomial time.

    For each link speed from the fastest down, only arcs at least that fast are allowed, and a depth-first
    search extends the sequence to the member with the fewest free onward arcs (Warnsdorff's rule; ties: the
    arc with the most links left, then the member's order), backtracking at most BACKTRACK_BUDGET x n times.
    The first sequence found is taken: the slowest link of a ring is as fast as this search can make it.
    On a node switch (every pair one equal arc) and on regular direct-link nodes it finds a ring without
    backtracking; on an irregular node it may find fewer rings than an exhaustive search could, never a
    ring that is not one."""
    inside = set(members)
    for floor in sorted({bw for bw, _ in arcs.values()}, reverse=True):
        left = {(a, b): count - used.get((a, b), 0) for (a, b), (bw, count) in arcs.items()
                if bw >= floor and a in inside and b in inside}
        found = _warnsdorff(members, {k: v for k, v in left.items() if v > 0}, closed)
        if found is not None:
            return found
    return None


BACKTRACK_BUDGET = 64  # per member: bounds the search at O(n^3) arc looks


def _warnsdorff(members: tuple[int, ...], left: dict[tuple[int, int], int], closed: bool) -> tuple[int, ...] | None:
    """The depth-first search of _polynomial_cycle over the arcs with links `left` (all > 0)."""
    n = len(members)
    order = {m: i for i, m in enumerate(members)}
    out: dict[int, set[int]] = {m: set() for m in members}
    for a, b in left:
        out[a].add(b)
    path, on_path = [members[0]], {members[0]}
    budget = BACKTRACK_BUDGET * n

    def candidates(at: int) -> list[int]:
        nxt = out[at] - on_path
        return sorted(nxt, key=lambda m: (len(out[m] - on_path), -left[(at, m)], order[m]))

    choices = [candidates(path[-1])]
    while choices:
        if len(path) == n and (not closed or (path[-1], path[0]) in left):
            return tuple(path)
        if choices[-1] and len(path) < n:
            m = choices[-1].pop(0)
            path.append(m)
            on_path.add(m)
            choices.append(candidates(m))
            continue
        budget -= 1
        if budget < 0:
            return None
        choices.pop()
        if len(path) > 1:
            on_path.discard(path.pop())
    return None


def pack_chains(members: tuple[int, ...], starts: tuple[int, ...], arcs: Arcs) -> list[tuple[int, ...]]:
    """One Hamiltonian path per channel through a node's members, from that channel's start GPU.

    Channels claim links as rings do, so chains spread over the node's links;
    a channel that finds no free direct path takes the best path regardless.
    """
    used: dict[tuple[int, int], int] = {}
    chains = []
    for start in starts:
        others = tuple(m for m in members if m != start)
        best, best_score = None, None
        for relaxed in (False, True):
            if len(members) > EXHAUSTIVE_MAX:
                best = _polynomial_cycle((start,) + others, arcs, {} if relaxed else used, closed=False)
            else:
                for perm in permutations(others):
                    path = (start,) + perm
                    score = _score(path, arcs, {} if relaxed else used, closed=False)
                    if score is not None and (best_score is None or score > best_score):
                        best, best_score = path, score
            if best is not None:
                break
        path = best if best is not None else (start,) + others
        _claim(path, used, closed=False)
        chains.append(path)
    return chains


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
    """Rings carry every kind but all_to_all, on any group (one rank: a ring that moves nothing)."""
    return kind != "all_to_all"


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
        if lowering.algorithm == "p2p":  # [estimate] NCCL's ring base latency plus one hop
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
        if best is None:  # every group has ring or pairwise: a kind outside the IR's
            raise ValueError(f"no collective algorithm applies to {kind!r}")
        self._choice[key] = best[1], best[2]
        return best[1], best[2]

    def _common(self, gpus: tuple[int, ...], kind: str, peers: Iterable[tuple[int, ...]]) -> tuple[str, ...]:
        """The algorithms that apply to `gpus` and to every peer, in registry order."""
        common = self.applicable(gpus, kind)
        shapes = {self._shape(peer) for peer in peers}
        return tuple(name for name in common if all(ALGORITHMS[name].applies(shape, kind) for shape in shapes))
