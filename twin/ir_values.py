"""Checks on the values of one IR record: an op's work and tag, the step's info and its plan.

twin.ir_validate checks how a schedule hangs together (ids, dependencies,
groups, matching transfers and collective orders) and calls these for each
record. Every number a backend turns into time or memory must be finite and
>= 0, GEMM and attention dimensions below 2^31 (what BLAS and attention
kernels index with), dtypes ones the builders and executor know. A plan read
from a file is checked field by field, as `--plan` is (twin.limits), and
against the schedule it describes, so that the executor's numerics (which lay
tensors out by it) never meet a plan of another step. Each check returns the
problem as text, or None, and the caller names where it is.
"""

from __future__ import annotations

import math
from typing import Callable

from twin import axes, limits
from twin.errors import TwinError
from twin.ir import (
    COLLECTIVE_KINDS, FP8, GEMM_LAYOUTS, P2P, P2P_KINDS, PHASES, Attention, Collective, Elementwise, Gemm, OpTag,
    StepInfo, Work,
)
from twin.model import DTYPE_BYTES
from twin.plan import (ATTENTION_KINDS, CP_COMM_KINDS, FP8_RECIPES, KERNEL_KINDS, OPTIMIZER_KINDS, RECOMPUTE_MODES,
                       ZERO_STAGES, ParallelPlan)
from twin.plan import P2P_KINDS as PIPELINE_TRANSFER_KINDS

IR_DTYPES = (*DTYPE_BYTES, FP8)  # a model's dtypes, and fp8 (ParallelPlan.fp8's linears)

# GEMM and attention dimensions must fit the 32-bit integers BLAS and attention kernels index with.
MAX_DIM = (1 << 31) - 1
MAX_AMOUNT = 1e30  # FLOPs or bytes of one op or step: a zettascale step is 1e21; beyond this, ratios overflow
_PLAN_COUNTS = {**{key: limits.DEGREE for key in axes.KEYS}, "vpp": limits.DEGREE, "global_batch": limits.SEQUENCES,
                "mbs": limits.SEQUENCES, "ga": limits.SEQUENCES, "rcl": limits.RECOMPUTED_LAYERS}
_PLAN_WORDS = {"recompute": RECOMPUTE_MODES, "attention": ATTENTION_KINDS, "optimizer": OPTIMIZER_KINDS,
               "p2p": PIPELINE_TRANSFER_KINDS, "cpcomm": CP_COMM_KINDS, "fp8recipe": FP8_RECIPES,
               "kernels": KERNEL_KINDS}


def check_info(info: StepInfo, world_size: int) -> None:
    """The step's totals feed the report's throughput and memory lines: counts >= 1, amounts finite and >= 0;
    its plan, if any, is a valid plan of this schedule."""
    for name in ("global_batch", "seq"):
        if getattr(info, name) < 1:
            raise TwinError(f"schedule info.{name}={getattr(info, name)} must be at least 1: re-export the schedule")
    for name in ("flops_hardware", "flops_model", "memory_per_gpu_bytes"):
        problem = bad_size(name, getattr(info, name))
        if problem:
            raise TwinError(f"schedule info.{problem}: re-export the schedule")
    if info.plan is not None:
        problem = _bad_plan(info.plan, world_size, info.global_batch)
        if problem:
            raise TwinError(f"schedule info.plan.{problem}: re-export the schedule")


def _bad_plan(plan: ParallelPlan, world_size: int, global_batch: int) -> str | None:
    """The first field of `plan` that no builder could have written for this schedule."""
    for name, allowed in _PLAN_COUNTS.items():
        try:
            limits.check_count(getattr(plan, name), name, allowed)
        except TwinError as e:
            return str(e)
    for name, allowed in _PLAN_WORDS.items():
        if getattr(plan, name) not in allowed:
            return f"{name}={getattr(plan, name)!r} is unknown; use one of {', '.join(allowed)}"
    if plan.zero not in ZERO_STAGES:
        return f"zero={plan.zero} is not a ZeRO stage; use 0, 1, 2 or 3"
    if plan.sp and plan.gy > 1:
        return f"sp is set with gy={plan.gy}: sequence parallelism needs gy=1"
    if plan.world_size != world_size:
        return (f"{' x '.join(axes.KEYS)} = {plan.world_size} ranks, but the schedule's world_size is {world_size}: "
                "the plan must be the schedule's own")
    if plan.global_batch != global_batch:
        return f"global_batch={plan.global_batch}, but info.global_batch is {global_batch}: the plan must be the step's own"
    if plan.mbs * plan.ga * plan.batch_split != global_batch:
        return (f"mbs={plan.mbs} x ga={plan.ga} x gz={plan.gz} x gdata={plan.gdata} sequences is not the global batch "
                f"of {global_batch}")
    return None


