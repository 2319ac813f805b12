"""Machine files, their graphs, the job fabric and rank placement."""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from pathlib import Path

import numpy as np
import pytest

from topologies import Fabric, list_machines, load_machine, place_ranks
from topologies.networks import dragonfly, layout
from topologies.networks.graph import network_graph, node_graph
from twin.errors import TwinError

TOPO_DIR = Path(__file__).resolve().parents[1] / "topologies"
MACHINES = ["frontier", "perlmutter", "alps"]  # the dragonfly seeds
ALL_MACHINES = MACHINES + ["dgx-a100"]  # dgx-a100's fat tree: tests/test_fattree.py
STRUCTURAL = {"a", "b", "count", "index", "attach_gpu"}

# A small fake machine: 4 devices in a line 0-1-2-3, one NIC on device 0,
# 2 nodes per group on 2 switches, 3 groups, 2 global links per group pair.
FAKE = """
[machine]
name = "line"
description = "test machine"

[device]
name = "fake"
peak_bf16_tflop_per_s = { value = 100, estimate = "test" }
empirical_gemm_bf16_tflop_per_s = { value = 80, estimate = "test" }
hbm_gb = { value = 16, estimate = "test" }
hbm_bw_gb_per_s = { value = 1000, estimate = "test" }
compute_units = { value = 10, estimate = "test" }
gemm_tile_m = { value = 128, estimate = "test" }
gemm_tile_n = { value = 128, estimate = "test" }
gemm_k_half = { value = 64, estimate = "test" }
layout_penalty_min_dim = { value = 0, estimate = "test" }
attention_efficiency = { value = 0.5, estimate = "test" }
hbm_efficiency = { value = 0.8, estimate = "test" }
comm_compute_slowdown = { value = 0.1, estimate = "test" }
kernel_overhead_us = { value = 5, estimate = "test" }
layout_efficiency = { nn = { value = 1, estimate = "t" }, nt = { value = 1, estimate = "t" }, tn = { value = 1, estimate = "t" } }

[node]
gpus_per_node = { value = 4, estimate = "test" }
links = [
  { a = 0, b = 1, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 10, estimate = "t" }, estimate = "t" },
  { a = 1, b = 2, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 20, estimate = "t" }, estimate = "t" },
  { a = 2, b = 3, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 30, estimate = "t" }, estimate = "t" },
]
nics = [
  { index = 0, attach_gpu = 0, bw_per_direction_gb_per_s = { value = 5, estimate = "t" }, attach_bw_per_direction_gb_per_s = { value = 8, estimate = "t" }, estimate = "t" },
]
link_efficiency = { wire = { value = 1, estimate = "t" }, nic = { value = 1, estimate = "t" }, attach = { value = 1, estimate = "t" } }

[network]
kind = "dragonfly"
nodes_per_group = { value = 2, estimate = "t" }
switches_per_group = { value = 2, estimate = "t" }
endpoint_ports_per_switch = { value = 1, estimate = "t" }
global_links_per_group_pair = { value = 2, estimate = "t" }
link_bw_per_direction_gb_per_s = { value = 5, estimate = "t" }
n_groups = { value = 3, estimate = "t" }

[collectives]
protocols = { allowed = ["simple"], estimate = "t" }
base_latency_us = { ring = { simple = { value = 8, estimate = "t" } }, tree = { simple = { value = 0, estimate = "t" } } }
intra_hop_latency_us = { simple = { value = 3, estimate = "t" } }
inter_hop_latency_us = { simple = { value = 14, estimate = "t" } }
protocol_bw_fraction = { simple = { value = 1, estimate = "t" } }
"""


@pytest.fixture(scope="module")
def frontier():
    return load_machine("frontier")


def _minimal(machine):
    """The machine with minimal dragonfly routing, whose links are all real cables."""
    return dataclasses.replace(machine, network=dataclasses.replace(machine.network, routing="minimal"))


@pytest.fixture(scope="module")
def frontier_minimal(frontier):
    return _minimal(frontier)


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "line.toml"
    path.write_text(FAKE)
    return load_machine(str(path))


