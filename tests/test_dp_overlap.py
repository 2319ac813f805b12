"""odp=1, the data-parallel synchronisation overlapped with the step (twin.builders.data_parallel): each gradient
bucket reduced right after the last micro-batch's backward of its layer, and under ZeRO-1/2 the updated weights
gathered under the forward; checked through the dependency graph (tests/helpers.happens_before) and by simulation."""

from __future__ import annotations

import pytest

from helpers import happens_before
from topologies import load_machine
from twin.build import build_step
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan

MODEL = parse_model_spec("layers=4,hidden=512,heads=8,seq=256,vocab=2048")


def build(frontier, text: str, batch: int = 8):
    plan = parse_plan(text, ParallelPlan(global_batch=batch))
    gpus = plan.gx * plan.gy * plan.gz * plan.gdata * plan.pp
    return build_step(MODEL, plan, frontier, gpus)


def by_role(program, role: str) -> dict[tuple[str, int | None], object]:
    """(block, layer) -> the step's op of `role` (a bucket's ar_data, rs_data or ag_data)."""
    return {(op.tag.block, op.tag.layer): op for op in program.ops if op.tag.role == role}


def layer_ops(program, phase: str, micro_batch: int, layer: int) -> list:
    return [op for op in program.ops if (op.tag.phase, op.tag.micro_batch, op.tag.layer) == (phase, micro_batch, layer)
            and op.tag.role not in ("ar_data", "rs_data", "ag_data")]


@pytest.mark.parametrize("text, role", [("dp=2,mbs=2,zero=1", "rs_data"), ("dp=2,mbs=2", "ar_data"),
                                        ("gz=2,dp=2,mbs=2", "ar_data"), ("pp=2,dp=2,mbs=2,zero=1", "rs_data")])
def test_each_bucket_is_reduced_as_soon_as_its_last_gradient_is_in(frontier, text, role):
    step = build(frontier, text + ",odp=1", batch=16)
    for program in step.schedule.programs:
        before = happens_before(program)
        reductions = by_role(program, role)
        layers = sorted(layer for block, layer in reductions if block == "layer")
        assert layers
        last_mb = max(op.tag.micro_batch for op in program.ops if op.tag.micro_batch is not None)
        for layer in layers:
            op = reductions[("layer", layer)]
            mine = layer_ops(program, "bwd", last_mb, layer)
            assert all(o.id in before[op.id] for o in mine)  # after this layer's whole last backward
            if layer > min(layers):  # and before the layers below it finish theirs: under the backward
                assert not all(o.id in before[op.id] for o in layer_ops(program, "bwd", last_mb, layer - 1))
            shard = [o for o in program.ops if o.tag.role == "rs_z" and o.tag.layer == layer]
            assert all(o.id in before[op.id] for o in shard)  # after the weight shards' reduce-scatters (gz)
        optimizer = next(o for o in program.ops if o.tag.block == "optimizer")
        assert all(op.id in before[optimizer.id] for op in reductions.values())


def test_zero1_weights_are_gathered_under_the_forward(frontier):
    program = build(frontier, "dp=2,mbs=2,zero=1,odp=1", batch=16).schedule.programs[0]
    before = happens_before(program)
    gathers = by_role(program, "ag_data")
    optimizer = next(o for o in program.ops if o.tag.block == "optimizer")
    for layer in range(MODEL.layers):
        gather = gathers[("layer", layer)]
        first_forward = layer_ops(program, "fwd", 0, layer)[0]
        assert gather.id in before[first_forward.id] and gather.id < optimizer.id  # ahead, not after the step
        if layer:  # and not before the layers above it have run: under the forward
            assert not all(o.id in before[gather.id] for o in layer_ops(program, "fwd", 0, layer - 1))


def test_odp_moves_the_same_bytes_and_hides_the_synchronisation(frontier):
    plain, overlapped = build(frontier, "dp=4,mbs=1,zero=1", 16), build(frontier, "dp=4,mbs=1,zero=1,odp=1", 16)
    totals = [sum(op.work.nbytes for op in s.schedule.programs[0].ops if op.is_comm) for s in (plain, overlapped)]
    assert totals[0] == pytest.approx(totals[1], rel=1e-12)
    h100 = load_machine("mpt-h100-80g")  # data parallelism over 4 nodes: its buckets take as long as the layers
    model = parse_model_spec("layers=4,hidden=4096,heads=32,seq=2048,vocab=8192")
    steps = [simulate_step(model, parse_plan(f"dp=32,mbs=1,zero=1,odp={odp}", ParallelPlan(global_batch=32)), h100, 32)
             for odp in (0, 1)]
    assert steps[1].step_time_s < 0.9 * steps[0].step_time_s
    assert steps[1].exposed_comm_s < 0.5 * steps[0].exposed_comm_s
