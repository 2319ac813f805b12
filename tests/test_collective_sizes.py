"""Every group size gets a collective algorithm that applies to it, on every machine file.

The tuner (CollectiveModel.choose) once picked an algorithm for a family's
first instance and the simulator lowered every other instance with it: with
tensor-parallel degree 3 on 8-GPU nodes one instance spans two nodes (tree
and hierarchical apply) and the next sits on one (they do not), and
`twin simulate` died with KeyError: 'tree'. These tests sweep group sizes
1..64, contiguous and strided, alone and as whole families.
"""

from __future__ import annotations

import math

import pytest

from test_cli import run
from topologies.fabric import Fabric
from topologies.machine import list_machines, load_machine
from twin.ir import COLLECTIVE_KINDS
from twin.sim.collectives import ALGORITHMS, CollectiveModel, NotApplicable

WORLD = 256  # GPUs per fabric: 32 to 64 nodes, so strided groups of up to 64 ranks span many nodes
MAX_GROUP = 64
NBYTES = (4.0, float(1 << 20), float(1 << 30))  # latency-bound, in between, bandwidth-bound


@pytest.fixture(scope="module", params=list_machines())
def model(request) -> CollectiveModel:
    machine = load_machine(request.param)
    return CollectiveModel(Fabric(machine, min(WORLD, machine.max_gpus)))


def _strides(model: CollectiveModel) -> tuple[int, ...]:
    """Strides that put a group's members on different nodes, unevenly (3) or one per node (gpn + 1)."""
    return (3, model.fabric.machine.node.gpus_per_node + 1)


def _single_groups(model: CollectiveModel):
    """(size, group): the first n ranks, and every strided group of n ranks that fits."""
    world = model.fabric.n_gpus
    for n in range(1, min(MAX_GROUP, world) + 1):
        yield n, tuple(range(n))
        for stride in _strides(model):
            if (n - 1) * stride < world:
                yield n, tuple(range(0, n * stride, stride))


