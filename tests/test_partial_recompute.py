"""rcl=N: full recompute of only the first N layers of each model chunk (Megatron-Core's --recompute-method block
--recompute-num-layers N): which layers the builder reruns, what memory keeps, and the refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topologies import load_machine
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir_io import load_schedule, save_schedule
from twin.memory import layer_activation_bytes, layer_input_bytes, stage_memory
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.pipeline_split import chunk_layers
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan

MODEL = parse_model_spec("layers=8,hidden=512,heads=8,seq=128,vocab=1024")
PIPELINE = "tp=2,pp=2,vpp=2,dp=2,mbs=1,ga=4"  # four chunks of two layers; a stage holds chunks 0 and 2 or 1 and 3


def plan(text: str) -> ParallelPlan:
    p = parse_plan(text, ParallelPlan(global_batch=8))
    validate_plan(p, MODEL, p.world_size)
    return p


def recomputed_layers(p: ParallelPlan, rank: int = 0) -> dict[int, set[int]]:
    """Micro-batch -> the layers whose forward the rank's program reruns before their backward."""
    schedule = build_schedule(MODEL, p)
    program = schedule.programs[schedule.program_of()[rank]]
    out: dict[int, set[int]] = {}
    for op in program.ops:
        if op.tag is not None and op.tag.phase == "rc" and op.tag.layer is not None:
            out.setdefault(op.tag.micro_batch, set()).add(op.tag.layer)
    return out


def test_the_plan_text_and_its_default():
    p = plan(f"{PIPELINE},recompute=full,rcl=1")
    assert p.rcl == 1 and "recompute=full,rcl=1" in p.describe()
    assert parse_plan(p.describe()) == replace(p, global_batch=0)
    assert "rcl" not in plan(PIPELINE).describe()  # 0, every layer: the text full recompute always had
    assert [p.recomputes(i) for i in range(3)] == [True, False, False]
    assert all(plan(PIPELINE).recomputes(i) for i in range(3))
    assert not any(plan(f"{PIPELINE},recompute=none").recomputes(i) for i in range(3))
    for text in (f"{PIPELINE},recompute=full,rcl=1", PIPELINE, f"{PIPELINE},recompute=none"):
        p = plan(text)
        for size in range(5):  # the count memory uses, and the positions the builder asks about, agree
            assert p.recomputed_layers(size) == sum(p.recomputes(i) for i in range(size))


@pytest.mark.parametrize("text, message", [
    (f"{PIPELINE},recompute=none,rcl=1", "rcl=1 .* needs recompute=full"),
    (f"{PIPELINE},recompute=selective,rcl=1", "needs recompute=full"),
    (f"{PIPELINE},rcl=2", r"rcl=2 recomputes every layer of each model chunk \(at most 2 a chunk here\)"),
])
def test_refusals_name_the_field_and_the_fix(text, message):
    with pytest.raises(TwinError, match=message):
        plan(text)


def test_a_negative_count_is_refused_when_parsed():
    with pytest.raises(TwinError, match="rcl=-1 is out of range"):
        parse_plan("tp=2,rcl=-1")


def test_only_the_first_layers_of_each_chunk_rerun_their_forward():
    p = plan(f"{PIPELINE},recompute=full,rcl=1")
    firsts = {chunk_layers(MODEL.layers, p, 0, chunk)[0] for chunk in range(p.vpp)}
    assert firsts == {0, 4}  # stage 0 holds chunks 0 (layers 0-1) and 2 (layers 4-5)
    assert recomputed_layers(p) == {mb: firsts for mb in range(p.ga)}
    every = recomputed_layers(plan(f"{PIPELINE},recompute=full"))
    assert every == {mb: {0, 1, 4, 5} for mb in range(p.ga)}
    assert recomputed_layers(plan(f"{PIPELINE},recompute=none")) == {}


def test_without_a_pipeline_the_model_is_one_chunk():
    p = plan("gz=2,gdata=2,mbs=1,ga=2,recompute=full,rcl=3")
    assert recomputed_layers(p) == {0: {0, 1, 2}, 1: {0, 1, 2}}


def test_a_recomputed_layer_reruns_what_full_recompute_reruns():
    """The ops of layer 0's recompute are the same with rcl as under full recompute (same kernels, same work)."""
    def rerun(text):
        program = build_schedule(MODEL, plan(text)).programs[0]  # rank 0's
        return [(op.tag.block, op.tag.role, op.work) for op in program.ops
                if op.tag is not None and op.tag.phase == "rc" and op.tag.layer == 0 and op.tag.micro_batch == 0]
    assert rerun(f"{PIPELINE},recompute=full,rcl=1") == rerun(f"{PIPELINE},recompute=full") != []


