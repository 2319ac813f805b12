"""networkx graphs of a node and of a job's network, for inspection and figures.

The graphs are drawn from the same descriptions the simulator's link table
is numbered from (``topologies.networks.node.node_links`` and the network
kind's ``Layout``), so an edge of the graph is a link of ``Fabric`` and the
other way round; the simulator's hot path never builds a graph.

Each link is a directed edge with attributes ``bw_bytes_per_s`` (peak per
direction), ``kind`` and ``count`` (physical links bundled). Parallel links
between the same two vertices (a dragonfly's global links that happen to
leave and arrive on the same switches) are one edge with the counts and
bandwidths added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from topologies.errors import InputError
from topologies.networks import layout
from topologies.networks.links import Link
from topologies.networks.node import NETWORK, network_nic, node_links

if TYPE_CHECKING:  # pragma: no cover
    from topologies.specs import Machine


def _add(g: nx.DiGraph, link: Link) -> None:
    if g.has_edge(link.u, link.v):
        g[link.u][link.v]["count"] += link.count
        g[link.u][link.v]["bw_bytes_per_s"] += link.bw_bytes_per_s
    else:
        g.add_edge(link.u, link.v, bw_bytes_per_s=link.bw_bytes_per_s, kind=link.kind, count=link.count)


def node_graph(machine: Machine) -> nx.DiGraph:
    """One node of `machine`: ("gpu", i), ("nic", k) and, with a node switch, (switch.kind, 0).

    A node switch has one edge each way per device: devices talk through it,
    not directly. The NICs' links to the network are not part of the node.
    """
    node = machine.node
    g = nx.DiGraph(name=f"{machine.name} node")
    g.add_nodes_from(("gpu", i) for i in range(node.gpus_per_node))
    g.add_nodes_from(("nic", nic.index) for nic in node.nics)
    for link in node_links(node):
        if network_nic(link) is None:
            _add(g, link)
    return g


def network_graph(machine: Machine, n_nodes: int) -> nx.DiGraph:
    """The first ``n_nodes`` nodes and every switch they use.

    Node vertices are the ``node_graph`` ones with the node inserted:
    ("gpu", node, i), ("nic", node, k), ("nvswitch", node, 0). The switches
    and the links between them are the network kind's ``Layout``:
    ``topologies.networks.dragonfly`` (("switch", group, s); "nic", "local",
    "global" edges) or ``topologies.networks.fattree`` (("leaf", unit,
    rail), ("spine", 0); "nic", "spine_pool" edges).
    """
    if not 1 <= n_nodes <= machine.max_nodes:
        raise InputError(f"n_nodes: {n_nodes} is outside 1..{machine.max_nodes} for machine '{machine.name}'")
    node = machine.node
    g = nx.DiGraph(name=f"{machine.name} {n_nodes} nodes")
    local = node_graph(machine)
    for n in range(n_nodes):
        g.add_nodes_from((kind, n, i) for kind, i in local.nodes)
        for (ku, u), (kv, v), attrs in local.edges(data=True):
            g.add_edge((ku, n, u), (kv, n, v), **attrs)
    net = layout(machine.network, len(node.nics), n_nodes)
    g.add_nodes_from(net.switches())
    uplinks = [link for link in node_links(node) if network_nic(link) is not None]
    for n in range(n_nodes):
        for link in uplinks:
            u, v = (net.attach(n, i) if kind == NETWORK else (kind, n, i) for kind, i in (link.u, link.v))
            _add(g, Link(u, v, link.kind, link.bw_bytes_per_s, link.count))
    for link in net.cables():
        _add(g, link)
    return g
