"""axonn=1: the linears' weight gathers as the AxoNN paper's code runs them (twin.builders.axonn_kernels): the first
forward's gathers block (none prefetched), each followed by the list all-gather's copies (one kernel a shard) and the
concatenation; the recompute prefetches as before; with oag=0 its gathers are copied too; its gradients reduced over
the data replicas in fp32 (bf16 models), over Z in bf16; without sharded weights only that changes; the step takes
longer; the refusals; twin validate's AxoNN plans hold it. Also the IR's
multi-kernel element-wise op it uses (Elementwise.kernels): its time, its check, its file form."""

from __future__ import annotations

from dataclasses import replace

import pytest

from topologies import load_machine
from twin import validate, validate_tasks
from twin.builders.axonn_kernels import CAT_PASSES, LIST_COPY_OUT_PASSES
from twin.builders.schedule import build_schedule
from twin.errors import TwinError
from twin.ir import Collective, Elementwise, Gemm, Op
from twin.ir_io import schedule_from_dict, schedule_to_dict
from twin.ir_values import bad_work
from twin.memory import memory_per_gpu
from twin.model import parse_model_spec
from twin.plan import ParallelPlan
from twin.search.space import AXONN_AXES, AXONN_CODE, SearchSpace
from twin.sim.compute import ComputeModel
from twin.sim.engine import simulate

from helpers import assert_switch_shows_and_slows, check_search_bounds_and_ranking, valid_plan

GPT = parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024")
COPIES = ("ag_copy", "ag_cat")


def plan(text: str) -> ParallelPlan:
    return valid_plan(text, GPT, 4)


def ops(text: str) -> list[Op]:
    return build_schedule(GPT, plan(text)).programs[0].ops


def weight_gathers(program: list[Op], phase: str) -> list[Op]:
    return [op for op in program if isinstance(op.work, Collective) and op.work.kind == "all_gather"
            and op.tag.role.startswith("ag_z") and op.tag.phase == phase]


def test_the_first_forward_gathers_each_weight_at_its_own_linear_and_copies_it_twice():
    """No gather is issued ahead of its linear: the next compute op after each is its own copy out of the list
    (one kernel per shard, read and written), then its concatenation, then its own GEMM."""
    program = ops("gz=4,mbs=1,ga=1,recompute=full,axonn=1")
    gathers = weight_gathers(program, "fwd")
    assert gathers
    for gather in gathers:
        after = [op for op in program[gather.id + 1:] if not op.work.comm][:3]
        assert [op.tag.role for op in after] == ["ag_copy", "ag_cat", "gemm"]
        assert {op.tag.block for op in after} == {gather.tag.block} and gather.id in after[0].deps
        copy, cat = after[0].work, after[1].work
        assert copy.kernels == 4 and cat.kernels == 1
        assert copy.nbytes == pytest.approx(LIST_COPY_OUT_PASSES * gather.work.nbytes)
        assert cat.nbytes == pytest.approx(CAT_PASSES * gather.work.nbytes)


def test_without_it_the_forward_prefetches_the_next_linears_weights():
    """The contrast that makes the test above mean something: under oag the forward issues a linear's gather
    before the previous linear's GEMM."""
    program = ops("gz=4,mbs=1,ga=1,recompute=full")
    gemms = [op for op in program if op.tag.phase == "fwd" and op.tag.role == "gemm"]
    own = {(op.tag.layer, op.tag.block): op.id for op in gemms}
    early = [g for g in weight_gathers(program, "fwd")
             if any(g.id < op.id < own[g.tag.layer, g.tag.block] for op in gemms)]  # another GEMM in between
    assert early and not any(op.tag.role in COPIES for op in program)


def test_the_recompute_and_backward_are_as_without_it_but_for_the_lm_heads_z_collectives():
    """The LM head is the word table, which AxoNN's code does not shard over Z (twin.builders.replicated_grads)."""
    def passes(text: str) -> list:
        return [op.tag for op in ops(text) if op.tag.phase in ("rc", "bwd")]

    def head_over_z(tag) -> bool:
        return tag.block == "lm_head" and tag.role in ("ag_z", "rs_z")

    with_code, without = passes("gz=4,mbs=1,ga=1,recompute=full,axonn=1"), passes("gz=4,mbs=1,ga=1,recompute=full")
    assert any(map(head_over_z, without)) and not any(map(head_over_z, with_code))
    assert with_code == [tag for tag in without if not head_over_z(tag)]


