"""cache=N (ParallelPlan.cache): axonn's weights cache, --num-layers-for-caching-weights-in-depth-tensor-parallel-
all-gather. The first N layers keep the weights their first forward of the step gathers over Z until the optimizer
step: no later forward (another micro-batch) or recompute of theirs gathers again, the other layers' do as before;
memory holds their gathered weights; the step is no longer; the plan text carries it; the refusals."""

from __future__ import annotations

import pytest

from topologies import load_machine
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir import Collective
from twin.memory import memory_per_gpu
from twin.micro_batches import simulate_step
from twin.model import parse_model_spec
from twin.plan import parse_plan
from twin.sim.engine import simulate

from helpers import valid_plan

GPT = parse_model_spec("layers=3,hidden=512,heads=8,seq=256,vocab=1024")
PLAN = "gz=4,mbs=1,ga=2,recompute=full,axonn=1"


def gathers(text: str) -> set[tuple[int, str, int]]:
    """(micro-batch, phase, layer) of every weight all-gather over Z on rank 0."""
    program = build_schedule(GPT, valid_plan(text, GPT, 8)).programs[0].ops
    return {(op.tag.micro_batch, op.tag.phase, op.tag.layer) for op in program
            if isinstance(op.work, Collective) and op.work.kind == "all_gather" and op.tag.role == "ag_z"}


def test_a_cached_layer_gathers_only_in_the_steps_first_forward():
    uncached, cached = gathers(PLAN), gathers(PLAN + ",cache=2")
    everywhere = {(mb, phase, layer) for mb in (0, 1) for phase in ("fwd", "rc") for layer in (0, 1, 2)}
    assert uncached == everywhere
    assert cached == {(0, "fwd", 0), (0, "fwd", 1)} | {(mb, phase, 2) for mb in (0, 1) for phase in ("fwd", "rc")}


@pytest.mark.parametrize("recompute", ["none", "op"])
def test_with_reshard_a_cached_layer_is_not_gathered_again_for_its_backward(recompute):
    """reshard=1 gathers a layer's weights again before its backward (none) or its per-operator rerun (op); a cached
    layer keeps them (LinearWriter.regathers), the others gather as before."""
    llama = parse_model_spec("layers=3,hidden=512,heads=8,seq=256,vocab=1024,arch=llama")
    text = f"gz=4,mbs=1,ga=2,recompute={recompute},reshard=1,axonn=1"
    phase = "bwd" if recompute == "none" else "rc"

    def again(plan_text: str) -> set[tuple[int, int]]:
        program = build_schedule(llama, valid_plan(plan_text, llama, 8)).programs[0].ops
        return {(op.tag.micro_batch, op.tag.layer) for op in program
                if isinstance(op.work, Collective) and op.tag.role == "ag_z" and op.tag.phase == phase}

    assert again(text) == {(mb, layer) for mb in (0, 1) for layer in (0, 1, 2)}
    assert again(text + ",cache=2") == {(0, 2), (1, 2)}


def test_the_cached_layers_gathered_weights_stay_in_memory():
    """Each cached layer adds its block's weights, gathered over Z (the X-Y block, 2 bytes a parameter)."""
    base = memory_per_gpu(GPT, valid_plan(PLAN, GPT, 8))
    one, all_three = (memory_per_gpu(GPT, valid_plan(PLAN + f",cache={n}", GPT, 8)) for n in (1, 3))
    block = 2 * GPT.params_per_layer
    assert one.gathered_weights - base.gathered_weights == pytest.approx(block)
    assert all_three.gathered_weights - base.gathered_weights == pytest.approx(2 * block)  # one was held anyway
    assert (one.model_state, one.activations) == (base.model_state, base.activations)


def test_caching_shortens_the_step_and_shows_in_the_plan_text():
    machine = load_machine("frontier")
    plain, cached = (valid_plan(PLAN + extra, GPT, 8) for extra in ("", ",cache=3"))
    assert "cache=3" in cached.describe() and "cache" not in plain.describe()
    assert parse_plan(cached.describe()) == parse_plan(PLAN + ",cache=3")
    steps = [simulate(build_schedule(GPT, p), machine, full=True).step_time_s for p in (plain, cached)]
    assert steps[1] < steps[0]


def test_a_step_continued_from_short_ones_is_exact_with_a_cache():
    """Only the step's first forward gathers a cached layer, so each micro-batch after it costs the same, and a step
    continued from two short ones (twin.micro_batches) is the whole one."""
    machine = load_machine("frontier")
    plan = valid_plan("gz=4,mbs=1,ga=5,recompute=full,axonn=1,cache=2", GPT, 20)
    continued = simulate_step(GPT, plan, machine, 4).step_time_s
    assert continued == pytest.approx(simulate(build_schedule(GPT, plan), machine, full=True).step_time_s, rel=1e-9)


@pytest.mark.parametrize("text, message", [
    ("gz=4,mbs=1,ga=2,cache=1", "cache=1 keeps the weights AxoNN's code gathers over Z.*needs axonn=1 and gz > 1"),
    ("gx=4,mbs=1,ga=2,axonn=1,cache=1", "needs axonn=1 and gz > 1 \\(got axonn=1, gz=1\\)"),
    (PLAN + ",cache=4", "cache=4 exceeds the model's 3 layers; give at most 3"),
])
def test_refusals(text, message):
    with pytest.raises(TwinError, match=message):
        valid_plan(text, GPT, 8)


def test_a_negative_cache_is_refused_by_the_parser():
    with pytest.raises(TwinError, match="cache"):
        parse_plan("gz=4,axonn=1,cache=-1")
