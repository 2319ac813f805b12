"""Where endpoints sit in a rail-optimized fat tree, as a graph and as a link table.

The same interface as ``topologies.dragonfly``: ``add_network`` adds the
switches to ``Machine.network_graph``, ``Links`` gives ``Fabric`` its link
table, and both follow the rules below, so they match link for link.

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

import networkx as nx
import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from topologies.machine import FatTreeSpec, NicSpec

SPINE = ("spine", 0)


def leaf_of(net: FatTreeSpec, node: int, nic: int) -> tuple[int, int]:
    """(leaf group, rail) of the leaf switch NIC ``nic`` of machine node ``node`` attaches to."""
    return node // net.nodes_per_leaf_group, nic


def uplinks_per_leaf(net: FatTreeSpec) -> int:
    """Uplink cables of one leaf (rounded): as many as its endpoints at full bisection."""
    return max(1, round(net.nodes_per_leaf_group / net.oversubscription))


def add_network(g: nx.DiGraph, net: FatTreeSpec, nics: tuple[NicSpec, ...], n_nodes: int) -> None:
    """Add the leaves of the groups the first ``n_nodes`` nodes use, and the spine, to ``g``.

    Vertices ("leaf", group, rail) and one ("spine", 0) standing for the
    whole non-blocking spine level. Edges: NIC <-> leaf ("nic"), and each
    leaf's uplink pool to the spine and downlink pool from it ("spine_pool",
    bandwidth of all its uplinks together).
    """
    n_used = -(-n_nodes // net.nodes_per_leaf_group)
    g.add_node(SPINE)
    pool = dict(bw_bytes_per_s=net.leaf_uplink_bw_bytes_per_s, kind="spine_pool", count=uplinks_per_leaf(net))
    for u in range(n_used):
        for nic in nics:
            leaf = ("leaf", u, nic.index)
            g.add_edge(leaf, SPINE, **pool)
            g.add_edge(SPINE, leaf, **pool)
    for n in range(n_nodes):
        for nic in nics:
            leaf = ("leaf", *leaf_of(net, n, nic.index))
            attrs = dict(bw_bytes_per_s=nic.bw_bytes_per_s, kind="nic", count=1)
            g.add_edge(("nic", n, nic.index), leaf, **attrs)
            g.add_edge(leaf, ("nic", n, nic.index), **attrs)


class Links:
    """The spine pools of a job's leaves, numbered from ``base`` (see ``topologies.fabric``).

    Ids: per used leaf group u, per rail k, the pool up (leaf -> spine) then
    the pool down (spine -> leaf).
    """

    def __init__(self, net: FatTreeSpec, nics_per_node: int, n_nodes: int, base: int, efficiency: float):
        self.net, self.nics, self.base = net, nics_per_node, base
        self.n_groups = -(-n_nodes // net.nodes_per_leaf_group)
        n_pool = 2 * self.n_groups * nics_per_node
        self.capacity_bytes_per_s = np.full(n_pool, net.leaf_uplink_bw_bytes_per_s * efficiency)
        self.kind = ["spine_pool"] * n_pool

    def names(self) -> list[str]:
        """"leaf2.5->spine" and "spine->leaf2.5" per leaf."""
        return [name for u in range(self.n_groups) for k in range(self.nics)
                for name in (f"leaf{u}.{k}->spine", f"spine->leaf{u}.{k}")]

    def nic_switch(self, node: int, nic: int) -> str:
        """Name of the leaf NIC ``nic`` of ``node`` attaches to, e.g. "leaf0.3"."""
        u, k = leaf_of(self.net, node, nic)
        return f"leaf{u}.{k}"

    def path(self, ns: int, nd: int, nic: int) -> list[int]:
        """Link ids from NIC ``nic``'s leaf on node ``ns`` to NIC ``nic``'s leaf on node ``nd``."""
        a, b = leaf_of(self.net, ns, nic), leaf_of(self.net, nd, nic)
        if a == b:
            return []
        up = self.base + 2 * (a[0] * self.nics + a[1])
        down = self.base + 2 * (b[0] * self.nics + b[1]) + 1
        return [up, down]
