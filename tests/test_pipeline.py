"""Pipeline parallelism: schedule orders, the textbook step time, transfers, ZeRO, memory per stage."""

from __future__ import annotations

import dataclasses

import pytest

from topologies import load_machine
from twin.build import build_step
from twin.builders.pipeline import pipeline_order
from twin.errors import TwinError
from twin.ir import P2P, Collective, Elementwise, GroupAxis, Op, Program, Schedule, StepInfo
from twin.memory import memory_per_gpu, stage_memory
from twin.model import get_model, parse_model_spec
from twin.plan import parse_plan
from twin.plan_checks import validate_plan
from twin.sim.engine import simulate

HBM_BW = 1.6e12  # Frontier GCD HBM, bytes/s


# ---- orders ------------------------------------------------------------------


@pytest.mark.parametrize("pp,vpp,m", [(4, 1, 8), (4, 1, 2), (2, 2, 4), (4, 2, 8), (3, 3, 6)])
def test_every_stage_runs_each_pass_once_and_backward_after_forward(pp, vpp, m):
    for stage in range(pp):
        order = pipeline_order(pp, vpp, m, stage)
        forwards = [(s.micro_batch, s.chunk) for s in order if s.kind == "F"]
        backwards = [(s.micro_batch, s.chunk) for s in order if s.kind == "B"]
        expected = sorted((mb, c) for mb in range(m) for c in range(vpp))
        assert sorted(forwards) == expected and sorted(backwards) == expected
        for key in expected:
            assert order.index(dataclasses.replace(order[0], kind="F", micro_batch=key[0], chunk=key[1])) < \
                order.index(dataclasses.replace(order[0], kind="B", micro_batch=key[0], chunk=key[1]))


def test_1f1b_warm_up_holds_pp_minus_stage_micro_batches():
    pp, m = 4, 8
    for stage in range(pp):
        order = pipeline_order(pp, 1, m, stage)
        first_backward = next(i for i, s in enumerate(order) if s.kind == "B")
        assert first_backward == pp - stage  # warm-up forwards plus the first steady-state forward


# ---- the textbook step time, from a hand-made pipeline schedule -------------------


def free_comm_machine():
    """Frontier with communication free (no latency) and kernels without overhead."""
    m = load_machine("frontier")
    zero = {key: 0.0 for key in m.collectives.base_latency_s}
    tuning = dataclasses.replace(
        m.collectives, base_latency_s=zero,
        intra_hop_latency_s={k: 0.0 for k in m.collectives.intra_hop_latency_s},
        inter_hop_latency_s={k: 0.0 for k in m.collectives.inter_hop_latency_s},
    )
    device = dataclasses.replace(m.device, kernel_overhead_s=0.0, comm_compute_slowdown=0.0)
    return dataclasses.replace(m, device=device, collectives=tuning)


def hand_pipeline(pp: int, vpp: int, m: int, t_f: float, t_b: float) -> Schedule:
    """Each stage: per virtual stage a forward of t_f/vpp and a backward of t_b/vpp seconds,
    with zero-byte transfers between neighbouring virtual stages (written independently of the builder)."""
    programs = []
    last = pp * vpp - 1
    for stage in range(pp):
        ops: list[Op] = []
        last_compute = None

        def add(name, stream, work, deps=()):
            ops.append(Op(len(ops), name, stream, work, tuple(sorted(set(deps)))))
            return len(ops) - 1

        for step in pipeline_order(pp, vpp, m, stage):
            v = step.chunk * pp + stage
            tag = f"{step.kind}{step.micro_batch}c{step.chunk}"
            fwd = step.kind == "F"
            prev_v, next_v = (v - 1, v + 1) if fwd else (v + 1, v - 1)
            waits = []
            if (fwd and v > 0) or (not fwd and v < last):
                what = "act" if fwd else "grad"
                peer = prev_v % pp - stage
                deps = [last_compute] if last_compute is not None else []
                waits.append(add(f"{tag}.recv", f"p2p:recv_{what}", P2P("recv", "pp", peer, 0.0, what), deps))
            seconds = (t_f if fwd else t_b) / vpp
            last_compute = add(f"{tag}.compute", "compute", Elementwise(seconds * HBM_BW * 0.8), waits + ([last_compute] if last_compute is not None else []))
            if (fwd and v < last) or (not fwd and v > 0):
                what = "act" if fwd else "grad"
                add(f"{tag}.send", f"p2p:send_{what}", P2P("send", "pp", next_v % pp - stage, 0.0, what), [last_compute])
        programs.append(Program((stage,), tuple(ops)))
    info = StepInfo("hand", None, m, 1, 1.0, 1.0, 0.0, label=f"pp={pp}")
    return Schedule(pp, (GroupAxis("pp", (tuple(range(pp)),)),), tuple(programs), info)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 4), (8, 16)])