def test_its_weight_gathers_run_on_a_second_communicator_over_z_beside_the_reduce_scatters():
    """axonn's Gordon Bell branch (73e102b) gathers on depth_intra_layer_parallel_group_2: every weight gather over
    Z, blocking or prefetched, on its own stream, the gradients' reduce-scatters on the group's; without axonn one
    stream holds both. In a simulated step the recompute's first gather then starts while the layer before's last
    reduce-scatter still runs, where on one stream it waited for it."""
    def streams(text: str) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for op in ops(text):
            if isinstance(op.work, Collective) and op.work.group == "z":
                found.setdefault(op.tag.role, set()).add(op.stream)
        return found

    assert streams("gz=4,mbs=1,ga=1,recompute=full,axonn=1") == {"ag_z": {"comm:z.gather"}, "rs_z": {"comm:z"},
                                                                 "ar_z": {"comm:z"}}
    assert streams("gz=4,mbs=1,ga=1,recompute=full") == {"ag_z": {"comm:z"}, "rs_z": {"comm:z"}}
    machine, wide = load_machine("frontier"), parse_model_spec("layers=2,hidden=2048,heads=16,seq=512,vocab=1024")

    def overlapped(text: str) -> bool:  # Z over two Frontier nodes: the reduce-scatter outlasts the layer's backward
        run = simulate(build_schedule(wide, valid_plan(text, wide, 16)), machine)
        timeline = run.timelines[0]
        program = run.schedule.programs[timeline.program].ops
        span = {(op.tag.phase, op.tag.layer, op.tag.block, op.tag.role): (timeline.start_s[op.id],
                                                                          timeline.end_s[op.id]) for op in program}
        scatter, gather = span["bwd", 1, "qkv", "rs_z"], span["rc", 0, "qkv", "ag_z"]
        return gather[0] < scatter[1]

    assert overlapped("gz=16,mbs=1,ga=1,recompute=full,axonn=1")
    assert not overlapped("gz=16,mbs=1,ga=1,recompute=full")


def test_without_prefetching_the_recompute_gathers_are_copied_too():
    program = ops("gz=4,mbs=1,ga=1,recompute=full,oag=0,axonn=1")
    gathered = len(weight_gathers(program, "fwd")) + len(weight_gathers(program, "rc"))
    assert weight_gathers(program, "rc")
    assert len([op for op in program if op.tag.role == "ag_copy"]) == gathered
    prefetched = ops("gz=4,mbs=1,ga=1,recompute=full,axonn=1")
    assert len([op for op in prefetched if op.tag.role == "ag_copy"]) == len(weight_gathers(prefetched, "fwd"))


def test_without_sharded_weights_only_the_steps_work_changes():
    """gz = 1: the passes are the same op for op, but for the GEMMs AxoNN's tuner does not time, left untuned
    (tests/test_gemm_layouts.py); the step does the same things, its data-parallel reductions in fp32 (and the
    position table, whole on every rank under axonn, adds to the gradient buffer's work)."""
    coded, plain = ops("gx=2,gdata=2,mbs=2,ga=1,axonn=1"), ops("gx=2,gdata=2,mbs=2,ga=1")

    def untuned(work):
        return replace(work, tunable=False) if isinstance(work, Gemm) else work

    assert [untuned(op.work) for op in coded if op.tag.phase != "step"] == \
        [untuned(op.work) for op in plain if op.tag.phase != "step"]
    assert [op.tag for op in coded if op.tag.phase == "step"] == [op.tag for op in plain if op.tag.phase == "step"]
    assert {op.work.dtype for op in coded if op.tag.role == "ar_data"} == {"fp32"}


def test_the_plan_text_round_trips_and_the_step_takes_longer():
    assert_switch_shows_and_slows(GPT, "gz=4,mbs=1,ga=1,axonn=1", "axonn", "perlmutter", 4)


@pytest.mark.parametrize("text, match", [
    ("gz=2,pp=2,mbs=1,ga=2,axonn=1", r"axonn=1 .* but pp=2: Megatron-AxoNN's pipelined schedules .* use pp=1"),
    ("gz=4,mbs=1,ga=1,fsdp2=1,axonn=1", r"axonn=1 .* but fsdp2=1: .* use fsdp2=0"),
])
def test_plans_it_does_not_describe_are_refused_with_the_fix(text, match):
    with pytest.raises(TwinError, match=match):
        plan(text)


