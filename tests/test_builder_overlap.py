"""Dependencies and overlap in AxoNN's step (twin.builders.schedule, .linears): waits, prefetches and AxoNN's
switches OAR, ORS and OAG, checked through the dependency graph only (deps plus the previous op on the same
stream, closed transitively), as every backend reads it. Steps are built as in tests/test_builder.py.
"""

from __future__ import annotations

from collections import Counter

import pytest

from helpers import happens_before, op_by_name
from test_builder import GA, LAYERS, LINEARS, PLANS, build, linear_ops, shape
from twin.builders.tags import ACCUMULATE_ROLES, LINEAR_BLOCKS
from twin.ir import Collective

@pytest.mark.parametrize("plan_text", PLANS)
def test_every_collective_waits_for_the_previous_compute_op(frontier, plan_text):
    program = build(frontier, plan_text).program
    last_compute = None
    for op in program.ops:
        if op.is_comm:
            if last_compute is not None:
                assert last_compute in op.deps, op.name
        else:
            last_compute = op.id


@pytest.mark.parametrize("plan_text", PLANS)
def test_weights_are_gathered_before_use(frontier, plan_text):
    b = build(frontier, plan_text)
    if b.gz == 1:
        pytest.skip("no all-gather without Z")
    before = happens_before(b.program)
    for (mb, layer, name), got in linear_ops(b.program).items():
        for phase in ("fwd", "rc"):
            for gemm in got[f"{phase}.gemm"]:
                (ag,) = got[f"{phase}.ag_z"]
                assert ag.id in before[gemm.id], gemm.name
        if got["rc.ag_z"]:  # backward uses the weights the recompute gathered
            assert got["rc.ag_z"][0].id in before[got["bwd.dI"][0].id]


@pytest.mark.parametrize("plan_text", PLANS)
def test_forward_all_reduce_is_blocking(frontier, plan_text):
    program = build(frontier, plan_text).program
    ops = program.ops
    for op in ops:
        tag = op.tag
        if tag.block in LINEAR_BLOCKS and tag.phase in ("fwd", "rc") and tag.role in ("ar_x", "ar_y"):
            following = next(o for o in ops[op.id + 1:] if not o.is_comm)
            assert op.id in following.deps, op.name


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=2,gy=4,gz=2,gdata=1"])
@pytest.mark.parametrize("oar", [True, False])
def test_oar_overlaps_the_dw_gemm_with_the_di_all_reduce(frontier, plan_text, oar):
    b = build(frontier, plan_text, f"oar={int(oar)}")
    before = happens_before(b.program)
    for key, got in linear_ops(b.program).items():
        if key[2] == "lm_head":
            continue
        _, _, transposed = shape(key[2])
        (ar,) = got["bwd.ar_y" if transposed else "bwd.ar_x"]
        (dW,) = got["bwd.dW"]
        (dI,) = got["bwd.dI"]
        assert dI.id in before[ar.id]  # the all-reduce reduces dI
        assert (ar.id in before[dW.id]) == (not oar), key
        # either way the all-reduce is waited before the linear's backward returns (its bias gradient, the QKV
        # linear's dbias, is computed before the wait, as in LinearWithGradAccumulationAndAsyncCommunication)
        following = next(o for o in b.program.ops[dW.id + 1:] if not o.is_comm and o.tag.role != "dbias")
        assert ar.id in before[following.id]


def _last_backward_op(program, mb: int) -> int:
    """The last op of the micro-batch's backward: the last of its embedding's backward kernels."""
    return max(op.id for op in program.ops if (op.tag.micro_batch, op.tag.phase, op.tag.block) == (mb, "bwd", "embed")
               and op.tag.role not in ACCUMULATE_ROLES)


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=4,gy=1,gz=2,gdata=1", "gx=1,gy=1,gz=4,gdata=1"])
def test_ors_waits_reduce_scatters_only_after_the_backward(frontier, plan_text):
    b = build(frontier, plan_text, "ors=1")
    program = b.program
    compute = [op for op in program.ops if not op.is_comm]
    for key, got in linear_ops(program).items():
        for rs in got["bwd.rs_z"]:
            end = _last_backward_op(program, key[0])
            assert rs.id < end
            waiting = [op for op in compute if rs.id in op.deps]
            assert waiting, rs.name  # waited somewhere
            assert min(op.id for op in waiting) > end, rs.name


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=4,gy=1,gz=2,gdata=1", "gx=1,gy=1,gz=4,gdata=1"])
def test_without_ors_the_next_compute_op_waits_for_the_reduce_scatter(frontier, plan_text):
    program = build(frontier, plan_text, "ors=0").program
    for key, got in linear_ops(program).items():
        for rs in got["bwd.rs_z"]:
            following = next(o for o in program.ops[rs.id + 1:] if not o.is_comm)
            assert rs.id in following.deps, rs.name


# Regression: ProgramWriter.collective once ignored pending wait()s, so with ors=1 the data-parallel
# all-reduces (issued before the optimizer, the next compute op) did not wait for the deferred
# reduce-scatters that produce the gradient shards they reduce.
def test_data_all_reduce_waits_for_the_gradient_reduce_scatters_with_ors(frontier):
    _check_data_all_reduce_after_reduce_scatters(build(frontier, "gx=2,gy=2,gz=2,gdata=2", "ors=1").program)


