"""What a parallel plan must satisfy to run a model on a GPU count: every check `twin simulate`, the search and the
measured-run files share, each a one-line TwinError naming the item and the fix.

twin.plan holds the plan itself and its text; this module holds the rules that relate it to a model and a job
(degrees against GPUs, dimensions against the axes that split them, switches against the plan's other settings,
the batch against its micro-batches). Memory fit is separate (twin.memory.check_fit): it needs a device.
"""

from __future__ import annotations

from twin import axes, limits, pipeline_split
from twin.errors import TwinError
from twin.model import ModelSpec
from twin.plan import WORD_KEYS, ZERO_STAGES, ParallelPlan, checked_word


def _require_divides(divisor: int, value: int, what: str, fix: str) -> None:
    if value % divisor:
        raise TwinError(f"{what}: {value} is not divisible by {divisor}; {fix}")


def validate_plan(plan: ParallelPlan, model: ModelSpec, n_gpus: int) -> None:
    """Raise a one-line TwinError for every plan the 4D algorithm cannot run.

    Memory fit is checked separately (twin.memory.check_fit), since it needs a
    device.
    """
    degrees = axes.degrees_text(plan.degrees).replace(",", " x ")
    if plan.world_size != n_gpus:
        raise TwinError(
            f"--plan: {degrees} = {plan.world_size} GPUs, but --gpus is {n_gpus}; "
            "make the product of the degrees equal the GPU count"
        )
    # every path checks the batch here (flags, plan text, measured-run files, code), before any work sized by it
    limits.check_count(plan.global_batch, "--global-batch", limits.SEQUENCES)
    if plan.zero not in ZERO_STAGES:
        raise TwinError(f"--plan: zero={plan.zero} is not a ZeRO stage; use 0, 1, 2 or 3")
    for key in WORD_KEYS:  # a plan made in code has not been through parse_plan
        checked_word(key, getattr(plan, key))
    if plan.reshard and plan.gathered_shards == 1:
        raise TwinError("--plan: reshard=1 frees sharded weights after the forward, but this plan shards none; "
                        "shard them (gz > 1, or zero=3 over gdata) or leave reshard out")
    if plan.fsdp2 and plan.gathered_shards == 1:
        raise TwinError("--plan: fsdp2=1 copies gathered weights out of FSDP2's all-gather buffer, but this plan "
                        "shards none; shard them (gz > 1, or zero=3 over gdata) or leave fsdp2 out")
    if plan.axonn and (plan.pp > 1 or plan.fsdp2):
        other = f"pp={plan.pp}: Megatron-AxoNN's pipelined schedules run without AxoNN's overlaps" if plan.pp > 1 \
            else "fsdp2=1: FSDP2's gathers are another code's"
        raise TwinError(f"--plan: axonn=1 gathers weights as Megatron-AxoNN's unpipelined schedule does, but {other}; "
                        "leave axonn out or use " + ("pp=1" if plan.pp > 1 else "fsdp2=0"))
    if plan.cache and not (plan.axonn and plan.gz > 1):
        raise TwinError(f"--plan: cache={plan.cache} keeps the weights AxoNN's code gathers over Z for the step; it "
                        f"needs axonn=1 and gz > 1 (got axonn={int(plan.axonn)}, gz={plan.gz}); add them or leave "
                        "cache out")
    if plan.cache > model.layers:
        raise TwinError(f"--plan: cache={plan.cache} exceeds the model's {model.layers} layers; give at most "
                        f"{model.layers}")
    if plan.sp and plan.gy > 1:
        raise TwinError(f"--plan: sp=1 is Megatron sequence parallelism over gx and needs gy=1 (got gy={plan.gy})")
    if plan.odp and plan.zero == 3:
        raise TwinError("--plan: odp=1 overlaps the data-parallel gradient buckets and weight gathers, which ZeRO-3 "
                        "does not have (it shards the weights inside the layers); use zero=0, 1 or 2, or odp=0")
    if plan.tpo and not (plan.sp and plan.gx > 1):
        raise TwinError("--plan: tpo=1 overlaps sequence parallelism's gathers and scatters with their GEMMs; "
                        f"it needs sp=1 and gx > 1 (got sp={int(plan.sp)}, gx={plan.gx})")
    if plan.cpcomm != "p2p" and plan.cp == 1:
        raise TwinError(f"--plan: cpcomm={plan.cpcomm} says how context parallelism meets the other ranks' keys and "
                        "values; it needs cp > 1 (got cp=1); leave it out")
    if plan.fp8recipe != "current" and not plan.fp8:
        raise TwinError(f"--plan: fp8recipe={plan.fp8recipe} says how FP8 linears quantise their tensors; it needs "
                        "fp8=1; add it or leave fp8recipe out")
    if plan.fp8pg and not (plan.fp8 and plan.zero in (1, 2)):
        raise TwinError(f"--plan: fp8pg=1 keeps the linears' weights in FP8 and gathers ZeRO-1/2's updated weights "
                        f"in FP8; it needs fp8=1 and zero=1 or 2 (got fp8={int(plan.fp8)}, zero={plan.zero}); add "
                        "them or leave fp8pg out")
    if plan.dpouter and (plan.pp == 1 or plan.gdata == 1):
        raise TwinError("--plan: dpouter=1 places the data-parallel replicas outside the pipeline's stages; it needs "
                        f"pp > 1 and dp > 1 (got pp={plan.pp}, dp={plan.gdata}); leave it out")
    split = pipeline_split.split_error(model.layers, plan)
    if split:
        raise TwinError(f"--plan: {split}")
    if plan.vpp > 1 and plan.pp == 1:
        raise TwinError("--plan: vpp > 1 (interleaved 1F1B) needs pipeline parallelism; set pp > 1 or vpp=1")
    if plan.rcl:
        _check_recomputed_layers(plan, model)
    if plan.recompute == "op":
        _check_op_recompute(plan, model)
    if plan.kernels == "eager":
        _check_eager_kernels(plan, model)
    if plan.norm == "eager":
        _check_eager_norm(plan, model)
    for dimension in axes.DIMENSIONS:  # heads, kv_heads, hidden, ffn, vocab, seq: each split by the axes that say so
        for axis in axes.AXES:
            for rule in axis.divides:
                if rule.dimension == dimension:
                    words = {"axis": axis.key, "factor": rule.factor}
                    _require_divides(rule.factor * getattr(plan, axis.key), getattr(model, dimension),
                                     rule.what.format(**words), rule.fix.format(**words))
    if plan.optimizer == "flat" and plan.zero:
        raise TwinError(f"--plan: optimizer=flat is DeepSpeed's ZeRO-0 fp16 optimizer (got zero={plan.zero}); "
                        "use zero=0 or optimizer=megatron")
    if plan.cp > 1 and plan.attention != "flash":
        raise TwinError(f"--plan: cp={plan.cp} runs ring attention on the fused kernel (as Megatron-Core does); "
                        "use attention=flash or cp=1")
    zero3 = plan.zero == 3
    shards = plan.gathered_shards
    over = "gz" + ("*cp" if zero3 and plan.cp > 1 else "") + ("*gdata" if zero3 else "")
    for name, k, n, _ in model.linear_shapes() + [("lm_head", model.hidden, model.vocab, False)]:
        block = k * n // (plan.gx * plan.gy)
        _require_divides(shards, block, f"{name} weight block k*n/(gx*gy) (sharded over {over})",
                         "choose a gz that divides it")
    _require_divides(
        plan.batch_split, plan.global_batch, "--global-batch (split over gdata*gz)",
        f"use a multiple of gdata*gz = {plan.batch_split} sequences",
    )
    per_rank = plan.sequences_per_rank
    if plan.mbs and plan.ga and plan.mbs * plan.ga != per_rank:
        raise TwinError(
            f"--plan: mbs={plan.mbs} x ga={plan.ga} != {per_rank} sequences per rank "
            "(global_batch / (gdata*gz)); give only one of mbs, ga"
        )
    if plan.mbs:
        _require_divides(plan.mbs, per_rank, "sequences per rank (global_batch / (gdata*gz))", "choose mbs dividing it")
    if plan.ga:
        _require_divides(plan.ga, per_rank, "sequences per rank (global_batch / (gdata*gz))", "choose ga dividing it")
    micro_batches = plan.ga or (per_rank // plan.mbs if plan.mbs else 0)
    if micro_batches:
        validate_pipeline_micro_batches(plan, micro_batches)


def _check_recomputed_layers(plan: ParallelPlan, model: ModelSpec) -> None:
    """rcl (the first rcl layers of each model chunk recompute) needs full recompute, and fewer layers than a chunk
    holds (as many is full recompute: the plan's text for it is rcl left out). With reshard, the layers that do
    not recompute gather their weights again for their backward (twin.builders.linears)."""
    if plan.recompute != "full":
        raise TwinError(f"--plan: rcl={plan.rcl} has only the first rcl layers of each model chunk recompute in "
                        f"full; it needs recompute=full (got recompute={plan.recompute}); add it or leave rcl out")
    most = pipeline_split.most_chunk_layers(model.layers, plan)
    if plan.rcl >= most:
        raise TwinError(f"--plan: rcl={plan.rcl} recomputes every layer of each model chunk (at most {most} a chunk "
                        f"here), which is recompute=full alone; leave rcl out, or give fewer than {most}")


def _check_op_recompute(plan: ParallelPlan, model: ModelSpec) -> None:
    """recompute=op is torchtitan's per-operator checkpointing of a Llama block (twin.plan): the matrix multiplies it
    keeps and reruns are counted in a Llama block's order (without dropout, as torchtitan's Llama), with flash
    attention (whose output it keeps), without tensor parallelism (whose collectives torchtitan's policy keeps or
    reruns by kind) and without FP8 (whose quantisations it would rerun); a plan outside that is refused rather
    than guessed."""
    problems = [(model.arch != "llama", f"a Llama model (got arch={model.arch})", "use a Llama model"),
                (model.dropout, "a model trained without dropout (got dropout=1)", "use dropout=0"),
                (plan.attention != "flash", f"flash attention (got attention={plan.attention})", "use attention=flash"),
                (plan.gx * plan.gy > 1, f"no tensor parallelism inside the block (got gx={plan.gx}, gy={plan.gy})",
                 "use gx=gy=1 (FSDP: gz)"),
                (plan.fp8, "bf16 linears (got fp8=1)", "leave fp8 out")]
    _refuse_outside("recompute=op (torchtitan's per-operator checkpointing)", problems,
                    "choose recompute=full, selective or none")


def _check_eager_kernels(plan: ParallelPlan, model: ModelSpec) -> None:
    """kernels=eager counts torchtitan's Llama op by op (twin.builders.eager_kernels): a Llama layer, its attention
    through SDPA's flash kernel on whole sequences; anything else is refused rather than guessed."""
    problems = [(model.arch != "llama", f"a Llama model (got arch={model.arch})", "use a Llama model"),
                (plan.attention != "flash", f"flash attention (got attention={plan.attention})", "use attention=flash"),
                (plan.cp > 1, f"whole sequences on a rank (got cp={plan.cp})", "use cp=1")]
    _refuse_outside("kernels=eager (torchtitan's Llama in eager PyTorch)", problems, "leave kernels out (fused)")


def _check_eager_norm(plan: ParallelPlan, model: ModelSpec) -> None:
    """norm=eager counts torch's RMSNorm module op by op (twin.builders.eager_kernels): a Llama's RMSNorm, over a
    hidden that is whole on each rank (its mean is taken without a collective)."""
    problems = [(model.arch != "llama", f"a Llama model's RMSNorm (got arch={model.arch})", "use a Llama model"),
                (plan.gy > 1, f"the whole hidden on each rank (got gy={plan.gy})", "use gy=1")]
    _refuse_outside("norm=eager (torch's RMSNorm module)", problems, "leave norm out (fused)")


def _refuse_outside(what: str, problems: list[tuple[bool, str, str]], otherwise: str) -> None:
    """The first of `problems` (wrong, what the model needs, the fix) that holds, as a one-line TwinError."""
    for wrong, needs, fix in problems:
        if wrong:
            raise TwinError(f"--plan: {what} is modelled for {needs}; {fix}, or {otherwise}")


def validate_pipeline_micro_batches(plan: ParallelPlan, micro_batches: int) -> None:
    """Interleaved 1F1B needs whole rounds of pp micro-batches (Megatron-LM asserts the same)."""
    if plan.vpp > 1 and (micro_batches < plan.pp or micro_batches % plan.pp):
        raise TwinError(
            f"--plan: interleaved 1F1B (vpp={plan.vpp}) needs the micro-batch count ({micro_batches}) to be a "
            f"multiple of pp={plan.pp} and at least pp; change mbs, ga or the global batch"
        )
