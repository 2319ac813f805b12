"""Network kinds: one module each, describing a job's switches and links once for its graph and its link table.

A machine file's ``[network] kind`` names a module here (``NETWORK_KINDS``)
whose ``Layout(net, nics_per_node, n_nodes)`` (see
``topologies.networks.links``) says which switches a job's first nodes use,
how their NICs are cabled, which links join the switches and how traffic is
routed over them. ``topologies.networks.graph`` draws it for people and
``topologies.fabric.Fabric`` numbers it for the simulator: a new kind is a new
module here, written once. ``topologies.networks.node`` does the same for the
links inside a node.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

from topologies.networks import dragonfly, fattree
from topologies.networks.links import Layout

if TYPE_CHECKING:  # pragma: no cover
    from topologies.specs import NetworkSpec

# Network kind -> the module placing its switches and links.
NETWORK_KINDS: dict[str, ModuleType] = {"dragonfly": dragonfly, "fat_tree": fattree}


def layout(net: NetworkSpec, nics_per_node: int, n_nodes: int) -> Layout:
    """The switches and links of a job's first ``n_nodes`` nodes on network ``net``."""
    return NETWORK_KINDS[net.kind].Layout(net, nics_per_node, n_nodes)