def _families(model: CollectiveModel, n: int) -> list[tuple[tuple[int, ...], ...]]:
    """The instances of an axis of size n, as the mesh lays them out: consecutive blocks (tensor parallel) and
    interleaved groups (data parallel over blocks of `stride` ranks)."""
    world = model.fabric.n_gpus
    blocks = tuple(tuple(range(i * n, (i + 1) * n)) for i in range(world // n))
    families = [blocks]
    for stride in _strides(model):
        if n * stride <= world:
            families.append(tuple(tuple(range(j, j + n * stride, stride)) for j in range(stride)))
    return families


def _assert_time(model: CollectiveModel, gpus: tuple[int, ...], kind: str, nbytes: float, algorithm: str,
                 protocol: str) -> None:
    lowering = model.lowering(gpus, kind, algorithm)
    t = model.time_alone_s(lowering, protocol, nbytes)
    assert math.isfinite(t), (gpus, kind, nbytes, algorithm)
    # One rank moves nothing and the twin charges it nothing; every real group takes time.
    assert t > 0 if len(gpus) > 1 else t == 0, (gpus, kind, nbytes, algorithm, t)


def test_every_group_size_gets_a_lowering_and_a_finite_time(model):
    for n, gpus in _single_groups(model):
        for kind in COLLECTIVE_KINDS:
            applicable = model.applicable(gpus, kind)
            assert applicable, (n, gpus, kind)
            for nbytes in NBYTES:
                lowering, protocol = model.choose(gpus, kind, nbytes)
                assert lowering.algorithm in applicable
                assert lowering.n_ranks == n
                _assert_time(model, gpus, kind, nbytes, lowering.algorithm, protocol)


def test_lowering_exists_exactly_where_an_algorithm_applies(model):
    """The registry's test and the lowering agree: applicable algorithms lower, the others raise a clear error."""
    for n, gpus in _single_groups(model):
        if n not in (1, 2, 3, 6, 12, 64):  # the shapes that differ; every size is swept above
            continue
        for kind in COLLECTIVE_KINDS:
            applicable = model.applicable(gpus, kind)
            for algorithm in ALGORITHMS:
                if algorithm in applicable:
                    assert model.lowering(gpus, kind, algorithm).algorithm == algorithm
                else:
                    with pytest.raises(NotApplicable, match=f"{algorithm} does not apply to {kind}"):
                        model.lowering(gpus, kind, algorithm)


def test_one_choice_applies_to_every_instance_of_a_family(model):
    """What the simulator does: choose on the first instance, naming the others as peers, and lower them all."""
    for n in range(1, min(MAX_GROUP, model.fabric.n_gpus) + 1):
        for instances in _families(model, n):
            for kind in ("all_reduce", "all_gather", "reduce_scatter"):
                for nbytes in (NBYTES[0], NBYTES[-1]):
                    lowering, protocol = model.choose(instances[0], kind, nbytes, peers=instances[1:])
                    for gpus in instances:
                        assert lowering.algorithm in model.applicable(gpus, kind), (n, gpus, kind)
                        _assert_time(model, gpus, kind, nbytes, lowering.algorithm, protocol)


def test_peers_only_restrict_the_choice():
    """Peers of the same shape leave the choice as it was; a peer of another shape only removes candidates."""
    machine = load_machine("frontier")
    model = CollectiveModel(Fabric(machine, 16))
    spanning, single = (6, 7, 8), (9, 10, 11)  # tensor parallel 3 on 8-GCD nodes: ranks 6-8 straddle two nodes
    assert "tree" in model.applicable(spanning, "all_reduce")
    assert model.applicable(single, "all_reduce") == ("ring",)
    alone = model.choose(spanning, "all_reduce", 4.0)
    assert model.choose(spanning, "all_reduce", 4.0, peers=[(5, 6, 8)]) == alone  # the same shape
    lowering, _ = model.choose(spanning, "all_reduce", 4.0, peers=[single])
    assert lowering.algorithm == "ring"


def test_simulate_with_tensor_parallel_three_on_frontier(capsys):
    """The command that raised KeyError: 'tree' (tp=3 and dp over two nodes of 8 GCDs) now simulates."""
    rc, out, err = run(capsys, "simulate", "--machine", "frontier", "--model-spec",
                       "layers=2,hidden=384,heads=6,seq=128", "--gpus", "12", "--plan", "tp=3,pp=2,dp=2",
                       "--global-batch", "48")
    assert rc == 0, err
    assert "step time" in out


@pytest.mark.parametrize("n", [2, 3, 8, 12])
def test_a_familys_batched_loads_are_the_sum_of_its_instances_lowerings(model, n):
    """CollectiveModel.family_loads (one batch of routes for every instance, what the simulator's flow network
    takes) against adding each instance's own lowering, for every algorithm that applies to the family."""
    import numpy as np

    for family in filter(None, _families(model, n)):  # a small host has no family of n
        for kind in COLLECTIVE_KINDS:
            for algorithm in model.applicable(family[0], kind):
                if not all(ALGORITHMS[algorithm].applies(model.shape(g), kind) for g in family):
                    continue
                batched = model.family_loads(family, kind, algorithm)
                summed = [np.zeros(len(model.fabric.capacity_bytes_per_s)) for _ in batched]
                for gpus in family:
                    for total, phase in zip(summed, model.lowering(gpus, kind, algorithm).phases):
                        for link, load in phase.items():
                            total[link] += load
                for got, want in zip(batched, summed):
                    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15, err_msg=f"{kind} {algorithm}")


@pytest.mark.parametrize("n", [2, 3, 8, 12])
def test_rings_across_nodes_as_arrays_are_the_transfers_routed_one_by_one(model, n):
    """The rings of groups spanning nodes are built as arrays per pattern of local members (_Lowerer._rings_across)
    in the order _ring_transfers lists them, so their loads are those of routing its transfers, to the last bit:
    strided families (a pattern per group), a family whose groups cover nodes unevenly (transfers listed one by
    one), and both in one batch."""
    import numpy as np

    lowerer, fabric = model._lowerer, model.fabric
    for family in filter(None, _families(model, n)):
        across = [(g, lowerer.by_node(g)) for g in family if len(lowerer.by_node(g)) > 1]
        for batch in (across, across[::-1], across[:1] + across[-1:]):
            if not batch:
                continue
            want = fabric.route_dense(t for gpus, nodes in batch for t in lowerer._ring_transfers(gpus, nodes))
            np.testing.assert_array_equal(lowerer._rings_across(batch), want)
