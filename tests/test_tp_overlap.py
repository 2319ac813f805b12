"""tpo=1, Megatron-Core's tensor-parallel communication overlap (twin.builders.linears): sequence parallelism's
gathers run under their GEMMs' chunks and the row-parallel reduce-scatters under all but the first chunk; checked
through the dependency graph (tests/helpers.happens_before) and by simulation."""

from __future__ import annotations

import pytest

from helpers import happens_before
from topologies import load_machine
from twin.build import build_step
from twin.errors import TwinError
from twin.ir import Gemm
from twin.model import parse_model_spec
from twin.plan import ParallelPlan, parse_plan
from twin.plan_checks import validate_plan
from twin.micro_batches import simulate_step
from twin.sim.engine import simulate

MODEL = parse_model_spec("layers=2,hidden=1024,heads=16,seq=512,vocab=4096")
TP = 4


def build(frontier, tpo: bool):
    plan = parse_plan(f"tp={TP},sp=1,tpo={int(tpo)},dp=2,mbs=1,recompute=none", ParallelPlan(global_batch=4))
    return build_step(MODEL, plan, frontier, 2 * TP)


def layer_ops(program, phase: str, block: str) -> dict[str, object]:
    """role -> op of micro-batch 0, layer 0, one linear's pass."""
    return {op.tag.role: op for op in program.ops
            if (op.tag.micro_batch, op.tag.layer, op.tag.phase, op.tag.block) == (0, 0, phase, block)}


def overlapped_forward(frontier, block: str):
    """(the tpo step's program, its happens-before sets, role -> op of `block`'s forward in layer 0)."""
    program = build(frontier, True).schedule.programs[0]
    return program, happens_before(program), layer_ops(program, "fwd", block)


def test_tpo_needs_sequence_parallelism_and_round_trips():
    with pytest.raises(TwinError, match="tpo=1 .* needs sp=1 and gx > 1"):
        validate_plan(parse_plan("tp=4,tpo=1", ParallelPlan(global_batch=4)), MODEL, 4)
    plan = parse_plan("tp=4,sp=1,tpo=1,mbs=1", ParallelPlan(global_batch=4))
    assert parse_plan(plan.describe(), ParallelPlan(global_batch=4)) == plan and "tpo=1" in plan.describe()


@pytest.mark.parametrize("block", ["qkv", "mlp_up"])
def test_a_column_parallel_gemm_runs_its_first_chunks_under_the_gather(frontier, block):
    _, before, ops = overlapped_forward(frontier, block)
    gather, head, tail = ops["ag_x"], ops["gemm"], ops["gemm_tail"]
    assert gather.id not in before[head.id] and gather.id in before[tail.id]
    assert isinstance(head.work, Gemm) and head.work.m + tail.work.m == 512 and tail.work.m == 512 // TP


@pytest.mark.parametrize("block", ["attn_out", "mlp_down"])
def test_a_row_parallel_gemm_scatters_under_its_later_chunks(frontier, block):
    program, before, ops = overlapped_forward(frontier, block)
    first, scatter, rest = ops["gemm"], ops["rs_x"], ops["gemm_rest"]
    assert first.id in before[scatter.id] and scatter.id not in before[rest.id]
    assert first.work.m == 512 // TP and first.work.m + rest.work.m == 512
    following = next(op for op in program.ops[rest.id + 1:] if not op.is_comm)
    assert scatter.id in before[following.id]  # the residual add waits for the scattered output
    backward = layer_ops(program, "bwd", block)  # the gradient's gather under the dI GEMM's chunks
    gather = backward["ag_x"].id
    assert gather not in before[backward["dI"].id] and gather in before[backward["dI_tail"].id]


def test_tpo_moves_the_same_bytes_and_flops_and_hides_time(frontier):
    """Same bytes and FLOPs; faster where the gathers are long against the GEMMs (hidden 7168 on an H100 node), and
    slower where they are not (hidden 1024 on a DGX A100, whose cuBLAS GEMMs pay a whole tail wave): the chunks are
    smaller, less efficient GEMMs."""
    blocking, overlapped = build(frontier, False), build(frontier, True)

    def totals(program):
        flops = sum(op.work.flops for op in program.ops if isinstance(op.work, Gemm))
        comm = sum(op.work.nbytes for op in program.ops if op.is_comm)
        return flops, comm

    assert totals(overlapped.schedule.programs[0]) == pytest.approx(totals(blocking.schedule.programs[0]), rel=1e-12)
    a100 = load_machine("dgx-a100")
    assert simulate(build(a100, True).schedule, a100).step_time_s > simulate(build(a100, False).schedule,
                                                                             a100).step_time_s
    h100 = load_machine("mpt-h100-80g")
    wide = parse_model_spec("layers=2,hidden=7168,heads=56,seq=4096,vocab=8192")
    steps = []
    for tpo in (0, 1):
        plan = parse_plan(f"tp=8,sp=1,tpo={tpo},mbs=1,recompute=none", ParallelPlan(global_batch=1))
        steps.append(simulate_step(wide, plan, h100, 8))
    assert steps[1].step_time_s < 0.95 * steps[0].step_time_s
    assert steps[1].exposed_comm_s < 0.5 * steps[0].exposed_comm_s
