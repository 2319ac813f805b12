"""The layers of each pipeline stage and chunk (twin.pipeline_split), and plans that count the embedding and the
loss as layers (pemb, ploss): Megatron-Core's split, the builder, memory and the search's bounds agree with it."""

from __future__ import annotations

import pytest

from helpers import SMALL_SPEC
from twin.build import build_step, resolve_step
from twin.errors import TwinError
from twin.memory import stage_params
from twin.model import get_model, parse_model_spec
from twin.pipeline_split import chunk_layers, stage_layers, split_error
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan


def megatron_offset_and_count(layers: int, pp: int, vpp: int, pemb: bool, ploss: bool, stage: int,
                              chunk: int) -> tuple[int, int]:
    """Megatron-Core's first layer and layer count of (stage, chunk) under --account-for-embedding/loss-in-
    pipeline-split, written out from its rules (transformer_layer.get_transformer_layer_offset,
    transformer_block.get_num_layers_to_build): the slots split evenly, the embedding's slot taken from the first
    chunk of the first stage and the loss's from the last chunk of the last stage."""
    total = layers + pemb + ploss
    per_chunk = total // (pp * vpp)
    offset = chunk * (total // vpp) + stage * per_chunk
    first_of_all = stage == 0 and chunk == 0
    last_of_all = stage == pp - 1 and chunk == vpp - 1
    if pemb and not first_of_all:
        offset -= 1
    count = per_chunk - (pemb and first_of_all) - (ploss and last_of_all)
    return offset, count


@pytest.mark.parametrize("layers, pp, vpp, pemb, ploss", [
    (126, 16, 1, True, True),   # Llama 3 405B: 7 layers on the end stages, 8 on the others
    (126, 16, 2, True, True),
    (126, 16, 8, True, True),   # one slot a chunk: the first chunk holds only the embedding, the last only the loss
    (31, 8, 1, True, False),
    (31, 4, 2, False, True),
    (32, 8, 2, False, False),   # the even split, unchanged
])
def test_split_is_megatron_cores_and_covers_every_layer_once_in_order(layers, pp, vpp, pemb, ploss):
    plan = ParallelPlan(pp=pp, vpp=vpp, pemb=pemb, ploss=ploss)
    assert split_error(layers, plan) is None
    in_model_order = []
    for chunk in range(vpp):
        for stage in range(pp):
            got = chunk_layers(layers, plan, stage, chunk)
            offset, count = megatron_offset_and_count(layers, pp, vpp, pemb, ploss, stage, chunk)
            assert (len(got), got.start) == (count, offset)
            in_model_order += list(got)
    assert in_model_order == list(range(layers))


def test_llama_3_405b_on_16_stages_holds_7_layers_on_each_end_and_8_between():
    plan = ParallelPlan(pp=16, pemb=True, ploss=True)
    assert [stage_layers(126, plan, s) for s in range(16)] == [7] + [8] * 14 + [7]
    assert chunk_layers(126, plan, 0) == range(0, 7) and chunk_layers(126, plan, 15) == range(119, 126)


@pytest.mark.parametrize("text, gpus, words", [
    ("pp=16,pemb=0,ploss=0", 16, ["126 layers do not split", "pemb=1, ploss=1"]),
    ("pp=4,pemb=1", 4, ["126 layers + 1 (embedding/loss counted) = 127 slots"]),
    ("pp=1,pemb=1", 1, ["need pp > 1"]),
])
def test_splits_that_do_not_divide_are_one_line_errors(text, gpus, words):
    model = get_model("Llama-3.1-405B")
    plan = parse_plan(text + ",mbs=1", ParallelPlan(global_batch=64))
    with pytest.raises(TwinError) as err:
        validate_plan(plan, model, gpus)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_plan_text_round_trips_and_the_default_text_is_unchanged():
    plan = parse_plan("tp=8,pp=16,dp=64,pemb=1,ploss=1")
    assert plan.pemb and plan.ploss
    assert parse_plan(plan.describe()) == plan
    assert "pemb" not in parse_plan("tp=8,pp=16,dp=64").describe()


def stage_programs(model, text: str, gpus: int, global_batch: int, machine):
    plan = parse_plan(text, ParallelPlan(global_batch=global_batch))
    resolved, _ = resolve_step(model, plan, machine, gpus)
    built = build_step(model, resolved, machine, gpus)
    per_stage = gpus // resolved.pp
    owner = built.schedule.program_of()
    return resolved, [built.schedule.programs[owner[s * per_stage]] for s in range(resolved.pp)]


def layers_in(program) -> set[int]:
    return {op.tag.layer for op in program.ops if op.tag.layer is not None and op.tag.block == "qkv"}


@pytest.mark.parametrize("vpp", [1, 2])
def test_builder_puts_each_layer_on_the_stage_the_split_names(frontier, vpp):
    model = parse_model_spec(SMALL_SPEC.replace("layers=2", "layers=6"))  # 6 layers + 2 slots on 4 stages
    plan, programs = stage_programs(model, f"tp=1,pp=4,vpp={vpp},pemb=1,ploss=1,mbs=1,ga=4", 4, 4, frontier)
    for stage, program in enumerate(programs):
        want = {layer for chunk in range(vpp) for layer in chunk_layers(6, plan, stage, chunk)}
        assert layers_in(program) == want
    if vpp == 1:
        assert [len(layers_in(p)) for p in programs] == [1, 2, 2, 1]


def test_every_parameter_is_all_reduced_once_with_the_end_slots(frontier):
    """Summed over the stages, the gradient all-reduces carry every parameter once (and GPT's tied table once
    more on the last stage), whatever the split."""
    model = parse_model_spec(SMALL_SPEC.replace("layers=2", "layers=4"))
    _, programs = stage_programs(model, "tp=1,dp=2,pp=3,pemb=1,ploss=1,mbs=1", 6, 4, frontier)
    total = sum(op.work.nbytes for p in programs for op in p.ops if op.is_comm and op.tag.role == "ar_data")
    assert total == pytest.approx(2 * (model.params + model.vocab * model.hidden))


def test_memory_counts_the_end_stages_fewer_layers():
    model = get_model("Llama-3.1-405B")
    plan = ParallelPlan(gx=8, pp=16, pemb=True, ploss=True, mbs=1, ga=16, global_batch=16)
    assert stage_params(model, plan, 1) == pytest.approx(8 * model.params_per_layer)
    assert stage_params(model, plan, 0) == pytest.approx(7 * model.params_per_layer + model.embedding_params)
    head = model.norm_params + model.vocab * model.hidden
    assert stage_params(model, plan, 15) == pytest.approx(7 * model.params_per_layer + head)
    assert sum(stage_params(model, plan, s) for s in range(16)) == pytest.approx(model.params)


def test_llama_3_benchmark_tries_every_chunk_count_megatron_allows_and_each_plan_is_valid():
    """benchmarks/llama3_405b.py's open settings: 1, 2, 4 or 8 chunks (the divisors of 8 slots a stage) where the
    micro-batches are a multiple of 16 stages, with and without tpo; each a valid plan of the run."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import llama3_405b
    from twin.runs import load_runs

    for run in load_runs(str(llama3_405b.RUNS)):
        texts = llama3_405b.settings(run)
        per_rank = run.plan.global_batch // run.plan.gdata  # 32 or 16 sequences
        chunks = {(p["mbs"], p["vpp"]) for p in (dict(kv.split("=") for kv in t.split(",")) for t in texts)}
        want = {("1", str(v)) for v in (1, 2, 4, 8)} | {("2", str(v)) for v in ((1, 2, 4, 8) if per_rank // 2 % 16 == 0
                                                                                else (1,))}
        assert chunks == want, run.gpus
        assert len(texts) == 2 * len(want)  # tpo 0 and 1
        for text in texts:
            plan = parse_plan(f"{text},recompute=full", ParallelPlan(global_batch=run.plan.global_batch))
            validate_plan(plan, run.model, run.gpus)
            assert plan.pemb and plan.ploss and plan.zero == 2 and plan.odp and plan.dpouter


def test_interleaved_activations_count_what_each_chunk_holds():
    """Llama 3 405B, pp=16 x vpp=8 (one slot a chunk), 32 micro-batches: stage 0 runs 2 x 15 + 7 x 16 + 1 = 143
    forwards before its first backward, 31 of them on its first chunk, which holds only the embedding; stage 1's
    141 forwards each hold one layer. An even split (128 layers) holds a layer in every one."""
    from dataclasses import replace

    from twin.memory import in_flight_layers

    model = get_model("Llama-3.1-405B")
    plan = ParallelPlan(gx=8, pp=16, vpp=8, pemb=True, ploss=True, mbs=1, ga=32, global_batch=32)
    assert in_flight_layers(model, plan, 0) == (143 - 31, 0)  # (recomputed, kept): full recompute
    assert in_flight_layers(model, plan, 1) == (141, 0)
    even = replace(plan, pemb=False, ploss=False)
    assert in_flight_layers(replace(model, layers=128), even, 0) == (143, 0)
    assert in_flight_layers(model, replace(plan, recompute="none"), 1) == (0, 141)
