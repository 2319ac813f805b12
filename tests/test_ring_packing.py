"""Ring and chain packing in polynomial time (issue 15): the same rings as before on today's machines, and
valid, arc-disjoint rings on nodes no ordering search could finish (a 72-GPU NVLink domain, 16-GPU nodes)."""

from __future__ import annotations

from itertools import combinations, permutations

import pytest

import twin.sim.lowerings as lowerings
import twin.sim.rings as ring_search
from topologies.fabric import Fabric
from topologies.machine import load_machine
from twin.sim.rings import pack_chains, pack_rings

MACHINES = ("frontier", "perlmutter", "alps", "dgx-a100", "dgx-a100-800g", "local")


def node_arcs(name: str):
    machine = load_machine(name)
    return Fabric(machine, machine.node.gpus_per_node).ring_arcs(), machine.node.gpus_per_node


def exhaustive_rings(members, arcs, max_rings=ring_search.MAX_CHANNELS):
    """The rings as chosen before the polynomial search existed, written out here as the reference: each
    round, over every ordering of the members after the first, the best ring by ring_search._score."""
    used, rings = {}, []
    while len(rings) < max_rings:
        scored = [(ring_search._score((members[0],) + p, arcs, used, True), (members[0],) + p)
                  for p in permutations(members[1:])]
        scored = [(s, r) for s, r in scored if s is not None]
        if not scored:
            break
        best = max(scored, key=lambda sr: sr[0])[1]  # max keeps the first of equals, as the old loop did
        rings.append(best)
        ring_search._claim(best, used, True)
    return rings or [members]


def slowest_links(rings, arcs):
    return [min(arcs[(r[i], r[(i + 1) % len(r)])][0] for i in range(len(r))) for r in rings]


def assert_valid_rings(rings, members, arcs):
    """Every ring visits every member once over arcs that exist, and no arc carries more rings than links."""
    load: dict = {}
    for ring in rings:
        assert sorted(ring) == sorted(members)
        for i in range(len(ring)):
            arc = (ring[i], ring[(i + 1) % len(ring)])
            assert arc in arcs
            load[arc] = load.get(arc, 0) + 1
    assert all(count <= arcs[arc][1] for arc, count in load.items())


@pytest.mark.parametrize("name", MACHINES)
def test_todays_nodes_keep_their_rings(name):
    arcs, n = node_arcs(name)
    for k in range(2, n + 1):
        for members in list(combinations(range(n), k))[:12]:
            assert pack_rings(members, arcs) == exhaustive_rings(members, arcs)


@pytest.mark.parametrize("name", ["frontier", "perlmutter", "alps"])
def test_the_polynomial_search_matches_the_exhaustive_one_on_direct_link_nodes(name, monkeypatch):
    """Forced onto today's direct-link nodes, the polynomial search finds as many rings, each with the same
    slowest link, for every group of local GPUs."""
    arcs, n = node_arcs(name)
    monkeypatch.setattr(ring_search, "EXHAUSTIVE_MAX", 1)
    for k in range(2, n + 1):
        for members in combinations(range(n), k):
            rings, exact = pack_rings(members, arcs), exhaustive_rings(members, arcs)
            if exact == [members]:  # no ring of direct links: both fall back to the members' order, routed
                assert rings == exact
                continue
            assert_valid_rings(rings, members, arcs)
            assert slowest_links(rings, arcs) == slowest_links(exact, arcs), members


@pytest.mark.parametrize("name", ["dgx-a100", "local"])
def test_on_a_switch_the_polynomial_rings_load_the_links_as_the_exhaustive_ones(name, monkeypatch):
    """Through a node switch every ring loads each member's port once, however many rings there are: the
    link loads (what the simulator times) are the same."""
    machine = load_machine(name)
    n = machine.node.gpus_per_node
    exact = lowerings._Lowerer(Fabric(machine, n))
    monkeypatch.setattr(ring_search, "EXHAUSTIVE_MAX", 1)
    fast = lowerings._Lowerer(Fabric(machine, n))
    for k in range(2, n + 1):
        for members in list(combinations(range(n), k))[:6]:
            a, b = exact._ring_on_node_zero(members), fast._ring_on_node_zero(members)
            assert a.keys() == b.keys() and all(abs(a[x] - b[x]) < 1e-12 for x in a)


def switch_arcs(n: int) -> dict:
    return {(a, b): (900e9, 1) for a in range(n) for b in range(n) if a != b}


@pytest.mark.parametrize("n", [9, 10, 16, 72])
def test_a_large_switch_gets_disjoint_rings_and_chains(n):
    arcs = switch_arcs(n)
    members = tuple(range(n))
    rings = pack_rings(members, arcs)
    assert_valid_rings(rings, members, arcs)
    assert len(rings) >= min(ring_search.MAX_CHANNELS, n - 2)  # n-2: what Walecki's construction gives
    starts = tuple(range(min(n, 8)))
    chains = pack_chains(members, starts, arcs)
    assert [c[0] for c in chains] == list(starts) and all(sorted(c) == list(members) for c in chains)


def test_an_irregular_16_gpu_node_gets_rings_of_its_fastest_links():
    """A 16-GPU hypercube with doubled links on one dimension: rings exist, use real arcs, and the first
    uses only the fastest links when those alone can close a ring."""
    arcs = {}
    for a in range(16):
        for d in (1, 2, 4, 8):
            arcs[(a, a ^ d)] = (100e9 if d == 1 else 50e9, 2 if d == 1 else 1)
    members = tuple(range(16))
    rings = pack_rings(members, arcs)
    assert rings and rings != [members]
    assert_valid_rings(rings, members, arcs)
    assert max(slowest_links(rings, arcs)) == 50e9  # the d=1 links alone form no ring of 16


def test_the_nvl72_domain_gets_its_rings_and_a_step_simulates(capsys):
    """gb200-nvl72.toml: 72 GPUs on one NVLink switch. Its rings are valid and disjoint, and a step with
    tensor parallelism over the whole domain simulates on two racks."""
    from twin.cli import main

    arcs, n = node_arcs("gb200-nvl72")
    assert n == 72
    rings = pack_rings(tuple(range(n)), arcs)
    assert_valid_rings(rings, tuple(range(n)), arcs)
    assert len(rings) == ring_search.MAX_CHANNELS
    rc = main(["simulate", "--machine", "gb200-nvl72", "--model-spec", "layers=2,hidden=4608,heads=72,seq=512,vocab=50400",
               "--gpus", "144", "--plan", "tp=72,dp=2,mbs=1", "--global-batch", "4", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert '"step_time_s"' in out