def test_memory_keeps_inputs_of_the_recomputed_layers_and_everything_of_the_others():
    """1F1B stage 0 of 2 with 4 micro-batches holds 2 micro-batches of its 4 layers; rcl=1 of each (one chunk) keeps
    one layer's input and three layers' whole sets per micro-batch, and rebuilds one layer at a time."""
    base = "tp=2,pp=2,dp=2,mbs=1,ga=4"
    tokens = MODEL.seq
    p = plan(f"{base},recompute=full,rcl=1")
    whole, inp = layer_activation_bytes(MODEL, p, tokens), layer_input_bytes(MODEL, p, tokens)
    assert stage_memory(MODEL, p, 0).activations == pytest.approx(2 * (inp + 3 * whole) + whole)
    full, none = (stage_memory(MODEL, plan(f"{base},recompute={r}"), 0).activations for r in ("full", "none"))
    assert full == pytest.approx(2 * 4 * inp + whole) and none == pytest.approx(2 * 4 * whole)
    assert full < stage_memory(MODEL, p, 0).activations < none


def test_gathered_weights_stay_for_the_layers_that_do_not_recompute():
    """With weights sharded over gz, a layer without recompute keeps its gathered weights for its backward (as
    recompute=none does for all of them); the recomputed ones gather theirs again, one block at a time."""
    gathered = {r: stage_memory(MODEL, plan(f"gz=2,gdata=2,mbs=1,ga=2,{r}"), 0).gathered_weights
                for r in ("recompute=none", "recompute=full,rcl=3", "recompute=full")}
    block = (gathered["recompute=none"] - gathered["recompute=full"]) / (MODEL.layers - 1)
    assert gathered["recompute=full,rcl=3"] == pytest.approx(gathered["recompute=full"] + (MODEL.layers - 3) * block)


def backward_gathers(p: ParallelPlan, micro_batch: int = 0) -> dict[int, int]:
    """Layer -> the weight all-gathers over z rank 0 issues for it in its backward pass (not its recompute)."""
    program = build_schedule(MODEL, p).programs[0]
    out: dict[int, int] = {}
    for op in program.ops:
        tag = op.tag
        if (tag is not None and tag.phase == "bwd" and tag.micro_batch == micro_batch and tag.layer is not None
                and tag.role == "ag_z"):
            out[tag.layer] = out.get(tag.layer, 0) + 1
    return out


@pytest.mark.parametrize("oag", [0, 1])
def test_with_reshard_the_layers_that_do_not_recompute_gather_their_weights_again(oag):
    """FSDP's reshard frees a layer's weights after its forward: a layer whose recompute gathered them back
    (the first rcl) does not gather them again for its backward; the others gather their four linears' again,
    prefetched one linear ahead with oag (the first by the LM head's backward), as without recompute."""
    linears = len(MODEL.linear_shapes())
    p = plan(f"gz=2,gdata=2,mbs=1,ga=2,recompute=full,rcl=3,reshard=1,oag={oag}")
    assert backward_gathers(p) == {layer: linears for layer in range(3, MODEL.layers)}
    assert backward_gathers(p, micro_batch=1) == backward_gathers(p)
    # the two ends: every layer recomputes (nothing gathered again) and none does (every layer gathers again)
    assert backward_gathers(plan(f"gz=2,gdata=2,mbs=1,ga=2,recompute=full,reshard=1,oag={oag}")) == {}
    assert backward_gathers(plan(f"gz=2,gdata=2,mbs=1,ga=2,recompute=none,reshard=1,oag={oag}")) == \
        {layer: linears for layer in range(MODEL.layers)}
    # without reshard the layers that do not recompute keep the forward's gathered weights
    assert backward_gathers(plan(f"gz=2,gdata=2,mbs=1,ga=2,recompute=full,rcl=3,oag={oag}")) == {}
    # and in a pipeline of interleaved chunks, per chunk: layers 1 and 5 of stage 0's chunks (0-1, 4-5)
    p = plan(f"gz=2,pp=2,vpp=2,mbs=1,ga=4,recompute=full,rcl=1,reshard=1,oag={oag}")
    assert backward_gathers(p) == {1: linears, 5: linears}


