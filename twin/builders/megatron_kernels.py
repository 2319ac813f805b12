"""The kernels Megatron-DeepSpeed launches besides GEMMs, attention and communication, as data.

What twin.builders.schedule emits for the memory-bound work of a step (its module
docstring lists them per layer and pass): how many kernels, and how many
bytes each moves, with the file and function of microsoft/Megatron-DeepSpeed
(commit c08e2cc2) that launches it. Kept apart from the builder so that the
inventory reads as one table and the builder as the algorithm.
"""

from __future__ import annotations

# Bytes are per element of the tensor a kernel walks, reads + writes: 2 per bf16/fp16 activation, 4 per fp32
# value, 1 per dropout-mask element. Files and functions are microsoft/Megatron-DeepSpeed's at c08e2cc2.

# Layer norm: megatron/model/fused_layer_norm.py, MixedFusedLayerNorm.forward. Forward: one kernel reading x and
# writing y (the per-token mean and 1/std are fp32 scalars).
LAYERNORM_BYTES = 2 + 2
# It takes apex.contrib's persistent FastLayerNormFN for these hidden sizes (unless --no-persist-layer-norm),
# apex's FusedLayerNormAffineFunction otherwise.
PERSISTENT_LAYERNORM_HIDDEN = frozenset({
    1024, 1536, 2048, 2304, 3072, 3840, 4096, 5120, 6144, 8192, 10240, 12288, 12800, 15360, 16384, 18432, 20480,
    24576, 25600, 30720, 32768, 40960, 49152, 65536,
})
# Backward, persistent (apex/contrib/csrc/layer_norm, ln_bwd then ln_bwd_finalize): the first kernel reads x and
# dy, writes dx and per-block partial sums of dgamma and dbeta; the second reduces the partial sums.
# Apex's (csrc/layer_norm_cuda_kernel.cu, HostLayerNormGradient): cuComputePartGradGammaBeta (reads x and dy),
# cuComputeGradGammaBeta (reduces the partial sums), cuComputeGradInput (reads x and dy, writes dx).
LAYERNORM_BACKWARD_BYTES = 2 + 2 + 2  # the input-gradient kernel
LAYERNORM_PARTIAL_BYTES = 2 + 2  # apex's separate partial-sum kernel
# The partial-sum reduction, per hidden element: LAYERNORM_PARTIAL_ROWS fp32 partials of dgamma and of dbeta
# read, dgamma and dbeta written (apex's part_size is 16; the persistent kernel's ctas_per_col is similar).
LAYERNORM_PARTIAL_ROWS = 16
LAYERNORM_PARTIAL_SUM_BYTES = 2 * LAYERNORM_PARTIAL_ROWS * 4 + 2 * 2
# RMSNorm (Llama) has gamma alone: the same kernels, the partial sums of one parameter vector instead of two.
RMSNORM_PARTIAL_SUM_BYTES = LAYERNORM_PARTIAL_SUM_BYTES / 2

# Residual connections (transformer.py ParallelTransformerLayer.forward, bias_dropout_add_fused_train, TorchScript
# fused): read x and the residual, write the sum and the 1-byte mask (a bias, when fused in, is a vector).
RESIDUAL_DROPOUT_BYTES = 2 + 2 + 2 + 1
# Its backward (TorchScript's autodiff of dropout): read the gradient and the mask, write dx. The residual's
# gradient passes through without a kernel; the bias's is a reduction (BIAS_GRAD_BYTES).
DROPOUT_BACKWARD_BYTES = 2 + 1 + 2
# A model trained without dropout (ModelSpec.dropout False) adds the residual without a mask, and its backward
# passes the gradient through without a kernel; the embedding's and attention's dropouts run no kernel at all
# (ATen's dropout returns its input at p = 0).
RESIDUAL_ADD_BYTES = 2 + 2 + 2
# The residual stream feeds a layer norm and a residual add: autograd sums its two gradients (one add per layer
# norm: the layer's input, and the first residual add's output).
GRAD_ADD_BYTES = 2 + 2 + 2
# MLP (transformer.py ParallelMLP, fused_bias_gelu.py GeLUFunction): bias_gelu reads the GEMM output and writes
# GeLU(x + b); bias_gelu_back reads the saved GEMM output and the gradient and writes the gradient.
GELU_BYTES = 2 + 2
GELU_BACKWARD_BYTES = 2 + 2 + 2
# Biases (megatron/core/tensor_parallel/layers.py). Forward: the QKV linear (ColumnParallelLinear, skip_bias_add
# False) adds its bias after the GEMM in LinearWithGradAccumulationAndAsyncCommunication.forward, and so does
# ParallelMLP's dense_4h_to_h (RowParallelLinear, skip_bias_add False in Megatron-DeepSpeed; Megatron-LM passes it
# to the dropout-add instead); attention's dense and dense_h_to_4h pass theirs to the fused dropout-add and
# bias-GeLU. Backward: every bias's gradient is a reduction over tokens of its output gradient (grad_output.sum(0)
# in the linear's backward, or autograd's sum_to_size of the expanded bias), one kernel each.
BIAS_ADD_BYTES = 2 + 2
BIAS_GRAD_BYTES = 2
COPY_BYTES = 2 + 2  # a .contiguous() copy: read and write each element

