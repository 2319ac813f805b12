"""A node's own links, listed once for both its graph and the simulator's per-node link block.

What ``topologies.networks.links`` does for a network kind, this does for
the inside of a node: ``node_links`` is the one list that
``topologies.networks.graph.node_graph`` (and so ``network_graph``) draws and that ``Fabric``
repeats on every node, in the same order, so the two cannot drift.

Vertices: ("gpu", i), ("nic", k), (switch.kind, 0) for a node switch
(NVSwitch), and ("network", k), which stands for the network switch NIC k
is cabled to: the kind's ``Layout.attach`` resolves it for a given node, and
the node's own graph, which has no network, leaves those links out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from topologies.networks.links import Link, Vertex

if TYPE_CHECKING:  # pragma: no cover
    from topologies.specs import NodeSpec

NETWORK = "network"  # ("network", k): the switch NIC k is cabled to, outside the node


def node_links(node: NodeSpec) -> list[Link]:
    """Every directed link of one node, in Fabric's order.

    Each device link both ways; with a node switch, per device its port up
    (device -> switch) and down; then per NIC k its attach link up (device ->
    NIC) and down, its injection link (NIC -> network switch) and its
    ejection link (network switch -> NIC). ``count`` is the physical links a
    link bundles (a node switch port: ``links_per_gpu``).
    """
    links: list[Link] = []
    for lk in node.links:
        for a, b in ((lk.a, lk.b), (lk.b, lk.a)):
            links.append(Link(("gpu", a), ("gpu", b), lk.kind, lk.bw_bytes_per_s, lk.count))
    sw = node.switch
    if sw is not None:
        for i in range(node.gpus_per_node):
            for u, v in ((("gpu", i), (sw.kind, 0)), ((sw.kind, 0), ("gpu", i))):
                links.append(Link(u, v, sw.link_kind, sw.bw_bytes_per_s, sw.links_per_gpu))
    for nic in node.nics:
        gpu, port, net = ("gpu", nic.attach_gpu), ("nic", nic.index), (NETWORK, nic.index)
        attach, inject = nic.attach_bw_bytes_per_s, nic.bw_bytes_per_s
        links += [Link(gpu, port, "attach", attach), Link(port, gpu, "attach", attach),
                  Link(port, net, "nic", inject), Link(net, port, "nic", inject)]
    return links


def local_name(vertex: Vertex) -> str:
    """A node vertex as link names show it: "gpu3", "nic1", "nvswitch"; "{sw}" for the network switch."""
    kind, i = vertex
    if kind in ("gpu", "nic"):
        return f"{kind}{i}"
    return "{sw}" if kind == NETWORK else kind


def network_nic(link: Link) -> int | None:
    """The NIC whose network switch ``link`` reaches (an injection or ejection link); None inside the node."""
    for kind, i in (link.u, link.v):
        if kind == NETWORK:
            return i
    return None
