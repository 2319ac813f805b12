"""AxoNN's 4D hybrid parallel training step, with Megatron's pipeline and ZeRO on top.

reference/algorithms.md sections 1, 2 and 5. Convention (written down once,
used by the simulator and the executor alike): for a linear O[m, n] = I[m, k] W[k, n]
on rank (x, y, z, d) of a gx x gy x gz x gdata mesh (X innermost),

- I is split over Z (rows: tokens) and Y (columns: k), replicated along X;
- W is split over Y (k) and X (n), and its (x, y) block is sharded along Z;
- forward:  W = ALL_GATHER_z(W_shard); O_part = I W; O = ALL_REDUCE_y(O_part)
- backward: dI_part = dO W^T; dI = ALL_REDUCE_x(dI_part);
            dW_part = I^T dO; dW_shard = REDUCE_SCATTER_z(dW_part)
- after the whole backward: ALL_REDUCE_data(gradient shards), blocking.

This is Algorithm 1 of the AxoNN paper with the forward all-reduce over Y, and
matches the communication model of its section V-B (algorithms.md section 3):
the forward all-reduce moves m n / (gz gx) elements, the backward one
m k / (gz gy). Every other linear is transposed (X and Y swap roles), so the
QKV output (split over X) is the attention-output linear's input, and so on:
the residual stream is split over Z (tokens) and Y (hidden).

Overlap switches (AxoNN's axonn/intra_layer):
- oar: dI's all-reduce is issued async and overlaps the dW GEMM; waited
  before the layer's backward returns;
- ors: dW's reduce-scatter is issued async and waited after the whole
  backward of the micro-batch (of the model chunk, with a pipeline);
- oag: the next linear's weight all-gather is issued one linear ahead in
  module order; the chain restarts in each activation-checkpoint recompute.

With full recompute each block's forward is recomputed (all-gathers and
forward all-reduces included) right before its backward, whose GEMMs then use
the weights gathered by the recompute.

Megatron-DeepSpeed on top (algorithms.md section 5):
- gx alone is Megatron tensor parallelism; sp=1 turns its all-reduces into
  reduce-scatter + all-gather and splits the residual stream over gx as well;
- pp stages run twin.builders.pipeline's 1F1B (or interleaved, vpp chunks)
  order; activations go forward and gradients back by point-to-point
  transfers of tokens x hidden / (gy [x gx with sp]) bf16 values per micro-batch.
  Sends never block compute (they complete in the background), receives do;
- ZeRO over gdata: stage 0 all-reduces gradients; stages 1 and 2
  reduce-scatter them, step the optimizer on the local shard and all-gather
  the updated bf16 weights; stage 3 shards the weights over gz x gdata, so the
  per-linear all-gather and reduce-scatter run on that combined group;
- with pp > 1 the embedding and the LM head (tied) all-reduce their gradient
  between the first and last stage.

Attention (plan.attention), on the heads / gx local heads of each of the mbs
sequences (replicated over gy, like every op between the QKV and attention
output linears):
- flash: one fused kernel per direction (the IR's Attention), what AxoNN and
  the Frontier paper ran;
- unfused: Megatron-LM's core attention before FlashAttention. Forward: the
  batched GEMM Q K^T, the fused scale + causal mask + softmax
  (FusedScaleMaskSoftmax), dropout on the probabilities, the batched GEMM
  probs x V. Backward: dV and d(probs) (batched GEMMs), dropout and softmax
  backward, dQ and dK (batched GEMMs). The full s x s scores are computed and
  then masked, so unlike flash's causal kernel no GEMM skips the masked half.

Recompute (plan.recompute): full reruns each block's forward right before its
backward (above); selective (Korthikanti et al., arXiv 2205.05198, as
Megatron's checkpointed core attention) reruns only the unfused core
attention's forward, under the recompute tag, right before that layer's
attention backward. Flash attention keeps nothing of size s^2 and already
recomputes its scores inside its backward kernel, so with flash selective
recomputes nothing: the schedule is the one without recompute.

Everything that is not a GEMM, attention or communication: one op per kernel
that Megatron-DeepSpeed launches for it (the simulator issues ops one host
launch apart, so their number matters as well as their bytes), each counted
in bytes moved (reads + writes) and flops. The kernels are those of
microsoft/Megatron-DeepSpeed, the code line of the Frontier paper's fork and
of vTrain's A100 measurements, at commit c08e2cc2 (August 2023), for a GPT in
bf16 or fp16 with its defaults: apex's fused layer norm (apex.contrib's
persistent kernel for the hidden sizes it supports), TorchScript-fused
bias-GeLU and bias-dropout-add, FusedScaleMaskSoftmax, gradient accumulation
into DistributedDataParallel's main_grad buffers (gradient_accumulation_fusion
is commented out in its layers.py) and Megatron's mixed-precision optimizer
with apex's FusedAdam. Megatron-LM differs in two places: dense_4h_to_h's bias
goes to the dropout-add (one forward kernel fewer) and its weights' gradients
accumulate inside the dW GEMM (8 accumulation kernels a layer, not 12); with
--deepspeed, DeepSpeed's engine replaces the accumulation and optimizer with
passes of the same kind. Each module-level constant below names the code it
counts. Per layer and micro-batch (c = 1 when mbs > 1, else 0; LN = a layer
norm's backward kernels: 2 persistent, 3 apex's):

  forward (and each full recompute): 16 + c flash, 16 unfused
    ln1 | qkv GEMM, qkv bias add | attention | attn_out GEMM |
    bias-dropout-add | ln2 | mlp_up GEMM, bias-GeLU | mlp_down GEMM,
    mlp_down bias add | dropout-add
    attention, flash:   3 q/k/v copies (rearrange + contiguous), the
                        cu_seqlens arange, the kernel, c context copy
    attention, unfused: Q K^T, softmax, dropout, probs V, the context's
                        permute + contiguous copy (selective recompute
                        reruns these 5)
  backward: 29 + 2 LN + attention's (35 flash at mbs = 1, 44 unfused)
    dropout-add bwd | mlp_down: dbias, bias acc, dI, dW, weight acc |
    bias-GeLU bwd | mlp_up: dbias, bias acc, dI, dW, weight acc |
    ln2 bwd (LN), residual-gradient add, 2 parameter accs |
    bias-dropout-add bwd | attn_out: dbias, bias acc, dI, dW, weight acc |
    attention bwd | qkv: dI, dW, dbias, weight acc, bias acc |
    ln1 bwd (LN), residual-gradient add, 2 parameter accs
    attention, flash:   c dO copy, the kernel, the q/k/v gradient
                        concatenation (1 kernel; 3 copies when mbs > 1)
    attention, unfused: dV, d(probs), dropout bwd, softmax bwd, dQ and its
                        1/sqrt(d) scale, dK and its scale, the q/k/v
                        gradient concatenation (3 copies)

"acc" is main_grad.add_(grad), one per parameter tensor and micro-batch,
named mb<i>[.c<j>].bwd.acc.<parameter> (e.g. mb0.bwd.acc.L3.qkv.weight):
outside the layer passes' mb<i>[.c<j>].<pass>.L<n>.<role> names, because
its size follows the parameters' sharding (gz, and gdata under ZeRO-3),
which the search's screening bound, built on the tensor-parallel grid alone,
does not see (twin.search.screen). Every other op of a layer keeps that
grammar.

The loss, per micro-batch on the last stage: 6 kernels over the logits (38
bytes per logit element: fp32 cast, max, subtract, exp, sum, divide), 3
all-reduces of one fp32 per token over X, and LOSS_TOKEN_KERNELS small
per-token kernels (masks, gathers, the loss function); backward 2 kernels (14
bytes per logit) and LOSS_BACKWARD_TOKEN_KERNELS per-token ones. The
embedding: lookups, add, dropout forward (with gx > 1 the vocabulary masking
and the all-reduce over X); backward, its dropout, the dense gradient of
each table (zeroed, then scattered into), the tied LM head's gradient added,
and the tables' accumulations. The step: the main_grad buffer zeroed, scaled
by 1 / data-parallel size, then the optimizer's multi-tensor passes
(OPTIMIZER_PASSES): 58 bytes per parameter in bf16, 66 in fp16.

Not counted (each under 1% of a step in the cases checked, or not expressible
in the IR): the data loader's per-micro-batch mask and position kernels, the
loss's logging all-reduce over the data-parallel group, the model-parallel
all-reduces of the gradient norm and the fp16 inf flag and the host syncs of
their .item(), the host syncs of ParallelTransformerLayer.forward's two
torch.tensor(0.0, device=...) per layer (the IR has no host synchronisation),
flash attention's internal extra backward kernels (the IR's Attention is one
kernel per direction), and sequence parallelism's all-reduce of layer-norm
gradients.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil

from twin.builders.megatron_kernels import (
    ATTENTION_DROPOUT_BACKWARD_BYTES, ATTENTION_DROPOUT_BYTES, BIAS_ADD_BYTES, BIAS_GRAD_BYTES, COPY_BYTES,
    DROPOUT_BACKWARD_BYTES, DROPOUT_FLOPS, EMBEDDING_ADD_BYTES, EMBEDDING_DIRECT_MAX_INDICES,
    EMBEDDING_DROPOUT_BYTES, EMBEDDING_LOOKUP_BYTES, EMBEDDING_MASK_BYTES, EMBEDDING_SCATTER_BYTES,
    EMBEDDING_SORTED_KERNELS, EMBEDDING_VOCAB_TOKEN_KERNELS, FLASH_COPIED, FP16_GRAD_CAST_BYTES, FP16_UNSCALE_PASS,
    FUSED_SOFTMAX_MAX_SEQ, GELU_BACKWARD_BYTES, GELU_BYTES, GRAD_ADD_BYTES, LAYERNORM_BACKWARD_BYTES,
    LAYERNORM_BYTES, LAYERNORM_PARTIAL_BYTES, LAYERNORM_PARTIAL_ROWS, LAYERNORM_PARTIAL_SUM_BYTES,
    LOSS_BACKWARD_KERNELS, LOSS_BACKWARD_TOKEN_KERNELS, LOSS_KERNELS, LOSS_TOKEN_KERNELS, MASK_FILL_BYTES,
    OPTIMIZER_PASSES, PERSISTENT_LAYERNORM_HIDDEN, RESIDUAL_DROPOUT_BYTES, SEQLENS_BYTES, SOFTMAX_BACKWARD_BYTES,
    SOFTMAX_BYTES, SOFTMAX_FLOPS, TOKEN_KERNEL_BYTES, grad_accumulation_bytes, main_grad_bytes,
)
from twin.builders.pipeline import pipeline_order
from twin.builders.program import ProgramWriter
from twin.ir import P2P, Attention, Collective, Elementwise, Gemm, GroupAxis, Program, Schedule, StepInfo
from twin.memory import memory_per_gpu
from twin.mesh import axonn_mesh
from twin.model import ModelSpec
from twin.plan import ParallelPlan

@dataclass(frozen=True)
class Linear:
    """One linear of the model; `transposed` swaps the X and Y roles."""

    name: str
    k: int
    n: int
    transposed: bool

    @property
    def forward_axis(self) -> str:
        """The axis the forward output is all-reduced over (k is split over it)."""
        return "x" if self.transposed else "y"

    @property
    def backward_axis(self) -> str:
        """The axis dI is all-reduced over (n is split over it)."""
        return "y" if self.transposed else "x"


class _StageWriter:
    """Writes the program every rank of one pipeline stage runs; one instance per stage."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, stage: int) -> None:
        self.model, self.plan, self.stage = model, plan, stage
        self.sizes = {"x": plan.gx, "y": plan.gy, "z": plan.gz, "data": plan.gdata, "pp": plan.pp}
        self.shard_axis = "z+data" if plan.zero == 3 and plan.gdata > 1 else "z"
        self.sizes["z+data"] = plan.gz * plan.gdata
        self.tokens = plan.mbs * model.seq  # rows of every GEMM on this rank
        self.residual_split = plan.gy * (plan.gx if plan.sp else 1)  # of the residual stream's hidden/tokens
        self.dtype = model.dtype
        self.b = model.dtype_bytes
        self.acc_bytes = grad_accumulation_bytes(model.dtype)
        self.w = ProgramWriter()
        self.n_virtual = plan.pp * plan.vpp
        per_chunk = model.layers // self.n_virtual
        self.chunks = []  # per chunk: the blocks (each four Linears) of this stage
        for chunk in range(plan.vpp):
            first = (chunk * plan.pp + stage) * per_chunk
            self.chunks.append([
                [Linear(f"L{layer}.{name}", k, n, t) for name, k, n, t in model.linear_shapes()]
                for layer in range(first, first + per_chunk)
            ])
        self.lm_head = Linear("lm_head", model.hidden, model.vocab, False)
        self.deferred_waits: list[int] = []  # ors: reduce-scatters waited at the end of backward

    # ---- sizes -------------------------------------------------------------
    def virtual_stage(self, chunk: int) -> int:
        return chunk * self.plan.pp + self.stage

    def is_first(self, chunk: int) -> bool:
        return self.virtual_stage(chunk) == 0

    def is_last(self, chunk: int) -> bool:
        return self.virtual_stage(chunk) == self.n_virtual - 1

    def residual_elements(self) -> float:
        """Elements of the residual stream (tokens x hidden) this rank holds."""
        return self.tokens * self.model.hidden / self.residual_split

    def head_elements(self) -> float:
        """Elements of q, k, v or the attention context (tokens x hidden/gx: the local heads) on this rank."""
        return self.tokens * self.model.hidden / self.sizes["x"]

    def norm_params(self) -> float:
        """Elements of one layer-norm parameter (gamma or beta) on this rank: the hidden split over gy."""
        return self.model.hidden / self.sizes["y"]

    def weight_block_bytes(self, lin: Linear) -> float:
        """The gathered (x, y) block of W: what the weight all-gather returns."""
        return self.b * lin.k * lin.n / (self.sizes["x"] * self.sizes["y"])

    def gemm_dims(self, lin: Linear) -> tuple[int, int, int]:
        """(rows, k_local, n_local) of this rank's forward GEMM."""
        return (self.tokens, lin.k // self.sizes[lin.forward_axis], lin.n // self.sizes[lin.backward_axis])

    def output_elements(self, lin: Linear) -> float:
        """Elements of the linear's output where its bias is added: the residual stream's share after a
        transposed (row-parallel) linear, tokens x n_local after the others."""
        return self.residual_elements() if lin.transposed else self.tokens * self.gemm_dims(lin)[2]

    def elementwise(self, name: str, elements: float, bytes_per_element: float, flops_per_element: float = 1.0) -> int:
        return self.w.compute(name, Elementwise(nbytes=elements * bytes_per_element, flops=elements * flops_per_element))

    def blocking(self, name: str, kind: str, axis: str, nbytes: float, dtype: str | None = None) -> int:
        """A collective the next compute op waits for."""
        op = self.w.collective(name, axis, Collective(kind, axis, nbytes, dtype or self.dtype))
        self.w.wait(op)
        return op

    def accumulate(self, tag: str, parameter: str, elements: float) -> int:
        """main_grad.add_(grad) of one parameter tensor (DistributedDataParallel's hook), named
        `tag`.acc.`parameter` (`tag` ends in .bwd): outside the layer passes' mb.<pass>.L<n>.<role> names, as its
        size follows the parameters' sharding (gz, ZeRO-3's gdata), which the search's screening bound, built on the
        tensor-parallel grid alone, does not see (twin.search.screen)."""
        return self.elementwise(f"{tag}.acc.{parameter}", elements, self.acc_bytes, 1)

    # ---- one linear --------------------------------------------------------
    def gather_weight(self, tag: str, lin: Linear) -> int | None:
        axis = self.shard_axis
        if self.sizes[axis] == 1:
            return None
        work = Collective("all_gather", axis, self.weight_block_bytes(lin), self.dtype)
        return self.w.collective(f"{tag}.{lin.name}.ag_{axis.replace('+', '')}", axis, work)

    def linear_forward(self, tag: str, lin: Linear, gathered: int | None, prefetch: Linear | None) -> int | None:
        """Forward of one linear; returns the prefetched all-gather of `prefetch`, if issued."""
        w, sp = self.w, self.plan.sp and self.sizes["x"] > 1
        if self.sizes[self.shard_axis] > 1 and gathered is None:
            gathered = self.gather_weight(tag, lin)
        if gathered is not None:
            w.wait(gathered)
        next_gather = self.gather_weight(tag, prefetch) if (prefetch and self.plan.oag) else None
        rows, k_loc, n_loc = self.gemm_dims(lin)
        if sp and not lin.transposed:  # sequence-parallel input gathered before a column-parallel linear
            self.blocking(f"{tag}.{lin.name}.ag_x", "all_gather", "x", self.b * rows * k_loc)
        w.compute(f"{tag}.{lin.name}.gemm", Gemm(rows, n_loc, k_loc, "NT", self.dtype, tunable=self.plan.tune_gemm))
        axis = lin.forward_axis
        if self.sizes[axis] > 1:
            if sp and lin.transposed:
                self.blocking(f"{tag}.{lin.name}.rs_x", "reduce_scatter", "x", self.b * rows * n_loc)
            else:
                self.blocking(f"{tag}.{lin.name}.ar_{axis}", "all_reduce", axis, self.b * rows * n_loc)
        return next_gather

    def linear_backward(self, tag: str, lin: Linear, bias: bool = False, accumulate: bool = True) -> None:
        """dI, dW (and, for a linear that adds its bias itself, dbias: LinearWithGradAccumulationAndAsyncCommunication
        .backward), then the accumulation of its weight (and that bias) into main_grad.

        A z-sharded weight accumulates its reduce-scattered shard, after the reduce-scatter's wait without ors;
        with ors the reduce-scatter is waited only at the end of the backward (AxoNN), and the add is issued in
        its place here all the same: its wait on the shard is not modelled."""
        w, plan = self.w, self.plan
        sp = plan.sp and self.sizes["x"] > 1
        rows, k_loc, n_loc = self.gemm_dims(lin)
        tune = plan.tune_gemm
        regather = None
        if sp and lin.transposed:  # the gradient arrives sequence-split: gather it first
            self.blocking(f"{tag}.{lin.name}.ag_x", "all_gather", "x", self.b * rows * n_loc)
        elif sp:  # the saved input is sequence-split: gather it again for dW, behind the dI GEMM
            regather = w.collective(f"{tag}.{lin.name}.ag_in_x", "x", Collective("all_gather", "x", self.b * rows * k_loc, self.dtype))
        w.compute(f"{tag}.{lin.name}.dI", Gemm(rows, k_loc, n_loc, "NN", self.dtype, tunable=tune))
        axis = lin.backward_axis
        reduce_dI = None
        if self.sizes[axis] > 1 and not (sp and lin.transposed):
            kind, short = ("reduce_scatter", "rs") if sp else ("all_reduce", "ar")
            reduce_dI = w.collective(f"{tag}.{lin.name}.{short}_{axis}", axis, Collective(kind, axis, self.b * rows * k_loc, self.dtype))
            if not plan.oar:
                w.wait(reduce_dI)
        if regather is not None:
            w.wait(regather)
        w.compute(f"{tag}.{lin.name}.dW", Gemm(n_loc, k_loc, rows, "TN", self.dtype, tunable=tune))
        if bias:  # grad_output.sum(dim=0), before the handle's wait
            self.elementwise(f"{tag}.{lin.name}.dbias", rows * n_loc, BIAS_GRAD_BYTES, 1)
        if reduce_dI is not None and plan.oar:
            w.wait(reduce_dI)
        axis = self.shard_axis
        if self.sizes[axis] > 1:
            work = Collective("reduce_scatter", axis, self.weight_block_bytes(lin), self.dtype)
            scatter = w.collective(f"{tag}.{lin.name}.rs_{axis.replace('+', '')}", axis, work)
            if plan.ors:
                self.deferred_waits.append(scatter)
            else:
                w.wait(scatter)
        if accumulate:
            self.accumulate(tag, f"{lin.name}.weight", k_loc * n_loc / self.sizes[axis])
            if bias:
                self.accumulate(tag, f"{lin.name}.bias", n_loc)

    def bias_backward(self, tag: str, lin: Linear) -> None:
        """The gradient of a bias added outside the linear's GEMM (a reduction over tokens), and its accumulation."""
        self.elementwise(f"{tag}.{lin.name}.dbias", self.output_elements(lin), BIAS_GRAD_BYTES, 1)
        self.accumulate(tag, f"{lin.name}.bias", self.gemm_dims(lin)[2])

    # ---- layer norms ---------------------------------------------------------
    def layernorm_backward(self, tag: str, layer: str | None, name: str, grad_add: bool) -> None:
        """A layer norm's backward kernels (LAYERNORM_* constants) under `tag` (.bwd), autograd's sum of the residual
        stream's two gradients when it has two consumers (`grad_add`), then the accumulation of gamma and beta."""
        acc_tag, param = tag, f"{layer}.{name}" if layer else name
        tag = f"{tag}.{layer}" if layer else tag.removesuffix(".bwd")
        res, hidden = self.residual_elements(), self.norm_params()
        partial_flops = 2 * LAYERNORM_PARTIAL_ROWS
        if self.model.hidden in PERSISTENT_LAYERNORM_HIDDEN:
            self.elementwise(f"{tag}.{name}_bwd", res, LAYERNORM_BACKWARD_BYTES, 8)
            self.elementwise(f"{tag}.{name}_bwd_params_sum", hidden, LAYERNORM_PARTIAL_SUM_BYTES, partial_flops)
        else:
            self.elementwise(f"{tag}.{name}_bwd_params", res, LAYERNORM_PARTIAL_BYTES, 4)
            self.elementwise(f"{tag}.{name}_bwd_params_sum", hidden, LAYERNORM_PARTIAL_SUM_BYTES, partial_flops)
            self.elementwise(f"{tag}.{name}_bwd", res, LAYERNORM_BACKWARD_BYTES, 8)
        if grad_add:
            self.elementwise(f"{tag}.{name}_grad_add", res, GRAD_ADD_BYTES, 1)
        self.accumulate(acc_tag, f"{param}.weight", hidden)
        self.accumulate(acc_tag, f"{param}.bias", hidden)

    # ---- blocks ------------------------------------------------------------
    def block_forward(self, tag: str, linears: list[Linear], gathered: int | None, after: Linear | None) -> int | None:
        """One transformer block (ParallelTransformerLayer.forward); `after`: the next linear in module order (oag)."""
        res, f, gx = self.residual_elements(), self.model.ffn, self.sizes["x"]
        m = self.tokens
        qkv, attn_out, up, down = linears
        layer = qkv.name.split(".")[0]
        self.elementwise(f"{tag}.{layer}.ln1", res, LAYERNORM_BYTES, 5)
        gathered = self.linear_forward(tag, qkv, gathered, attn_out)
        self.elementwise(f"{tag}.{qkv.name}.bias", self.output_elements(qkv), BIAS_ADD_BYTES, 1)
        self.attention_forward(tag, layer)
        gathered = self.linear_forward(tag, attn_out, gathered, up)
        self.elementwise(f"{tag}.{layer}.resid1", res, RESIDUAL_DROPOUT_BYTES, 3)
        self.elementwise(f"{tag}.{layer}.ln2", res, LAYERNORM_BYTES, 5)
        gathered = self.linear_forward(tag, up, gathered, down)
        self.elementwise(f"{tag}.{layer}.gelu", m * f / gx, GELU_BYTES, 8)
        gathered = self.linear_forward(tag, down, gathered, after)
        self.elementwise(f"{tag}.{down.name}.bias", self.output_elements(down), BIAS_ADD_BYTES, 1)
        self.elementwise(f"{tag}.{layer}.resid2", res, RESIDUAL_DROPOUT_BYTES, 2)
        return gathered

    def block_backward(self, mb_tag: str, linears: list[Linear]) -> None:
        """One block's backward under `mb_tag`.bwd (selective recompute adds `mb_tag`.rc ops), in autograd's order."""
        res, f, gx = self.residual_elements(), self.model.ffn, self.sizes["x"]
        m = self.tokens
        qkv, attn_out, up, down = linears
        layer = qkv.name.split(".")[0]
        tag = f"{mb_tag}.bwd"
        self.elementwise(f"{tag}.{layer}.resid2_bwd", res, DROPOUT_BACKWARD_BYTES, 2)
        self.bias_backward(tag, down)
        self.linear_backward(tag, down)
        self.elementwise(f"{tag}.{layer}.gelu_bwd", m * f / gx, GELU_BACKWARD_BYTES, 8)
        self.bias_backward(tag, up)
        self.linear_backward(tag, up)
        self.layernorm_backward(tag, layer, "ln2", grad_add=True)
        self.elementwise(f"{tag}.{layer}.resid1_bwd", res, DROPOUT_BACKWARD_BYTES, 2)
        self.bias_backward(tag, attn_out)
        self.linear_backward(tag, attn_out)
        self.attention_backward(mb_tag, layer)
        self.linear_backward(tag, qkv, bias=True)
        self.layernorm_backward(tag, layer, "ln1", grad_add=True)

    # ---- attention (module docstring) ----------------------------------------
    def attention_forward(self, tag: str, layer: str) -> None:
        """The attention core's forward, in the forward pass and in either recompute."""
        heads = self.head_elements()
        if self.plan.attention == "flash":
            for which in FLASH_COPIED:
                self.elementwise(f"{tag}.{layer}.attn_{which}_copy", heads, COPY_BYTES, 0)
            self.elementwise(f"{tag}.{layer}.attn_seqlens", self.plan.mbs + 1, SEQLENS_BYTES, 1)
            self.w.compute(f"{tag}.{layer}.attn", self.flash_attention(backward=False))
            if self.plan.mbs > 1:
                self.elementwise(f"{tag}.{layer}.attn_context_copy", heads, COPY_BYTES, 0)
            return
        s, d = self.model.seq, self.model.head_dim
        self.batched_gemm(f"{tag}.{layer}.attn_scores", s, s, d, "NT")  # Q K^T
        if s <= FUSED_SOFTMAX_MAX_SEQ:
            self.score_elementwise(f"{tag}.{layer}.attn_softmax", SOFTMAX_BYTES, SOFTMAX_FLOPS)
        else:
            self.score_elementwise(f"{tag}.{layer}.attn_mask", MASK_FILL_BYTES, 1)
            self.score_elementwise(f"{tag}.{layer}.attn_softmax", SOFTMAX_BYTES, SOFTMAX_FLOPS)
        self.score_elementwise(f"{tag}.{layer}.attn_dropout", ATTENTION_DROPOUT_BYTES, DROPOUT_FLOPS)
        self.batched_gemm(f"{tag}.{layer}.attn_context", s, d, s, "NN")  # probs V
        self.elementwise(f"{tag}.{layer}.attn_context_copy", heads, COPY_BYTES, 0)

    def attention_backward(self, mb_tag: str, layer: str) -> None:
        """The attention core's backward; selective recompute first reruns the unfused forward (`mb_tag`.rc)."""
        tag = f"{mb_tag}.bwd"
        heads = self.head_elements()
        if self.plan.attention == "flash":  # nothing to recompute: the kernel rebuilds its scores itself
            if self.plan.mbs > 1:
                self.elementwise(f"{tag}.{layer}.attn_bwd_copy", heads, COPY_BYTES, 0)
            self.w.compute(f"{tag}.{layer}.attn_bwd", self.flash_attention(backward=True))
            if self.plan.mbs == 1:
                self.elementwise(f"{tag}.{layer}.attn_qkv_grad", 3 * heads, COPY_BYTES, 0)
            else:
                self.qkv_gradient_copies(tag, layer)
            return
        if self.plan.recompute == "selective":
            self.attention_forward(f"{mb_tag}.rc", layer)
        s, d = self.model.seq, self.model.head_dim
        self.batched_gemm(f"{tag}.{layer}.attn_context_dV", s, d, s, "TN")  # probs^T dO
        self.batched_gemm(f"{tag}.{layer}.attn_context_dP", s, s, d, "NT")  # dO V^T
        self.score_elementwise(f"{tag}.{layer}.attn_dropout_bwd", ATTENTION_DROPOUT_BACKWARD_BYTES, DROPOUT_FLOPS)
        self.score_elementwise(f"{tag}.{layer}.attn_softmax_bwd", SOFTMAX_BACKWARD_BYTES, SOFTMAX_FLOPS)
        if s > FUSED_SOFTMAX_MAX_SEQ:
            self.score_elementwise(f"{tag}.{layer}.attn_mask_bwd", MASK_FILL_BYTES, 1)
        self.batched_gemm(f"{tag}.{layer}.attn_scores_dQ", s, d, s, "NN")  # dS K
        self.elementwise(f"{tag}.{layer}.attn_scores_dQ_scale", heads, COPY_BYTES, 1)
        self.batched_gemm(f"{tag}.{layer}.attn_scores_dK", s, d, s, "TN")  # dS^T Q
        self.elementwise(f"{tag}.{layer}.attn_scores_dK_scale", heads, COPY_BYTES, 1)
        self.qkv_gradient_copies(tag, layer)

    def qkv_gradient_copies(self, tag: str, layer: str) -> None:
        """torch.cat of strided q, k, v gradients into the QKV output's gradient: one copy each."""
        for which in FLASH_COPIED:
            self.elementwise(f"{tag}.{layer}.attn_{which}_grad", self.head_elements(), COPY_BYTES, 0)

    def attention_heads(self) -> int:
        """Independent (sequence, local head) pairs: the batch of every unfused attention GEMM."""
        return self.plan.mbs * self.model.heads // self.sizes["x"]

    def batched_gemm(self, name: str, m: int, n: int, k: int, layout: str) -> int:
        """One per-head GEMM of unfused attention (torch.bmm/baddbmm in Megatron: not layout-tuned)."""
        return self.w.compute(name, Gemm(m, n, k, layout, self.dtype, batch=self.attention_heads()))

    def score_elementwise(self, name: str, bytes_per_element: float, flops_per_element: float) -> int:
        """A memory-bound kernel over the whole score tensor (attention_heads x s x s elements)."""
        return self.elementwise(name, self.attention_heads() * self.model.seq**2, bytes_per_element, flops_per_element)

    def flash_attention(self, backward: bool) -> Attention:
        model = self.model
        return Attention(
            batch=self.plan.mbs, seq=model.seq, heads=model.heads // self.sizes["x"],
            head_dim=model.head_dim, backward=backward, causal=True, dtype=self.dtype,
        )

    # ---- the loss ----------------------------------------------------------
    def loss(self, tag: str) -> None:
        """Vocabulary-parallel cross entropy (LOSS_* constants): logits split over X; the max, the target logit and
        the sum of exponentials all-reduced over X, one fp32 per token each."""
        logits = self.tokens * self.model.vocab / self.sizes["x"]
        kernels = dict((name, (nbytes, flops)) for name, nbytes, flops in LOSS_KERNELS)
        tokens = 0

        def token_kernels(count: int, prefix: str = "loss") -> None:
            nonlocal tokens
            for _ in range(count):
                self.elementwise(f"{tag}.{prefix}.token{tokens}", self.tokens, TOKEN_KERNEL_BYTES, 1)
                tokens += 1

        def kernel(name: str) -> None:
            nbytes, flops = kernels[name]
            self.elementwise(f"{tag}.loss.{name}", logits, nbytes, flops)

        def all_reduce(what: str) -> None:
            if self.sizes["x"] > 1:
                self.blocking(f"{tag}.loss.{what}.ar_x", "all_reduce", "x", 4 * self.tokens, "fp32")

        kernel("cast")
        kernel("max")
        all_reduce("max")
        kernel("sub")
        token_kernels(10)  # the vocabulary-range masks and the target gather
        all_reduce("target")
        kernel("exp")
        kernel("sum")
        all_reduce("sum")
        kernel("div")
        token_kernels(LOSS_TOKEN_KERNELS - 10)  # log, subtract; the loss function; the scalings
        tokens = 0
        token_kernels(LOSS_BACKWARD_TOKEN_KERNELS, "loss_bwd")
        for name, nbytes, flops in LOSS_BACKWARD_KERNELS:
            self.elementwise(f"{tag}.loss_bwd.{name}", logits, nbytes, flops)

    # ---- the embedding -------------------------------------------------------
    def embedding_elements(self) -> float:
        """Elements of the embedding's output before the residual stream's split over X (sp): tokens x hidden/gy."""
        return self.tokens * self.model.hidden / self.sizes["y"]

    def word_table_elements(self) -> float:
        """The word table (and tied LM head) on this rank: split over vocabulary (X) and hidden (Y), sharded over Z."""
        return self.model.vocab * self.model.hidden / self.plan.tensor_parallel_size

    def position_table_elements(self) -> float:
        """The position table on this rank: replicated over X (Megatron's Embedding), split like the word table else."""
        return self.model.seq * self.model.hidden / (self.sizes["y"] * self.sizes["z"])

    def embedding_forward(self, tag: str) -> None:
        """Embedding.forward (EMBEDDING_* constants): lookups, sum, transpose, dropout."""
        out = self.embedding_elements()
        if self.sizes["x"] > 1:
            for i in range(EMBEDDING_VOCAB_TOKEN_KERNELS):
                self.elementwise(f"{tag}.embed.token{i}", self.tokens, TOKEN_KERNEL_BYTES, 1)
        self.elementwise(f"{tag}.embed.word", out, EMBEDDING_LOOKUP_BYTES, 0)
        if self.sizes["x"] > 1:
            self.elementwise(f"{tag}.embed.mask", out, EMBEDDING_MASK_BYTES, 1)
            self.blocking(f"{tag}.embed.ar_x", "all_reduce", "x", self.b * out)
        self.elementwise(f"{tag}.embed.pos", out, EMBEDDING_LOOKUP_BYTES, 0)
        self.elementwise(f"{tag}.embed.add", out, EMBEDDING_ADD_BYTES, 1)
        if self.plan.mbs > 1:
            self.elementwise(f"{tag}.embed.transpose", out, COPY_BYTES, 0)
        self.elementwise(f"{tag}.embed.dropout", self.residual_elements(), EMBEDDING_DROPOUT_BYTES, DROPOUT_FLOPS)

    def embedding_backward(self, tag: str) -> None:
        """The embedding's backward: dropout, each table's dense gradient, the tied head's, the accumulations."""
        out = self.embedding_elements()
        self.elementwise(f"{tag}.embed_bwd.dropout", self.residual_elements(), DROPOUT_BACKWARD_BYTES, 2)
        for table, elements in (("pos", self.position_table_elements()), ("word", self.word_table_elements())):
            if self.plan.mbs > 1:
                self.elementwise(f"{tag}.embed_bwd.{table}_copy", out, COPY_BYTES, 0)
            self.elementwise(f"{tag}.embed_bwd.{table}_zero", elements, 2, 0)
            if self.tokens > EMBEDDING_DIRECT_MAX_INDICES:
                for i in range(EMBEDDING_SORTED_KERNELS):
                    self.elementwise(f"{tag}.embed_bwd.{table}_sort{i}", self.tokens, TOKEN_KERNEL_BYTES, 1)
            self.elementwise(f"{tag}.embed_bwd.{table}", out, EMBEDDING_SCATTER_BYTES, 1)
        if self.plan.pp == 1:  # the LM head's gradient of the same (tied) table
            self.elementwise(f"{tag}.embed_bwd.tied_grad_add", self.word_table_elements(), GRAD_ADD_BYTES, 1)
        self.accumulate(f"{tag}.bwd", "embed.word", self.word_table_elements())
        self.accumulate(f"{tag}.bwd", "embed.pos", self.position_table_elements())

    # ---- pipeline transfers ------------------------------------------------
    def p2p_bytes(self) -> float:
        return self.b * self.residual_elements()

    def receive(self, tag: str, what: str, peer: int) -> None:
        op = self.w.collective(f"{tag}.recv_{what}", "pp", P2P("recv", "pp", peer, self.p2p_bytes(), what), stream=f"p2p:recv_{what}")
        self.w.wait(op)

    def send(self, tag: str, what: str, peer: int) -> None:
        self.w.collective(f"{tag}.send_{what}", "pp", P2P("send", "pp", peer, self.p2p_bytes(), what), stream=f"p2p:send_{what}")

    def neighbour(self, chunk: int, step: int) -> int:
        """Offset along the pp axis to the virtual stage `step` (+1 or -1) away (wrapping chunks)."""
        target = (self.virtual_stage(chunk) + step) % self.plan.pp
        return target - self.stage

    # ---- passes --------------------------------------------------------------
    def tag(self, mb: int, chunk: int) -> str:
        return f"mb{mb}" + (f".c{chunk}" if self.plan.vpp > 1 else "")

    def forward_chunk(self, mb: int, chunk: int) -> None:
        tag = self.tag(mb, chunk)
        blocks = self.chunks[chunk]
        if self.is_first(chunk):
            self.embedding_forward(tag)
        else:
            self.receive(tag, "act", self.neighbour(chunk, -1))
        order = [lin for block in blocks for lin in block] + ([self.lm_head] if self.is_last(chunk) else [])
        gathered = None
        for i, block in enumerate(blocks):
            after = order[4 * i + 4] if 4 * i + 4 < len(order) else None
            gathered = self.block_forward(f"{tag}.fwd", block, gathered, after)
        if self.is_last(chunk):
            self.elementwise(f"{tag}.ln_f", self.residual_elements(), LAYERNORM_BYTES, 5)
            self.linear_forward(f"{tag}.fwd", self.lm_head, gathered, None)
            self.loss(tag)
        else:
            self.send(tag, "act", self.neighbour(chunk, +1))

    def backward_chunk(self, mb: int, chunk: int) -> None:
        tag = self.tag(mb, chunk)
        if self.is_last(chunk):
            # Tied to the word table on one stage: its gradient is summed with the lookup's and accumulated there.
            self.linear_backward(f"{tag}.bwd", self.lm_head, accumulate=self.plan.pp > 1)
            self.layernorm_backward(f"{tag}.bwd", None, "ln_f", grad_add=False)
        else:
            self.receive(tag, "grad", self.neighbour(chunk, +1))
        for block in reversed(self.chunks[chunk]):
            if self.plan.recompute == "full":
                self.block_forward(f"{tag}.rc", block, None, None)
            self.block_backward(tag, block)
        if self.is_first(chunk):
            self.embedding_backward(tag)
        else:
            self.send(tag, "grad", self.neighbour(chunk, -1))
        self.w.wait(*self.deferred_waits)
        self.deferred_waits.clear()

    # ---- after the last backward ---------------------------------------------
    def gradient_buckets(self) -> list[tuple[str, float]]:
        """(name, parameters) per gradient bucket, in the order backward finishes them."""
        layers = [lin.name.split(".")[0] for chunk in reversed(self.chunks) for block in reversed(chunk) for lin in block[:1]]
        buckets = [(layer, float(self.model.params_per_layer)) for layer in layers]
        final_norm = 2.0 * self.model.hidden
        if self.plan.pp == 1:
            buckets.append(("embed", self.model.embedding_params + final_norm))  # the LM head is tied to it
            return buckets
        if self.stage == self.plan.pp - 1:
            buckets.insert(0, ("lm_head", final_norm + self.model.vocab * self.model.hidden))
        if self.stage == 0:
            buckets.append(("embed", float(self.model.embedding_params)))
        return buckets

    def parameter_tensors(self) -> int:
        """Parameter tensors of this stage: 12 a layer, word and position tables, final norm, an untied LM head."""
        tensors = 12 * sum(len(chunk) for chunk in self.chunks)
        if self.stage == 0:
            tensors += 2
        if self.stage == self.plan.pp - 1:
            tensors += 2 + (1 if self.plan.pp > 1 else 0)
        return tensors

    def zero_grad(self) -> None:
        """train_step's zero_grad_buffer: main_grad zeroed before the first micro-batch."""
        local_params = sum(params for _, params in self.gradient_buckets()) / self.plan.tensor_parallel_size
        self.elementwise("zero_grad", local_params, main_grad_bytes(self.dtype), 0)

    def data_parallel_and_optimizer(self) -> None:
        """Gradient scaling and sync over data (by ZeRO stage), the tied-embedding sync, then the optimizer's passes."""
        plan, tp = self.plan, self.plan.tensor_parallel_size
        buckets = self.gradient_buckets()
        local_params = sum(params for _, params in buckets) / tp
        main = main_grad_bytes(self.dtype)
        self.elementwise("dp.grad_scale", local_params, 2 * main, 1)  # main_grad /= data-parallel size
        if plan.pp > 1 and self.stage in (0, plan.pp - 1):
            self.blocking("tied.embed.ar", "all_reduce", "tied", self.b * self.model.vocab * self.model.hidden / tp)
        gathers = []
        if self.sizes["data"] > 1 and plan.zero in (0, 1, 2):
            kind, short = ("all_reduce", "ar") if plan.zero == 0 else ("reduce_scatter", "rs")
            ops = [self.w.collective(f"dp.{name}.{short}_data", "data", Collective(kind, "data", self.b * params / tp, self.dtype))
                   for name, params in buckets]
            self.w.wait(*ops)
            gathers = buckets if plan.zero in (1, 2) else []
        shards = plan.gdata if plan.zero else 1
        optimizer_params = local_params / shards
        passes = list(OPTIMIZER_PASSES)
        if self.dtype == "fp16":
            casts = ceil(self.parameter_tensors() / shards)  # one .float() per parameter tensor (of the shard)
            for i in range(casts):
                self.elementwise(f"optimizer.grad_cast{i}", optimizer_params / casts, FP16_GRAD_CAST_BYTES, 0)
            passes.insert(0, FP16_UNSCALE_PASS)
        for name, nbytes, flops in passes:
            self.elementwise(f"optimizer.{name}", optimizer_params, nbytes, flops)
        for name, params in gathers:  # ZeRO-1/2: every rank needs the updated weights back
            self.blocking(f"dp.{name}.ag_data", "all_gather", "data", self.b * params / tp)

    def write(self) -> list:
        self.zero_grad()
        for step in pipeline_order(self.plan.pp, self.plan.vpp, self.plan.ga, self.stage):
            if step.kind == "F":
                self.forward_chunk(step.micro_batch, step.chunk)
            else:
                self.backward_chunk(step.micro_batch, step.chunk)
        self.data_parallel_and_optimizer()
        return self.w.ops


def build_axonn(model: ModelSpec, plan: ParallelPlan, stages: tuple[int, ...] | None = None) -> Schedule:
    """The whole training step; `plan` validated, mbs and ga resolved. One Program per pipeline stage.

    `stages` keeps only those stages' programs: a partial schedule for the
    search's lower bound (twin.search.bound), which needs the first, a middle
    and the last stage of a long pipeline; it cannot be simulated."""
    if plan.mbs <= 0 or plan.ga <= 0:
        raise ValueError("build_axonn needs a plan with mbs and ga resolved (twin.memory.resolve_micro_batch)")
    mesh = axonn_mesh(plan.gx, plan.gy, plan.gz, plan.gdata, plan.pp)
    per_stage = mesh.size // plan.pp  # pp is the outermost axis: each stage is a block of consecutive ranks
    stage_ranks = {s: tuple(range(s * per_stage, (s + 1) * per_stage)) for s in range(plan.pp)}
    kept = range(plan.pp) if stages is None else sorted(set(stages))
    programs = tuple(Program(stage_ranks[s], tuple(_StageWriter(model, plan, s).write())) for s in kept)

    used = sorted({op.work.group for prog in programs for op in prog.ops if isinstance(op.work, (Collective, P2P))})
    groups = []
    for axis in used:
        if axis == "tied":
            instances = tuple((g[0], g[-1]) for g in mesh.group_instances("pp"))
        else:
            instances = mesh.group_instances(axis)
        groups.append(GroupAxis(axis, instances))
    info = StepInfo(
        model=model.name,
        plan=plan.describe(),
        global_batch=plan.global_batch,
        seq=model.seq,
        flops_hardware=model.flops_per_step(plan.global_batch, "hardware"),
        flops_model=model.flops_per_step(plan.global_batch, "model"),
        memory_per_gpu_bytes=memory_per_gpu(model, plan).total,
    )
    return Schedule(world_size=mesh.size, groups=tuple(groups), programs=programs, info=info)