def test_with_reshard_one_gathered_block_is_held_whichever_layers_recompute():
    """Resharded weights are freed after each forward: the gathered weights memory holds is one block (and the
    prefetched linear), with rcl as with full recompute or none."""
    held = {r: stage_memory(MODEL, plan(f"gz=2,gdata=2,mbs=1,ga=2,reshard=1,{r}"), 0).gathered_weights
            for r in ("recompute=none", "recompute=full,rcl=3", "recompute=full")}
    assert held["recompute=full,rcl=3"] == pytest.approx(held["recompute=full"]) == pytest.approx(
        held["recompute=none"])


def test_the_step_costs_what_its_recomputed_layers_cost():
    """On one machine the step grows with the layers that recompute: rcl=1 of 2 a chunk adds half of what full
    recompute adds to no recompute, to within what the pipeline's overlaps move (5%)."""
    machine = load_machine("dgx-a100")
    steps = {r: simulate_step(MODEL, plan(f"{PIPELINE},{r}"), machine, 8).step_time_s
             for r in ("recompute=none", "recompute=full,rcl=1", "recompute=full")}
    none, half, full = steps.values()
    assert none < half < full
    assert (half - none) / (full - none) == pytest.approx(0.5, abs=0.05)


def test_with_reshard_the_step_lies_between_no_recompute_and_full():
    """With reshard a layer that does not recompute pays a weight gather where it saves a forward: with weights
    sharded over z (FSDP) on one machine, rcl's step still lies between none's and full's."""
    machine = load_machine("dgx-a100")
    steps = [simulate_step(MODEL, plan(f"gz=2,gdata=2,mbs=1,ga=2,reshard=1,{r}"), machine, 4).step_time_s
             for r in ("recompute=none", "recompute=full,rcl=4", "recompute=full")]
    assert steps[0] < steps[1] < steps[2]


def test_an_exported_schedule_keeps_rcl(tmp_path):
    schedule = build_schedule(MODEL, plan(f"{PIPELINE},recompute=full,rcl=1"))
    path = tmp_path / "step.json"
    save_schedule(schedule, str(path))
    assert load_schedule(str(path)).info.plan.rcl == 1


def test_search_tries_rcl_where_it_applies_and_its_bounds_hold():
    """`twin search --rcl 0,1,2` with full recompute: each plan's bounds stay at or below its simulated step (the
    screen counts no recompute where only some layers recompute; the full bound continues from chunks of rcl + 1
    and rcl + 2 layers), and branch and bound ranks as simulating every plan does."""
    from helpers import check_search_bounds_and_ranking
    from twin.search.space import SearchSpace

    model = parse_model_spec("layers=12,hidden=512,heads=8,seq=512,vocab=4096")
    space = SearchSpace(axes=("gx", "gdata", "pp"), recompute=("none", "full"), vpp=(1, 2), rcl=(0, 1, 2, 12))
    plans, _, every = check_search_bounds_and_ranking(model, load_machine("dgx-a100"), 8, 32, space, top=5)
    assert len({p.describe() for p in plans}) == len(plans)  # rcl=12 is every layer: the rcl=0 plans, once
    assert {p.rcl for p in plans} == {0, 1, 2}
    for p in plans:
        assert p.rcl == 0 or (p.recompute == "full" and p.rcl < model.layers // (p.pp * p.vpp))
    assert "rcl 0,1,2,12" in space.describe()
    with pytest.raises(TwinError, match="--rcl must list layer counts of 0 or more"):
        SearchSpace(rcl=(-1,))


def test_search_tries_rcl_with_reshard_and_its_bounds_hold():
    """`twin search --reshard 0,1 --rcl 0,2` over FSDP-like plans: reshard=1 with full recompute only beside an rcl
    (with every layer recomputing it changes nothing: that plan is kept once, without it), every plan's bounds at
    or below its simulated step, and branch and bound ranks as simulating every plan does."""
    from helpers import check_search_bounds_and_ranking
    from twin.search.space import SearchSpace

    model = parse_model_spec("layers=6,hidden=512,heads=8,seq=512,vocab=4096")
    space = SearchSpace(axes=("gz", "gdata"), recompute=("none", "full"), reshard=(False, True), rcl=(0, 2))
    plans, _, _ = check_search_bounds_and_ranking(model, load_machine("dgx-a100"), 8, 32, space, top=5)
    assert len({p.describe() for p in plans}) == len(plans)
    sharded_full = [p for p in plans if p.reshard and p.recompute == "full"]
    assert sharded_full and all(p.rcl == 2 for p in sharded_full)
    assert any(p.reshard and p.recompute == "none" for p in plans)
    assert any(not p.reshard and p.recompute == "full" and p.rcl == 0 for p in plans)