def _edit(tmp_path: Path, old: str, new: str, machine: str = "frontier") -> str:
    text = (TOPO_DIR / f"{machine}.toml").read_text()
    assert old in text, old
    path = tmp_path / "edited.toml"
    path.write_text(text.replace(old, new, 1))
    return str(path)


def _endpoints(fabric: Fabric, link: int):
    """Graph vertices (u, v) of a Fabric link, parsed from its name."""
    name = fabric.link_name[link]
    net = fabric.machine.network

    def vertex(node: int, token: str):
        if token.startswith("gpu"):
            return ("gpu", node, int(token[3:]))
        if token.startswith("nic"):
            return ("nic", node, int(token[3:]))
        group, s = token[2:].split(".")
        return ("switch", int(group), int(s))

    if name.startswith("n"):
        node, rest = name.split(":")
        u, v = rest.split("->")
        return vertex(int(node[1:]), u), vertex(int(node[1:]), v)
    if ":" in name:
        group, rest = name.split(":")
        u, v = rest.split("->")
        return ("switch", int(group[1:]), int(u[2:])), ("switch", int(group[1:]), int(v[2:]))
    pair, j = name.split("#")
    ga, gb = (int(x[1:]) for x in pair.split("->"))
    return (("switch", ga, dragonfly.global_port(net, ga, gb, int(j))),
            ("switch", gb, dragonfly.global_port(net, gb, ga, int(j))))


