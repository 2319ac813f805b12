"""How each collective algorithm loads the links: a Lowering per (group, kind, algorithm).

twin.sim.collectives describes the algorithms, decides which apply to a
group and times them; this module computes where their bytes go. A Lowering
says how many bytes cross each directed link of the fabric per byte of the
collective's buffer, in one or more phases run one after the other. Rings are
packed on the node's links by twin.sim.rings; every transfer is routed by the
fabric (topologies.fabric.Fabric.route_loads).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from topologies.fabric import Fabric, transfer_arrays
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
        cap = fabric.capacity_for(self.kind)
        value = sum(max((load / cap[link] for link, load in phase.items()), default=0.0) for phase in self.phases)
        self.__dict__["_bottleneck"] = (fabric, value)  # a frozen dataclass: memo beside the fields
        return value


Transfer = tuple[int, int, float, "int | None"]  # (src GPU, dst GPU, bytes per buffer byte, NIC or None: nearest)


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
        """Node -> the members' local indices on it, nodes in order of first appearance (gpu // gpus per node:
        Fabric.node_of and local_of, inlined; a family of thousands of instances asks for every one)."""
        nodes: dict[int, list[int]] = {}
        gpn = self.gpn
        for g in gpus:
            node, local = divmod(g, gpn)
            if node in nodes:
                nodes[node].append(local)
            else:
                nodes[node] = [local]
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
        return self.fabric.route_loads(self._ring_transfers(gpus, nodes))

    def _ring_transfers(self, gpus: tuple[int, ...], nodes: dict[int, list[int]] | None = None) -> list[Transfer]:
        """The transfers of rings over `gpus`, one byte sent onward per rank: the node's packed rings inside one
        node; across nodes, one channel per NIC, each walking every node's members and leaving through its NIC."""
        nodes = self.by_node(gpus) if nodes is None else nodes
        if len(nodes) == 1:
            (node, locals_), = nodes.items()
            rings, base = self._rings(tuple(sorted(locals_))), node * self.gpn
            return [(base + ring[i], base + ring[(i + 1) % len(ring)], 1.0 / len(rings), None)
                    for ring in rings for i in range(len(ring))]
        transfers: list[Transfer] = []
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
        return transfers

    def _rings_across(self, across: list[tuple[tuple[int, ...], dict[int, list[int]]]]) -> np.ndarray:
        """The summed loads of rings over groups that span nodes (each with its by_node), one byte sent onward per
        rank. The transfers _ring_transfers lists for a group whose every node holds the same local members (a
        family's usual case) are built as arrays, a batch per such pattern, and all are routed in _ring_transfers'
        order (so the sums are the same to the last bit): a Python tuple per transfer took most of a large
        family's lowering."""
        batches: dict[tuple[tuple[int, ...], int], list[int]] = {}  # (local members, nodes) -> rows of `across`
        blocks: list[tuple[tuple, int] | list[Transfer]] = []  # per group: its batch and row, or its transfers
        for gpus, nodes in across:
            each = iter(nodes.values())
            pattern = tuple(sorted(next(each)))
            if all(tuple(sorted(locals_)) == pattern for locals_ in each):
                rows = batches.setdefault((pattern, len(nodes)), [])
                blocks.append(((pattern, len(nodes)), len(rows)))
                rows.append(len(blocks) - 1)
            else:
                blocks.append(self._ring_transfers(gpus, nodes))
        built = {key: self._ring_arrays(key[0], [list(across[i][1]) for i in rows]) for key, rows in batches.items()}
        parts = [built[block[0]][block[1]] if isinstance(block, tuple) else transfer_arrays(block)
                 for block in blocks]
        if not parts:
            return np.zeros(len(self.fabric.capacity_bytes_per_s))
        return self.fabric.route_dense_arrays(*(np.concatenate(column) for column in zip(*parts)))

    def _ring_arrays(self, members: tuple[int, ...], node_lists: list[list[int]]
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per group (its nodes in order, each holding `members`): the (src, dst, amount, nic) arrays of
        _ring_transfers' list, in its order: per channel, each node's chain, then the hop to the next node."""
        nics = sorted({self.fabric.nearest_nic(l) for l in members})
        chains = self._chains(members, self.channel_starts(members, nics))
        base = np.array(node_lists, dtype=np.int64) * self.gpn  # (groups, nodes)
        after = np.roll(base, -1, axis=1)
        src, dst, nic = [], [], []
        for chain, k in zip(chains, nics):
            steps = np.array(chain, dtype=np.int64)
            src.append(np.concatenate([base[:, :, None] + steps[:-1], (base + steps[-1])[:, :, None]], axis=2))
            dst.append(np.concatenate([base[:, :, None] + steps[1:], (after + steps[0])[:, :, None]], axis=2))
            hop = np.full(len(chain), -1, dtype=np.int64)
            hop[-1] = k
            nic.append(np.broadcast_to(hop, src[-1].shape))
        src_all, dst_all, nic_all = (np.concatenate([a.reshape(len(base), -1) for a in arrays], axis=1)
                                     for arrays in (src, dst, nic))
        amount = np.full(src_all.shape[1], 1.0 / len(nics))
        return [(src_all[i], dst_all[i], amount, nic_all[i]) for i in range(len(base))]

    def _ring_on_node_zero(self, locals_: tuple[int, ...]) -> dict[int, float]:
        return self.fabric.route_loads(self._ring_transfers(locals_))  # local indices are node 0's GPUs

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

    def _routed(self, algorithm: str, gpus: tuple[int, ...], kind: str, transfers: list[Transfer]) -> Lowering:
        """A one-phase lowering: `transfers` routed on the fabric."""
        nodes = self.by_node(gpus)
        return Lowering(algorithm, kind, (self.fabric.route_loads(transfers),), len(gpus), len(nodes),
                        max(len(v) for v in nodes.values()))

    def tree(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """A chain inside each node, NCCL's two mirrored binary trees across the nodes' heads."""
        return self._routed("tree", gpus, kind, self._tree_transfers(gpus))

    def _tree_transfers(self, gpus: tuple[int, ...]) -> list[Transfer]:
        nodes = self.by_node(gpus)
        transfers: list[Transfer] = []
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
        return transfers

    def neighbour(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """Every rank sends the whole buffer to the next member, in group order, the last to the first:
        one byte per buffer byte on each link of each route (one rank: moves nothing)."""
        return self._routed("neighbour", gpus, kind, self._neighbour_transfers(gpus))

    @staticmethod
    def _neighbour_transfers(gpus: tuple[int, ...]) -> list[Transfer]:
        n = len(gpus)
        return [(gpus[i], gpus[(i + 1) % n], 1.0, None) for i in range(n)] if n > 1 else []

    def pairwise(self, gpus: tuple[int, ...], kind: str) -> Lowering:
        """Every rank sends nbytes / n straight to every other."""
        return self._routed("pairwise", gpus, kind, self._pairwise_transfers(gpus))

    @staticmethod
    def _pairwise_transfers(gpus: tuple[int, ...]) -> list[Transfer]:
        n = len(gpus)
        return [(src, dst, 1.0 / n, None) for src in gpus for dst in gpus if src != dst]

    # ---- a family's loads: every instance at once ----------------------------------------------
    def family_loads(self, instances: tuple[tuple[int, ...], ...], kind: str, algorithm: str
                     ) -> tuple[np.ndarray, ...]:
        """Per phase, the loads of every instance of a family together, as a vector over the fabric's links
        (bytes per buffer byte, summed over the instances), routed in one batch: what summing each instance's
        lowering gives, up to the order of the sums. A new algorithm needs its batched form here too
        (tests/test_collective_sizes.py compares each with its lowerings).

        The simulator needs every instance's loads to share the links among them (twin.sim.flowtypes); routing
        them together costs a fraction of one call per instance at tens of thousands of GPUs. Rings inside one
        node are the node's cached pattern, moved to each instance's node."""
        if algorithm == "ring":
            if len(instances[0]) < 2:
                return (np.zeros(len(self.fabric.capacity_bytes_per_s)),)
            return (self._ring_family_unit(instances) * per_rank_traffic(kind, len(instances[0])),)
        if algorithm == "hierarchical":
            return self._hierarchical_family(instances)
        batched = {"tree": self._tree_transfers, "neighbour": self._neighbour_transfers,
                   "pairwise": self._pairwise_transfers}[algorithm]
        return (self.fabric.route_dense(t for gpus in instances for t in batched(gpus)),)

    def _hierarchical_family(self, instances: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, ...]:
        """hierarchical's three phases for every instance: the rings inside each node (reduce-scatter, and the
        same for the all-gather), and the rings of each local rank across the nodes, as `hierarchical` lays them
        out, batched by the instances' shape (each shape has its own traffic per byte)."""
        by_shape: dict[tuple[int, int], tuple[list, list]] = {}  # (per node, nodes) -> (node rings, cross rings)
        for gpus in instances:
            nodes = self.by_node(gpus)
            per_node, n_nodes = len(next(iter(nodes.values()))), len(nodes)
            ordered = [[node * self.gpn + local for local in sorted(locals_)] for node, locals_ in nodes.items()]
            inside, across = by_shape.setdefault((per_node, n_nodes), ([], []))
            inside.extend(tuple(members) for members in ordered)
            across.extend(tuple(members[i] for members in ordered) for i in range(per_node))
        intra = np.zeros(len(self.fabric.capacity_bytes_per_s))
        inter = np.zeros_like(intra)
        for (per_node, n_nodes), (inside, across) in by_shape.items():
            if per_node > 1:
                intra += self._ring_family_unit(tuple(inside)) * per_rank_traffic("reduce_scatter", per_node)
            if n_nodes > 1:
                inter += (self._ring_family_unit(tuple(across)) * per_rank_traffic("all_reduce", n_nodes)
                          / per_node)
        return intra, inter, intra

    def _ring_family_unit(self, instances: tuple[tuple[int, ...], ...]) -> np.ndarray:
        """Every instance's rings, one byte sent onward per rank, summed over the links."""
        on_one_node: dict[tuple[int, ...], list[int]] = defaultdict(list)  # local pattern -> the nodes it is on
        across: list[tuple[tuple[int, ...], dict[int, list[int]]]] = []
        for gpus in instances:
            nodes = self.by_node(gpus)
            if len(nodes) == 1:
                (node, locals_), = nodes.items()
                on_one_node[tuple(sorted(locals_))].append(node)
            else:
                across.append((gpus, nodes))
        total = self._rings_across(across)
        per_node = self.fabric.links_per_node
        for pattern, nodes in on_one_node.items():
            base = self._single_node_ring(pattern)
            links = np.fromiter(base, dtype=np.int64, count=len(base))
            loads = np.fromiter(base.values(), dtype=float, count=len(base))
            ids = (np.asarray(nodes, dtype=np.int64)[:, None] * per_node + links[None, :]).ravel()
            total += np.bincount(ids, weights=np.tile(loads, len(nodes)), minlength=len(total))
        return total
