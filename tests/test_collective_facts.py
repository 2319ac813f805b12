"""The machine files' NIC efficiencies reproduce the collective measurements they cite."""

import pytest

from topologies.fabric import Fabric
from topologies.machine import load_machine
from twin.collective_facts import (compare, fitted_nic_efficiency, strided_groups,
                                   with_nic_efficiency)


def test_strided_groups_nest_innermost_first():
    assert strided_groups(8, 2, 2) == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert strided_groups(4, 1, 4) == ((0, 1, 2, 3),)


@pytest.mark.parametrize("machine", ["frontier", "perlmutter"])
def test_machine_file_carries_the_fitted_nic_efficiency(machine):
    """The value in the file is what `benchmarks/collective_facts.py --fit` computes."""
    in_file = load_machine(machine).node.link_efficiency["nic"]
    assert fitted_nic_efficiency(machine) == pytest.approx(in_file, abs=0.005)


@pytest.mark.parametrize("machine", ["frontier", "perlmutter"])
def test_calibrating_entries_match_and_node_spanning_ones_are_not_faster_than_1_6x(machine):
    rows = compare(machine)
    assert sum(r.calibrates_nic for r in rows) >= 2
    for r in rows:
        if r.calibrates_nic:
            assert r.ratio == pytest.approx(1.0, abs=0.05), r
        elif r.spans_nodes:
            assert 0.8 < r.ratio < 1.6, r


def test_nic_efficiency_lowers_injection_not_the_wire_between_switches():
    base = load_machine("frontier")
    slow = with_nic_efficiency(base, 0.2)
    assert slow.node.link_efficiency["nic"] == 0.2
    assert slow.node.network_link_efficiency == base.node.network_link_efficiency
    fabric = Fabric(slow, 8 * 256)  # two dragonfly groups
    kinds = dict(zip(range(len(fabric.link_kind)), fabric.link_kind))
    network = [fabric.capacity_bytes_per_s[i] for i, k in kinds.items() if k not in ("nic", "attach", "xgmi")]
    nic = [fabric.capacity_bytes_per_s[i] for i, k in kinds.items() if k == "nic"]
    assert max(nic) == pytest.approx(25e9 * 0.2)
    assert min(network) == pytest.approx(25e9 * base.node.network_link_efficiency)
