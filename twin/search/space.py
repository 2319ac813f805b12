"""The search space: every valid plan for a model, a GPU count and a batch.

A plan is one factorisation of G into the degrees of the searched axes
(twin.axes: by default gx gy gz gdata pp; cp when asked for; the others
stay 1), a ZeRO stage, a recompute mode, whether sharded weights are
gathered again for the backward (`reshard`, FSDP's FULL_SHARD; only where
some are sharded and some layer does not recompute, elsewhere it changes
nothing and the plan is kept once) and a micro-batch size, with AxoNN's overlap switches
and GEMM tuning on. Plans are checked exactly
as `twin simulate` checks them (twin.plan_checks.validate_plan: divisibility of
heads, hidden, ffn, vocabulary, weight blocks and batch), then pruned by
memory fit (twin.memory) before anything is simulated. Where the layers do
not split evenly over a plan's stages but do with the embedding and the loss
counted as one layer each, the plan takes that split (pemb=1, ploss=1, as
Megatron-Core and Llama 3 405B's 126 layers on 16 stages), or else with the
loss alone or the embedding alone counted (127 layers on 16: ploss=1); plans
that split evenly keep the even split.

Micro-batch ("auto"): without a pipeline the largest micro-batch that fits
(larger GEMMs run closer to peak and a micro-batch repeats every weight
all-gather, so smaller ones never win in the twin); with a pipeline every
power-of-two micro-batch that fits, since a smaller one shrinks the bubble.
A ZeRO stage only above 0 when gdata > 1 (it shards over gdata).

Megatron-Core's schedule options are searched when asked for (--vpp, --sp,
--tpo, --odp, --dpouter), each where it changes the step: interleaved chunks
where the pipeline's layers split into them (and the micro-batches are a
multiple of the stages), sequence parallelism where gx > 1 and gy = 1, its
overlapped gathers and scatters with it, the data-parallel overlap where
ZeRO 0-2 synchronises more than one replica, the ranks' order (each
pipeline on consecutive GPUs, the replicas outermost) where there are both
stages and replicas, and (--cpcomm) context parallelism's K/V all-gathered
instead of passed in a ring where cp > 1, and (--fp8) the layers' linears in
FP8 on any plan. --rcl adds full recompute of only the first N layers of
each model chunk (rcl=N) to the plans with full recompute, where N is fewer
than a chunk's layers.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace
from itertools import product

from twin import axes as axis_registry
from twin.errors import TwinError
from twin.memory import memory_per_gpu, usable_bytes
from twin.model import ModelSpec
from twin.pipeline_split import most_chunk_layers, split_error
from twin.plan import CP_COMM_KINDS, RECOMPUTE_MODES, ZERO_STAGES, ParallelPlan, divisors, with_micro_batch
from twin.plan_checks import validate_plan

AXES = axis_registry.KEYS  # every axis a search may vary
DEFAULT_AXES = axis_registry.DEFAULT_SEARCH  # what it varies unless told (cp only when asked for)
AXONN_AXES = ("gx", "gy", "gz", "gdata")
# What every plan of the AxoNN paper's runs holds: the linears' weight gathers as its code runs them
# (ParallelPlan.axonn, twin.builders.axonn_kernels); SearchSpace.fixed of twin.validate's AxoNN searches.
AXONN_CODE = (("axonn", True),)


@dataclass(frozen=True)
class SearchSpace:
    """What may vary. Defaults: the registry's default axes, ZeRO 0, full recompute (both papers' choice), micro-batch auto."""

    axes: tuple[str, ...] = DEFAULT_AXES
    min_tp: int = 1  # gx*gy*gz at least this
    max_tp: int = 0  # 0: no limit
    min_gx: int = 1
    max_gx: int = 0  # 0: no limit (AxoNN's Fig. 7 baseline: 1D tensor parallelism over a whole node, gx = 8)
    zero: tuple[int, ...] = (0,)
    recompute: tuple[str, ...] = ("full",)
    reshard: tuple[bool, ...] = (False,)  # FSDP's FULL_SHARD (True) beside SHARD_GRAD_OP / AxoNN (False)
    mbs: tuple[int, ...] = ()  # () = auto (module docstring)
    # Megatron-Core's schedule options, each tried only where it applies (module docstring)
    vpp: tuple[int, ...] = (1,)  # interleaved model chunks per pipeline rank
    sp: tuple[bool, ...] = (False,)  # sequence parallelism over gx
    tpo: tuple[bool, ...] = (False,)  # its gathers and scatters under their GEMMs
    odp: tuple[bool, ...] = (False,)  # the data-parallel synchronisation under the backward and forward
    dpouter: tuple[bool, ...] = (False,)  # ranks placed tp-cp-pp-dp (the replicas outermost), not tp-cp-dp-pp
    cpcomm: tuple[str, ...] = ("p2p",)  # context parallelism's K/V: a ring, or all-gathered (twin.plan.CP_COMM_KINDS)
    fp8: tuple[bool, ...] = (False,)  # the layers' linears in FP8 (twin.plan's fp8)
    rcl: tuple[int, ...] = (0,)  # with full recompute, the layers of each chunk that recompute (0: all; twin.plan)
    # Plan fields every candidate holds, not searched (--with: e.g. the gradients' dtype, eager kernels, FSDP2's
    # copies), as (field, value) pairs
    fixed: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        for axis in self.axes:
            if axis not in AXES:
                raise TwinError(f"--axes: unknown axis {axis!r}; use some of {', '.join(AXES)}")
        if not self.axes:
            raise TwinError("--axes is empty; give at least one of " + ", ".join(AXES))
        for z in self.zero:
            if z not in ZERO_STAGES:
                raise TwinError(f"--zero: {z} is not a ZeRO stage; use some of 0,1,2,3")
        for r in self.recompute:
            if r not in RECOMPUTE_MODES:
                raise TwinError(f"--recompute: {r!r} is unknown; use some of {', '.join(RECOMPUTE_MODES)}")
        if self.min_tp < 1:
            raise TwinError(f"--min-tp {self.min_tp} must be at least 1")
        if self.max_tp and self.max_tp < self.min_tp:
            raise TwinError(f"--max-tp {self.max_tp} is below --min-tp {self.min_tp}; raise it or drop one")
        if any(m < 1 for m in self.mbs):
            raise TwinError("--mbs values must be positive integers")
        for flag in ("reshard", "sp", "tpo", "odp", "dpouter", "fp8"):
            if not getattr(self, flag):
                raise TwinError(f"--{flag} is empty; give 0, 1 or 0,1")
        if not self.cpcomm or any(c not in CP_COMM_KINDS for c in self.cpcomm):
            raise TwinError(f"--cpcomm must list some of {', '.join(CP_COMM_KINDS)}, e.g. p2p,allgather")
        if not self.vpp or any(v < 1 for v in self.vpp):
            raise TwinError("--vpp must list positive chunk counts, e.g. 1,2,4")
        if not self.rcl or any(n < 0 for n in self.rcl):
            raise TwinError("--rcl must list layer counts of 0 or more, e.g. 0,1,2 (0: every layer recomputes)")

    def describe(self) -> str:
        tp = f"tp {self.min_tp}..{self.max_tp or 'any'}"
        if self.min_gx > 1 or self.max_gx:
            tp += f", gx {self.min_gx}..{self.max_gx or 'any'}"
        mbs = ",".join(map(str, self.mbs)) if self.mbs else "auto"
        options = "".join(f"; {flag} {','.join(str(int(v)) for v in getattr(self, flag))}"
                          for flag, default in (("reshard", (False,)), ("vpp", (1,)), ("sp", (False,)),
                                                ("tpo", (False,)), ("odp", (False,)), ("dpouter", (False,)),
                                                ("fp8", (False,)), ("rcl", (0,)))
                          if getattr(self, flag) != default)
        if self.cpcomm != ("p2p",):
            options += f"; cpcomm {','.join(self.cpcomm)}"
        if self.fixed:
            options += "; with " + fixed_words(self.fixed)
        return (f"axes {','.join(self.axes)}; {tp}; zero {','.join(map(str, self.zero))}; "
                f"recompute {','.join(self.recompute)}{options}; mbs {mbs}")


def fixed_words(fixed: tuple[tuple[str, object], ...]) -> str:
    """SearchSpace.fixed as the plan text that gives it (tune_gemm is the plan's `tune`)."""
    def word(value: object) -> str:
        return str(int(value)) if isinstance(value, bool) else str(value)

    return ",".join(f"{'tune' if field == 'tune_gemm' else field}={word(value)}" for field, value in fixed)


@dataclass(frozen=True)
class Candidate:
    """A valid plan that fits, with its memory per GPU."""

    plan: ParallelPlan
    memory_bytes: float


@dataclass(frozen=True)
class Space:
    candidates: tuple[Candidate, ...]
    factorisations: int  # degree tuples tried
    rejected: Counter  # reason -> count
    smallest_overflow_gb: float | None  # the plan closest to fitting, when none fits: GB over


def factorisations(gpus: int, axes: tuple[str, ...]) -> list[dict[str, int]]:
    """Every way to write gpus as a product of one degree per axis (axes not named are 1)."""
    out: list[dict[str, int]] = []

    def rec(i: int, left: int, chosen: dict[str, int]) -> None:
        if i == len(axes) - 1:
            out.append({**chosen, axes[i]: left})
            return
        for d in divisors(left):
            rec(i + 1, left // d, {**chosen, axes[i]: d})

    rec(0, gpus, {})
    return out


def _micro_batch_sizes(plan: ParallelPlan, space: SearchSpace) -> list[int]:
    """The micro-batch sizes the space allows for `plan`, largest first where auto; interleaved, only those that
    make the micro-batches whole rounds of the stages (a multiple of pp)."""
    per_rank = plan.sequences_per_rank
    if space.mbs:
        sizes = [m for m in space.mbs if per_rank % m == 0]
    else:  # largest first; with a pipeline, powers of two only
        sizes = [d for d in reversed(divisors(per_rank)) if plan.pp == 1 or d & (d - 1) == 0]
    if plan.vpp > 1:
        sizes = [m for m in sizes if (per_rank // m) >= plan.pp and (per_rank // m) % plan.pp == 0]
    return sizes


def _micro_batches(model: ModelSpec, plan: ParallelPlan, space: SearchSpace, usable: float) -> list[tuple[ParallelPlan, float]]:
    """(plan with mbs resolved, memory) for each micro-batch size the space allows that fits."""
    fits = []
    for mbs in _micro_batch_sizes(plan, space):
        trial = with_micro_batch(plan, mbs)
        mem = memory_per_gpu(model, trial).total
        if mem <= usable:
            fits.append((trial, mem))
            if plan.pp == 1 and not space.mbs:
                break  # auto without a pipeline: the largest that fits
    return fits


def enumerate_space(model: ModelSpec, gpus: int, global_batch: int, hbm_bytes: float, space: SearchSpace) -> Space:
    """Every valid plan that fits, and why the others were rejected."""
    if gpus <= 0:
        raise TwinError("--gpus must be a positive number of GPUs")
    if global_batch <= 0:
        raise TwinError("--batch-tokens/--global-batch must give at least one sequence")
    usable = usable_bytes(hbm_bytes)
    rejected: Counter = Counter()
    candidates: list[Candidate] = []
    overflow: float | None = None
    degrees = factorisations(gpus, space.axes)
    for deg, zero, recompute in product(degrees, space.zero, space.recompute):
        tp = deg.get("gx", 1) * deg.get("gy", 1) * deg.get("gz", 1)
        if tp < space.min_tp or (space.max_tp and tp > space.max_tp) or (space.max_gx and deg.get("gx", 1) > space.max_gx) \
                or deg.get("gx", 1) < space.min_gx:
            rejected["outside the tensor-parallel limits"] += 1
            continue
        if zero and deg.get("gdata", 1) == 1:
            rejected["ZeRO needs gdata > 1"] += 1
            continue
        plan = _split_variant(replace(ParallelPlan(**dict(space.fixed)), global_batch=global_batch, zero=zero,
                                      recompute=recompute, **deg), model)
        try:
            validate_plan(plan, model, gpus)
        except TwinError as e:
            rejected[_reason(str(e))] += 1
            continue
        variants = [v for r in _reshard_variants(plan, space) for v in _schedule_variants(r, model, space)
                    if (v.vpp, v.sp, v.tpo, v.odp, v.dpouter, v.cpcomm, v.fp8, v.rcl) == (1, False, False, False, False,
                                                                                          "p2p", False, 0)
                    or _valid(v, model, gpus)]
        if not variants:
            rejected["no schedule option applies"] += 1
            continue
        fits = [fit for variant in variants for fit in _micro_batches(model, variant, space, usable)]
        if not fits:
            rejected["does not fit in memory"] += 1
            smallest = min(memory_per_gpu(model, with_micro_batch(v, 1)).total for v in variants)
            over = (smallest - usable) / 1e9
            overflow = over if overflow is None else min(overflow, over)
            continue
        candidates += [Candidate(p, mem) for p, mem in fits]
    return Space(tuple(candidates), len(degrees), rejected, overflow)


def _split_variant(plan: ParallelPlan, model: ModelSpec) -> ParallelPlan:
    """`plan`, or, where its layers do not split evenly over its stages, the first split that does of: the embedding
    and the loss counted as one layer each (pemb=1, ploss=1: Megatron-Core's; Llama 3 405B's 126 layers on 16), the
    loss alone (the last stage also runs the LM head's GEMM), the embedding alone."""
    if plan.pp == 1 or not split_error(model.layers, plan):
        return plan
    for pemb, ploss in ((True, True), (False, True), (True, False)):
        ends = replace(plan, pemb=pemb, ploss=ploss)
        if not split_error(model.layers, ends):
            return ends
    return plan


def _valid(plan: ParallelPlan, model: ModelSpec, gpus: int) -> bool:
    try:
        validate_plan(plan, model, gpus)
    except TwinError:
        return False
    return True


def _schedule_variants(plan: ParallelPlan, model: ModelSpec, space: SearchSpace) -> list[ParallelPlan]:
    """`plan` with each asked-for chunk count, sequence parallelism, tensor- and data-parallel overlap and rank order
    that applies to it (vpp > 1 where the stages' layers split so and some micro-batch size makes whole rounds, sp
    where gx > 1 and gy = 1, tpo with sp, odp where ZeRO 0-2 synchronises more than one replica, dpouter where there
    are both stages and replicas to order, cpcomm=allgather with cp > 1, fp8 everywhere, rcl with full recompute
    and fewer than a chunk's layers), each distinct plan once."""
    chunks = [v if plan.pp > 1 and not split_error(model.layers, replace(plan, vpp=v))
              and _micro_batch_sizes(replace(plan, vpp=v), space) else 1 for v in space.vpp]
    sequence = dict.fromkeys(s and plan.gx > 1 and plan.gy == 1 for s in space.sp)
    overlap_dp = dict.fromkeys(o and plan.gradient_replicas > 1 and plan.zero in (0, 1, 2) for o in space.odp)
    order = dict.fromkeys(d and plan.pp > 1 and plan.gdata > 1 for d in space.dpouter)
    kv = dict.fromkeys(c if plan.cp > 1 else "p2p" for c in space.cpcomm)
    recomputed = {vpp: _recomputed_layer_counts(replace(plan, vpp=vpp), model, space) for vpp in chunks}
    return [replace(plan, vpp=vpp, sp=sp, tpo=tpo, odp=odp, dpouter=dpouter, cpcomm=cpcomm, fp8=fp8, rcl=rcl)
            for vpp in dict.fromkeys(chunks) for sp in sequence
            for tpo in dict.fromkeys(t and sp for t in space.tpo) for odp in overlap_dp for dpouter in order
            for cpcomm in kv for fp8 in dict.fromkeys(space.fp8) for rcl in recomputed[vpp]]


def _recomputed_layer_counts(plan: ParallelPlan, model: ModelSpec, space: SearchSpace) -> list[int]:
    """The asked-for rcl that apply to `plan`: with full recompute, 0 (every layer) and counts below a chunk's
    layers, but with reshard only the counts (where every layer recomputes, resharding changes nothing: that plan
    is the one without it); otherwise 0 alone."""
    if plan.recompute != "full":
        return [0]
    most = most_chunk_layers(model.layers, plan)
    counts = dict.fromkeys(n if n < most else 0 for n in space.rcl)
    return [n for n in counts if n] if plan.reshard else list(counts)


def _reshard_variants(plan: ParallelPlan, space: SearchSpace) -> list[ParallelPlan]:
    """`plan` with each asked-for reshard that can change it: reshard=1 only where weights are sharded and some
    layer's backward does not follow its recompute (recompute is not full, or --rcl asks for full recompute of
    only some layers: _recomputed_layer_counts keeps those), so each distinct plan once."""
    applies = plan.gathered_shards > 1 and (plan.recompute != "full" or any(space.rcl))
    return [replace(plan, reshard=r) for r in dict.fromkeys(r and applies for r in space.reshard)]


_DIVISIBILITY = re.compile(r"^(?:--)?(?:model )?(.*?)(?: k\*n/\(gx\*gy\))? \((?:LM head )?(?:split|sharded) over ([^)]+)\): ")


def _reason(message: str) -> str:
    """A validation error as a short cause that counts plans alike ("hidden not divisible by gy")."""
    m = _DIVISIBILITY.match(message)
    if m:
        return f"{m.group(1).replace('-', ' ')} not divisible by {m.group(2)}"
    if "do not split into pp x vpp" in message:
        return "layers do not split into pp x vpp equal stages"
    head = message.split(":")[0] if not message.startswith("--plan") else message.split(":")[1]
    cause = head.strip().split(" is not")[0].split(";")[0]
    # numbers become N so that plans refused alike count together; names with digits in them (fp8pg, FP8) stay
    cause = re.sub(r"(?<![A-Za-z0-9_])\d+(?![A-Za-z0-9_])", "N", cause)
    return cause if len(cause) <= _REASON_CHARS else cause[:_REASON_CHARS].rsplit(" ", 1)[0] + " ..."


_REASON_CHARS = 80  # the longest cause a "no valid plan" line quotes


def explain_empty(space_result: Space, model: ModelSpec, gpus: int, global_batch: int, hbm_gb: float) -> str:
    """One line: why no plan exists."""
    reasons = "; ".join(f"{n} plan{'s' if n != 1 else ''}: {r}" for r, n in space_result.rejected.most_common(3))
    if space_result.smallest_overflow_gb is not None and space_result.rejected["does not fit in memory"]:
        return (f"no valid plan for {model.name} on {gpus} GPUs with {global_batch} sequences: the closest plan needs "
                f"{space_result.smallest_overflow_gb:.1f} GB more than the {hbm_gb:.0f} GB per GPU allow "
                f"({reasons}); use more GPUs, more axes (--axes), ZeRO (--zero) or recompute")
    return (f"no valid plan for {model.name} on {gpus} GPUs with {global_batch} sequences ({reasons}); "
            "change the GPU count, the batch or --axes")
