"""The one description of a job's network links that both its graph and its link table are read from.

A network kind used to be written twice: as networkx edges for inspection
and as the simulator's link table, kept in step by a test. Now a kind's
module says once, in a ``Layout``, which switches a job's nodes use, which
switch each NIC is cabled to, and which links join the switches, in the
order of their ids; ``topologies.networks.graph`` draws that and
``topologies.fabric.Fabric`` numbers it, so the two cannot drift.

Links come in ``LinkBlock``s: runs of alike links (one kind, one peak
bandwidth) with consecutive ids, whose ends and names are functions of the
index inside the block. The table needs only a block's size and bandwidth,
so a 4,096-node job's ~35,000 switch links cost a few numpy calls; ends and
names are computed when a graph or a person asks for them. A block without
ends is a routing pool: a bottleneck the simulator shares (all of a group's
global links under adaptive routing) that is no cable of its own, so the
graph leaves it out.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

Vertex = tuple[Any, ...]  # ("gpu", node, i), ("nic", node, k), ("switch", group, s), ("spine", 0), ...


@dataclass(frozen=True)
class Link:
    """One directed link between two graph vertices: its kind, peak per direction and physical links bundled."""

    u: Vertex
    v: Vertex
    kind: str
    bw_bytes_per_s: float
    count: int = 1


@dataclass(frozen=True)
class LinkBlock:
    """``size`` alike links with consecutive ids; link i of the block joins ``ends(i)`` and is called ``name(i)``.

    Capacity of each link: ``bw_bytes_per_s * efficiency * scale``. ``scale``
    is 1 but for a pool standing for several links (a group's global links
    under adaptive routing). ``ends`` is None for such a pool: it is no cable,
    so it is not drawn.
    """

    kind: str
    size: int
    bw_bytes_per_s: float  # peak per direction of one link (the graph's edge attribute)
    name: Callable[[int], str]
    ends: Callable[[int], tuple[Vertex, Vertex]] | None = None
    count: int = 1  # physical links each bundles (the graph's edge attribute)
    scale: float = 1.0


class Layout(ABC):
    """Where a network kind puts the switches and links of a job's first ``n_nodes`` nodes.

    Each kind's module defines ``Layout(net, nics_per_node, n_nodes)``, with
    ``blocks`` (its links in id order) and the four methods below. Link ids
    here count from 0; ``Fabric`` puts them after the nodes' own links.
    """

    blocks: tuple[LinkBlock, ...]

    @abstractmethod
    def switches(self) -> list[Vertex]:
        """Every switch vertex the job uses, in the order the graph adds them."""

    @abstractmethod
    def attach(self, node: int, nic: int) -> Vertex:
        """The switch NIC ``nic`` of machine node ``node`` is cabled to."""

    @abstractmethod
    def switch_name(self, switch: Vertex) -> str:
        """A switch as link names show it, e.g. "sw0.5" or "leaf0.3"."""

    @abstractmethod
    def path(self, src_node: int, dst_node: int, nic: int) -> list[int]:
        """Link ids from NIC ``nic``'s switch on ``src_node`` to NIC ``nic``'s switch on ``dst_node``."""

    def paths(self, src_nodes: np.ndarray, dst_nodes: np.ndarray, nics: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Many transfers' paths at once, for ``Fabric.route_loads``: (transfer row, link id) pairs, in each
        transfer's ``path`` order. This default asks ``path`` once per ``path_key``; a kind may compute them
        with numpy instead."""
        rows: list[int] = []
        links: list[int] = []
        memo: dict[Hashable, list[int]] = {}
        for i, (a, b, k) in enumerate(zip(src_nodes.tolist(), dst_nodes.tolist(), nics.tolist())):
            key = self.path_key(a, b, k)
            path = memo.get(key)
            if path is None:
                path = memo[key] = self.path(a, b, k)
            rows += [i] * len(path)
            links += path
        return np.array(rows, dtype=np.int64), np.array(links, dtype=np.int64)

    def path_key(self, src_node: int, dst_node: int, nic: int) -> Hashable:
        """What ``path`` depends on: transfers with equal keys take the same links, so ``Fabric.route_loads``
        finds a path once per key. By default the arguments themselves; a kind whose routes depend only on
        the switches the NICs are cabled to says so, and routing many transfers gets cheaper."""
        return src_node, dst_node, nic

    def nic_switch(self, node: int, nic: int) -> str:
        """Name of the switch NIC ``nic`` of ``node`` is cabled to."""
        return self.switch_name(self.attach(node, nic))

    @property
    def n_links(self) -> int:
        return sum(b.size for b in self.blocks)

    def capacity_bytes_per_s(self, efficiency: float) -> np.ndarray:
        """Per link id: peak per direction times ``efficiency`` (and the block's scale)."""
        return np.concatenate([np.full(b.size, b.bw_bytes_per_s * efficiency * b.scale) for b in self.blocks])

    def kinds(self) -> list[str]:
        kinds: list[str] = []
        for b in self.blocks:
            kinds += [b.kind] * b.size
        return kinds

    def names(self) -> list[str]:
        return [b.name(i) for b in self.blocks for i in range(b.size)]

    def cables(self) -> Iterator[Link]:
        """The links that are cables (every block with ends), in id order."""
        for b in self.blocks:
            if b.ends is not None:
                for i in range(b.size):
                    u, v = b.ends(i)
                    yield Link(u, v, b.kind, b.bw_bytes_per_s, b.count)
