"""The dgx-a100 machine: an NVSwitch node on a rail-optimized fat tree."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from topologies import Fabric, load_machine
from topologies.networks.graph import network_graph, node_graph
from topologies.machine import FatTreeSpec
from twin.errors import TwinError

TOPO_DIR = Path(__file__).resolve().parents[1] / "topologies"
GPN = 8


@pytest.fixture(scope="module")
def dgx():
    return load_machine("dgx-a100")


@pytest.fixture(scope="module")
def fab64(dgx):
    return Fabric(dgx, 64 * GPN)  # 64 nodes: leaf groups 0-2 full, group 3 with 4 nodes


def _edit(tmp_path: Path, old: str, new: str) -> str:
    text = (TOPO_DIR / "dgx-a100.toml").read_text()
    assert old in text, old
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def _vertex(node: int | None, token: str):
    if token.startswith("gpu"):
        return ("gpu", node, int(token[3:]))
    if token.startswith("nic"):
        return ("nic", node, int(token[3:]))
    if token == "nvswitch":
        return ("nvswitch", node, 0)
    if token == "spine":
        return ("spine", 0)
    unit, rail = token[4:].split(".")
    return ("leaf", int(unit), int(rail))


def _endpoints(fabric: Fabric, link: int):
    """Graph vertices (u, v) of a fat-tree Fabric link, parsed from its name."""
    name = fabric.link_name[link]
    node = None
    if ":" in name:
        head, name = name.split(":")
        node = int(head[1:])
    u, v = name.split("->")
    return _vertex(node, u), _vertex(node, v)


def _check_path(fabric: Fabric, src: int, dst: int, route: tuple[int, ...]) -> None:
    at = ("gpu", src // GPN, src % GPN)
    for link in route:
        u, v = _endpoints(fabric, link)
        assert u == at, (fabric.link_name[link], at)
        at = v
    assert at == ("gpu", dst // GPN, dst % GPN)


def _names(fab: Fabric, src: int, dst: int, nic: int | None = None) -> list[str]:
    return [fab.link_name[i] for i in fab.route(src, dst, nic)]


# ------------------------------------------------------------ the machine file


def test_dgx_a100_loads_in_si_units(dgx):
    d, net, c = dgx.device, dgx.network, dgx.collectives
    assert d.hbm_bytes == 85.9e9 and d.hbm_bw_bytes_per_s == 2039e9  # 80 GiB
    assert d.peak_flop_per_s == pytest.approx(312e12) and d.empirical_gemm_flop_per_s == pytest.approx(280e12)
    assert d.compute_units == 108
    assert c.protocols == ("ll", "ll128", "simple")
    assert isinstance(net, FatTreeSpec) and net.kind == "fat_tree"
    assert net.link_bw_bytes_per_s == 25e9 and net.oversubscription == 1.0
    assert dgx.max_nodes == 560 and dgx.max_gpus == 560 * 8
    # What `twin machines` prints: the leaf groups stand in for dragonfly groups.
    assert (net.n_groups, net.nodes_per_group) == (28, 20)
    assert net.describe().startswith("fat_tree, 28 leaf groups x 20 nodes")
    sw = dgx.node.switch
    assert (sw.kind, sw.link_kind, sw.links_per_gpu, sw.bw_bytes_per_s) == ("nvswitch", "nvlink", 12, 300e9)
    assert [(n.index, n.attach_gpu, n.bw_bytes_per_s) for n in dgx.node.nics] == [(i, i, 25e9) for i in range(8)]


def test_estimates_stay_visible(dgx):
    for key in ("network.nodes_per_leaf_group", "network.n_nodes", "network.oversubscription",
                "node.link_efficiency.nvlink"):
        assert dgx.sources[key].estimate, key
    assert dgx.sources["node.switch.bw_per_direction_gb_per_s"].source


# ------------------------------------------------------------ the NVSwitch node


def test_node_graph_has_a_switch_and_no_direct_gpu_links(dgx):
    g = node_graph(dgx)
    assert not any(u[0] == v[0] == "gpu" for u, v in g.edges())
    sw = [(u, v, d) for u, v, d in g.edges(data=True) if "nvswitch" in (u[0], v[0])]
    assert len(sw) == 2 * 8
    assert {u for u, v, _ in sw if v == ("nvswitch", 0)} == {("gpu", i) for i in range(8)}
    assert all(d["bw_bytes_per_s"] == 300e9 and d["kind"] == "nvlink" and d["count"] == 12 for *_, d in sw)
    attach = {u[1]: v[1] for u, v, d in g.edges(data=True) if d["kind"] == "attach" and u[0] == "nic"}
    assert attach == {k: k for k in range(8)}


def test_same_node_route_crosses_the_switch(dgx):
    fab = Fabric(dgx, 16)
    assert fab.local_direct_links() == {}
    port = 300e9 * dgx.node.link_efficiency["nvlink"]
    for a, b in itertools.permutations(range(8), 2):
        r = fab.route(8 + a, 8 + b)
        assert [fab.link_name[i] for i in r] == [f"n1:gpu{a}->nvswitch", f"n1:nvswitch->gpu{b}"]
        assert all(fab.capacity_bytes_per_s[i] == pytest.approx(port) for i in r)
    # Every route out of a GPU shares its one uplink: the port is the bottleneck.
    assert len({fab.route(0, b)[0] for b in range(1, 8)}) == 1


def test_nearest_nic_is_the_gpus_own(dgx):
    fab = Fabric(dgx, 8)
    assert [fab.nearest_nic(g) for g in range(8)] == list(range(8))


def test_ring_arcs(dgx):
    arcs = Fabric(dgx, 8).ring_arcs()
    port = 300e9 * dgx.node.link_efficiency["nvlink"]
    assert set(arcs) == set(itertools.permutations(range(8), 2))
    assert all(bw == pytest.approx(port) and count == 1 for bw, count in arcs.values())
    # On a node of direct links, the arcs are its link bundles, split per physical link.
    frontier = load_machine("frontier")
    farcs = Fabric(frontier, 8).ring_arcs()
    assert len(farcs) == 24 and farcs[(0, 1)] == (pytest.approx(200e9 * 0.75 / 4), 4)
    assert farcs[(1, 0)] == farcs[(0, 1)] and farcs[(0, 2)] == (pytest.approx(50e9 * 0.75), 1)


# ------------------------------------------------------------ the fat tree


def test_same_leaf_group_same_rail_crosses_the_leaf_only(dgx, fab64):
    # Node 0 and node 3 are in leaf group 0; GPU 2 uses NIC 2 (rail 2) on both.
    assert _names(fab64, 2, 3 * GPN + 5) == [
        "n0:gpu2->nic2", "n0:nic2->leaf0.2", "n3:leaf0.2->nic2", "n3:nic2->gpu2",
        "n3:gpu2->nvswitch", "n3:nvswitch->gpu5"]
    r = fab64.route(2, 3 * GPN + 5)
    _check_path(fab64, 2, 3 * GPN + 5, r)


def test_different_leaf_groups_cross_the_spine_pools(dgx, fab64):
    src, dst = 7, 45 * GPN + 7  # node 0 (group 0) -> node 45 (group 2), rail 7
    r = fab64.route(src, dst)
    pools = [fab64.link_name[i] for i in r if fab64.link_kind[i] == "spine_pool"]
    assert pools == ["leaf0.7->spine", "spine->leaf2.7"]
    _check_path(fab64, src, dst, r)
    pool = [i for i in r if fab64.link_kind[i] == "spine_pool"][0]
    # Full bisection: a leaf's uplinks carry what its 20 endpoints inject.
    assert fab64.capacity_bytes_per_s[pool] == pytest.approx(20 * 25e9 * dgx.node.link_efficiency["nic"])
    # An explicit NIC picks the rail on both ends.
    assert [n for n in _names(fab64, src, dst, nic=3) if "spine" in n] == ["leaf0.3->spine", "spine->leaf2.3"]


def test_fat_tree_fabric_for_64_nodes(fab64):
    assert fab64.n_nodes == 64
    kinds = fab64.link_kind
    # Per node: 16 switch ports + 8 NICs x 4; per used leaf (4 groups x 8 rails) a pool each way.
    assert kinds.count("spine_pool") == 4 * 8 * 2
    assert fab64.n_links == 64 * (16 + 32) + 64 == len(fab64.capacity_bytes_per_s)
    assert (fab64.capacity_bytes_per_s > 0).all()
    for a, b in [(0, 511), (9, 170), (300, 301), (511, 0), (6, 62 * 8 + 1)]:
        _check_path(fab64, a, b, fab64.route(a, b))
        assert len(fab64.route(a, b)) == len(fab64.route(b, a))


@pytest.mark.parametrize("n_nodes", [1, 25, 64])
def test_fabric_links_match_the_network_graph(dgx, n_nodes):
    fab = Fabric(dgx, n_nodes * GPN)
    g = network_graph(dgx, n_nodes)
    edges = {_endpoints(fab, i) for i in range(fab.n_links)}
    assert len(edges) == fab.n_links == g.number_of_edges()
    assert edges == set(g.edges())
    peak = {e: g.edges[e]["bw_bytes_per_s"] * dgx.node.link_efficiency[
        "nic" if g.edges[e]["kind"] == "spine_pool" else g.edges[e]["kind"]] for e in g.edges}
    assert all(fab.capacity_bytes_per_s[i] == pytest.approx(peak[_endpoints(fab, i)]) for i in range(fab.n_links))


def test_largest_dgx_job_builds(dgx):
    fab = Fabric(dgx, dgx.max_gpus)
    assert fab.n_nodes == 560 and fab.link_kind.count("spine_pool") == 28 * 8 * 2
    last = dgx.max_gpus - 1
    for a, b in itertools.combinations([0, 1, last // 2, last], 2):
        _check_path(fab, a, b, fab.route(a, b))


def test_oversubscription_shrinks_the_spine_pools(tmp_path):
    path = _edit(tmp_path, "oversubscription = { value = 1.0,", "oversubscription = { value = 2.0,")
    m = load_machine(path)
    fab = Fabric(m, 40 * GPN)
    pool = fab.link_kind.index("spine_pool")
    assert fab.capacity_bytes_per_s[pool] == pytest.approx(10 * 25e9 * m.node.link_efficiency["nic"])


def test_collective_model_sees_the_port_bottleneck(dgx):
    """An 8-GPU ring all-reduce is bounded by each GPU's 300 GB/s NVSwitch port."""
    from twin.sim.collectives import CollectiveModel

    fab = Fabric(dgx, 64)
    model = CollectiveModel(fab)
    lowering, protocol = model.choose(tuple(range(8)), "all_reduce", 1 << 30)
    port = 300e9 * dgx.node.link_efficiency["nvlink"]
    assert lowering.bottleneck_s_per_byte(fab) == pytest.approx(2 * 7 / 8 / port)
    assert model.time_alone_s(lowering, protocol, 1 << 30) > (1 << 30) * 2 * 7 / 8 / port


