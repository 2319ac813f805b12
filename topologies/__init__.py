"""Machine files and the code that turns them into graphs, link tables and placements.

    load_machine("frontier")   -> Machine (SI units, every number's source kept)
    networks.graph.node_graph(machine)        -> networkx graph of one node
    networks.graph.network_graph(machine, n)  -> networkx graph of a job's nodes and switches (dragonfly, fat tree)
    Fabric(machine, n_gpus)    -> link ids, capacities and cached routes (simulator)
    place_ranks(n, machine)    -> rank -> GPU

Modules, bottom up: ``errors`` (InputError), ``schema`` and ``overrides``
(reading sourced numbers), ``specs`` (the plain dataclasses), ``networks``
(one module per network kind, and the node's own links), ``machine``
(loading a file), ``fabric`` and ``placement``. Nothing here imports the
twin. The names above load on first use, so ``import topologies.errors`` (as
``twin.errors`` does) stays free of numpy and networkx.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__all__ = ["Fabric", "Machine", "list_machines", "load_machine", "place_ranks"]

_HOME = {"Fabric": "topologies.fabric", "Machine": "topologies.specs", "list_machines": "topologies.machine",
         "load_machine": "topologies.machine", "place_ranks": "topologies.placement"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'topologies' has no attribute {name!r}")
    value = getattr(import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