def test_twin_validates_axonns_rows_on_its_code(monkeypatch):
    """AxoNN's plans (its model's top 20) and Fig. 7's baseline search hold axonn=1."""
    assert validate.FIG7_BASELINE.fixed == AXONN_CODE == (("axonn", True),)
    seen = []

    def enumerate_space(model, gpus, batch, hbm, space):
        seen.append(space)
        raise RuntimeError("enough")

    monkeypatch.setattr(validate_tasks, "enumerate_space", enumerate_space)
    monkeypatch.setattr(validate_tasks, "_cached", lambda name, inputs, machine, compute, shape=None: compute())
    with pytest.raises(RuntimeError, match="enough"):
        validate_tasks.axonn_plan("perlmutter", "GPT-5B", 512, 8192)
    assert seen[0].fixed == AXONN_CODE


def test_a_multi_kernel_elementwise_op_pays_the_overhead_once_a_kernel():
    compute = ComputeModel(load_machine("perlmutter").device)
    one, many = (compute.duration_s(Elementwise(1e6, 0.0, k)) for k in (1, 5))
    assert many - one == pytest.approx(4 * load_machine("perlmutter").device.kernel_overhead_s)
    assert bad_work(Elementwise(1e6, 0.0, 0)) and bad_work(Elementwise(1e6, 0.0, 2)) is None


def test_its_kernel_count_is_written_only_where_it_is_not_one():
    schedule = build_schedule(GPT, plan("gz=4,mbs=1,ga=1,axonn=1"))
    d = schedule_to_dict(schedule)
    works = [o["work"] for p in d["programs"] for o in p["ops"] if o["type"] == "elementwise"]
    assert {w.get("kernels") for w in works} == {None, 4}
    assert schedule_from_dict(d).programs[0].ops == schedule.programs[0].ops


def test_the_search_bounds_its_plans_and_ranks_them_exactly():
    """AxoNN's space with its code held (what twin validate searches): every plan's bounds stay at or under its
    simulated step, the blocking gathers and copies included, and branch and bound ranks as simulating all does."""
    space = SearchSpace(axes=AXONN_AXES, fixed=AXONN_CODE)
    plans, pruned, _ = check_search_bounds_and_ranking(GPT, load_machine("frontier"), 8, 32, space, top=5)
    assert sum(p.gz > 1 for p in plans) > 5 and all(p.axonn for p in plans)
    assert all("axonn=1" in r.plan for r in pruned.ranked)


def test_its_gradients_are_reduced_over_the_data_replicas_in_fp32_and_scattered_over_z_in_bf16():
    """Megatron-LM's main_grad under --bf16 (ParallelPlan.fp32_main_grads): the data-parallel all-reduces move 4 bytes
    a parameter where the plan without axonn moves 2; the reduce-scatters over Z are unchanged; memory holds 2 bytes
    a parameter more. An fp16 model keeps its 16-bit buffer. (The layers' buckets and weights: the embedding's are
    tests/test_axonn_replicated.py's.)"""
    def reductions(text: str, model=GPT) -> tuple[list[Collective], list[Collective]]:
        program = build_schedule(model, valid_plan(text, model, 8)).programs[0].ops
        data = [op.work for op in program if isinstance(op.work, Collective) and op.tag.role == "ar_data"
                and op.tag.block == "layer"]
        scatters = [op.work for op in program if isinstance(op.work, Collective) and op.tag.role == "rs_z"
                    and op.tag.block != "lm_head"]
        return data, scatters

    (coded, coded_rs), (plain, plain_rs) = (reductions(f"gz=4,gdata=2,mbs=1,ga=1{t}") for t in (",axonn=1", ""))
    assert coded and len(coded) == len(plain) and coded_rs == plain_rs
    assert all(c.dtype == "fp32" and p.dtype == "bf16" and c.nbytes == pytest.approx(2 * p.nbytes)
               for c, p in zip(coded, plain))
    fp16 = parse_model_spec("layers=2,hidden=512,heads=8,seq=256,vocab=1024,dtype=fp16")
    assert reductions("gz=4,gdata=2,mbs=1,ga=1,axonn=1", fp16)[0] == reductions("gz=4,gdata=2,mbs=1,ga=1", fp16)[0]
    params = GPT.params_per_layer * GPT.layers / 4  # the layers' share of a rank, sharded over gz = 4
    extra = (memory_per_gpu(GPT, valid_plan("gz=4,gdata=2,mbs=1,ga=1,axonn=1", GPT, 8)).model_state
             - memory_per_gpu(GPT, valid_plan("gz=4,gdata=2,mbs=1,ga=1", GPT, 8)).model_state)
    assert extra >= 2 * params