# ------------------------------------------------------------ load errors


@pytest.mark.parametrize("old,new,field", [
    ('kind = "fat_tree"', 'kind = "torus"', "network.kind"),
    ("oversubscription = { value = 1.0,", "oversubscription = { value = 0.5,", "network.oversubscription"),
    ("nodes_per_leaf_group = ", "nodes_per_leaf = ", "network.nodes_per_leaf_group"),
    ('kind = "nvswitch"', 'kind = "pcie"', "node.switch.kind"),
    ("nvlink = { value = 0.77,", "nvlnk = { value = 0.77,", "node.link_efficiency.nvlink"),
    ("links_per_gpu = { value = 12,", "links_per_gpu = { value = 12.5,", "node.switch.links_per_gpu"),
])
def test_load_errors_name_the_field(tmp_path, old, new, field):
    with pytest.raises(TwinError) as err:
        load_machine(_edit(tmp_path, old, new))
    message = str(err.value)
    assert f"'{field}'" in message and "\n" not in message


def test_bad_network_kind_lists_the_known_kinds(tmp_path):
    with pytest.raises(TwinError, match=r"'network.kind' is 'torus'; use one of 'dragonfly', 'fat_tree'"):
        load_machine(_edit(tmp_path, 'kind = "fat_tree"', 'kind = "torus"'))
