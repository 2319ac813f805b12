"""Where endpoints and global links sit in a Slingshot dragonfly.

Vendors publish the shape of a dragonfly (groups, switches per group, links
per group pair) but not the cabling, so the rules below are estimates chosen
to respect the published port counts. They live in one module so that the
inspection graph (``Machine.network_graph``) and the simulator's link table
(``Fabric``) cannot disagree.

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

if TYPE_CHECKING:  # pragma: no cover
    from topologies.machine import NetworkSpec


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