# Llama-style layers (ModelSpec.arch "llama"): Megatron-DeepSpeed at c08e2cc2 has no such model, so these are
# Megatron-Core's fused kernels (megatron/core/fusions: fused_bias_swiglu.py's SwiGLUFunction, the fused rotary
# embedding) [estimate: each kernel's traffic from what it must read and write, not a kernel trace]. SwiGLU, per
# element of its output (ffn/gx per token): forward reads the gate and the up half, writes silu(gate) * up;
# backward reads both halves and the output's gradient and writes both halves' gradients. Rotary embedding on q and
# on k (Llama has no position table): read and write each element, in the forward and again in the backward.
SWIGLU_BYTES = 2 + 2 + 2
SWIGLU_BACKWARD_BYTES = 3 * 2 + 2 * 2
SWIGLU_FLOPS = 6  # sigmoid (exp, add, divide), two multiplies, the product
ROPE_BYTES = 2 + 2
ROPE_FLOPS = 3  # x cos + rotate_half(x) sin

# FP8 linears (ParallelPlan.fp8) [estimate: each kernel's traffic from what it must read and write, not a kernel
# trace]. Under current scaling (fp8recipe=current, Megatron-Core's --fp8-recipe tensorwise) a tensor is quantised
# in two kernels per element: the amax reduction reads it (2 bytes), the cast reads it again and writes the FP8 copy
# in rows (1 byte) and transposed (1 byte; Hopper's FP8 GEMMs take only the TN layout, so the wgrad and dgrad
# GEMMs read the transposed copies). Under delayed scaling (fp8recipe=delayed: the scale from earlier amaxes) the
# cast-transpose alone, taking the amax as it goes. Each linear's input (forward, and again in a recomputed
# forward), its output's gradient (backward) and, once a step, its weight. The gathers of sequence parallelism move
# the FP8 copy.
FP8_QUANTIZE_BYTES = {"current": 2 + 2 + 1 + 1, "delayed": 2 + 1 + 1}
FP8_GATHER_BYTES = 1  # per element of a sequence-parallel all-gather of a quantised tensor
# --fp8-param-gather (ParallelPlan.fp8pg): each rank quantises its shard of the linears' weights from the fp32
# master weights (current scaling: an amax pass reading 4 bytes, then the cast reading 4 and writing the 1-byte
# row-wise copy into the parameter buffer; delayed: the cast alone), and after the FP8 gather Transformer Engine
# writes each weight's transposed copy (reading 1 byte, writing 1) [estimate, as above]. Under current scaling the
# shards' amaxes are all-reduced (MAX) over the gradient group first, one fp32 per weight tensor, in one call.
FP8_MASTER_QUANTIZE_BYTES = {"current": 4 + 4 + 1, "delayed": 4 + 1}
FP8_TRANSPOSE_BYTES = 1 + 1
# Under current scaling a tensor that sequence parallelism gathers in FP8 needs one scale on every tensor-parallel
# rank: Transformer Engine all-reduces its amax (one fp32, a MAX) over the tensor-parallel group between the amax
# kernel and the cast, for a column-parallel linear's input and a row-parallel one's output gradient
# (transformer_engine/pytorch/module/linear.py: set_quantizer_amax_reduction_group, TE 2.x). Delayed scaling takes
# its scale from earlier steps and reduces nothing here.
FP8_AMAX_BYTES = 4
FP8_SAVED_INPUT_BYTES = 1  # per element of a linear's input kept for dW: its transposed FP8 copy (twin.memory)
FP8_WEIGHT_COPY_BYTES = 2  # per weight: its FP8 copy in rows and transposed, kept beside the bf16 weight (twin.memory)