def _check_path(fabric: Fabric, src: int, dst: int, route: tuple[int, ...]) -> None:
    gpn = fabric.machine.node.gpus_per_node
    at = ("gpu", src // gpn, src % gpn)
    for link in route:
        u, v = _endpoints(fabric, link)
        assert u == at, (fabric.link_name[link], at)
        at = v
    assert at == ("gpu", dst // gpn, dst % gpn)


# ------------------------------------------------------------ machine files


def _walk(table: dict, path: str, problems: list[str]) -> int:
    """Count sourced numbers; collect numbers lacking a source or estimate."""
    noted = any(isinstance(table.get(k), str) and table[k].strip() for k in ("source", "estimate"))
    count = 0
    for key, value in table.items():
        where = f"{path}.{key}" if path else key
        if isinstance(value, dict) and "value" in value:
            count += 1
            if not any(isinstance(value.get(k), str) and value[k].strip() for k in ("source", "estimate")):
                problems.append(where)
        elif isinstance(value, dict):
            count += _walk(value, where, problems)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    count += _walk(item, f"{where}[{i}]", problems)
                elif isinstance(item, (int, float)) and not isinstance(item, bool):
                    problems.append(f"{where}[{i}]")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            if key not in STRUCTURAL or not noted:
                problems.append(where)
    return count


@pytest.mark.parametrize("name", ALL_MACHINES)
def test_every_number_has_a_source_or_an_estimate(name):
    with open(TOPO_DIR / f"{name}.toml", "rb") as f:
        data = tomllib.load(f)
    problems: list[str] = []
    count = _walk(data, "", problems)
    assert problems == []
    assert count == len(load_machine(name).sources) > 40


def test_list_machines_has_the_seeds_and_dgx_a100():
    assert set(ALL_MACHINES) <= set(list_machines())


def test_units_are_si(frontier):
    d, c = frontier.device, frontier.collectives
    assert d.hbm_bytes == 68.7e9 and d.hbm_bw_bytes_per_s == 1600e9  # 64 GiB
    assert d.peak_flop_per_s == pytest.approx(191.5e12)
    assert d.kernel_overhead_s == pytest.approx(8e-6)
    assert d.layout_efficiency["NT"] == pytest.approx(6 / 55, abs=1e-3)
    assert c.base_latency_s[("ring", "ll")] == pytest.approx(6.6e-6)
    assert c.protocols == ("ll", "simple")
    assert frontier.network.link_bw_bytes_per_s == 25e9
    assert frontier.max_gpus == 74 * 128 * 8 and frontier.max_nodes == frontier.network.max_nodes
    assert frontier.network.kind == "dragonfly" and frontier.node.switch is None
    assert frontier.sources["device.hbm_gb"].value == 68.7  # 64 GiB


# ------------------------------------------------------------ node graphs


def test_frontier_node_graph_is_the_published_link_table(frontier):
    g = node_graph(frontier)
    pairs = {frozenset((u[1], v[1])): d["bw_bytes_per_s"] for u, v, d in g.edges(data=True) if d["kind"] == "xgmi"}
    gbs = {200: [(0, 1), (2, 3), (4, 5), (6, 7)], 100: [(0, 6), (2, 4)],
           50: [(0, 2), (1, 3), (4, 6), (5, 7), (1, 5), (3, 7)]}
    expected = {frozenset(p): bw * 1e9 for bw, ps in gbs.items() for p in ps}
    assert pairs == expected
    assert sum(1 for *_, d in g.edges(data=True) if d["kind"] == "xgmi") == 24
    attach = {u[1]: v[1] for u, v, d in g.edges(data=True) if d["kind"] == "attach" and u[0] == "nic"}
    assert attach == {0: 1, 1: 3, 2: 5, 3: 7}


@pytest.mark.parametrize("name,gbs", [("perlmutter", 100), ("alps", 150)])
def test_nvidia_nodes_are_fully_connected(name, gbs):
    g = node_graph(load_machine(name))
    gpu_edges = [(u, v, d) for u, v, d in g.edges(data=True) if u[0] == v[0] == "gpu"]
    assert len(gpu_edges) == 12
    assert all(d["bw_bytes_per_s"] == gbs * 1e9 and d["kind"] == "nvlink" for *_, d in gpu_edges)


def test_network_graph_of_two_nodes(frontier):
    g = network_graph(frontier, 2)
    # 2 x (8 GCDs + 4 NICs) + 32 switches of one group.
    assert g.number_of_nodes() == 2 * 12 + 32
    # 2 x (24 xGMI + 8 attach + 8 NIC<->switch) + 32 x 31 local, no global.
    assert g.number_of_edges() == 2 * 40 + 32 * 31
    assert not any(d["kind"] == "global" for *_, d in g.edges(data=True))


def test_endpoint_and_global_ports_fit_a_rosetta_switch():
    for name in MACHINES:
        m = load_machine(name)
        net, nics = m.network, len(m.node.nics)
        endpoints = [dragonfly.nic_switch(net, nics, n, k) for n in range(net.nodes_per_group) for k in range(nics)]
        per_switch = [endpoints.count((0, s)) for s in range(net.switches_per_group)]
        assert max(per_switch) <= net.endpoint_ports_per_switch
        ports = [dragonfly.global_port(net, 0, h, j) for h in range(1, net.n_groups)
                 for j in range(net.global_links_per_group_pair)]
        assert max(ports.count(s) for s in range(net.switches_per_group)) <= 16


# ------------------------------------------------------------ fabric and routes


def test_nearest_nic_on_frontier(frontier):
    fab = Fabric(frontier, 8)
    assert [fab.nearest_nic(g) for g in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    alps = Fabric(load_machine("alps"), 4)
    assert [alps.nearest_nic(g) for g in range(4)] == [0, 1, 2, 3]


def test_same_node_routes(frontier):
    fab = Fabric(frontier, 16)
    direct = fab.local_direct_links()
    assert len(direct) == 24 and direct[(0, 1)] == pytest.approx(200e9 * 0.75)
    r = fab.route(8, 9)
    assert len(r) == 1 and fab.link_name[r[0]] == "n1:gpu0->gpu1"
    assert fab.capacity_bytes_per_s[r[0]] == pytest.approx(150e9)
    # GCD0 -> GCD3: no direct link; the best 2-hop bottleneck over all intermediates.
    r = fab.route(0, 3)
    assert len(r) == 2
    best = max(min(direct[(0, m)], direct[(m, 3)]) for m in range(8) if (0, m) in direct and (m, 3) in direct)
    assert min(fab.capacity_bytes_per_s[i] for i in r) == best
    _check_path(fab, 0, 3, r)
    assert fab.route(5, 5) == ()
    assert fab.route(0, 3) is r  # cached


def test_fake_machine_takes_the_only_path_and_nearest_nic(fake):
    fab = Fabric(fake, 8)
    assert [fab.link_name[i] for i in fab.route(0, 3)] == ["n0:gpu0->gpu1", "n0:gpu1->gpu2", "n0:gpu2->gpu3"]
    assert [fab.nearest_nic(g) for g in range(4)] == [0, 0, 0, 0]
    r = fab.route(3, 7)  # 3 hops to the NIC, NIC, switch, NIC, 3 hops back
    assert len(r) == 3 + 2 + 1 + 2 + 3
    _check_path(fab, 3, 7, r)


def test_two_hop_route_takes_the_widest_bottleneck_then_lowest_index(tmp_path, frontier):
    # Diamond 0-1-3 (bottleneck 10) and 0-2-3 (bottleneck 20): the wider path wins over the lower index.
    diamond = """links = [
  { a = 0, b = 1, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 10, estimate = "t" }, estimate = "t" },
  { a = 1, b = 3, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 40, estimate = "t" }, estimate = "t" },
  { a = 0, b = 2, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 20, estimate = "t" }, estimate = "t" },
  { a = 2, b = 3, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 30, estimate = "t" }, estimate = "t" },
]"""
    start, end = FAKE.index("links = ["), FAKE.index("]\nnics")
    path = tmp_path / "diamond.toml"
    path.write_text(FAKE[:start] + diamond + FAKE[end + 1:])
    fab = Fabric(load_machine(str(path)), 4)
    assert [fab.link_name[i] for i in fab.route(0, 3)] == ["n0:gpu0->gpu2", "n0:gpu2->gpu3"]
    # Frontier GCD2 -> GCD6: via 0 (50, 100) or via 4 (100, 50) tie; the lower index wins.
    assert _names(Fabric(frontier, 8), 2, 6) == ["n0:gpu2->gpu0", "n0:gpu0->gpu6"]


def test_nearest_nic_prefers_fewer_hops_then_the_wider_link(tmp_path):
    # Line 0-1-2-3 (10, 20, 30 GB/s) with NIC0 on GPU 1 and NIC1 on GPU 3.
    nics = """nics = [
  { index = 0, attach_gpu = 1, bw_per_direction_gb_per_s = { value = 5, estimate = "t" }, attach_bw_per_direction_gb_per_s = { value = 8, estimate = "t" }, estimate = "t" },
  { index = 1, attach_gpu = 3, bw_per_direction_gb_per_s = { value = 5, estimate = "t" }, attach_bw_per_direction_gb_per_s = { value = 8, estimate = "t" }, estimate = "t" },
]"""
    start, end = FAKE.index("nics = ["), FAKE.index("]\nlink_efficiency")
    text = FAKE[:start] + nics + FAKE[end + 1:]
    text = text.replace("switches_per_group = { value = 2,", "switches_per_group = { value = 4,")
    path = tmp_path / "two_nics.toml"
    path.write_text(text)
    fab = Fabric(load_machine(str(path)), 8)
    assert [fab.nearest_nic(g) for g in range(4)] == [0, 0, 1, 1]
    r = fab.route(2, 6)
    assert _names(fab, 2, 6)[:2] == ["n0:gpu2->gpu3", "n0:gpu3->nic1"]
    _check_path(fab, 2, 6, r)


def _names(fab: Fabric, src: int, dst: int) -> list[str]:
    return [fab.link_name[i] for i in fab.route(src, dst)]


def test_inter_node_route_passes_injection_and_ejection(frontier):
    fab = Fabric(frontier, 64)
    r = fab.route(0, 8 * 5 + 6)
    names = [fab.link_name[i] for i in r]
    assert [fab.link_kind[i] for i in r].count("nic") == 2
    assert names[:3] == ["n0:gpu0->gpu1", "n0:gpu1->nic0", "n0:nic0->sw0.0"]
    assert names[-4] == "n5:sw0.0->nic0" and names[-1].startswith("n5:")
    _check_path(fab, 0, 46, r)


def test_inter_group_route_crosses_one_global_link(frontier_minimal):
    fab = Fabric(frontier_minimal, 300 * 8)  # 3 groups
    for src, dst in [(0, 200 * 8 + 3), (17, 299 * 8 + 6), (130 * 8 + 2, 5 * 8 + 1)]:
        r = fab.route(src, dst)
        assert [fab.link_kind[i] for i in r].count("global") == 1
        _check_path(fab, src, dst, r)
    same_group = fab.route(0, 100 * 8)
    assert "global" not in [fab.link_kind[i] for i in same_group]


def test_routes_are_symmetric_in_length(frontier):
    fab = Fabric(frontier, 300 * 8)
    pairs = [(0, 3), (1, 6), (0, 8 * 7 + 2), (3, 8 * 140 + 4), (8 * 299 + 7, 12)]
    for a, b in pairs:
        for k in range(4):
            assert len(fab.route(a, b, nic=k)) == len(fab.route(b, a, nic=k))
    # Default NIC: the nearest to the source, the same on both ends when the local indices match.
    for a, b in [(2, 8 * 150 + 2), (6, 8 * 299 + 6), (0, 8 * 3)]:
        assert len(fab.route(a, b)) == len(fab.route(b, a))


def test_fabric_links_match_the_network_graph(frontier_minimal):
    for machine, n_nodes in [(frontier_minimal, 2), (frontier_minimal, 260), (_minimal(load_machine("alps")), 230)]:
        fab = Fabric(machine, n_nodes * machine.node.gpus_per_node)
        g = network_graph(machine, n_nodes)
        edges = {_endpoints(fab, i) for i in range(fab.n_links)}
        assert len(edges) == fab.n_links == g.number_of_edges()
        assert edges == set(g.edges())


@pytest.mark.parametrize("name", ["frontier", "alps", "dgx-a100", "gb200-nvl72"])
def test_network_routes_follow_the_described_links(name):
    """Every network route chains described links from the source NIC's switch to the destination's: the
    ids the simulator routes over and the edges the graph draws come from one description (the Layout)."""
    m = load_machine(name)
    if m.network.kind == "dragonfly":
        m = _minimal(m)
    n_nodes = min(m.max_nodes, 3 * m.network.nodes_per_group + 1)
    net = layout(m.network, len(m.node.nics), n_nodes)
    ends = [b.ends(i) for b in net.blocks for i in range(b.size)]
    assert len(ends) == net.n_links == len(net.names()) == len(net.kinds())
    for ns, nd in itertools.product([0, 1, n_nodes // 2, n_nodes - 1], repeat=2):
        for k in range(len(m.node.nics)):
            at = net.attach(ns, k)
            for i in net.path(ns, nd, k):
                u, v = ends[i]
                assert u == at, (name, ns, nd, k, net.names()[i])
                at = v
            assert at == net.attach(nd, k)


def test_full_frontier_job_fabric(frontier_minimal):
    fab = Fabric(frontier_minimal, 32768)
    assert fab.n_nodes == 4096
    kinds = fab.link_kind
    assert kinds.count("global") == 32 * 31 // 2 * 4 * 2
    assert kinds.count("local") == 32 * 32 * 31
    assert fab.n_links == len(fab.capacity_bytes_per_s) == len(kinds)
    assert (fab.capacity_bytes_per_s > 0).all()
    r = fab.route(0, 32767)
    assert kinds.count("global") and [kinds[i] for i in r].count("global") == 1


def test_fabric_rejects_too_many_gpus(frontier):
    with pytest.raises(TwinError, match="n_gpus"):
        Fabric(frontier, frontier.max_gpus + 1)
    with pytest.raises(TwinError, match="nic"):
        Fabric(frontier, 16).route(0, 8, nic=4)


# ------------------------------------------------------------ placement


def test_place_ranks_is_node_major(frontier):
    ranks = place_ranks(16, frontier)
    assert ranks == list(range(16))
    fab = Fabric(frontier, 16)
    assert [fab.node_of(g) for g in ranks[:9]] == [0] * 8 + [1]
    with pytest.raises(TwinError, match="n_ranks"):
        place_ranks(frontier.max_gpus + 1, frontier)


# ------------------------------------------------------------ load errors


def test_unknown_machine_lists_known_ones():
    with pytest.raises(TwinError, match="unknown machine 'summit'.*frontier"):
        load_machine("summit")


def test_bad_path():
    with pytest.raises(TwinError, match="not found"):
        load_machine("/nonexistent/machine.toml")


def test_invalid_toml(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[machine\nname = 1\n")
    with pytest.raises(TwinError, match="invalid TOML"):
        load_machine(str(path))


@pytest.mark.parametrize("old,new,field", [
    ('hbm_gb = { value = 68.7, source = "OLCF Frontier user guide: 64 GB HBM2E per GCD; the 64 GB are binary: the ROCm runtime reports 68,702,699,520 bytes of total memory on an MI250X GCD" }\n', "", "device.hbm_gb"),
    ('hbm_gb = { value = 68.7, source = "OLCF Frontier user guide: 64 GB HBM2E per GCD; the 64 GB are binary: the ROCm runtime reports 68,702,699,520 bytes of total memory on an MI250X GCD" }', "hbm_gb = 68.7", "device.hbm_gb"),
    ('source = "OLCF Frontier user guide: 64 GB HBM2E per GCD; the 64 GB are binary: the ROCm runtime reports 68,702,699,520 bytes of total memory on an MI250X GCD"', 'note = "x"', "device.hbm_gb"),
    ("hbm_efficiency = { value = 0.8,", "hbm_efficiency = { value = 1.8,", "device.hbm_efficiency"),
    ("a = 0\nb = 1\n", "a = 0\nb = 9\n", "node.links[0].b"),
    ('source = "OLCF Frontier user guide, node diagram"\n', "", "node.links[0].a"),
    ("attach_gpu = 1\n", "attach_gpu = 8\n", "node.nics[0].attach_gpu"),
    ("xgmi = { value = 0.75,", "xgmx = { value = 0.75,", "node.link_efficiency.xgmi"),
    ("n_groups = ", "n_group = ", "network.n_groups"),
    ('kind = "dragonfly"', 'kind = "torus"', "network.kind"),
    ('allowed = ["ll", "simple"]', 'allowed = ["ll", "fast"]', "collectives.protocols.allowed"),
])
def test_load_errors_name_the_field(tmp_path, old, new, field):
    with pytest.raises(TwinError) as err:
        load_machine(_edit(tmp_path, old, new))
    message = str(err.value)
    assert f"'{field}'" in message and "\n" not in message


def test_unknown_field_is_rejected(tmp_path):
    path = _edit(tmp_path, "[device]\n", '[device]\nhbm_bandwidth = { value = 1, source = "x" }\n')
    with pytest.raises(TwinError, match="'device.hbm_bandwidth' is not a known field"):
        load_machine(path)


def test_disconnected_node_is_rejected(tmp_path):
    text = FAKE.replace('  { a = 2, b = 3, count = 1, kind = "wire", bw_per_direction_gb_per_s = { value = 30, estimate = "t" }, estimate = "t" },\n', "")
    path = tmp_path / "cut.toml"
    path.write_text(text)
    with pytest.raises(TwinError, match="node.links.*GPU 3 unreachable"):
        load_machine(str(path))


def test_every_machine_builds_its_largest_job():
    for name in MACHINES:
        m = _minimal(load_machine(name))
        fab = Fabric(m, m.max_gpus)
        assert fab.n_nodes == m.max_nodes
        last = m.max_gpus - 1
        for a, b in itertools.islice(itertools.combinations([0, 1, last // 2, last], 2), 6):
            _check_path(fab, a, b, fab.route(a, b))


def test_adaptive_routing_uses_the_group_pools(frontier):
    """Slingshot's adaptive routing: inter-group traffic crosses its groups' pooled global links."""
    fab = Fabric(frontier, 300 * 8)  # 3 groups
    kinds = fab.link_kind
    assert kinds.count("global_pool") == 2 * 3
    route = fab.route(0, 200 * 8 + 3)
    pools = [i for i in route if kinds[i] == "global_pool"]
    assert [fab.link_name[i] for i in pools] == ["g0:global-out", "g1:global-in"]
    assert "global" not in [kinds[i] for i in route]
    net = frontier.network
    per_link = net.link_bw_bytes_per_s * frontier.node.network_link_efficiency
    expected = net.global_links_per_group_pair * (net.n_groups - 1) * per_link / 2
    assert fab.capacity_bytes_per_s[pools[0]] == pytest.approx(expected)
    assert "global_pool" not in [kinds[i] for i in fab.route(0, 100 * 8)]  # same group


def test_adaptive_routing_inside_a_group_uses_the_switch_pools(frontier):
    """Inside a group too: a transfer between two switches crosses the source switch's pooled local links out and
    the destination's in, (switches - 1) links each, halved for the two-hop paths; minimal routing takes the one
    direct link; on one switch there is no network hop at all."""
    fab = Fabric(frontier, 64 * 8)  # one group
    kinds, net = fab.link_kind, frontier.network
    route = fab.route(0, 16 * 8)  # node 0 and node 16: NIC 0 of each on the first switch of two blocks
    pools = [i for i in route if kinds[i] == "local_pool"]
    assert [fab.link_name[i] for i in pools] == ["g0:sw0:local-out", "g0:sw4:local-in"]
    assert "local" not in [kinds[i] for i in route]
    per_link = net.link_bw_bytes_per_s * frontier.node.network_link_efficiency
    assert fab.capacity_bytes_per_s[pools[0]] == pytest.approx((net.switches_per_group - 1) * per_link / 2)
    assert not [i for i in fab.route(0, 8) if kinds[i] in ("local", "local_pool")]  # nodes 0 and 1: one switch
    minimal = dataclasses.replace(frontier, network=dataclasses.replace(net, routing="minimal"))
    direct = Fabric(minimal, 64 * 8)
    assert [direct.link_kind[i] for i in direct.route(0, 16 * 8)].count("local") == 1


@pytest.mark.parametrize("name, n_gpus, routing", [
    ("frontier", 8 * 300, None), ("frontier", 8 * 300, "minimal"), ("perlmutter", 4 * 600, None),
    ("dgx-a100", 8 * 50, None), ("local", 4, None),
])
def test_route_loads_sum_the_routes(name, n_gpus, routing):
    """Fabric.route_loads (numpy, for collectives over many nodes) gives what adding up route() does, on
    dragonflies (adaptive and minimal routing, across groups), a fat tree across leaves and one node."""
    machine = load_machine(name)
    if routing:
        machine = dataclasses.replace(machine, network=dataclasses.replace(machine.network, routing=routing))
    fabric = Fabric(machine, n_gpus)
    rng = np.random.default_rng(7)
    transfers = [(int(a), int(b), float(w), None if k < 0 else int(k))
                 for a, b, w, k in zip(rng.integers(0, n_gpus, 400), rng.integers(0, n_gpus, 400),
                                       rng.random(400), rng.integers(-1, len(machine.node.nics), 400))]
    expected: dict[int, float] = {}
    for src, dst, amount, nic in transfers:
        for link in fabric.route(src, dst, nic):
            expected[link] = expected.get(link, 0.0) + amount
    got = fabric.route_loads(transfers)
    assert set(got) == set(expected)
    assert all(got[link] == pytest.approx(v, rel=1e-12) for link, v in expected.items())
    assert fabric.route_loads([]) == {}
    with pytest.raises(TwinError, match="dst_gpu"):
        fabric.route_loads([(0, n_gpus, 1.0, None)])