def bad_tag(tag: OpTag) -> str | None:
    """A tag's pass is one of PHASES, its indices non-negative integers (or None), its block and role named."""
    if tag.phase not in PHASES:
        return f"tag.phase {tag.phase!r} is not a pass: use one of {', '.join(PHASES)}"
    for name in ("micro_batch", "chunk", "layer"):
        value = getattr(tag, name)
        if value is not None and not 0 <= value <= MAX_DIM:
            return f"tag.{name}={value} must be an index from 0 to 2^31 - 1, or left out"
    for name in ("block", "role"):
        if not getattr(tag, name):
            return f"tag.{name} is empty: name the op's {name}"
    return None


def bad_work(work: Work) -> str | None:
    """The problem with an op's work, or None; TypeError-free for any IR work type."""
    check = _WORK_CHECKS.get(type(work))
    if check is None:
        return f"work {type(work).__name__} is not an IR work type: use one of twin.ir.WORK_TYPES"
    return check(work)


def bad_size(name: str, value: float) -> str | None:
    if not (value >= 0 and math.isfinite(value)):
        return f"{name}={value} must be a finite number >= 0"
    if value > MAX_AMOUNT:
        return f"{name}={value:g} is beyond any step (at most {MAX_AMOUNT:g})"
    return None


def _bad_dims(kind: str, work: Work, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = getattr(work, name)
        if type(value) is not int or not 0 < value <= MAX_DIM:
            return f"{kind} {name}={value!r} must be a positive integer below 2^31"
    return None


def _bad_dtype(work: Gemm | Attention | Collective) -> str | None:
    """The element type: one the builders write (a model's dtype, or fp8 for a plan's FP8 linears and their
    gathers, which the executor refuses to run)."""
    if work.dtype not in IR_DTYPES:
        return f"unknown dtype {work.dtype!r}: use one of {', '.join(IR_DTYPES)}"
    return None


def _check_gemm(w: Gemm) -> str | None:
    if w.layout not in GEMM_LAYOUTS:
        return f"unknown GEMM layout {w.layout!r}: use one of {', '.join(GEMM_LAYOUTS)}"
    return _bad_dims("gemm", w, ("m", "n", "k", "batch")) or _bad_dtype(w)


def _check_attention(w: Attention) -> str | None:
    return _bad_dims("attention", w, ("batch", "seq", "heads", "head_dim")) or _bad_dtype(w)


def _check_elementwise(w: Elementwise) -> str | None:
    if type(w.kernels) is not int or w.kernels < 1:
        return f"kernels={w.kernels!r} must be a whole number of launches, at least 1"
    return bad_size("nbytes", w.nbytes) or bad_size("flops", w.flops)


def _check_collective(w: Collective) -> str | None:
    if w.kind not in COLLECTIVE_KINDS:
        return f"unknown collective kind {w.kind!r}: use one of {', '.join(COLLECTIVE_KINDS)}"
    return bad_size("nbytes", w.nbytes) or _bad_dtype(w)


def _check_p2p(w: P2P) -> str | None:
    if w.kind not in P2P_KINDS:
        return f"unknown p2p kind {w.kind!r}: use one of {', '.join(P2P_KINDS)}"
    if type(w.peer) is not int:
        return f"p2p peer={w.peer!r} must be an integer offset along '{w.group}'"
    return bad_size("nbytes", w.nbytes)


# One checker per work type: a new Work type registers its checker here.
_WORK_CHECKS: dict[type, Callable[..., str | None]] = {
    Gemm: _check_gemm,
    Attention: _check_attention,
    Elementwise: _check_elementwise,
    Collective: _check_collective,
    P2P: _check_p2p,
}