# Gradient accumulation (megatron/model/distributed.py, DistributedDataParallel._make_param_hook): after each
# micro-batch's backward every parameter tensor's gradient is added into its main_grad, one kernel per tensor:
# read main_grad and the 16-bit gradient, write main_grad. main_grad is fp32 in bf16 (arguments.py forces
# accumulate_allreduce_grads_in_fp32), 16-bit in fp16. Per layer 12 tensors: 4 weights, 4 biases, 2 x 2
# layer-norm parameters.


def main_grad_bytes(dtype: str) -> int:
    """Bytes per element of Megatron's main_grad buffer (module constants above)."""
    return 2 if dtype == "fp16" else 4


def grad_accumulation_bytes(dtype: str) -> int:
    """main_grad.add_(grad) per element: read and write main_grad, read the 16-bit gradient."""
    return 2 * main_grad_bytes(dtype) + 2


# Flash attention (transformer.py ParallelAttention.forward, FlashSelfAttention.forward): q, k and v, chunks of the
# QKV output (split_tensor_along_last_dim: never contiguous), are copied by rearrange(...).contiguous(); one
# torch.arange builds cu_seqlens; the context's rearrange back is a copy only when mbs > 1. Backward: the output
# gradient is copied (reshape of a permuted tensor) when mbs > 1; the q, k, v gradients are concatenated by the
# split's backward (torch.cat: one kernel when its inputs are contiguous, mbs = 1, else one copy per input).
FLASH_COPIED = ("q", "k", "v")  # forward: each rearranged and copied; backward (mbs > 1): each gradient copied
SEQLENS_BYTES = 4  # per sequence boundary: one int32 written
# Ring attention (context parallelism, twin.builders.ring_attention), per element of the rank's attention output:
# [estimate] the out correction reads the running and the step's output and writes the running one (3 values of
# 2 bytes; the log-sum-exp, one fp32 per head and token, left out); the dK/dV sum reads two and writes one.
RING_CORRECTION_BYTES = 3 * 2
RING_ADD_BYTES = 3 * 2
# The all-gather variant (twin.builders.gathered_attention), per element of the whole sequence's dK or dV: zeroed
# (one write), each chunk's partial made contiguous (read, write) and added in (two reads, one write), 2 bytes each;
# [estimate] the partials counted as covering the whole sequence once (they overlap by one chunk).
GATHERED_DKV_BYTES = 2 + 2 * 2 + 3 * 2
# Unfused attention's kernels on the mbs x heads/gx x s x s score tensor, bytes per score element (transformer.py
# CoreAttention.forward):
SOFTMAX_BYTES = 2 + 2  # fused scale + mask + softmax: read the scores, write the probabilities
SOFTMAX_BACKWARD_BYTES = 2 + 2 + 2  # read the probabilities and their gradient, write the scores' gradient
ATTENTION_DROPOUT_BYTES = 2 + 2 + 1  # read the probabilities, write the dropped ones and the mask
ATTENTION_DROPOUT_BACKWARD_BYTES = 2 + 1 + 2  # read the gradient and the mask, write the gradient
SOFTMAX_FLOPS = 5  # per element: scale, mask, max, exp, normalise (forward); y (dy - sum y dy) (backward)
DROPOUT_FLOPS = 2  # per element: compare with the random draw, scale
# fused_softmax.py FusedScaleMaskSoftmax.is_kernel_available: the fused kernel takes 16-bit scores with
# 16 < s <= 4096, s a multiple of 4, and attn_batches = mbs x local heads a multiple of the kernel's rows per
# thread block (scaled_masked_softmax.h get_batch_per_block: 128 threads in warps of 32, one row per warp where
# s > 128, two where s <= 128: 4 or 8). Otherwise forward_torch_softmax runs, and with query-key layer scaling
# (Megatron-DeepSpeed's default: --no-query-key-layer-scaling turns it off) it softmaxes in fp32 with the layer
# number as scale: float(), * scale, masked_fill_ of the broadcast [1, 1, s, s] mask (cached, not counted),
# torch's softmax, half(); autograd runs the five backwards in reverse. Bytes per score element read + written.
FUSED_SOFTMAX_MIN_SEQ, FUSED_SOFTMAX_MAX_SEQ = 16, 4096
TORCH_SOFTMAX_FORWARD = (("softmax_to_fp32", 2 + 4, 0), ("softmax_scale", 4 + 4, 1), ("softmax_mask", 4 + 4, 1),
                         ("softmax", 4 + 4, 3), ("softmax_to_16bit", 4 + 2, 0))
