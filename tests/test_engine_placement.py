"""Where a job's ranks run: `simulate(gpus=)` places them on a shared CollectiveModel's fabric.

twin.pipeline_depth simulates short pipelines on the full job's fabric (some of its nodes, possibly not the
first ones in rank order); a job named on a larger fabric must simulate as it does on its own, and a placement
that does not fit is refused.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from topologies.fabric import Fabric
from topologies.machine import load_machine
from twin.build import build_step
from twin.model import ModelSpec
from twin.plan import parse_plan
from twin.sim.collectives import CollectiveModel
from twin.sim.engine import simulate

MODEL = ModelSpec("placement-test", layers=4, hidden=1024, heads=16, seq=1024)


def _schedule(machine, gpus: int, plan: str):
    return build_step(MODEL, replace(parse_plan(plan), global_batch=8), machine, gpus).schedule


def test_a_job_on_a_larger_fabric_simulates_as_on_its_own():
    """A 4-node pipeline (tp=8, pp=4 on dgx-a100) named on 4 nodes of a 16-node fabric: the same step."""
    m = load_machine("dgx-a100")
    schedule = _schedule(m, 32, "tp=8,pp=4,mbs=1")
    alone = simulate(schedule, m).step_time_s
    larger = CollectiveModel(Fabric(m, 128))
    for first in (0, 32):  # its own nodes 0-3, or nodes 4-7 (the same leaf switch)
        on = list(range(first, first + 32))
        assert simulate(schedule, m, collectives=larger, gpus=on).step_time_s == pytest.approx(alone, rel=1e-12)


def test_placements_that_do_not_fit_are_refused():
    m = load_machine("dgx-a100")
    schedule = _schedule(m, 16, "tp=8,pp=2,mbs=1")
    with pytest.raises(ValueError, match="one GPU per rank"):
        simulate(schedule, m, gpus=list(range(8)))
    with pytest.raises(ValueError, match="hold them"):
        simulate(schedule, m, collectives=CollectiveModel(Fabric(m, 16)), gpus=list(range(8, 24)))
    with pytest.raises(ValueError, match="world size"):
        simulate(schedule, m, collectives=CollectiveModel(Fabric(m, 32)))


def test_dpouter_places_each_pipeline_on_consecutive_gpus():
    """tp=2 x dp=2 x pp=2: rank i + 2 (d + 2 s) runs on GPU i + 2 (s + 2 d); without dpouter, on GPU r."""
    from twin.mesh import rank_gpus

    plan = parse_plan("tp=2,dp=2,pp=2,dpouter=1")
    assert rank_gpus(plan) == [0, 1, 4, 5, 2, 3, 6, 7]
    assert rank_gpus(replace(plan, dpouter=False)) is None
    big = parse_plan("tp=8,cp=2,dp=4,pp=16,dpouter=1")
    assert sorted(rank_gpus(big)) == list(range(big.world_size))


def test_the_rank_on_each_gpu_inverts_the_placement():
    """rank_on_gpu (the executor's worker on GPU g runs that rank) undoes rank_gpus, and is the GPU itself where the
    ranks are not reordered; stage_stride is the GPUs from one stage of a pipeline to its next."""
    from twin.mesh import rank_gpus, rank_on_gpu, stage_stride

    for text in ("tp=2,dp=2,pp=2,dpouter=1", "tp=8,cp=2,dp=4,pp=16,dpouter=1", "tp=2,dp=3,pp=5,dpouter=1"):
        plan = parse_plan(text)
        placed = rank_gpus(plan)
        assert [rank_on_gpu(plan, placed[r]) for r in range(plan.world_size)] == list(range(plan.world_size))
        assert stage_stride(plan) == plan.world_size // (plan.pp * plan.gdata)
        assert [placed[r + stage_stride(plan) * plan.gdata] - placed[r] for r in range(4)] == [stage_stride(plan)] * 4
    plain = parse_plan("tp=2,dp=3,pp=5")
    assert [rank_on_gpu(plain, g) for g in range(30)] == list(range(30))
    assert stage_stride(plain) == 6 and rank_on_gpu(None, 7) == 7


def test_dpouter_moves_the_data_parallel_sum_across_the_spine():
    """tp=8, pp=2, dp=2 on 4 DGX nodes, two a leaf group, an 8:1 spine. Stages outermost (the default): each stage's
    two replicas share a leaf, and only the pipeline's small transfers cross the spine. dpouter: each replica's
    two stages share a leaf, and the gradient all-reduce crosses it: a longer step; the reduced simulation still
    equals the one of every rank."""
    from topologies.overrides import parse_override

    m = load_machine("dgx-a100", (parse_override("network.nodes_per_leaf_group=2"),
                                  parse_override("network.oversubscription=8")))
    plain = simulate(_schedule(m, 32, "tp=8,pp=2,dp=2,mbs=1"), m).step_time_s
    schedule = _schedule(m, 32, "tp=8,pp=2,dp=2,mbs=1,dpouter=1")
    outer = simulate(schedule, m).step_time_s
    assert outer > 1.05 * plain
    assert simulate(schedule, m, full=True).step_time_s == pytest.approx(outer, rel=1e-9)
