"""`[collectives.nic_efficiency]`: a collective library's achieved fraction of a NIC port by kind of collective.

RCCL's all-gathers across Frontier's NICs were measured at twice its all-reduces' rate (docs/accuracy.md), so a
machine file may give a kind its own NIC efficiency. Only the NICs' injection and ejection links take it; the
simulation, the tuner's choice, the search's lower bound and `twin fit`'s attribution all see the same rate.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from helpers import SMALL_SPEC
from topologies import load_machine
from topologies.errors import InputError
from topologies.fabric import Fabric
from twin.build import build_step
from twin.model import parse_model_spec
from twin.search.bound import BoundModel
from twin.search.space import SearchSpace, enumerate_space
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate

TOPO_DIR = Path(__file__).resolve().parents[1] / "topologies"
MB = 1 << 20


def frontier_with(table: dict[str, float]):
    plain = load_machine("frontier")
    return replace(plain, collectives=replace(plain.collectives, nic_efficiency=table))


def test_only_the_nic_links_of_that_kind_change():
    plain, twice = Fabric(load_machine("frontier"), 16), Fabric(frontier_with({"all_gather": 0.82}), 16)
    nic = np.array([kind == "nic" for kind in twice.link_kind[:twice.node_link_count]]
                   + [False] * (twice.n_links - twice.node_link_count))
    assert nic.sum() == 2 * 2 * 4  # two nodes, four NICs, injection and ejection
    gathered = twice.capacity_for("all_gather")
    ratio = 0.82 / plain.machine.node.link_efficiency["nic"]
    np.testing.assert_allclose(gathered[nic], plain.capacity_bytes_per_s[nic] * ratio)
    np.testing.assert_array_equal(gathered[~nic], plain.capacity_bytes_per_s[~nic])
    assert twice.capacity_for("all_reduce") is twice.capacity_bytes_per_s
    assert twice.capacity_for(None) is twice.capacity_bytes_per_s


def test_an_all_gather_across_nodes_takes_its_kinds_rate_and_nothing_else_moves():
    plain = CollectiveModel(Fabric(load_machine("frontier"), 16))
    twice = 2 * plain.fabric.machine.node.link_efficiency["nic"]
    faster = CollectiveModel(Fabric(frontier_with({"all_gather": twice}), 16))

    def alone(model, gpus, kind):
        lowering, protocol = model.choose(gpus, kind, 1024 * MB)
        return model.time_alone_s(lowering, protocol, 1024 * MB)

    both_nodes, one_node = tuple(range(16)), tuple(range(8))
    # the NICs at twice the file's rate: a 1 GB gather across them takes half the time (latency is microseconds)
    assert alone(faster, both_nodes, "all_gather") == pytest.approx(alone(plain, both_nodes, "all_gather") / 2,
                                                                     rel=0.02)
    assert alone(faster, both_nodes, "all_reduce") == alone(plain, both_nodes, "all_reduce")
    assert alone(faster, one_node, "all_gather") == alone(plain, one_node, "all_gather")


def test_the_search_bound_stays_below_the_simulated_step_with_kinds_faster_and_slower():
    machine = frontier_with({"all_gather": 0.82, "reduce_scatter": 0.2})
    model = parse_model_spec(SMALL_SPEC)
    bounds = BoundModel(machine, 16)
    space = enumerate_space(model, 16, 64, machine.device.hbm_bytes, SearchSpace(axes=("gx", "gz", "gdata")))
    plans = [c.plan for c in space.candidates if c.plan.gz > 1][:8]
    assert plans
    for plan in plans:
        built = build_step(model, plan, machine, 16)
        assert bounds.bound_s(built.schedule) <= simulate(built.schedule, machine).step_time_s * (1 + 1e-9)


def test_a_kind_with_its_own_rate_is_not_charged_to_the_fitted_nic_level():
    """`twin fit` scales a phase by 1 / node.link_efficiency.nic where the NIC sets its time; under a kind's own
    NIC efficiency that number does not set it, so the phase is charged to no level."""
    model = parse_model_spec(SMALL_SPEC)
    plain = load_machine("frontier")
    plan = next(c.plan for c in enumerate_space(model, 16, 64, plain.device.hbm_bytes,
                                                SearchSpace(axes=("gz", "gdata"))).candidates if c.plan.gz == 16)
    levels = {}
    for name, machine in (("plain", plain), ("own", frontier_with({"all_gather": 0.82}))):
        types = simulate(build_step(model, plan, machine, 16).schedule, machine).flow_types
        levels[name] = {(key[1], types.bottleneck[row]) for key, rows in zip(types.keys, types.phase_rows)
                        for row in rows}
    assert ("all_gather", "nic") in levels["plain"]
    assert ("all_gather", "nic") not in levels["own"] and ("all_gather", "") in levels["own"]
    assert {k for k in levels["plain"] if k[0] != "all_gather"} == {k for k in levels["own"] if k[0] != "all_gather"}


def test_the_file_table_is_checked(tmp_path):
    text = (TOPO_DIR / "frontier.toml").read_text()
    good = tmp_path / "good.toml"
    good.write_text(text + '\n[collectives.nic_efficiency]\nall_gather = { value = 0.8, source = "x" }\n')
    assert load_machine(str(good)).collectives.nic_efficiency == {"all_gather": 0.8}
    assert "collectives.nic_efficiency.all_gather" in load_machine(str(good)).sources
    for entry, field in (("gather = { value = 0.8, source = \"x\" }", "gather"),
                         ("all_gather = { value = 1.5, source = \"x\" }", "all_gather")):
        bad = tmp_path / "bad.toml"
        bad.write_text(text + f"\n[collectives.nic_efficiency]\n{entry}\n")
        with pytest.raises(InputError) as err:
            load_machine(str(bad))
        assert field in str(err.value) and "\n" not in str(err.value)


def test_the_benchmark_takes_each_kinds_rate_from_the_pccl_fit(tmp_path):
    """benchmarks/nic_by_kind.py: the efficiencies are the fits' node bandwidths over the node's NIC peak (100 GB/s
    on Frontier), and the files it validates on carry them (each variant's own table)."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import nic_by_kind

    found = nic_by_kind.measured_efficiencies()
    assert set(found) == {"all_gather", "reduce_scatter"}
    all_reduces = load_machine("frontier").node.link_efficiency["nic"]  # the file's, fitted on all-reduces
    for e in found.values():
        assert e["efficiency"] == pytest.approx(e["node_gb_per_s"] / 100, abs=5e-4)
        assert all_reduces < e["efficiency"] < 1
    ways = nic_by_kind.variants(tmp_path, found)
    assert list(ways) == ["files as they are", "each kind its own", "every kind the all-gather's"]
    assert ways["files as they are"] == {}
    own, every = ways["each kind its own"], ways["every kind the all-gather's"]
    for files in (own["files"], own["fitted_files"]):
        assert load_machine(files["frontier"]).collectives.nic_efficiency == {k: e["efficiency"]
                                                                              for k, e in found.items()}
    assert load_machine(own["fitted_files"]["frontier"]).device.empirical_gemm_flop_per_s == \
        load_machine(str(TOPO_DIR / "fitted" / "frontier.toml")).device.empirical_gemm_flop_per_s
    gather = found["all_gather"]["efficiency"]
    assert load_machine(every["files"]["frontier"]).collectives.nic_efficiency == {
        "all_reduce": gather, "all_gather": gather, "reduce_scatter": gather}
