"""fsdp2=1: the copies PyTorch's FSDP2 launches beside its weight gathers (twin.builders.fsdp_kernels): one copy out
of the gather's buffer after every gather a linear waits for, in the forward, a recompute and a backward that
gathers again (the weights gathered in the model's dtype, with FP8 linears too); nothing else changes; the
refusal."""

from __future__ import annotations

import pytest

from twin.builders.fsdp_kernels import COPY_OUT_PASSES
from twin.builders.program import COMPUTE_STREAM
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir import Collective, Elementwise
from twin.model import parse_model_spec
from twin.plan import ParallelPlan

from helpers import assert_switch_shows_and_slows, valid_plan

LLAMA = parse_model_spec("layers=2,hidden=512,heads=8,kv_heads=2,seq=256,vocab=1024,ffn=1536,arch=llama,dropout=0")


def plan(text: str) -> ParallelPlan:
    return valid_plan(text, LLAMA, 4)


def ops(text: str) -> list:
    return build_schedule(LLAMA, plan(text)).programs[0].ops


@pytest.mark.parametrize("text", ["gz=4,mbs=1,ga=1,recompute=none,reshard=1",
                                  "gz=4,mbs=1,ga=1,recompute=full,reshard=1",
                                  "gz=4,mbs=1,ga=1,recompute=op,reshard=1", "gz=4,mbs=1,ga=1,recompute=none",
                                  "gz=2,gdata=2,zero=3,mbs=1,ga=1,recompute=full", "gz=4,mbs=1,ga=1,fp8=1"])
def test_every_waited_weight_gather_is_followed_by_its_copy_out(text):
    """As many copies as weight gathers, each moving the gathered block twice (read and written) in the weights'
    dtype, right after the wait on its gather; the same schedule otherwise."""
    with_copies, without = ops(f"{text},fsdp2=1"), ops(text)
    gathers = [op for op in with_copies if isinstance(op.work, Collective) and op.work.kind == "all_gather"
               and op.tag.role.startswith("ag_z")]
    copies = [op for op in with_copies if op.tag.role == "copy_out"]
    assert gathers and len(copies) == len(gathers)
    by_id = {op.id: op for op in with_copies}
    for copy in copies:
        [waited] = [by_id[d] for d in copy.deps if by_id[d].tag.role.startswith("ag_z")]
        assert isinstance(copy.work, Elementwise) and copy.stream == COMPUTE_STREAM
        assert (copy.tag.block, copy.tag.layer, copy.tag.phase) == (waited.tag.block, waited.tag.layer,
                                                                    waited.tag.phase)
        assert copy.work.nbytes == pytest.approx(COPY_OUT_PASSES * waited.work.nbytes)
    assert [op.tag for op in with_copies if op.tag.role != "copy_out"] == [op.tag for op in without]


def test_the_plan_text_round_trips_and_the_step_takes_longer():
    assert_switch_shows_and_slows(LLAMA, "gz=4,mbs=1,ga=1,reshard=1,fsdp2=1", "fsdp2", "dgx-a100", 4)


def test_a_plan_without_sharded_weights_is_refused_with_the_fix():
    with pytest.raises(TwinError, match=r"fsdp2=1 .* but this plan shards none; shard them \(gz > 1"):
        plan("gx=4,mbs=1,ga=1,fsdp2=1")
