"""Published collective measurements, and the twin's prediction of each.

The twin's link efficiencies are microbenchmark facts. This module keeps the
collective-level measurements beside the simulator so that a benchmark can
print twin vs measured, a test can check the machine files still reproduce
them, and the NIC efficiency of a machine can be derived from them by a
command instead of typed in (`benchmarks/collective_facts.py --fit`).

AxoNN's measured table (Megatron-AxoNN examples/comm_model.py, `get_bw`):
ring all-reduce bus bandwidth (GB/s) of a group of `own` ranks whose rank
stride is `inner` (the product of the inner groups' sizes, ranks nested
innermost first), measured with 1 GB collectives and every other group of the
job running at once. Where the file carries the raw measurement in a comment
(Frontier: 34.031, 20.62, 10.18) that value is used, not the rounded one its
model returns; Frontier's stride >= 8 entry (5 GB/s) carries no measurement
there and is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from topologies.machine import Machine, load_machine
from twin.ir import Collective, GroupAxis, Op, Program, Schedule, StepInfo
from twin.sim.engine import simulate

GB = 1e9
AXONN_TABLE_SOURCE = "Megatron-AxoNN examples/comm_model.py get_bw (AxoNN SC'24 sec. V-B)"


@dataclass(frozen=True)
class MeasuredAllReduce:
    """One measured bus bandwidth: `own` ranks at rank stride `inner`, all groups busy."""

    machine: str
    inner: int
    own: int
    busbw_gb_per_s: float
    nbytes: float = 1e9


AXONN_MEASURED: tuple[MeasuredAllReduce, ...] = (
    # Frontier, 8 GCDs per node: inner-node entries, then the node-spanning ones.
    MeasuredAllReduce("frontier", 1, 2, 129.0),
    MeasuredAllReduce("frontier", 1, 4, 52.0),
    MeasuredAllReduce("frontier", 1, 8, 135.0),
    MeasuredAllReduce("frontier", 2, 2, 50.0),
    MeasuredAllReduce("frontier", 2, 4, 72.0),
    MeasuredAllReduce("frontier", 4, 2, 36.0),
    MeasuredAllReduce("frontier", 1, 16, 34.031),
    MeasuredAllReduce("frontier", 2, 8, 20.62),
    MeasuredAllReduce("frontier", 4, 4, 10.18),
    # Perlmutter, 4 GPUs per node.
    MeasuredAllReduce("perlmutter", 1, 2, 76.0),
    MeasuredAllReduce("perlmutter", 1, 4, 225.0),
    MeasuredAllReduce("perlmutter", 2, 2, 76.0),
    MeasuredAllReduce("perlmutter", 1, 8, 80.0),
    MeasuredAllReduce("perlmutter", 2, 4, 40.0),
    MeasuredAllReduce("perlmutter", 4, 2, 20.0),
)


def spans_nodes(fact: MeasuredAllReduce, machine: Machine) -> bool:
    """True when one group's ranks sit on more than one node (its ring crosses NICs)."""
    return fact.inner * fact.own > machine.node.gpus_per_node


def injection_bound(fact: MeasuredAllReduce, machine: Machine) -> bool:
    """A node-spanning group among `inner` > 1 concurrent ones on each node.

    Their rings all leave the node through its NICs, so the NICs' reach sets
    the bus bandwidth whatever algorithm the library picks. A lone group
    (inner = 1) is also shaped by the algorithm choice (ring vs hierarchical),
    so it is a prediction, not a calibration point.
    """
    return spans_nodes(fact, machine) and fact.inner > 1


def strided_groups(world: int, inner: int, own: int) -> tuple[tuple[int, ...], ...]:
    """Every group of `own` ranks at stride `inner` in a world nested innermost first."""
    return tuple(tuple(base + j * inner for j in range(own))
                 for base in range(world) if (base // inner) % own == 0)


def simulated_busbw(fact: MeasuredAllReduce, machine: Machine) -> float:
    """Bus bandwidth (GB/s, nccl-tests definition) of the fact's all-reduce, every group at once.

    The world is the fact's groups over at least two nodes, so that a
    node-spanning group shares its NICs with the node's other groups exactly
    as in the measurement.
    """
    world = max(fact.inner * fact.own, 2 * machine.node.gpus_per_node)
    groups = strided_groups(world, fact.inner, fact.own)
    op = Op(0, "all_reduce", "comm:x", Collective("all_reduce", "x", fact.nbytes))
    schedule = Schedule(world, (GroupAxis("x", groups),), (Program(tuple(range(world)), (op,)),),
                        StepInfo("collective fact", None, 1, 1, 1.0, 1.0, 0.0))
    seconds = simulate(schedule, machine, full=True).step_time_s
    return fact.nbytes / seconds * 2 * (fact.own - 1) / fact.own / GB


@dataclass(frozen=True)
class FactComparison:
    fact: MeasuredAllReduce
    twin_gb_per_s: float
    spans_nodes: bool
    calibrates_nic: bool  # one of the entries `fitted_nic_efficiency` matches

    @property
    def ratio(self) -> float:
        return self.twin_gb_per_s / self.fact.busbw_gb_per_s


def compare(machine_name: str, machine: Machine | None = None) -> list[FactComparison]:
    """Every AxoNN-measured entry of one machine beside the twin's bus bandwidth."""
    machine = machine or load_machine(machine_name)
    return [FactComparison(f, simulated_busbw(f, machine), spans_nodes(f, machine),
                           injection_bound(f, machine))
            for f in AXONN_MEASURED if f.machine == machine_name]


def with_nic_efficiency(machine: Machine, efficiency: float) -> Machine:
    """The machine with its NIC efficiency replaced (the network's own entry kept)."""
    node = machine.node
    efficiencies = dict(node.link_efficiency)
    efficiencies.setdefault("network", node.network_link_efficiency)
    efficiencies["nic"] = efficiency
    return replace(machine, node=replace(node, link_efficiency=efficiencies))


def _geomean_ratio(machine_name: str, machine: Machine) -> float:
    ratios = [simulated_busbw(f, machine) / f.busbw_gb_per_s for f in AXONN_MEASURED
              if f.machine == machine_name and injection_bound(f, machine)]
    if not ratios:
        raise ValueError(f"no injection-bound measurement for {machine_name}")
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def fitted_nic_efficiency(machine_name: str, machine: Machine | None = None,
                          tolerance: float = 1e-3, max_rounds: int = 30) -> float:
    """The NIC efficiency under which the injection-bound entries match on geometric mean.

    Bus bandwidth grows with the NIC efficiency, linearly while the NIC is
    the bottleneck and more slowly once another link is: the fixed-point
    iteration eff <- eff / geomean(twin / measured) settles on the value at
    which the geometric mean of twin / measured is 1.
    """
    machine = machine or load_machine(machine_name)
    efficiency = machine.node.link_efficiency["nic"]
    for _ in range(max_rounds):
        ratio = _geomean_ratio(machine_name, with_nic_efficiency(machine, efficiency))
        if abs(ratio - 1.0) < tolerance:
            break
        efficiency = min(1.0, efficiency / ratio)
    return efficiency
