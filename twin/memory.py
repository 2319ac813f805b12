"""Per-GPU memory of a 4D plan, and the micro-batch that fits.

Accounting (reference/algorithms.md section 6), per GPU, for the layout the
AxoNN builder uses (twin.builders.axonn): the residual stream of a micro-batch
is split over gz (tokens) and gy (hidden) and replicated over gx; Q, K, V, the
attention output and the MLP's 4h activations are split over gx.

- Model state, sharded over the whole gx x gy x gz grid: bf16 weight (2 B),
  fp32 master weight (4), two fp32 Adam moments (8), bf16 gradient (2):
  16 bytes per local parameter.
- Gathered weights: the all-gathered (gx x gy) weight blocks of one block (and
  the next linear's when oag prefetches it), plus the unreduced dW block.
  Without recompute the forward keeps every layer's gathered weights for its
  backward, as autograd does.
- Activations per micro-batch of m = mbs x seq tokens, for one layer, in bf16
  (Korthikanti et al. arXiv 2205.05198, redone for this layout; flash
  attention removes the 5as/h score term):
      2m (4h/gy + 4h/gx + 2f/gx) + 2 m h/gy   (the last term: two 1-byte dropout masks)
  which for gy = 1, gx = t, f = 4h is Korthikanti's s b h (10 + 24/t).
  Full recompute keeps only each layer's input (2 m h/gy bytes) plus one layer's
  working set; no recompute keeps every layer's working set.
- Logits of the LM head: m V/gx elements in bf16 plus an fp32 copy for the loss.
- RUNTIME_RESERVE_FRACTION of HBM is not usable.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from twin.errors import TwinError
from twin.model import ModelSpec
from twin.plan import ParallelPlan, with_micro_batch

# [estimate] CUDA/HIP context, NCCL/RCCL buffers and caching-allocator
# fragmentation: PyTorch training typically cannot use the last 5-15% of HBM.
RUNTIME_RESERVE_FRACTION = 0.10

MODEL_STATE_BYTES_PER_PARAM = 2 + 4 + 8 + 2
LOGIT_BYTES_PER_ELEMENT = 2 + 4


@dataclass(frozen=True)
class MemoryBreakdown:
    model_state: float
    gathered_weights: float
    activations: float
    logits: float

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def layer_activation_bytes(model: ModelSpec, plan: ParallelPlan, tokens: int) -> float:
    """Saved activations of one layer for `tokens` tokens on one GPU."""
    h, f, b = model.hidden, model.ffn, model.dtype_bytes
    return b * tokens * (4 * h / plan.gy + 4 * h / plan.gx + 2 * f / plan.gx) + 2 * tokens * h / plan.gy


def memory_per_gpu(model: ModelSpec, plan: ParallelPlan) -> MemoryBreakdown:
    """Peak memory of one GPU; `plan.mbs` must be resolved (non-zero)."""
    if plan.mbs <= 0:
        raise ValueError("memory_per_gpu needs a resolved micro-batch size")
    b = model.dtype_bytes
    model_state = MODEL_STATE_BYTES_PER_PARAM * model.params / plan.tensor_parallel_size

    block_params = model.params_per_layer / (plan.gx * plan.gy)
    largest_linear = max(k * n for _, k, n, _ in model.linear_shapes()) / (plan.gx * plan.gy)
    if plan.recompute == "none":
        gathered = b * model.layers * block_params if plan.gz > 1 else 0.0
    else:
        gathered = b * block_params if plan.gz > 1 else 0.0
    if plan.gz > 1:
        gathered += b * largest_linear * (2 if plan.oag else 1)  # in flight + prefetched
    gathered += b * largest_linear  # dW before its reduce-scatter

    tokens = plan.mbs * model.seq
    working = layer_activation_bytes(model, plan, tokens)
    if plan.recompute == "full":
        activations = model.layers * b * tokens * model.hidden / plan.gy + working
    else:
        activations = model.layers * working
    logits = LOGIT_BYTES_PER_ELEMENT * tokens * model.vocab / plan.gx
    return MemoryBreakdown(model_state, gathered, activations, logits)


def usable_bytes(hbm_bytes: float) -> float:
    return hbm_bytes * (1 - RUNTIME_RESERVE_FRACTION)


def check_fit(model: ModelSpec, plan: ParallelPlan, hbm_bytes: float) -> MemoryBreakdown:
    """The breakdown, or a TwinError saying by how much the plan does not fit."""
    mem = memory_per_gpu(model, plan)
    usable = usable_bytes(hbm_bytes)
    if mem.total > usable:
        gb = 1e9
        raise TwinError(
            f"plan does not fit: needs {mem.total / gb:.1f} GB per GPU "
            f"(model state {mem.model_state / gb:.1f}, gathered weights {mem.gathered_weights / gb:.1f}, "
            f"activations {mem.activations / gb:.1f}, logits {mem.logits / gb:.1f}) but "
            f"{usable / gb:.1f} GB are usable, over by {(mem.total - usable) / gb:.1f} GB; "
            "raise gx*gy*gz or lower mbs"
        )
    return mem


def resolve_micro_batch(model: ModelSpec, plan: ParallelPlan, hbm_bytes: float) -> ParallelPlan:
    """Fix mbs and ga: as given, or the largest micro-batch that fits in memory.

    A larger micro-batch means larger GEMMs (closer to peak) and fewer
    latency-bound collectives, so the largest that fits is what a user tuning
    by hand would pick first.
    """
    per_rank = plan.sequences_per_rank
    if plan.mbs:
        return with_micro_batch(plan, plan.mbs)
    if plan.ga:
        return with_micro_batch(plan, per_rank // plan.ga)
    candidates = [d for d in range(per_rank, 0, -1) if per_rank % d == 0]
    usable = usable_bytes(hbm_bytes)
    for mbs in candidates:
        trial = with_micro_batch(plan, mbs)
        if memory_per_gpu(model, trial).total <= usable:
            return trial
    return with_micro_batch(plan, 1)  # does not fit even at mbs=1: check_fit says by how much
