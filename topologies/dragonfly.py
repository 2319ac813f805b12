"""Where endpoints and global links sit in a Slingshot dragonfly, as a graph and as a link table.

Vendors publish the shape of a dragonfly (groups, switches per group, links
per group pair) but not the cabling, so the rules below are estimates chosen
to respect the published port counts. They live in one module, with the
inspection graph (``add_network``, used by ``Machine.network_graph``) and the
simulator's link table (``Links``, used by ``Fabric``), so the two cannot
disagree. ``topologies.fattree`` has the same interface.

Endpoint rule [estimate]. An HPE Cray EX chassis holds 16 nodes and four
switch blades; a node's NIC k is cabled to the chassis' k-th switch. In
general: the nodes of a group are cut into blocks of
``endpoint_ports_per_switch`` consecutive nodes, and NIC k of every node in
block b attaches to switch ``b * nics_per_node + k``. Each switch then has at
most ``endpoint_ports_per_switch`` endpoints, and jobs that keep to one NIC
index ("rail") inside a block stay on one switch.

Global link rule [estimate]. Group g numbers its peers h = 0, 1, ... skipping
itself (``p = h if h < g else h - 1``); link j of the pair (g, h) leaves g
from switch ``(p * links_per_pair + j) % switches_per_group``. The links of a
pair therefore start on consecutive, distinct switches, and each group's
global ports spread evenly over its switches (Frontier: 73 x 4 = 292 ports
over 32 switches, at most 10 per switch of the 16 a Rosetta switch has).

Minimal routing with ECMP spreading. Between two groups, a message between
nodes u and v uses link ``(u + v) % links_per_pair``: deterministic, the same
in both directions, and spread over the parallel links the way adaptive
routing spreads flows. Non-minimal (UGAL) paths are not modelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx
import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    from topologies.machine import DragonflySpec as NetworkSpec
    from topologies.machine import NicSpec


def nic_switch(net: NetworkSpec, nics_per_node: int, node: int, nic: int) -> tuple[int, int]:
    """(group, switch) that NIC ``nic`` of machine node ``node`` attaches to."""
    group, slot = divmod(node, net.nodes_per_group)
    return group, (slot // net.endpoint_ports_per_switch) * nics_per_node + nic


def switches_needed(net: NetworkSpec, nics_per_node: int) -> int:
    """Switches a full group needs under the endpoint rule."""
    blocks = -(-net.nodes_per_group // net.endpoint_ports_per_switch)
    return blocks * nics_per_node


def global_port(net: NetworkSpec, group: int, peer: int, link: int) -> int:
    """Switch of ``group`` that owns global link ``link`` towards ``peer``."""
    p = peer if peer < group else peer - 1
    return (p * net.global_links_per_group_pair + link) % net.switches_per_group


def global_link_index(net: NetworkSpec, src_node: int, dst_node: int) -> int:
    """Which of the parallel global links a message between two nodes takes."""
    return (src_node + dst_node) % net.global_links_per_group_pair


def add_network(g: nx.DiGraph, net: NetworkSpec, nics: tuple[NicSpec, ...], n_nodes: int) -> None:
    """Add the switches of the groups the first ``n_nodes`` nodes use, and their links, to ``g``.

    Vertices ("switch", group, s). Edges, both ways: NIC <-> switch ("nic"),
    all-to-all switch links inside each group ("local"), and the global links
    between every pair of used groups ("global"; parallel links between the
    same two switches merge into one edge with a larger count).
    """
    n_used = -(-n_nodes // net.nodes_per_group)
    link = dict(bw_bytes_per_s=net.link_bw_bytes_per_s, count=1)
    for grp in range(n_used):
        g.add_nodes_from(("switch", grp, s) for s in range(net.switches_per_group))
        for a in range(net.switches_per_group):
            for b in range(net.switches_per_group):
                if a != b:
                    g.add_edge(("switch", grp, a), ("switch", grp, b), kind="local", **link)
    for n in range(n_nodes):
        for nic in nics:
            sw = ("switch", *nic_switch(net, len(nics), n, nic.index))
            attrs = dict(bw_bytes_per_s=nic.bw_bytes_per_s, kind="nic", count=1)
            g.add_edge(("nic", n, nic.index), sw, **attrs)
            g.add_edge(sw, ("nic", n, nic.index), **attrs)
    for ga in range(n_used):
        for gb in range(ga + 1, n_used):
            for j in range(net.global_links_per_group_pair):
                u = ("switch", ga, global_port(net, ga, gb, j))
                v = ("switch", gb, global_port(net, gb, ga, j))
                for x, y in ((u, v), (v, u)):
                    if g.has_edge(x, y):
                        g[x][y]["count"] += 1
                        g[x][y]["bw_bytes_per_s"] += net.link_bw_bytes_per_s
                    else:
                        g.add_edge(x, y, kind="global", **link)


class Links:
    """The dragonfly links of a job's groups, numbered from ``base`` (see ``topologies.fabric``).

    Ids: per used group, the all-to-all local links between its switches;
    per pair of used groups, each global link in both directions; with
    adaptive routing, per used group a global egress and ingress pool.

    Routing between groups. "minimal": local hop to the switch owning the
    global link, the global link (one of the pair's parallel links,
    ECMP-spread), local hop. "adaptive" (Slingshot's UGAL-style routing)
    [estimate]: traffic leaving a group spreads over all its global links,
    minimally or through an intermediate group, so its bottleneck is the
    group's pooled global bandwidth: links_per_pair x (n_groups - 1) links,
    halved because a non-minimal path crosses two global links. The pool
    assumes the rest of the machine is idle; local hops inside the groups are
    left out (a switch's 31 local ports carry more than its 16 endpoints can
    inject).
    """

    def __init__(self, net: NetworkSpec, nics_per_node: int, n_nodes: int, base: int, efficiency: float):
        self.net, self.nics = net, nics_per_node
        S = net.switches_per_group
        self.n_groups = n_groups = -(-n_nodes // net.nodes_per_group)
        self._local_base = base
        n_local = n_groups * S * (S - 1)
        global_base = base + n_local
        self._global: dict[tuple[int, int, int], int] = {}
        glabel: list[str] = []
        for ga in range(n_groups):
            for gb in range(ga + 1, n_groups):
                for j in range(net.global_links_per_group_pair):
                    self._global[(ga, gb, j)] = global_base + len(glabel)
                    self._global[(gb, ga, j)] = global_base + len(glabel) + 1
                    glabel += [f"g{ga}->g{gb}#{j}", f"g{gb}->g{ga}#{j}"]
        net_cap = net.link_bw_bytes_per_s * efficiency
        self._pool_base = global_base + len(glabel)
        n_pool = 2 * n_groups if net.routing == "adaptive" else 0
        glabel += [f"g{g}:global-{d}" for g in range(n_groups) for d in ("out", "in")][:n_pool]
        pool_cap = net.global_links_per_group_pair * (net.n_groups - 1) * net_cap / 2
        n_net = n_local + len(glabel)
        self.capacity_bytes_per_s = np.concatenate([np.full(n_net - n_pool, net_cap), np.full(n_pool, pool_cap)])
        self.kind = ["local"] * n_local + ["global"] * (len(glabel) - n_pool) + ["global_pool"] * n_pool
        self._glabel = glabel

    def names(self) -> list[str]:
        """"g0:sw3->sw7" (local), "g0->g1#2" (global), "g0:global-out" (pool)."""
        S = self.net.switches_per_group
        names = [f"g{grp}:sw{a}->sw{b}" for grp in range(self.n_groups) for a in range(S) for b in range(S) if a != b]
        return names + self._glabel

    def nic_switch(self, node: int, nic: int) -> str:
        """Name of the switch NIC ``nic`` of ``node`` attaches to, e.g. "sw0.5"."""
        grp, s = nic_switch(self.net, self.nics, node, nic)
        return f"sw{grp}.{s}"

    def _local_link(self, group: int, a: int, b: int) -> int:
        S = self.net.switches_per_group
        return self._local_base + (group * S + a) * (S - 1) + (b - (b > a))

    def path(self, ns: int, nd: int, nic: int) -> list[int]:
        """Link ids from NIC ``nic``'s switch on node ``ns`` to NIC ``nic``'s switch on node ``nd``."""
        net = self.net
        ga, sa = nic_switch(net, self.nics, ns, nic)
        gb, sb = nic_switch(net, self.nics, nd, nic)
        if ga == gb:
            return [] if sa == sb else [self._local_link(ga, sa, sb)]
        if net.routing == "adaptive":
            return [self._pool_base + 2 * ga, self._pool_base + 2 * gb + 1]
        j = global_link_index(net, ns, nd)
        out_sw, in_sw = global_port(net, ga, gb, j), global_port(net, gb, ga, j)
        ids = [] if sa == out_sw else [self._local_link(ga, sa, out_sw)]
        ids.append(self._global[(ga, gb, j)])
        if in_sw != sb:
            ids.append(self._local_link(gb, in_sw, sb))
        return ids