TORCH_SOFTMAX_BACKWARD = (("softmax_to_16bit_bwd", 2 + 4, 0), ("softmax_bwd", 4 + 4 + 4, 3),
                          ("softmax_mask_bwd", 4 + 4, 1), ("softmax_scale_bwd", 4 + 4, 1),
                          ("softmax_to_fp32_bwd", 4 + 2, 0))
TORCH_SOFTMAX_CASTS = ("softmax_to_fp32", "softmax_to_16bit", "softmax_to_16bit_bwd", "softmax_to_fp32_bwd")


def fused_softmax_available(seq: int, attention_batches: int, dtype_bytes: int) -> bool:
    """Whether Megatron's FusedScaleMaskSoftmax runs its fused causal kernel on these scores (constants above)."""
    if dtype_bytes != 2 or not FUSED_SOFTMAX_MIN_SEQ < seq <= FUSED_SOFTMAX_MAX_SEQ or seq % 4:
        return False
    rows_per_block = 8 if seq <= 128 else 4
    return attention_batches % rows_per_block == 0


def torch_softmax_kernels(backward: bool, dtype_bytes: int) -> tuple[tuple[str, float, float], ...]:
    """forward_torch_softmax's kernels (role, bytes and flops per score element): no casts on fp32 scores."""
    kernels = TORCH_SOFTMAX_BACKWARD if backward else TORCH_SOFTMAX_FORWARD
    return tuple(k for k in kernels if dtype_bytes == 2 or k[0] not in TORCH_SOFTMAX_CASTS)


# The context's permute(2, 0, 1, 3).contiguous() is one copy of the tokens x h/gx context (COPY_BYTES); its
# backward is a view. torch.baddbmm's backward multiplies each of dQ and dK by alpha = 1/sqrt(d) (one kernel each,
# COPY_BYTES); the q, k, v gradients reach the split's backward strided, so torch.cat copies each (3 kernels).

# The loss (megatron/core/tensor_parallel/cross_entropy.py _VocabParallelCrossEntropy, gpt_model.py
# post_language_model_processing), per logit element (tokens x vocab/gx on this rank), in issue order:
LOSS_KERNELS = (  # (name, bytes, flops)
    ("cast", 2 + 4, 0),  # output.float(): bf16 logits to fp32
    ("max", 4, 1),  # torch.max(logits, dim=-1); then an all-reduce (MAX) of one fp32 per token over X
    ("sub", 4 + 4, 1),  # logits - max
    ("exp", 4 + 4, 1),  # torch.exp(out=): in place; the target logit was all-reduced (SUM) before it
    ("sum", 4, 1),  # exp.sum(dim=-1); then an all-reduce (SUM) over X
    ("div", 4 + 4, 1),  # exp.div_(sum): the softmax kept for backward
)
LOSS_BACKWARD_KERNELS = (
    ("scale", 4 + 4, 1),  # grad_input.mul_(grad_output): in place on the kept softmax (after the one-hot subtract)
    ("cast", 4 + 2, 0),  # the backward of .float(): the gradient back to bf16
)
# Per-token kernels (a few bytes per token each): the vocabulary-range masks and the target gather of the cross
# entropy (target < start, >= end, |, clone, - start, masked fill, arange, gather, clone, masked fill: 10), log and
# subtract (2); pretrain_gpt.py loss_func (the masked mean: mul, sum, mask sum, divide; its logging copy: clone,
# cat, divide by the data-parallel size: 7); schedules.py forward_step's / num_microbatches and backward_step's
# grad_scale_func (2). Backward: autograd's seed, the two scalings, the masked mean's divide and mul (5), the one-hot
# subtract (1 - mask, float, arange, index, subtract, index_put: 6).
LOSS_TOKEN_KERNELS = 21
LOSS_BACKWARD_TOKEN_KERNELS = 11
TOKEN_KERNEL_BYTES = 8  # [estimate] per token: an int64 or two fp32 read or written