def test_1f1b_step_time_is_the_textbook_one_when_communication_is_free(pp, m):
    t_f, t_b = 1.0e-3, 2.0e-3
    run = simulate(hand_pipeline(pp, 1, m, t_f, t_b), free_comm_machine())
    assert run.step_time_s == pytest.approx((m + pp - 1) * (t_f + t_b), rel=1e-9)


@pytest.mark.parametrize("pp,vpp,m", [(4, 2, 8), (4, 3, 8), (2, 4, 4)])
def test_interleaving_divides_the_bubble_by_vpp(pp, vpp, m):
    t_f, t_b = 1.0e-3, 2.0e-3
    plain = simulate(hand_pipeline(pp, 1, m, t_f, t_b), free_comm_machine()).step_time_s
    interleaved = simulate(hand_pipeline(pp, vpp, m, t_f, t_b), free_comm_machine()).step_time_s
    work = m * (t_f + t_b)
    assert plain - work == pytest.approx((pp - 1) * (t_f + t_b), rel=1e-9)
    assert interleaved - work == pytest.approx((pp - 1) * (t_f + t_b) / vpp, rel=1e-9)


# ---- the builder's transfers and ZeRO collectives ------------------------------------------

SPEC = "layers=8,hidden=512,heads=8,seq=128,vocab=1024"


def built(plan_text: str, gpus: int, batch: int = 64):
    model = parse_model_spec(SPEC)
    plan = parse_plan(f"{plan_text},global_batch={batch}")
    return model, build_step(model, plan, load_machine("frontier"), gpus)


PIPELINES = [("tp=2,pp=4,dp=1,mbs=2", 8), ("tp=4,pp=2,dp=2,mbs=1,sp=1", 16), ("tp=2,pp=2,dp=2,vpp=2,mbs=1", 8),
             ("tp=1,pp=4,dp=2,mbs=2", 8), ("tp=2,pp=4,dp=1,mbs=2,p2p=full", 8)]


def _cut(plan) -> int:
    """How many ways a transfer's s x b x h values are cut: over tp by sequence parallelism or, unless p2p=full,
    by Megatron's scatter-gather."""
    return plan.gx if plan.sp or plan.p2p == "split" else 1


@pytest.mark.parametrize("plan_text,gpus", PIPELINES)
def test_pipeline_transfers_carry_one_tensor_parallel_ranks_slice_of_s_b_h_bf16_values(plan_text, gpus):
    """s x b x h bf16 values cross each stage boundary, cut over the tensor-parallel ranks: by sequence
    parallelism, or else by Megatron's scatter-gather (each rank sends 1/tp of the tensor it holds whole), unless
    p2p=full (megatron.core without sequence parallelism: each sends all of it)."""
    model, step = built(plan_text, gpus)
    plan = step.plan
    expected = model.seq * plan.mbs * model.hidden * 2 / _cut(plan)
    p2p = [op.work for prog in step.schedule.programs for op in prog.ops if isinstance(op.work, P2P)]
    assert p2p and all(w.nbytes == pytest.approx(expected) for w in p2p)
    sends = sum(1 for w in p2p if w.kind == "send")
    # every virtual-stage boundary is crossed once per micro-batch forward and once backward
    boundaries = plan.pp * plan.vpp - 1
    assert sends == 2 * boundaries * plan.ga
    assert sum(1 for w in p2p if w.kind == "recv") == sends


@pytest.mark.parametrize("plan_text,gpus", PIPELINES)
def test_without_sequence_parallelism_a_received_slice_is_all_gathered_before_the_compute_that_needs_it(
        plan_text, gpus):
    """Megatron's gather_split_1d_tensor: after every receive of tp > 1 ranks that each hold the whole residual
    stream, an all-gather over x of the whole s x b x h tensor, which the receive precedes and the next compute
    op waits for. With sequence parallelism, one rank per stage or p2p=full, the receive alone."""
    model, step = built(plan_text, gpus)
    plan = step.plan
    split = _cut(plan) > 1 and not plan.sp
    gathers = 0
    for prog in step.schedule.programs:
        ops = prog.ops
        for op in ops:
            if not (isinstance(op.work, P2P) and op.work.kind == "recv"):
                continue
            after = [o for o in ops if op.id in o.deps]
            gather = [o for o in after if isinstance(o.work, Collective) and o.work.kind == "all_gather"]
            if split:
                assert len(gather) == 1 and gather[0].work.group == "x"
                assert gather[0].work.nbytes == pytest.approx(model.seq * plan.mbs * model.hidden * 2)
                assert any(gather[0].id in o.deps and not o.work.comm for o in ops)
                gathers += 1
            else:
                assert not gather
    assert gathers == (sum(isinstance(op.work, P2P) and op.work.kind == "recv" for prog in step.schedule.programs
                           for op in prog.ops) if split else 0)


def test_pipeline_simulates_and_every_stage_finishes():
    _, step = built("tp=2,pp=4,dp=2,mbs=1", 16)
    run = simulate(step.schedule, load_machine("frontier"))
    assert run.step_time_s > 0 and len(run.timelines) == 4


