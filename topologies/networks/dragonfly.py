"""Where endpoints and global links sit in a Slingshot dragonfly: one ``Layout`` for its graph and its link table.

Vendors publish the shape of a dragonfly (groups, switches per group, links
per group pair) but not the cabling, so the rules below are estimates chosen
to respect the published port counts. They live in this one module, and both
the inspection graph (``topologies.networks.graph.network_graph``) and the simulator's link
table (``Fabric``) are read from its ``Layout`` (see
``topologies.networks.links``), so the two cannot disagree.

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

Adaptive routing (Slingshot's UGAL-style routing) [estimate]: traffic
leaving a group spreads over all its global links, minimally or through an
intermediate group, so its bottleneck is the group's pooled global
bandwidth: links_per_pair x (n_groups - 1) links, halved because a
non-minimal path crosses two global links. The pool assumes the rest of the
machine is idle; the local hops of a path between groups are left out (a
switch's 31 local ports carry more than its 16 endpoints can inject).
Inside a group the same rule: traffic from one switch to another spreads
over the direct link and the two-hop paths through the group's other
switches, so its bottleneck is the source switch's pooled local links out and
the destination's in, (switches_per_group - 1) links each, halved because a
non-minimal path crosses two local links. (Routed over the one direct link
instead, every rank of a block of nodes sending to its counterpart in another
block queued on a single 25 GB/s link: 32 flows on Frontier, a data-parallel
all-reduce ten times its time alone.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from topologies.networks.links import Layout as LayoutBase
from topologies.networks.links import LinkBlock, Vertex

if TYPE_CHECKING:  # pragma: no cover
    from topologies.specs import DragonflySpec as NetworkSpec


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


class Layout(LayoutBase):
    """The dragonfly groups a job's first ``n_nodes`` nodes use: switches ("switch", group, s) and links.

    Link ids, in order: per used group, the all-to-all local links between
    its switches ("local", "g0:sw3->sw7"); per pair of used groups, each
    global link in both directions ("global", "g0->g1#2"; parallel links
    between the same two switches are one graph edge with a larger count);
    with adaptive routing, per used group a global egress and ingress pool
    ("global_pool", "g0:global-out", not drawn) and per switch a local egress
    and ingress pool ("local_pool", "g0:sw3:local-out", not drawn), which
    inside a group carry what the direct links carry under minimal routing.
    """

    def __init__(self, net: NetworkSpec, nics_per_node: int, n_nodes: int) -> None:
        self.net, self.nics = net, nics_per_node
        S, L = net.switches_per_group, net.global_links_per_group_pair
        self.n_groups = n_groups = -(-n_nodes // net.nodes_per_group)
        self._pairs = [(ga, gb) for ga in range(n_groups) for gb in range(ga + 1, n_groups)]
        self._pair_index = {pair: i for i, pair in enumerate(self._pairs)}
        bw = net.link_bw_bytes_per_s
        local = LinkBlock("local", n_groups * S * (S - 1), bw, self._local_name, self._local_ends)
        glob = LinkBlock("global", 2 * L * len(self._pairs), bw, self._global_name, self._global_ends)
        self._global_base = local.size
        self._pool_base = local.size + glob.size
        self.blocks = (local, glob)
        if net.routing == "adaptive":
            self.blocks += (LinkBlock("global_pool", 2 * n_groups, bw, self._pool_name,
                                      scale=L * (net.n_groups - 1) / 2),)
            self._local_pool_base = self._pool_base + 2 * n_groups
            self.blocks += (LinkBlock("local_pool", 2 * n_groups * S, bw, self._local_pool_name,
                                      scale=(S - 1) / 2),)

    # ------------------------------------------------------------ the links, by index
    def _local(self, i: int) -> tuple[int, int, int]:
        """(group, a, b) of local link i: group-major, then a, then b skipping a."""
        S = self.net.switches_per_group
        group, rest = divmod(i, S * (S - 1))
        a, b = divmod(rest, S - 1)
        return group, a, b + (b >= a)

    def _local_ends(self, i: int) -> tuple[Vertex, Vertex]:
        group, a, b = self._local(i)
        return ("switch", group, a), ("switch", group, b)

    def _local_name(self, i: int) -> str:
        group, a, b = self._local(i)
        return f"g{group}:sw{a}->sw{b}"

    def _local_link(self, group: int, a: int, b: int) -> int:
        S = self.net.switches_per_group
        return (group * S + a) * (S - 1) + (b - (b > a))

    def _global(self, i: int) -> tuple[int, int, int]:
        """(from group, to group, j) of global link i: per pair, per parallel link j, both directions."""
        pair, rest = divmod(i, 2 * self.net.global_links_per_group_pair)
        j, back = divmod(rest, 2)
        ga, gb = self._pairs[pair]
        return (gb, ga, j) if back else (ga, gb, j)

    def _global_ends(self, i: int) -> tuple[Vertex, Vertex]:
        ga, gb, j = self._global(i)
        return ("switch", ga, global_port(self.net, ga, gb, j)), ("switch", gb, global_port(self.net, gb, ga, j))

    def _global_name(self, i: int) -> str:
        ga, gb, j = self._global(i)
        return f"g{ga}->g{gb}#{j}"

    def _global_link(self, ga: int, gb: int, j: int) -> int:
        pair = self._pair_index[(min(ga, gb), max(ga, gb))]
        return self._global_base + 2 * (pair * self.net.global_links_per_group_pair + j) + (ga > gb)

    def _pool_name(self, i: int) -> str:
        group, inbound = divmod(i, 2)
        return f"g{group}:global-{'in' if inbound else 'out'}"

    def _local_pool_name(self, i: int) -> str:
        switch, inbound = divmod(i, 2)
        group, sw = divmod(switch, self.net.switches_per_group)
        return f"g{group}:sw{sw}:local-{'in' if inbound else 'out'}"

    # ------------------------------------------------------------ switches and routes
    def switches(self) -> list[Vertex]:
        return [("switch", g, s) for g in range(self.n_groups) for s in range(self.net.switches_per_group)]

    def attach(self, node: int, nic: int) -> Vertex:
        return ("switch", *nic_switch(self.net, self.nics, node, nic))

    def switch_name(self, switch: Vertex) -> str:
        return f"sw{switch[1]}.{switch[2]}"

    def paths(self, src_nodes: np.ndarray, dst_nodes: np.ndarray, nics: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``path`` for many transfers (``LayoutBase.paths``): with numpy inside a group and under adaptive
        routing; minimal routes between groups one key at a time."""
        net, S = self.net, self.net.switches_per_group
        ga, slot_a = np.divmod(src_nodes, net.nodes_per_group)
        gb, slot_b = np.divmod(dst_nodes, net.nodes_per_group)
        sa = (slot_a // net.endpoint_ports_per_switch) * self.nics + nics
        sb = (slot_b // net.endpoint_ports_per_switch) * self.nics + nics
        local = np.flatnonzero((ga == gb) & (sa != sb))
        if net.routing == "adaptive":
            rows = [np.repeat(local, 2)]
            links = [np.stack([self._local_pool_base + 2 * (ga[local] * S + sa[local]),
                               self._local_pool_base + 2 * (gb[local] * S + sb[local]) + 1], axis=1).ravel()]
        else:
            rows = [local]
            links = [(ga[local] * S + sa[local]) * (S - 1) + (sb[local] - (sb[local] > sa[local]))]
        across = np.flatnonzero(ga != gb)
        if net.routing == "adaptive":
            rows.append(np.repeat(across, 2))
            links.append(np.stack([self._pool_base + 2 * ga[across], self._pool_base + 2 * gb[across] + 1],
                                  axis=1).ravel())
        else:
            r, l = LayoutBase.paths(self, src_nodes[across], dst_nodes[across], nics[across])
            rows.append(across[r])
            links.append(l)
        rows_all, links_all = np.concatenate(rows), np.concatenate(links)
        order = np.argsort(rows_all, kind="stable")
        return rows_all[order], links_all[order]

    def path_key(self, src_node: int, dst_node: int, nic: int) -> tuple[int, ...]:
        """The two NICs' (group, switch), and with minimal routing between groups the parallel global link
        taken, which depends on the nodes."""
        ga, sa = nic_switch(self.net, self.nics, src_node, nic)
        gb, sb = nic_switch(self.net, self.nics, dst_node, nic)
        if ga != gb and self.net.routing != "adaptive":
            return ga, sa, gb, sb, global_link_index(self.net, src_node, dst_node)
        return ga, sa, gb, sb

    def path(self, src_node: int, dst_node: int, nic: int) -> list[int]:
        """Same group: one local hop (none on one switch); adaptive, the source switch's local egress pool and
        the destination's ingress pool. Other group, minimal routing: local hop to the switch owning the global
        link, the global link (one of the pair's parallel links, ECMP-spread), local hop. Adaptive: the source
        group's egress pool and the destination group's ingress pool."""
        net = self.net
        ga, sa = nic_switch(net, self.nics, src_node, nic)
        gb, sb = nic_switch(net, self.nics, dst_node, nic)
        if ga == gb:
            if sa == sb:
                return []
            if net.routing == "adaptive":
                S = net.switches_per_group
                return [self._local_pool_base + 2 * (ga * S + sa), self._local_pool_base + 2 * (gb * S + sb) + 1]
            return [self._local_link(ga, sa, sb)]
        if net.routing == "adaptive":
            return [self._pool_base + 2 * ga, self._pool_base + 2 * gb + 1]
        j = global_link_index(net, src_node, dst_node)
        out_sw, in_sw = global_port(net, ga, gb, j), global_port(net, gb, ga, j)
        ids = [] if sa == out_sw else [self._local_link(ga, sa, out_sw)]
        ids.append(self._global_link(ga, gb, j))
        if in_sw != sb:
            ids.append(self._local_link(gb, in_sw, sb))
        return ids
