"""norm=eager: a Llama's RMSNorms as torch's RMSNorm module runs them op by op (torchtitan's norm_type "rmsnorm";
twin.builders.eager_kernels): the kernels of each norm, their bytes, what memory keeps, and the refusals."""

from __future__ import annotations

import pytest

from twin.builders.eager_kernels import ELEMENT, RMSNORM_BACKWARD, RMSNORM_FORWARD, ROW
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir import Elementwise
from twin.memory import layer_activation_bytes
from twin.model import parse_model_spec
from twin.plan import WORD_KEYS, ParallelPlan, parse_plan

from helpers import valid_plan

LLAMA = parse_model_spec("layers=2,hidden=512,heads=8,kv_heads=2,seq=256,vocab=1024,ffn=1536,arch=llama")
PLAN = "gz=2,mbs=1,ga=1,recompute=none"


def plan(text: str, model=LLAMA) -> ParallelPlan:
    return valid_plan(text, model, 2)


def norm_ops(text: str, block: str, layer: int | None = 0) -> list:
    """The element-wise ops of `block` (ln1, ln2, ln_f) rank 0 writes for `layer` in micro-batch 0, in order."""
    program = build_schedule(LLAMA, plan(text)).programs[0]
    return [op for op in program.ops
            if op.tag.block == block and op.tag.layer == layer and isinstance(op.work, Elementwise)]


def test_the_plan_text_round_trips_and_fused_keeps_the_old_text():
    p = plan(f"{PLAN},kernels=eager,norm=eager")
    assert "norm=eager" in p.describe() and parse_plan(p.describe(), ParallelPlan(global_batch=2)) == p
    assert "norm" not in plan(PLAN).describe()


def test_every_plan_words_default_is_the_first_it_allows():
    """describe() leaves a word at its default out by comparing it with the first allowed value."""
    defaults = ParallelPlan()
    assert all(getattr(defaults, key) == allowed[0] for key, allowed in WORD_KEYS.items())


@pytest.mark.parametrize("text, model, message", [
    (f"{PLAN},norm=eager", parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024"),
     r"norm=eager .* a Llama model's RMSNorm \(got arch=gpt\); use a Llama model, or leave norm out"),
    ("gy=2,mbs=1,ga=1,recompute=none,norm=eager", LLAMA, r"the whole hidden on each rank \(got gy=2\); use gy=1"),
    (f"{PLAN},norm=apex", LLAMA, r"norm='apex' is unknown; use one of fused, eager"),
])
def test_refusals_name_the_field_and_the_fix(text, model, message):
    with pytest.raises(TwinError, match=message):
        plan(text, model)


@pytest.mark.parametrize("block, layer", [("ln1", 0), ("ln2", 0), ("ln_f", None)])
def test_each_norm_runs_the_modules_kernels_each_way_over_its_elements_or_its_tokens(block, layer):
    """Forward: the cast up, the square, the mean, + eps and rsqrt on one value a token, the scaling, the cast down,
    the weight; backward in autograd's order; each kernel's bytes as counted, over every element of the residual
    stream or over its tokens. Fused, one kernel forward."""
    tokens, h = LLAMA.seq, LLAMA.hidden
    for phase, kernels in (("fwd", RMSNORM_FORWARD), ("bwd", RMSNORM_BACKWARD)):
        ops = [op for op in norm_ops(f"{PLAN},norm=eager", block, layer) if op.tag.phase == phase]
        ops = [op for op in ops if op.tag.role not in ("grad_add", "acc_weight")]  # the residual's sum, gamma's
        assert [op.tag.role for op in ops] == [role for role, _, _, _ in kernels]
        by_role = {op.tag.role: op.work.nbytes for op in ops}
        for role, nbytes, _, per in kernels:
            assert by_role[role] == pytest.approx(nbytes * (tokens * h if per == ELEMENT else tokens))
    assert {per for *_, per in RMSNORM_FORWARD + RMSNORM_BACKWARD} == {ELEMENT, ROW}
    assert [op.tag.role for op in norm_ops(PLAN, block, layer) if op.tag.phase == "fwd"] == ["fwd"]


def test_the_module_moves_36_bytes_an_element_forward_and_92_backward():
    """From the code (eager_kernels' docstring): x.float 6, pow 8, mean 4, scale 8, type_as 6, weight 4; the
    backward's weight products 4 + 6 + 2, casts 6 + 6, scaling 8 + 12 + 4, mean 4, pow 8 + 8 + 12, the sum 12."""
    assert sum(b for _, b, _, per in RMSNORM_FORWARD if per == ELEMENT) == 36
    assert sum(b for _, b, _, per in RMSNORM_BACKWARD if per == ELEMENT) == 92


def test_memory_keeps_the_fp32_copy_and_the_cast_down_output_of_both_norms():
    tokens, h = LLAMA.seq, LLAMA.hidden
    assert layer_activation_bytes(LLAMA, plan(f"{PLAN},norm=eager"), tokens) - \
        layer_activation_bytes(LLAMA, plan(PLAN), tokens) == pytest.approx(2 * 4 * tokens * h)