def test_zero1_moves_the_bytes_of_a_reduce_scatter_and_an_all_gather():
    model, step0 = built("tp=2,pp=2,dp=4,zero=0,mbs=1", 16)
    _, step1 = built("tp=2,pp=2,dp=4,zero=1,mbs=1", 16)

    def data_ops(schedule):
        return [op.work for op in schedule.programs[0].ops if isinstance(op.work, Collective) and op.work.group == "data"]

    ar = data_ops(step0.schedule)
    zero = data_ops(step1.schedule)
    assert {w.kind for w in ar} == {"all_reduce"}
    rs = [w.nbytes for w in zero if w.kind == "reduce_scatter"]
    ag = [w.nbytes for w in zero if w.kind == "all_gather"]
    # the same buffers: a ring all-reduce is a reduce-scatter followed by an all-gather
    assert rs == ag == [w.nbytes for w in ar]
    n = step1.plan.gdata
    ring_ar = sum(2 * (n - 1) / n * w.nbytes for w in ar)
    ring_rs_ag = sum((n - 1) / n * b for b in rs + ag)
    assert ring_rs_ag == pytest.approx(ring_ar)


def test_zero3_gathers_weights_over_z_and_data_together():
    _, step = built("tp=2,pp=1,dp=4,zero=3,mbs=1", 8)
    groups = {g.name for g in step.schedule.groups}
    assert "z+data" in groups and "data" not in groups
    kinds = {op.work.kind for op in step.schedule.programs[0].ops
             if isinstance(op.work, Collective) and op.work.group == "z+data"}
    assert kinds == {"all_gather", "reduce_scatter"}


def test_tied_embedding_gradient_is_all_reduced_between_first_and_last_stage():
    _, step = built("tp=2,pp=4,dp=1,mbs=1", 8)
    tied = step.schedule.group("tied")
    assert tied.instances == ((0, 6), (1, 7))
    issued = [i for i, prog in enumerate(step.schedule.programs)
              if any(isinstance(op.work, Collective) and op.work.group == "tied" for op in prog.ops)]
    assert issued == [0, 3]


# ---- memory per stage ----------------------------------------------------------------


def test_memory_per_stage_for_175b_by_hand():
    """175B, tp=4, pp=16, dp=2, ZeRO-1, mbs=1, full recompute, 320 micro-batches (the authors' script plan)."""
    model = get_model("175B")
    plan = parse_plan("tp=4,pp=16,dp=2,zero=1,mbs=1,ga=320,recompute=full,global_batch=640")
    validate_plan(plan, model, 128)
    h, V, s = 12288, 50304, 2048
    per_layer = model.params_per_layer  # qkv, out, up, down, two layer norms, with biases: 12 h^2 + 13 h
    assert model.layers == 96 and per_layer == 12 * h * h + 13 * h
    stage0 = stage_memory(model, plan, 0)
    params0 = 6 * per_layer + V * h + s * h  # 6 layers + token and position embeddings
    assert stage0.model_state == pytest.approx((2 + 2 + 12 / 2) * params0 / 4)
    # 1F1B: stage 0 holds pp = 16 micro-batches of 6 layers' inputs (2 s h bytes each), plus one layer's working set
    tokens = s
    working = 2 * tokens * (4 * h + 4 * h / 4 + 2 * 4 * h / 4) + 2 * tokens * h
    assert stage0.activations == pytest.approx(16 * 6 * 2 * tokens * h + working)
    last = stage_memory(model, plan, 15)
    assert last.activations == pytest.approx(1 * 6 * 2 * tokens * h + working)
    assert last.logits == pytest.approx(6 * tokens * V / 4) and stage0.logits == 0
    assert memory_per_gpu(model, plan).stage == 0  # the first stage is the fullest


# ---- bad pipeline plans -----------------------------------------------------------------


@pytest.mark.parametrize("plan_text,gpus,field", [
    ("tp=4,pp=5,dp=1", 20, "layers"),                       # 48 layers / 5 stages
    ("tp=4,pp=2,vpp=5,dp=1", 8, "layers"),                   # 48 / 10
    ("tp=4,vpp=2,dp=2", 8, "vpp"),                            # interleaving without a pipeline
    ("tp=4,pp=4,vpp=2,dp=1,ga=2", 16, "multiple of pp"),     # fewer micro-batches than stages
    ("tp=2,gy=2,pp=2,sp=1,dp=1", 8, "sp=1"),                 # sequence parallelism needs gy=1
    ("tp=4,pp=2,dp=1,zero=4", 8, "zero"),
])
def test_bad_pipeline_plans_are_one_line_errors(plan_text, gpus, field):
    model = get_model("22B")
    with pytest.raises(TwinError) as err:
        validate_plan(parse_plan(f"{plan_text},global_batch=64"), model, gpus)
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["tp=2,gx=2", "gx=2,tp=2", "dp=2,gdata=4", "pp=2,pp=4"])
def test_a_degree_given_twice_is_refused(text):
    with pytest.raises(TwinError, match="twice|two names"):
        parse_plan(text)
