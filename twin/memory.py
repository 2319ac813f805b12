"""Per-GPU memory of a plan, stage by stage, and the micro-batch that fits.

Accounting (reference/algorithms.md section 6), per GPU, for the layout the
builder uses (twin.builders.schedule): the residual stream of a micro-batch is
split over gz (tokens) and gy (hidden) and replicated over gx (split over gx
too with sequence parallelism); Q, K, V, the attention output and the MLP's
4h activations are split over gx.

- Model state per local parameter (a stage's parameters / (gx gy gz)): bf16
  weight 2 B, bf16 gradient 2, fp32 master 4, two fp32 Adam moments 8 = 16 B;
  ZeRO over gdata shards the optimizer state (stage 1: 4 + 12/gdata), also the
  gradients (stage 2: 2 + 14/gdata), also the weights (stage 3: 16/gdata).
  Gradients kept in fp32 (plan.gradfp32, and plan.axonn in bf16) take 4 B where these count 2.
  Under plan.axonn the embedding's tables are not sharded over Z: the word
  table counts over gx gy, the position table whole
  (twin.builders.axonn_kernels.rank_params).
- Gathered weights: the all-gathered (gx x gy) weight blocks of one block (and
  the next linear's when oag prefetches it), plus the unreduced dW block.
  Without recompute the forward keeps every layer's gathered weights for its
  backward, as autograd does, unless the plan reshards them (plan.reshard:
  FSDP's FULL_SHARD frees them after each layer's forward and gathers them
  again for its backward).
- Activations per micro-batch of m = mbs x seq tokens, for one layer, in bf16
  (Korthikanti et al. arXiv 2205.05198, redone for this layout), with r = gx
  under sequence parallelism, else 1:
      2m (4h/(gy r) + 4h/gx + 2f/gx) + 2 m h/(gy r)   (the last term: two 1-byte dropout masks)
  which for gy = 1, gx = t, f = 4h is Korthikanti's s b h (10 + 24/t), and
  with sp s b h 34/t; a model trained without dropout (ModelSpec.dropout)
  has no masks, nor the dropped scores below. With grouped-query attention
  k and v are kv_heads/heads of q (4h/gx becomes (2 + 2 kv_heads/heads) h/gx),
  and a SwiGLU MLP (Llama) keeps its first linear's 2f outputs and the down
  projection's f inputs (3f/gx in place of 2f/gx); in eager PyTorch
  (plan.kernels) SwiGLU's multiply also keeps silu's output (4f/gx) and SDPA
  its k and v copied out to every head (4h/gx); torch's RMSNorm module
  (plan.norm) keeps an fp32 copy of its input and its cast-down output
  (4 bytes more an element than a fused norm, for each of the two). Unfused attention
  (plan.attention) also keeps, per score element (mbs x heads/gx x seq x seq of them), the softmax output and
  the dropout output (bf16) and the dropout mask (1 byte): 5 m a s/gx bytes,
  Korthikanti's 5as/(ht) term (the same with or without sp: sp splits only
  the tokens outside attention). Flash attention never stores it (its
  backward recomputes the scores block by block).
- Recompute: none keeps every layer's whole set; selective (Korthikanti's)
  keeps all but the scores and rebuilds one layer's scores at a time in its
  backward; full keeps only each layer's input (2 m h/(gy r) bytes) and
  rebuilds one layer's whole set at a time. With flash attention selective
  has nothing to drop, so it counts as none. op (torchtitan's per-operator
  checkpointing, twin.plan) keeps each layer's input and the outputs its
  policy keeps, wq's, wv's, the attention's, w1's and w2's:
  2m (h/(gy r) + ((3 + kv_heads/heads) h + f)/gx), and rebuilds the rest of
  one layer's set at a time. Full recompute of the first
  rcl layers of each model chunk (plan.rcl) keeps those layers' inputs and
  the other layers' whole sets, and rebuilds one layer at a time; the
  gathered weights of the layers that do not recompute stay for their
  backward, as without recompute.
- A pipeline stage holds the activations of its in-flight micro-batches:
  min(pp - s, m) under 1F1B (the first stage holds the most), and
  min(2 (pp - s - 1) + (vpp - 1) pp + 1, m vpp) model chunks under interleaving.
- Logits of the LM head, on the last stage: m V/gx elements in bf16 plus an
  fp32 copy for the loss.
- Context parallelism (cp) splits every micro-batch's tokens, so each
  activation term above and the logits are divided by cp; the ring's K/V
  blocks in flight (two of 2 m h/(gx cp) bytes), and with cpcomm=allgather
  the whole sequence's gathered K and V, transient too, are left out. ZeRO shards
  over cp x gdata (plan.gradient_replicas), the ranks that hold the same
  weights.
- FP8 linears (plan.fp8): each layer weight's FP8 copies, row-wise and
  transposed (2 B per parameter of the layers' linears, sharded as the
  weights), as Transformer Engine keeps them from step to step (under
  fp8pg they are the weights: no bf16 copy, so no extra bytes); and each
  FP8 linear's input kept for its dW as the 1-byte transposed copy: in
  place of the model's dtype for the QKV's and the MLP's normed inputs,
  2h/(gy r), and the down projection's input, f/gx per token; beside it for
  the attention's output, h/gx, which the attention's backward also keeps.
- RUNTIME_RESERVE_FRACTION of HBM is not usable.

The plan's memory is its worst stage's.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.builders.axonn_kernels import rank_params
from twin.builders.eager_kernels import RMSNORM_SAVED_EXTRA_BYTES
from twin.builders.megatron_kernels import FP8_SAVED_INPUT_BYTES, FP8_WEIGHT_COPY_BYTES, fused_softmax_available
from twin.errors import TwinError
from twin.model import ModelSpec
from twin.pipeline_split import chunk_layers, stage_layers
from twin.plan import ParallelPlan, divisors, with_micro_batch
from twin.plan_checks import validate_pipeline_micro_batches

# [estimate] CUDA/HIP context, NCCL/RCCL buffers and caching-allocator
# fragmentation: PyTorch training typically cannot use the last 5-15% of HBM.
RUNTIME_RESERVE_FRACTION = 0.10

LOGIT_BYTES_PER_ELEMENT = 2 + 4
# Kept per attention-score element by unfused attention for its backward, on
# top of the softmax and dropout outputs (dtype bytes each): the dropout mask.
SCORE_MASK_BYTES = 1


def model_state_bytes_per_param(zero: int, gdata: int, grad: float = 2.0) -> float:
    """Bytes per parameter of one tensor-parallel shard, under a ZeRO stage over gdata ranks, with gradients of
    `grad` bytes (4 under plan.gradfp32, and under plan.axonn in bf16: ParallelPlan.fp32_main_grads)."""
    weight, optimizer = 2.0, 12.0
    if zero >= 1:
        optimizer /= gdata
    if zero >= 2:
        grad /= gdata
    if zero >= 3:
        weight /= gdata
    return weight + grad + optimizer


@dataclass(frozen=True)
class MemoryBreakdown:
    model_state: float
    gathered_weights: float
    activations: float
    logits: float
    stage: int = 0

    @property
    def total(self) -> float:
        return self.model_state + self.gathered_weights + self.activations + self.logits


def layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, tokens: int) -> float:
    """Saved activations of one layer for `tokens` tokens on one GPU without recompute: all its backward reads."""
    h, f, b = model.hidden, model.ffn, model.dtype_bytes
    residual = residual_split(plan)
    masks = 2 * tokens * h / residual if model.dropout else 0.0  # the two residual dropouts' 1-byte masks
    eager = plan.kernels == "eager"  # SDPA keeps k and v copied out to every head; the multiply keeps silu's output
    heads = (4 if eager else 2 + 2 * model.kv_fraction) * h  # q, k, v and the attention's output (GQA: k, v narrower)
    mlp = (3 + eager if model.gated else 2) * f  # the first linear's output (SwiGLU's gate and up) and the down's input
    linears = b * tokens * (4 * h / residual + heads / plan.gx + mlp / plan.gx) + masks
    if plan.norm == "eager":  # each of the two RMSNorms keeps an fp32 copy of its input and its cast-down output
        linears += 2 * RMSNORM_SAVED_EXTRA_BYTES * tokens * h / residual
    if plan.fp8:  # the FP8 linears' inputs kept for dW as 1-byte copies (module docstring)
        linears -= (b - FP8_SAVED_INPUT_BYTES) * tokens * (2 * h / residual + f / plan.gx)
        linears += FP8_SAVED_INPUT_BYTES * tokens * h / plan.gx  # the context's copy, beside the one attention keeps
    return linears + score_bytes(model, plan, tokens)


def score_bytes(model: ModelSpec, plan: ParallelPlan, tokens: int) -> float:
    """What unfused attention keeps of its s x s scores for one layer (Korthikanti's 5as/h term); none with flash.
    Where Megatron cannot run its fused softmax (twin.builders.megatron_kernels) torch's softmax keeps its fp32
    output for its backward in place of the fused kernel's 16-bit one."""
    if plan.attention == "flash":
        return 0.0
    local_heads = model.heads / plan.gx
    elements = tokens * model.seq * local_heads  # mbs sequences x local heads x seq x seq
    batches = round(tokens / model.seq * local_heads)
    fused = fused_softmax_available(model.seq, batches, model.dtype_bytes)
    probabilities = model.dtype_bytes if fused else 4
    dropped = model.dtype_bytes + SCORE_MASK_BYTES if model.dropout else 0  # the dropped copy and its mask
    return elements * (probabilities + dropped)


def layer_input_bytes(model: ModelSpec, plan: ParallelPlan, tokens: int) -> float:
    """A layer's input (the residual stream's share on this GPU): all full recompute keeps of a layer."""
    return model.dtype_bytes * tokens * model.hidden / residual_split(plan)


def residual_split(plan: ParallelPlan) -> int:
    """How many ways the residual stream's hidden (gy) and, with sequence parallelism, tokens (gx) are split."""
    return plan.gy * (plan.gx if plan.sp else 1)


def kept_and_rebuilt_bytes(model: ModelSpec, plan: ParallelPlan, tokens: int) -> tuple[float, float, float]:
    """(what each in-flight layer that recomputes keeps, what each other in-flight layer keeps, what one layer's
    backward rebuilds at a time), by plan.recompute."""
    working = layer_activation_bytes(model, plan, tokens)
    if plan.recompute == "op":
        kept = op_kept_bytes(model, plan, tokens)
        return 0.0, kept, max(working - kept, 0.0)
    if plan.recompute == "selective":
        scores = score_bytes(model, plan, tokens)
        return 0.0, working - scores, scores
    return layer_input_bytes(model, plan, tokens), working, working if plan.recompute == "full" else 0.0


def op_kept_bytes(model: ModelSpec, plan: ParallelPlan, tokens: int) -> float:
    """What recompute=op keeps of one layer for `tokens` tokens (module docstring): its input and the outputs of
    wq, wv (narrower with grouped-query attention), the attention kernel, w1 and w2."""
    h = model.hidden
    kept_outputs = (3 + model.kv_fraction) * h + model.ffn
    return layer_input_bytes(model, plan, tokens) + model.dtype_bytes * tokens * kept_outputs / plan.gx


def stage_params(model: ModelSpec, plan: ParallelPlan, stage: int) -> float:
    """Parameters a pipeline stage holds: its layers, the embedding on the first, and on the last the final norm and
    the LM head (GPT's tied to the embedding, so a second copy only when pp > 1; Llama's its own)."""
    params = stage_layers(model.layers, plan, stage) * model.params_per_layer
    if stage == 0:
        params += model.embedding_params
    if stage == plan.pp - 1:
        head = model.vocab * model.hidden if plan.pp > 1 or not model.tied_head else 0
        params += model.norm_params + head
    return params


def in_flight_layers(model: ModelSpec, plan: ParallelPlan, stage: int) -> tuple[int, int]:
    """Layers whose activations a stage holds at its peak, those of the forwards it runs before its first backward:
    (how many recompute, how many keep everything). Interleaved, those forwards take the stage's chunks in turn,
    pp micro-batches each (Megatron's order), so a chunk holding fewer layers (the embedding's or the loss's slot,
    pemb/ploss) counts for what it holds. Of a chunk's layers the first plan.rcl recompute (all under full
    recompute without rcl, none without recompute)."""
    micro_batches = max(plan.ga, 1)
    if plan.vpp == 1:
        forwards = [min(plan.pp - stage, micro_batches)]
    else:
        held = min(2 * (plan.pp - stage - 1) + (plan.vpp - 1) * plan.pp + 1, micro_batches * plan.vpp)
        rounds, rest = divmod(held, plan.pp * plan.vpp)
        forwards = [rounds * plan.pp + max(0, min(plan.pp, rest - chunk * plan.pp)) for chunk in range(plan.vpp)]
    recomputed = kept = 0
    for chunk, count in enumerate(forwards):
        size, again = chunk_recompute(model, plan, stage, chunk)
        recomputed += count * again
        kept += count * (size - again)
    return recomputed, kept


def chunk_recompute(model: ModelSpec, plan: ParallelPlan, stage: int, chunk: int) -> tuple[int, int]:
    """(layers, layers that recompute) of model chunk `chunk` on pipeline stage `stage`."""
    size = len(chunk_layers(model.layers, plan, stage, chunk))
    return size, plan.recomputed_layers(size)


def stage_memory(model: ModelSpec, plan: ParallelPlan, stage: int) -> MemoryBreakdown:
    b = model.dtype_bytes
    grad = 4.0 if plan.fp32_main_grads(model.dtype) else 2.0
    per_param = model_state_bytes_per_param(plan.zero, plan.gradient_replicas, grad)
    model_state = per_param * rank_params(model, plan, stage_params(model, plan, stage), with_embedding=stage == 0)
    layers = stage_layers(model.layers, plan, stage)
    if plan.fp8 and not plan.fp8pg:  # the linear weights' FP8 copies beside the bf16 ones (fp8pg: instead of them)
        model_state += FP8_WEIGHT_COPY_BYTES * layers * model.linear_weights_per_layer / plan.weight_shards

    block_params = model.params_per_layer / (plan.gx * plan.gy)
    largest_linear = max(k * n for _, k, n, _ in model.linear_shapes()) / (plan.gx * plan.gy)
    gathered = 0.0
    if plan.gathered_shards > 1:
        # the weights of the layers whose backward reads the forward's (reshard frees them, recompute gathers them
        # again), and of the one block being recomputed
        recomputing = sum(chunk_recompute(model, plan, stage, chunk)[1] for chunk in range(plan.vpp))
        held = 1 if plan.reshard else layers - recomputing + (1 if recomputing else 0)
        held = min(layers, held + plan.cache)  # axonn's cached layers keep theirs for the step (ParallelPlan.cache)
        gathered = b * block_params * held
        gathered += b * largest_linear * (1 if plan.oag else 0)  # the next linear, prefetched
    gathered += b * largest_linear  # dW before its reduction

    tokens = plan.mbs * model.seq // plan.cp  # context parallelism splits every activation's tokens
    input_only, everything, rebuilt = kept_and_rebuilt_bytes(model, plan, tokens)
    recomputed, kept = in_flight_layers(model, plan, stage)
    activations = recomputed * input_only + kept * everything + rebuilt
    logits = LOGIT_BYTES_PER_ELEMENT * tokens * model.vocab / plan.gx if stage == plan.pp - 1 else 0.0
    return MemoryBreakdown(model_state, gathered, activations, logits, stage)


def memory_per_gpu(model: ModelSpec, plan: ParallelPlan) -> MemoryBreakdown:
    """Peak memory of the fullest GPU (the worst pipeline stage); mbs and ga must be resolved."""
    if plan.mbs <= 0:
        raise ValueError("memory_per_gpu needs a resolved micro-batch size")
    if plan.ga <= 0:
        plan = with_micro_batch(plan, plan.mbs)
    return max((stage_memory(model, plan, s) for s in range(plan.pp)), key=lambda m: m.total)


def usable_bytes(hbm_bytes: float) -> float:
    return hbm_bytes * (1 - RUNTIME_RESERVE_FRACTION)


def check_fit(model: ModelSpec, plan: ParallelPlan, hbm_bytes: float, reserve: bool = True) -> MemoryBreakdown:
    """The breakdown, or a TwinError saying by how much the plan does not fit. `reserve=False` checks against
    the whole HBM: for a run that was measured, so did fit, where only the reserve estimate can be wrong."""
    mem = memory_per_gpu(model, plan)
    usable = usable_bytes(hbm_bytes) if reserve else hbm_bytes
    if mem.total > usable:
        gb = 1e9
        where = f" on pipeline stage {mem.stage}" if plan.pp > 1 else ""
        raise TwinError(
            f"plan does not fit: needs {mem.total / gb:.1f} GB per GPU{where} "
            f"(model state {mem.model_state / gb:.1f}, gathered weights {mem.gathered_weights / gb:.1f}, "
            f"activations {mem.activations / gb:.1f}, logits {mem.logits / gb:.1f}) but "
            f"{usable / gb:.1f} GB are usable, over by {(mem.total - usable) / gb:.1f} GB; "
            "raise gx*gy*gz or lower mbs"
        )
    return mem


def resolve_micro_batch(model: ModelSpec, plan: ParallelPlan, hbm_bytes: float) -> ParallelPlan:
    """Fix mbs and ga: as given, or derived.

    Without a pipeline, the largest micro-batch that fits: larger GEMMs run
    closer to peak and there are fewer latency-bound collectives, so it is what
    a user tuning by hand would pick first. With a pipeline, micro-batches of
    one sequence first (Megatron-LM's usual choice): the bubble (pp-1)/m shrinks
    with the micro-batch count; then larger ones only if needed to fit (never).
    """
    per_rank = plan.sequences_per_rank
    if plan.mbs:
        return with_micro_batch(plan, plan.mbs)
    if plan.ga:
        return with_micro_batch(plan, per_rank // plan.ga)
    candidates = list(reversed(divisors(per_rank)))
    if plan.pp > 1:
        candidates = [d for d in reversed(candidates) if plan.vpp == 1 or (per_rank // d) % plan.pp == 0]
        if not candidates:  # not even one sequence per micro-batch makes whole rounds: the plan's rule, said so
            validate_pipeline_micro_batches(plan, per_rank)
        return with_micro_batch(plan, candidates[0])
    usable = usable_bytes(hbm_bytes)
    for mbs in candidates:
        trial = with_micro_batch(plan, mbs)
        if memory_per_gpu(model, trial).total <= usable:
            return trial
    return with_micro_batch(plan, 1)  # does not fit even at mbs=1: check_fit says by how much
