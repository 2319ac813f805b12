"""Machine files and the code that turns them into graphs, link tables and placements.

    load_machine("frontier")   -> Machine (SI units, every number's source kept)
    Machine.node_graph()       -> networkx graph of one node
    Machine.network_graph(n)   -> networkx graph of a job's nodes and switches (dragonfly or fat tree)
    Fabric(machine, n_gpus)    -> link ids, capacities and cached routes (simulator)
    place_ranks(n, machine)    -> rank -> GPU
"""

from topologies.fabric import Fabric
from topologies.machine import Machine, list_machines, load_machine
from topologies.placement import place_ranks

__all__ = ["Fabric", "Machine", "list_machines", "load_machine", "place_ranks"]
