"""axonn=1: what Megatron-AxoNN does not shard over Z (twin.builders.axonn_kernels, twin.builders.replicated_grads):
the LM head (the tied word table) neither gathered nor reduce-scattered; after the last micro-batch an all-reduce
over Z of every replicated parameter tensor, in fp32, before the data-parallel reductions; the embedding's bucket and
memory counting the word table over X and Y only and the position table whole."""

from __future__ import annotations

import pytest

from twin.builders.axonn_kernels import replicated_embedding_params
from twin.builders.replicated_grads import ReplicatedGradWriter
from twin.builders.schedule import build_schedule
from twin.ir import Op
from twin.memory import memory_per_gpu, model_state_bytes_per_param
from twin.model import parse_model_spec

from helpers import valid_plan

GPT = parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024")
LLAMA = parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024,ffn=1376,kv_heads=2,arch=llama")


def step_ops(text: str, model=GPT, batch: int = 8) -> list[Op]:
    """Rank 0's program of `text` over a step of `batch` sequences."""
    return build_schedule(model, valid_plan(text, model, batch)).programs[0].ops


def z_syncs(program: list[Op]) -> list[Op]:
    return [op for op in program if op.tag.phase == "step" and op.tag.role == "ar_z"]


def replicated(text: str, model=GPT, batch: int = 8) -> list[tuple]:
    """The parameter tensors the step's all-reduce over Z sums (ReplicatedGradWriter.replicated_tensors)."""
    return ReplicatedGradWriter(model, valid_plan(text, model, batch), 0).replicated_tensors()


def test_the_lm_head_is_not_gathered_or_scattered_over_z():
    for program, expected in ((step_ops("gz=4,gdata=2,mbs=1,ga=1,axonn=1"), False),
                              (step_ops("gz=4,gdata=2,mbs=1,ga=1"), True)):
        over_z = [op for op in program if op.tag.block == "lm_head" and op.tag.role in ("ag_z", "rs_z")]
        assert bool(over_z) is expected


def test_the_replicated_gradients_are_all_reduced_over_z_in_fp32_after_the_last_backward():
    """GPT: the word and position tables, per layer two norms of two tensors and four biases, the final norm's two,
    summed into one blocking all-reduce over Z in fp32 (main_grad under --bf16), after the last backward and before
    the data-parallel reductions: the word table's half (split over gx = 2), the position table whole."""
    text = "gx=2,gz=2,gdata=2,mbs=1,ga=1,axonn=1"
    tensors = replicated(text, batch=4)
    assert len(tensors) == 2 + 8 * GPT.layers + 2
    assert [t[2] for t in tensors[:2]] == ["word", "pos"]
    assert tensors[0][3] == GPT.vocab * GPT.hidden / 2 and tensors[1][3] == GPT.seq * GPT.hidden
    program = step_ops(text, batch=4)
    [sync] = z_syncs(program)
    assert (sync.tag.block, sync.work.kind, sync.work.group, sync.work.dtype) == ("main_grad", "all_reduce", "z",
                                                                                   "fp32")
    assert sync.work.nbytes == pytest.approx(4 * sum(t[3] for t in tensors))
    last_backward = max(op.id for op in program if op.tag.phase == "bwd")
    first_data = min(op.id for op in program if op.tag.role == "ar_data")
    assert last_backward < sync.id < first_data
    after = next(op for op in program[sync.id + 1:] if not op.work.comm)  # blocking: the next compute op waits
    assert sync.id in after.deps


def test_llama_has_no_biases_or_position_table_to_sync():
    roles = [t[2] for t in replicated("gz=4,gdata=2,mbs=1,ga=1,axonn=1", LLAMA)]
    assert roles == ["word"] + ["weight"] * (2 * LLAMA.layers + 1)


@pytest.mark.parametrize("text, expected", [("gz=4,gdata=2,mbs=1,ga=1,axonn=1", True),
                                            ("gx=4,gdata=8,mbs=1,ga=1,axonn=1", False),
                                            ("gz=4,gdata=2,mbs=1,ga=1", False)])
def test_there_is_nothing_to_sync_without_axonn_or_without_z(text, expected):
    assert bool(z_syncs(step_ops(text))) is expected


def test_the_embeddings_bucket_and_memory_count_the_tables_as_axonn_holds_them():
    """gx = 2, gz = 4: the word table over X alone, the position table whole; the data-parallel all-reduce of the
    embedding's bucket moves those (and the final norm, 1/8 of it) in fp32, and memory holds them at the plan's bytes a
    parameter, where without axonn they are sharded over all 8 ranks."""
    text = "gx=2,gz=4,gdata=2,mbs=1,ga=1"
    replicated = replicated_embedding_params(GPT, valid_plan(text + ",axonn=1", GPT, 8))
    assert replicated == GPT.vocab * GPT.hidden / 2 + GPT.seq * GPT.hidden
    bucket = [op.work for op in step_ops(text + ",axonn=1")
              if op.tag.role == "ar_data" and op.tag.block == "embed"]
    assert [w.nbytes for w in bucket] == [pytest.approx(4 * (replicated + GPT.norm_params / 8))]
    coded, plain = (memory_per_gpu(GPT, valid_plan(text + t, GPT, 8)) for t in (",axonn=1", ",gradfp32=1"))
    per_param = model_state_bytes_per_param(0, 2, 4.0)  # fp32 gradients in both
    assert coded.model_state - plain.model_state == pytest.approx(
        per_param * (replicated - GPT.embedding_params / 8))