def test_data_all_reduce_waits_for_the_gradient_reduce_scatters_without_ors(frontier):
    _check_data_all_reduce_after_reduce_scatters(build(frontier, "gx=2,gy=2,gz=2,gdata=2", "ors=0").program)


def _check_data_all_reduce_after_reduce_scatters(program):
    before = happens_before(program)
    last_mb = GA - 1
    scatters = [op for (mb, _, _), got in linear_ops(program).items() if mb == last_mb for op in got["bwd.rs_z"]]
    assert scatters
    for op in program.ops:
        if isinstance(op.work, Collective) and op.work.group == "data":
            missing = [rs.name for rs in scatters if rs.id not in before[op.id]]
            assert not missing, f"{op.name} may start before {missing[:3]}"


def _module_order() -> list[str]:
    return [f"L{layer}.{name}" for layer in range(LAYERS) for name, *_ in LINEARS] + ["lm_head"]


@pytest.mark.parametrize("plan_text", ["gx=2,gy=2,gz=2,gdata=2", "gx=4,gy=1,gz=2,gdata=1", "gx=1,gy=1,gz=4,gdata=1"])
@pytest.mark.parametrize("oag", [True, False])
def test_oag_prefetches_the_next_weights_one_linear_ahead(frontier, plan_text, oag):
    program = build(frontier, plan_text, f"oag={int(oag)}").program
    named = op_by_name(program)
    order = _module_order()
    for mb in range(GA):
        # forward: the chain runs through every linear, LM head included
        for cur, nxt in zip(order, order[1:]):
            gemm = named[f"mb{mb}.fwd.{cur}.gemm"].id
            ag = named[f"mb{mb}.fwd.{nxt}.ag_z"].id
            assert (ag < gemm) == oag, (cur, nxt)
        # recompute: the chain restarts in each block
        for layer in range(LAYERS):
            names = [f"L{layer}.{n}" for n, *_ in LINEARS]
            for cur, nxt in zip(names, names[1:]):
                gemm = named[f"mb{mb}.rc.{cur}.gemm"].id
                ag = named[f"mb{mb}.rc.{nxt}.ag_z"].id
                assert (ag < gemm) == oag, (cur, nxt)
            first_ag = named[f"mb{mb}.rc.{names[0]}.ag_z"].id
            previous_compute = max(op.id for op in program.ops[:first_ag] if not op.is_comm)
            # the block's first all-gather is not prefetched across the previous block's backward
            assert program.ops[previous_compute].tag.micro_batch == mb


@pytest.mark.parametrize("oag", [True, False])
def test_no_all_gather_prefetch_without_z(frontier, oag):
    program = build(frontier, "gx=8,gy=1,gz=1,gdata=2", f"oag={int(oag)}").program
    assert not [op for op in program.ops if op.tag.role == "ag_z"]


def test_overlap_switches_change_only_dependencies(frontier):
    """Same ops with and without overlap, in a different order and with different deps."""
    on = build(frontier, "gx=2,gy=2,gz=2,gdata=2").program
    off = build(frontier, "gx=2,gy=2,gz=2,gdata=2", "oar=0,ors=0,oag=0").program
    assert Counter((op.name, op.tag, op.work) for op in on.ops) == Counter((op.name, op.tag, op.work) for op in off.ops)
    assert [op.deps for op in on.ops] != [op.deps for op in off.ops]


@pytest.mark.parametrize("oag", [0, 1])
def test_resharded_weights_are_gathered_again_before_each_backward(frontier, oag):
    """FSDP's FULL_SHARD (reshard=1) without recompute: each linear's weights gathered in the forward and again
    in the backward, before its dI GEMM; with oag each backward gather is issued by the linear before it in the
    backward's order (FSDP's BACKWARD_PRE prefetch), so it waits on no compute of its own linear."""
    b = build(frontier, "gx=2,gy=2,gz=2,gdata=2", f"recompute=none,reshard=1,oag={oag}")
    before = happens_before(b.program)
    backward_gemms = [op.id for op in b.program.ops if op.tag.phase == "bwd" and op.tag.role == "dI"]
    for (mb, layer, name), got in linear_ops(b.program).items():
        (forward,), (backward,) = got["fwd.ag_z"], got["bwd.ag_z"]
        (d_input,) = got["bwd.dI"]
        assert backward.id in before[d_input.id] and forward.id in before[backward.id]
        assert not ({d_input.id, got["bwd.dW"][0].id} & before[backward.id])
        # prefetched: issued before the dI GEMM of the linear before it in the backward; the LM head, first in the
        # backward of each micro-batch, gathers its own
        prefetched = any(backward.id < g < d_input.id for g in backward_gemms)
        assert prefetched == (bool(oag) and layer is not None), (mb, layer, name)
    kept = build(frontier, "gx=2,gy=2,gz=2,gdata=2", f"recompute=full,reshard=1,oag={oag}").program
    assert kept.ops == build(frontier, "gx=2,gy=2,gz=2,gdata=2", f"recompute=full,oag={oag}").program.ops
