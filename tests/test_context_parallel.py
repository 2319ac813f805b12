"""Context parallelism (cp=N) end to end, and the axis registry it was added through (issue 16).

The registry (twin.axes) is checked against the plan dataclass and the mesh;
cp against what it must mean: each rank holds seq/cp tokens of each
sequence, attention is a ring of cp steps whose kernels sum to the whole
causal attention, gradients are summed (and ZeRO-sharded) over cp x gdata,
activations shrink by cp, and a 32k-token sequence that does not fit
without it fits with it. The executor's numerics for cp run in
tests/test_executor_run.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from helpers import SMALL_SPEC, check_search_bounds_and_ranking
from topologies import load_machine
from twin import axes
from twin.build import build_step
from twin.errors import TwinError
from twin.ir import Attention, Collective
from twin.memory import check_fit, memory_per_gpu
from twin.mesh import gradient_axis, plan_mesh, weight_shard_axis
from twin.micro_batches import simulate_step
from twin.model import get_model, parse_model_spec
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan
from twin.search.space import DEFAULT_AXES, SearchSpace, enumerate_space

SMALL = parse_model_spec(SMALL_SPEC)  # hidden 512, heads 8, ffn 2048, vocab 1024, seq 128
FRONTIER = load_machine("frontier")


def plan(text: str, batch: int = 8) -> ParallelPlan:
    return parse_plan(text, parse_plan(f"global_batch={batch}"))


# ---- the registry -------------------------------------------------------------------------------


def test_every_axis_is_a_plan_degree_and_a_mesh_axis_in_registry_order():
    fields = {f.name: f for f in dataclasses.fields(ParallelPlan)}
    for axis in axes.AXES:
        assert fields[axis.key].default == 1, axis.key  # a degree: 1 leaves the plan as it was
    p = plan("gx=2,gy=3,gz=5,cp=7,gdata=11,pp=13")
    assert plan_mesh(p).axes == tuple((a.mesh, getattr(p, a.key)) for a in axes.AXES)
    assert p.world_size == 2 * 3 * 5 * 7 * 11 * 13
    assert p.degrees == {"gx": 2, "gy": 3, "gz": 5, "cp": 7, "gdata": 11, "pp": 13}
    assert p.batch_split == 5 * 11  # cp's ranks see other tokens of the same sequences, not other sequences


def test_describe_round_trips_and_keeps_the_text_of_plans_without_cp():
    assert plan("tp=4,pp=2,dp=2").describe().startswith("gx=4,gy=1,gz=1,gdata=2,pp=2,")
    with_cp = plan("tp=2,cp=4,dp=2,mbs=1")
    assert "gz=1,cp=4,gdata=2" in with_cp.describe()
    assert parse_plan(with_cp.describe()) == dataclasses.replace(with_cp, global_batch=0)


def test_help_and_search_space_come_from_the_registry():
    text = axes.help_text()
    assert all(axis.key in text for axis in axes.AXES) and "tp" in text and "dp" in text
    assert "cp" in axes.KEYS and "cp" not in DEFAULT_AXES  # searched only when asked for
    assert SearchSpace().axes == DEFAULT_AXES
    with pytest.raises(TwinError, match="unknown axis 'w'"):
        SearchSpace(axes=("gx", "w"))


# ---- plan and memory ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, message", [
    ("cp=3", "model seq (split into 2*cp chunks, two per rank, for causal balance): 128 is not divisible by 6"),
    ("cp=2,attention=unfused", "cp=2 runs ring attention on the fused kernel"),
    ("cp=2,gdata=2", "GPUs, but --gpus is 2"),
])
def test_bad_cp_plans_are_one_line_errors(text, message):
    p = plan(text)
    with pytest.raises(TwinError) as err:
        validate_plan(p, SMALL, 2 if "gdata" in text else p.world_size)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_cp_divides_activations_and_zero_shards_over_cp_and_data():
    one, two = (memory_per_gpu(SMALL, plan(f"gx=2,cp={cp},recompute=none,mbs=4")) for cp in (1, 2))
    assert two.activations == pytest.approx(one.activations / 2)
    assert two.logits == pytest.approx(one.logits / 2)
    assert two.model_state == one.model_state  # cp ranks hold the same weights
    z1 = memory_per_gpu(SMALL, plan("cp=2,gdata=2,zero=1,mbs=1"))
    z1_dp4 = memory_per_gpu(SMALL, plan("gdata=4,zero=1,mbs=1", batch=16))
    assert z1.model_state == pytest.approx(z1_dp4.model_state)  # optimizer state over cp x gdata = 4 ranks


def test_gradient_and_shard_axes():
    assert gradient_axis(plan("gdata=2")) == "data" and gradient_axis(plan("cp=2")) == "cp"
    assert gradient_axis(plan("cp=2,gdata=2")) == "cp+data"
    assert weight_shard_axis(plan("gz=2,cp=2,gdata=2,zero=3")) == "z+cp+data"
    assert weight_shard_axis(plan("gz=2,cp=2,gdata=2,zero=1")) == "z"


# ---- the builder's pass ------------------------------------------------------------------------


def build(text: str, batch: int = 8):
    p = plan(text, batch)
    return build_step(SMALL, p, FRONTIER, p.world_size).schedule


def test_without_cp_the_schedule_has_no_ring():
    ops = build("gx=2,gdata=2").programs[0].ops
    assert not any(op.tag.role in ("kv_shift", "dkv_shift", "out_correction") for op in ops)


@pytest.mark.parametrize("cp", [2, 4])
def test_ring_attention_steps_shifts_and_flops(cp):
    """Per layer and micro-batch: cp kernels each way, cp-1 K/V shifts per pass, cp dK/dV shifts in backward;
    the cp ranks' kernels together do the whole sequence's causal attention."""
    schedule = build(f"gx=2,cp={cp},mbs=1,recompute=none")
    ops = schedule.programs[0].ops
    layer0 = [op for op in ops if op.tag.layer == 0 and op.tag.micro_batch == 0 and op.tag.block == "attn"]
    kernels = {phase: [op.work for op in layer0 if isinstance(op.work, Attention) and op.tag.phase == phase]
               for phase in ("fwd", "bwd")}
    assert [len(kernels["fwd"]), len(kernels["bwd"])] == [cp, cp]
    roles = [op.tag.role for op in layer0]
    assert roles.count("kv_shift") == 2 * (cp - 1) and roles.count("dkv_shift") == cp
    whole = Attention(batch=1, seq=SMALL.seq, heads=SMALL.heads // 2, head_dim=SMALL.head_dim, causal=True)
    assert cp * sum(k.flops for k in kernels["fwd"]) == pytest.approx(whole.flops)
    shift = next(op.work for op in layer0 if op.tag.role == "kv_shift")
    assert (shift.kind, shift.group) == ("shift", "cp")
    assert shift.nbytes == 2 * 2 * (SMALL.seq // cp) * SMALL.hidden / 2  # K and V, bf16, local tokens and heads
    gemm = next(op.work for op in ops if op.tag.block == "qkv" and op.tag.role == "gemm")
    assert gemm.m == SMALL.seq // cp  # every linear sees the rank's share of the tokens
    assert {g.name for g in schedule.groups} == {"x", "cp"}


@pytest.mark.parametrize("cp", [2, 4])
def test_all_gathered_kv_collectives_kernels_and_flops(cp):
    """cpcomm=allgather (TE's AttnFuncWithCPAndKVAllGather): per layer and micro-batch, K and V each all-gathered
    over cp before the two local chunks' kernels in each pass (again in the backward), dK and dV each
    reduce-scattered after it, no ring; the kernels' FLOPs are the ring's (each rank's share of the causal whole)
    and every collective is waited for."""
    ring = build(f"gx=2,cp={cp},mbs=1,recompute=none").programs[0].ops
    ops = build(f"gx=2,cp={cp},mbs=1,recompute=none,cpcomm=allgather").programs[0].ops

    def attention(op_list):
        return [op for op in op_list if op.tag.layer == 0 and op.tag.micro_batch == 0 and op.tag.block == "attn"]

    layer0 = attention(ops)
    roles = [op.tag.role for op in layer0]
    assert not {"kv_shift", "dkv_shift", "out_correction"} & set(roles)
    assert [roles.count(r) for r in ("k_gather", "v_gather", "dk_scatter", "dv_scatter")] == [2, 2, 1, 1]
    gathers = [op.work for op in layer0 if op.tag.role in ("k_gather", "v_gather")]
    kv = (SMALL.seq // cp) * SMALL.hidden / 2  # this rank's K (or V): its tokens, its local heads
    assert all((w.kind, w.group, w.nbytes) == ("all_gather", "cp", 2 * cp * kv) for w in gathers)
    scatter = next(op.work for op in layer0 if op.tag.role == "dk_scatter")
    assert (scatter.kind, scatter.group, scatter.nbytes) == ("reduce_scatter", "cp", 2 * cp * kv)
    for phase in ("fwd", "bwd"):
        mine = [op.work for op in layer0 if isinstance(op.work, Attention) and op.tag.phase == phase]
        theirs = [op.work for op in attention(ring) if isinstance(op.work, Attention) and op.tag.phase == phase]
        assert len(mine) == 2 and sum(k.flops for k in mine) == pytest.approx(sum(k.flops for k in theirs))
    waited = {d for op in ops for d in op.deps}
    assert all(op.id in waited for op in layer0 if isinstance(op.work, Collective))  # each blocks what follows


def test_all_gathered_kv_simulates_and_is_refused_without_cp():
    """Both variants simulate; with few K/V heads (grouped-query attention) gathering them moves less than the
    ring; cpcomm=allgather without cp is a one-line error."""
    model = dataclasses.replace(get_model("Llama-3.1-8B"), seq=32768)
    machine = load_machine("mpt-h100-80g")
    steps = {c: simulate_step(model, plan(f"tp=8,cp=4,mbs=1,recompute=full,cpcomm={c}"), machine, 32)
             for c in ("p2p", "allgather")}
    assert steps["allgather"].time_by_class_s["all_gather"] > 0 and "shift" not in steps["allgather"].time_by_class_s
    assert all(s.step_time_s > 0 for s in steps.values())
    with pytest.raises(TwinError) as err:
        validate_plan(plan("gx=2,cpcomm=allgather"), SMALL, 2)
    assert "needs cp > 1" in str(err.value) and "\n" not in str(err.value)
    assert "cpcomm=allgather" in plan("cp=2,cpcomm=allgather").describe()
    assert "cpcomm" not in plan("cp=2").describe()
    assert parse_plan(plan("cp=2,cpcomm=allgather").describe()).cpcomm == "allgather"


def test_gradients_are_summed_over_cp_and_data():
    schedule = build("cp=2,gdata=2,mbs=1", batch=8)
    ops = schedule.programs[0].ops
    buckets = [op.work for op in ops if op.tag.role == "ar_data"]
    assert buckets and all(isinstance(w, Collective) and w.group == "cp+data" for w in buckets)
    group = next(g for g in schedule.groups if g.name == "cp+data")
    assert len(group.instances) == 1 and len(group.instances[0]) == 4


# ---- why it matters --------------------------------------------------------------------------------


def test_a_32k_token_sequence_that_does_not_fit_without_cp_fits_and_simulates_with_it():
    model = dataclasses.replace(get_model("GPT-10B"), seq=32768)
    machine = load_machine("dgx-a100")
    alone = plan("tp=8,recompute=none,mbs=1")
    with pytest.raises(TwinError, match="plan does not fit"):
        check_fit(model, dataclasses.replace(alone, ga=8), machine.device.hbm_bytes)
    with_cp = plan("tp=8,cp=2,recompute=none,mbs=1")
    summary = simulate_step(model, with_cp, machine, 16)
    assert summary.memory_per_gpu_gb * 1e9 < machine.device.hbm_bytes
    assert summary.time_by_class_s["shift"] > 0 and summary.step_time_s > 0


def test_search_over_cp_finds_plans_with_it_and_the_default_search_none():
    model = dataclasses.replace(SMALL, seq=1024)
    with_cp = enumerate_space(model, 8, 8, FRONTIER.device.hbm_bytes, SearchSpace(axes=("gx", "cp", "gdata")))
    assert any(c.plan.cp > 1 for c in with_cp.candidates)
    default = enumerate_space(model, 8, 8, FRONTIER.device.hbm_bytes, SearchSpace())
    assert all(c.plan.cp == 1 for c in default.candidates)


def test_search_tries_both_kv_exchanges_where_cp_splits_and_its_bounds_hold():
    """--cpcomm p2p,allgather: the all-gather variant appears only with cp > 1; every plan's screening and full
    bound stay below its simulated step, and branch and bound ranks as simulating every plan does."""
    model = dataclasses.replace(SMALL, seq=1024)
    space = SearchSpace(axes=("gx", "cp", "gdata"), cpcomm=("p2p", "allgather"))
    plans, _, _ = check_search_bounds_and_ranking(model, FRONTIER, 8, 8, space, top=6)
    assert len({p.describe() for p in plans}) == len(plans)
    assert all(p.cp > 1 for p in plans if p.cpcomm == "allgather") and any(p.cpcomm == "allgather" for p in plans)
    assert "cpcomm p2p,allgather" in space.describe()
    with pytest.raises(TwinError, match="--cpcomm"):
        SearchSpace(cpcomm=("ring",))
