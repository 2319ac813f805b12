"""gradfp32=1: gradients accumulated and reduced in fp32 (Megatron-LM's default under --bf16, FSDP's
reduce_dtype=float32, Llama 3's): every gradient reduction moves 4 bytes an element where the model's dtype moves 2,
nothing else does, and memory keeps 4-byte gradients."""

from __future__ import annotations

from dataclasses import replace

import pytest

from twin.builders.schedule import build_schedule
from twin.ir import Collective
from twin.memory import stage_memory
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan

MODEL = parse_model_spec("layers=4,hidden=512,heads=8,seq=128,vocab=1024,dtype=bf16")
# the gradient reductions by (block, role): the data-parallel buckets, the tied embedding's, dW's reduce-scatter
GRADIENT_ROLES = {"ar_data", "rs_data", "ar_tied", "rs_z", "rs_zdata"}


def plan(text: str) -> ParallelPlan:
    p = parse_plan(text, ParallelPlan(global_batch=8))
    p = p if p.ga else replace(p, ga=p.global_batch // (p.batch_split * p.mbs))
    validate_plan(p, MODEL, p.world_size)
    return p


def collectives(p: ParallelPlan) -> list[tuple[str, str, float, str]]:
    """(role, kind, bytes, dtype) of every collective rank 0 issues."""
    program = build_schedule(MODEL, p).programs[0]
    return [(op.tag.role, op.work.kind, op.work.nbytes, op.work.dtype) for op in program.ops
            if isinstance(op.work, Collective)]


def test_the_plan_text():
    p = plan("gz=2,gdata=2,mbs=1,gradfp32=1")
    assert p.gradfp32 and "gradfp32=1" in p.describe()
    assert parse_plan(p.describe()) == replace(p, global_batch=0)
    assert "gradfp32" not in plan("gz=2,gdata=2,mbs=1").describe()


@pytest.mark.parametrize("text", [
    "gx=2,gdata=4,mbs=1",  # the data-parallel all-reduce
    "gx=2,gdata=4,zero=1,mbs=1,odp=1",  # the distributed optimizer's reduce-scatter, issued by the backward
    "gz=2,gdata=2,mbs=1",  # FSDP: dW's reduce-scatter over z, then the all-reduce over data
    "gz=2,gdata=2,zero=3,mbs=1,reshard=1",  # ZeRO-3: dW's reduce-scatter over z and data together
    "gx=2,pp=2,gdata=2,mbs=1",  # the tied embedding's all-reduce between the ends of the pipeline
])
def test_only_the_gradient_reductions_move_fp32(text):
    base, wide = collectives(plan(text)), collectives(plan(f"{text},gradfp32=1"))
    assert len(base) == len(wide)
    reductions = 0
    for (role, kind, nbytes, dtype), (role2, kind2, nbytes2, dtype2) in zip(base, wide):
        assert (role, kind) == (role2, kind2)
        if role in GRADIENT_ROLES:
            reductions += 1
            assert (dtype, dtype2) == ("bf16", "fp32") and nbytes2 == pytest.approx(2 * nbytes)
        else:  # weights, activations and their gradients: as before
            assert (nbytes2, dtype2) == (nbytes, dtype)
    assert reductions > 0


@pytest.mark.parametrize("zero, sharded", [(0, 1), (1, 1), (2, 2), (3, 2)])
def test_memory_keeps_four_byte_gradients(zero, sharded):
    """Two more bytes a local parameter, divided over gdata where ZeRO-2 and -3 shard the gradients."""
    text = f"gx=2,gdata={sharded * 2},zero={zero},mbs=1" if zero else "gx=2,gdata=2,mbs=1"
    base, wide = (stage_memory(MODEL, plan(t), 0) for t in (text, f"{text},gradfp32=1"))
    p = plan(text)
    params = (base.model_state / {0: 16, 1: 4 + 12 / p.gdata, 2: 2 + 14 / p.gdata, 3: 16 / p.gdata}[zero])
    extra = 2 * params / (p.gdata if zero >= 2 else 1)
    assert wide.model_state - base.model_state == pytest.approx(extra)
    assert (wide.gathered_weights, wide.activations) == (base.gathered_weights, base.activations)