# The embedding (language_model.py Embedding.forward, layers.py VocabParallelEmbedding.forward), over the tokens x
# hidden/gy embedding output: word and position lookups (F.embedding: read a row, write it), their sum, the
# [b s h] -> [s b h] transpose (a copy when mbs > 1), dropout on the residual stream's share.
EMBEDDING_LOOKUP_BYTES = 2 + 2
EMBEDDING_ADD_BYTES = 2 + 2 + 2
EMBEDDING_DROPOUT_BYTES = 2 + 2 + 1
# With gx > 1 the word table is split over the vocabulary: 6 per-token kernels build and apply the range mask
# ((input < start) | (input >= end), clone, - start, masked fill), the rows of other ranks' tokens are zeroed
# (a masked fill of the output, EMBEDDING_MASK_BYTES) and the partial embeddings are all-reduced over X.
EMBEDDING_VOCAB_TOKEN_KERNELS = 6
EMBEDDING_MASK_BYTES = 2 + 2
# Backward of each lookup (ATen's embedding_dense_backward_cuda): the output gradient is made contiguous (a copy
# when mbs > 1), the table's gradient is zeroed (2 bytes per table element), then up to
# EMBEDDING_DIRECT_MAX_INDICES tokens one kernel adds the rows in (EMBEDDING_SCATTER_BYTES per output element);
# beyond, the indices are sorted and segmented first: EMBEDDING_SORTED_KERNELS more small kernels [estimate: cub
# radix sort and ATen's segment offsets and partial sums].
EMBEDDING_DIRECT_MAX_INDICES = 3072
EMBEDDING_SORTED_KERNELS = 8
EMBEDDING_SCATTER_BYTES = 2 + 2
# With the LM head tied to the word table on one stage (pp = 1), autograd sums the table's two gradients (the
# LM head's dW and the lookup's): one add over the table, GRAD_ADD_BYTES per element.

# The step (megatron/training.py train_step, megatron/model/distributed.py, megatron/optimizer/optimizer.py
# MixedPrecisionOptimizer.step, clip_grads.py clip_grad_norm_fp32), bytes per parameter:
# - zero_grad_buffer: main_grad zeroed at the start of the step (main_grad_bytes);
# - DistributedDataParallel.allreduce_gradients: main_grad /= data-parallel size (read and write), then reduced;
# - in fp16 only: _copy_model_grads_to_main_grads casts each 16-bit main_grad to fp32 (.float(), one kernel per
#   parameter tensor: FP16_GRAD_CAST_BYTES), and _unscale_main_grads_and_check_for_nan unscales the fp32 grads
#   (torch._amp_foreach_non_finite_check_and_unscale_); bf16 has no grad scaler and fp32 main grads already;
# - then OPTIMIZER_PASSES, each apex multi_tensor_applier call (amp_C): ceil(chunks / 320) launches of 65,536-
#   element chunks, each streaming tens of MB, so one op per pass stands for them.
FP16_GRAD_CAST_BYTES = 2 + 4
FP16_UNSCALE_PASS = ("unscale", 4 + 4, 2)
OPTIMIZER_PASSES = (  # (name, bytes per parameter, flops per parameter), in MixedPrecisionOptimizer.step order
    ("grad_norm", 4, 2),  # multi_tensor_l2norm over the fp32 main grads
    ("clip", 4 + 4, 1),  # multi_tensor_scale of the grads by clip_grad / norm [taken: it is, whenever the norm
    #                      exceeds --clip-grad (1.0 by default), as early in training]
    ("adam", 4 * 4 + 3 * 4, 12),  # FusedAdam (multi_tensor_adam): read grad, master, m, v; write master, m, v
    ("copy_params", 4 + 2, 0),  # _copy_main_params_to_model_params: multi_tensor_scale fp32 master -> 16-bit weight
)
# optimizer=flat: DeepSpeed's fp16 optimizer with legacy fusion, as Megatron-DeepSpeed runs under --deepspeed
# (deepspeed/runtime/fp16/fused_optimizer.py, FP16_Optimizer.step_fused_adam): each parameter group's 16-bit
# gradients copied into one flat buffer (_flatten_dense_tensors), that buffer's norm (get_weight_norm), then one
# fused Adam (the legacy FusedAdam's step(grads=, output_params=, scale=)) that unscales and clips inside the
# kernel, reads the 16-bit gradient, the fp32 master weight and both moments and writes the master, both moments
# and the 16-bit weight (the flat buffer the model's parameters view). No per-tensor casts, no separate unscale,
# clip or copy pass: 34 bytes per parameter in three passes, where OPTIMIZER_PASSES stream 46 (60 with fp16's
# casts and unscale). docs/fit.md says why the vTrain calibration runs point to this step.
FLAT_OPTIMIZER_PASSES = (
    ("flatten_grads", 2 + 2, 0),  # read each 16-bit gradient, write the flat copy
    ("grad_norm", 2, 2),  # the flat 16-bit gradients' norm
    ("adam", 2 + 3 * 4 + 3 * 4 + 2, 12),  # read grad, master, m, v; write master, m, v and the 16-bit weight
)
