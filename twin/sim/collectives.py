"""Collective algorithms, lowered onto the links their members actually use.

A Lowering says how many bytes cross each directed link of the fabric per
byte of the collective's buffer (`loads`), and how many latency steps it
takes. Its time alone is latency + nbytes * max_link(load / capacity) /
protocol_efficiency; shared with other traffic, the simulator's flow network
(twin.sim.network) decides.

Algorithms, in a registry by name (what NCCL/RCCL would choose between):

- "ring": the ranks form rings; the buffer is split evenly over the rings
  (NCCL channels). Inside one node the rings are packed greedily from the
  direct links, each directed ring using links no earlier ring used and
  chosen to maximise its slowest link (RCCL's topology search finds the same
  two Hamiltonian rings, both directions, on Frontier's 8 GCDs). Across nodes
  there is one channel per NIC the node's members sit near: each channel
  enters a node at the member nearest its NIC, walks the node's members, and
  leaves through the same NIC to the next node.
- "tree": all-reduce only, across nodes: a chain inside each node and
  NCCL's double binary tree across nodes, each tree carrying half the buffer.
- all_to_all is lowered pairwise (every rank sends nbytes / n to each other).

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
from typing import Callable

from topologies.fabric import Fabric

ALLREDUCE_KINDS = ("all_reduce",)


@dataclass(frozen=True)
class Lowering:
    algorithm: str
    kind: str
    loads: dict[int, float]  # link id -> bytes per byte of buffer
    n_ranks: int
    n_nodes: int
    ranks_per_node: int

    def bottleneck_s_per_byte(self, fabric: Fabric) -> float:
        cap = fabric.capacity_bytes_per_s
        return max((load / cap[link] for link, load in self.loads.items()), default=0.0)


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


# ---- intra-node ring and path search (cached per set of local GPUs) ----------

def _bw(direct: dict[tuple[int, int], float], a: int, b: int) -> float:
    return direct.get((a, b), 0.0)


def pack_rings(members: tuple[int, ...], direct: dict[tuple[int, int], float]) -> list[tuple[int, ...]]:
    """Directed rings over local GPUs, each on direct links unused by earlier rings.

    Greedy: repeatedly take the ring whose slowest link is fastest (then the
    largest total). Falls back to one ring in the given order (routed over
    intermediate GPUs) when no ring of direct links exists.
    """
    if len(members) < 2:
        return [members]
    used: set[tuple[int, int]] = set()
    rings: list[tuple[int, ...]] = []
    first, rest = members[0], members[1:]
    while True:
        best, best_score = None, None
        for perm in permutations(rest):
            cycle = (first,) + perm
            arcs = [(cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle))]
            if any(arc in used or arc not in direct for arc in arcs):
                continue
            bws = [direct[arc] for arc in arcs]
            score = (min(bws), sum(bws))
            if best_score is None or score > best_score:
                best, best_score = cycle, score
        if best is None:
            break
        rings.append(best)
        used.update((best[i], best[(i + 1) % len(best)]) for i in range(len(best)))
        if len(best) == 2:  # a 2-ring uses both directions of its only pair
            break
    return rings or [members]


def best_path(start: int, others: tuple[int, ...], direct: dict[tuple[int, int], float]) -> tuple[int, ...]:
    """A Hamiltonian path from `start` through `others` maximising its slowest link."""
    if not others:
        return (start,)
    best, best_score = None, None
    for perm in permutations(others):
        path = (start,) + perm
        bws = [_bw(direct, path[i], path[i + 1]) for i in range(len(path) - 1)]
        score = (min(bws), sum(bws))
        if best_score is None or score > best_score:
            best, best_score = path, score
    assert best is not None
    return best


# ---- algorithms --------------------------------------------------------------

class _Lowerer:
    """Lowers collectives on one fabric, caching the per-node searches."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.direct = fabric.local_direct_links()
        self.gpn = fabric.machine.node.gpus_per_node
        self._rings = lru_cache(maxsize=None)(lambda members: pack_rings(members, self.direct))
        self._path = lru_cache(maxsize=None)(lambda start, others: best_path(start, others, self.direct))

    def by_node(self, gpus: tuple[int, ...]) -> dict[int, list[int]]:
        nodes: dict[int, list[int]] = {}
        for g in gpus:
            nodes.setdefault(self.fabric.node_of(g), []).append(self.fabric.local_of(g))
        return nodes

    def add_route(self, loads: dict[int, float], src: int, dst: int, amount: float, nic: int | None = None) -> None:
        for link in self.fabric.route(src, dst, nic):
            loads[link] += amount

    def node_chain(self, locals_: list[int], nic: int) -> tuple[int, ...]:
        """The members of one node in the order a channel through `nic` visits them."""
        near = [l for l in sorted(locals_) if self.fabric.nearest_nic(l) == nic]
        start = near[0] if near else min(locals_)
        return self._path(start, tuple(sorted(l for l in locals_ if l != start)))

    def ring(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        n = len(gpus)
        nodes = self.by_node(gpus)
        loads: dict[int, float] = defaultdict(float)
        traffic = per_rank_traffic(kind, n) if n > 1 else 0.0
        ppn = max(len(v) for v in nodes.values())
        if len(nodes) == 1:
            (node, locals_), = nodes.items()
            rings = self._rings(tuple(sorted(locals_)))
            share = traffic / len(rings)
            base = node * self.gpn
            for ring in rings:
                for i in range(len(ring)):
                    if len(ring) > 1:
                        self.add_route(loads, base + ring[i], base + ring[(i + 1) % len(ring)], share)
        else:
            node_ids = list(nodes)
            nics = sorted({self.fabric.nearest_nic(l) for l in nodes[node_ids[0]]})
            share = traffic / len(nics)
            for nic in nics:
                chains = [(node, self.node_chain(nodes[node], nic)) for node in node_ids]
                for j, (node, chain) in enumerate(chains):
                    base = node * self.gpn
                    for a, b in zip(chain, chain[1:]):
                        self.add_route(loads, base + a, base + b, share)
                    next_node, next_chain = chains[(j + 1) % len(chains)]
                    self.add_route(loads, base + chain[-1], next_node * self.gpn + next_chain[0], share, nic)
        return Lowering("ring", kind, dict(loads), n, len(nodes), ppn)

    def tree(self, gpus: tuple[int, ...], kind: str) -> Lowering | None:
        nodes = self.by_node(gpus)
        if kind != "all_reduce" or len(nodes) < 2:
            return None
        loads: dict[int, float] = defaultdict(float)
        heads = []
        for node, locals_ in nodes.items():
            nic = self.fabric.nearest_nic(min(locals_))
            chain = self.node_chain(locals_, nic)
            base = node * self.gpn
            for a, b in zip(chain, chain[1:]):  # reduce up the chain, broadcast down
                self.add_route(loads, base + a, base + b, 1.0)
                self.add_route(loads, base + b, base + a, 1.0)
            heads.append(base + chain[0])
        count = len(heads)
        for order in (list(range(count)), list(reversed(range(count)))):  # two mirrored binary trees
            for pos in range(1, count):
                child, parent = heads[order[pos]], heads[order[(pos - 1) // 2]]
                self.add_route(loads, child, parent, 0.5)
                self.add_route(loads, parent, child, 0.5)
        ppn = max(len(v) for v in nodes.values())
        return Lowering("tree", kind, dict(loads), len(gpus), len(nodes), ppn)

    def pairwise(self, gpus: tuple[int, ...], kind: str) -> Lowering | None:
        if kind != "all_to_all":
            return None
        n = len(gpus)
        loads: dict[int, float] = defaultdict(float)
        for src in gpus:
            for dst in gpus:
                if src != dst:
                    self.add_route(loads, src, dst, 1.0 / n)
        nodes = self.by_node(gpus)
        return Lowering("pairwise", kind, dict(loads), n, len(nodes), max(len(v) for v in nodes.values()))


def _ring(lowerer: _Lowerer, gpus: tuple[int, ...], kind: str) -> Lowering | None:
    return None if kind == "all_to_all" else lowerer.ring(gpus, kind)


ALGORITHMS: dict[str, Callable[[_Lowerer, tuple[int, ...], str], Lowering | None]] = {
    "ring": _ring,
    "tree": lambda lowerer, gpus, kind: lowerer.tree(gpus, kind),
    "pairwise": lambda lowerer, gpus, kind: lowerer.pairwise(gpus, kind),
}


class CollectiveModel:
    """Lowers and times collectives on one fabric."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.tuning = fabric.machine.collectives
        self._lowerer = _Lowerer(fabric)
        self._lowerings = lru_cache(maxsize=None)(self._lower_all)

    def _lower_all(self, gpus: tuple[int, ...], kind: str) -> tuple[Lowering, ...]:
        out = []
        for algo in ALGORITHMS.values():
            lowering = algo(self._lowerer, gpus, kind)
            if lowering is not None:
                out.append(lowering)
        return tuple(out)

    def lowerings(self, gpus: tuple[int, ...], kind: str) -> tuple[Lowering, ...]:
        return self._lowerings(gpus, kind)

    def lowering(self, gpus: tuple[int, ...], kind: str, algorithm: str) -> Lowering:
        for lowering in self._lowerings(gpus, kind):
            if lowering.algorithm == algorithm:
                return lowering
        raise KeyError(algorithm)

    def latency_s(self, lowering: Lowering, protocol: str) -> float:
        t = self.tuning
        if lowering.n_ranks < 2:
            return 0.0
        intra, inter = t.intra_hop_latency_s[protocol], t.inter_hop_latency_s[protocol]
        if lowering.algorithm == "tree":
            base = t.base_latency_s[("tree", protocol)]
            return base + 2 * ((lowering.ranks_per_node - 1) * intra + log2(lowering.n_nodes) * inter)
        base = t.base_latency_s[("ring", protocol)]
        if lowering.algorithm == "pairwise":
            return base + (lowering.n_ranks - 1) * (inter if lowering.n_nodes > 1 else intra)
        steps = ring_steps(lowering.kind, lowering.n_ranks)
        if lowering.n_nodes > 1:
            inter_steps = min(steps, (2 if lowering.kind == "all_reduce" else 1) * lowering.n_nodes)
        else:
            inter_steps = 0
        return base + (steps - inter_steps) * intra + inter_steps * inter

    def time_alone_s(self, lowering: Lowering, protocol: str, nbytes: float) -> float:
        bandwidth_term = nbytes * lowering.bottleneck_s_per_byte(self.fabric) / self.tuning.protocol_bw_fraction[protocol]
        return self.latency_s(lowering, protocol) + bandwidth_term

    def choose(self, gpus: tuple[int, ...], kind: str, nbytes: float) -> tuple[Lowering, str]:
        """The (algorithm, protocol) NCCL's tuner would pick: the fastest alone."""
        best = None
        for lowering in self._lowerings(gpus, kind):
            for protocol in self.tuning.protocols:
                t = self.time_alone_s(lowering, protocol, nbytes)
                if best is None or t < best[0]:
                    best = (t, lowering, protocol)
        assert best is not None, f"no algorithm for {kind}"
        return best[1], best[2]
