"""Where endpoints sit in a rail-optimized fat tree: one ``Layout`` for its graph and its link table.

The same interface as ``topologies.networks.dragonfly``: its ``Layout``
gives the switches, the NIC cabling and the links, which
``topologies.networks.graph.network_graph`` draws and ``Fabric`` numbers, so they match link
for link.

Rail-optimized leaves [estimate: NVIDIA DGX SuperPOD reference
architecture]. Nodes are cut into leaf groups ("scalable units") of
``nodes_per_leaf_group`` consecutive nodes; a group has one leaf switch per
NIC index ("rail"), and NIC k of every node of group u is cabled to leaf
(u, k). Traffic between two nodes of one group on the same rail therefore
crosses only that leaf.

Spine pools [estimate]. Everything else goes up to the spine and down again.
The spine level is not cabled switch by switch: each leaf's uplinks form one
pool each way, of ``nodes_per_leaf_group x link_bw / oversubscription``
(full bisection at oversubscription 1), and the spine between the pools is
taken to be non-blocking, with ECMP/adaptive routing spreading flows evenly
over a leaf's uplinks (like the dragonfly's adaptive pools). A full-bisection
fat tree of more levels has the same bottlenecks. Links carry no latency:
the collective model's per-hop latencies stand for the switch hops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from topologies.networks.links import Layout as LayoutBase
from topologies.networks.links import LinkBlock, Vertex

if TYPE_CHECKING:  # pragma: no cover
    from topologies.specs import FatTreeSpec

SPINE = ("spine", 0)


def leaf_of(net: FatTreeSpec, node: int, nic: int) -> tuple[int, int]:
    """(leaf group, rail) of the leaf switch NIC ``nic`` of machine node ``node`` attaches to."""
    return node // net.nodes_per_leaf_group, nic


def uplinks_per_leaf(net: FatTreeSpec) -> int:
    """Uplink cables of one leaf (rounded): as many as its endpoints at full bisection."""
    return max(1, round(net.nodes_per_leaf_group / net.oversubscription))


class Layout(LayoutBase):
    """The leaves of the groups a job's first ``n_nodes`` nodes use, ("leaf", group, rail), and the spine.

    One ("spine", 0) vertex stands for the whole non-blocking spine level.
    Link ids: per used leaf group u, per rail k, the leaf's uplink pool
    (leaf -> spine) then its downlink pool (spine -> leaf), "spine_pool",
    with the bandwidth of all its uplinks together.
    """

    def __init__(self, net: FatTreeSpec, nics_per_node: int, n_nodes: int) -> None:
        self.net, self.nics = net, nics_per_node
        self.n_groups = -(-n_nodes // net.nodes_per_leaf_group)
        self.blocks = (LinkBlock("spine_pool", 2 * self.n_groups * nics_per_node, net.leaf_uplink_bw_bytes_per_s,
                                 self._pool_name, self._pool_ends, count=uplinks_per_leaf(net)),)

    def _pool_ends(self, i: int) -> tuple[Vertex, Vertex]:
        leaf, down = divmod(i, 2)
        vertex = ("leaf", *divmod(leaf, self.nics))
        return (SPINE, vertex) if down else (vertex, SPINE)

    def _pool_name(self, i: int) -> str:
        u, v = self._pool_ends(i)
        return f"{self.switch_name(u)}->{self.switch_name(v)}"

    def switches(self) -> list[Vertex]:
        return [SPINE, *(("leaf", u, k) for u in range(self.n_groups) for k in range(self.nics))]

    def attach(self, node: int, nic: int) -> Vertex:
        return ("leaf", *leaf_of(self.net, node, nic))

    def switch_name(self, switch: Vertex) -> str:
        return "spine" if switch == SPINE else f"leaf{switch[1]}.{switch[2]}"

    def paths(self, src_nodes: np.ndarray, dst_nodes: np.ndarray, nics: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``path`` for many transfers (``LayoutBase.paths``), with numpy."""
        a, b = src_nodes // self.net.nodes_per_leaf_group, dst_nodes // self.net.nodes_per_leaf_group
        rows = np.flatnonzero(a != b)
        up, down = 2 * (a[rows] * self.nics + nics[rows]), 2 * (b[rows] * self.nics + nics[rows]) + 1
        return np.repeat(rows, 2), np.stack([up, down], axis=1).ravel()

    def path_key(self, src_node: int, dst_node: int, nic: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """The two NICs' leaves: a route depends on nothing else."""
        return leaf_of(self.net, src_node, nic), leaf_of(self.net, dst_node, nic)

    def path(self, src_node: int, dst_node: int, nic: int) -> list[int]:
        """None on one leaf; else the source leaf's uplink pool and the destination leaf's downlink pool."""
        a, b = leaf_of(self.net, src_node, nic), leaf_of(self.net, dst_node, nic)
        if a == b:
            return []
        return [2 * (a[0] * self.nics + a[1]), 2 * (b[0] * self.nics + b[1]) + 1]
