"""One transformer layer (ParallelTransformerLayer): its forward, its backward in autograd's order, its layer norms.

The linears come from twin.builders.linears, the attention core from
twin.builders.attention; what is left are the layer's own memory-bound
kernels (layer norms, bias-GeLU, the bias-dropout-adds), counted as
twin.builders.schedule's module docstring lists them. A Llama layer
(ModelSpec.arch) has RMSNorms, no biases, rotary embedding on q and k after
the QKV linear, and SwiGLU where GPT has GeLU.
"""

from __future__ import annotations

from twin.builders.attention import AttentionWriter
from twin.builders.eager_kernels import (
    RMSNORM_BACKWARD, RMSNORM_FORWARD, ROPE_BACKWARD, ROPE_FORWARD, ROW, SWIGLU_BACKWARD, SWIGLU_FORWARD,
)
from twin.builders.linears import LinearWriter
from twin.builders.megatron_kernels import (
    BIAS_ADD_BYTES, DROPOUT_BACKWARD_BYTES, GELU_BACKWARD_BYTES, GELU_BYTES, GRAD_ADD_BYTES, LAYERNORM_BACKWARD_BYTES,
    LAYERNORM_BYTES, LAYERNORM_PARTIAL_BYTES, LAYERNORM_PARTIAL_ROWS, LAYERNORM_PARTIAL_SUM_BYTES,
    PERSISTENT_LAYERNORM_HIDDEN, RESIDUAL_ADD_BYTES, RESIDUAL_DROPOUT_BYTES, RMSNORM_PARTIAL_SUM_BYTES, ROPE_BYTES,
    ROPE_FLOPS, SWIGLU_BACKWARD_BYTES, SWIGLU_BYTES, SWIGLU_FLOPS,
)
from twin.builders.replay import BlockRecorder
from twin.builders.stage import Linear
from twin.builders.tags import Pass


class LayerWriter(LinearWriter, AttentionWriter):
    """Writes whole transformer layers, and the layer norms' backward (the final norm's too).

    Each kind of block pass is written once and copied for the other layers and micro-batches
    (twin.builders.replay)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.blocks = BlockRecorder()

    def block_forward(self, at: Pass, linears: list[Linear], gathered: int | None, after: Linear | None) -> int | None:
        """One transformer block (ParallelTransformerLayer.forward) in the pass `at` (forward or full recompute);
        `after`: the next linear in module order (oag). Returns the prefetched gather of `after`'s weights."""
        layer = linears[0].layer
        prefetch = None if after is None else (after.block, None if after.layer is None else after.layer - layer)
        held = self.holds_cached_weights(at, layer)
        kind = ("forward", prefetch, held)
        return self.blocks.write(self.w, kind, at, layer, gathered, self.deferred_waits,
                                 lambda: self.write_block_forward(at, linears, gathered, after, held))

    def block_backward(self, at: Pass, linears: list[Linear], gathered: int | None, after: Linear | None,
                       regather: bool) -> int | None:
        """One block's backward in the pass `at` (selective recompute adds recompute ops), in autograd's order.
        Where it gathers its weights again (`regather`: LinearWriter.regathers for whether the block recomputed),
        `gathered` is the first linear's, prefetched by the block before. `after` is the next linear of the
        backward that gathers again (None where there is none), whose gather this block prefetches and returns."""
        layer = linears[0].layer
        prefetch = None if after is None else (after.block, None if after.layer is None else after.layer - layer)
        return self.blocks.write(self.w, ("backward", prefetch, regather), at, layer, gathered, self.deferred_waits,
                                 lambda: self.write_block_backward(at, linears, gathered, after, regather))

    def block_op_recompute(self, at: Pass, linears: list[Linear]) -> None:
        """What recompute=op (twin.plan: torchtitan's per-operator checkpointing) reruns of one block before its
        backward, in the recompute pass `at`. Where FSDP freed the block's sharded weights after its forward
        (reshard) it gathers them back, all four (FSDP gathers a block's parameters before the backward that reruns
        these ops), so the backward that follows gathers none again; without reshard they are still held."""
        layer = linears[0].layer
        self.blocks.write(self.w, ("op_recompute", self.caches_weights(layer)), at, layer, None, self.deferred_waits,
                          lambda: self.write_block_op_recompute(at, linears))

    def write_block_op_recompute(self, at: Pass, linears: list[Linear]) -> None:
        """block_op_recompute, op by op. Of a Llama block's matrix multiplies in execution order (wq, wk, wv, wo,
        w1, w3, w2) the policy keeps the odd ones' outputs and reruns the even ones: wk (the k columns of the fused
        QKV), wo and w3 (the up half of the fused gate and up); and it reruns the element-wise work between what
        it keeps and what the backward reads: ln1, the rotary embedding of q and k and the flash kernel's input
        copies (the kernel's output is kept), the residual add, ln2, and SwiGLU (the down projection's input).
        w2's output is kept and the second residual add's backward reads nothing, so the rerun ends there."""
        res, f = self.residual_elements(), self.model.ffn
        qkv, attn_out, up, down = linears
        layer = qkv.layer
        held = not self.regathers(recomputed=False, layer=layer)  # the forward's gathered weights, unless resharded
        self.norm_forward(at, "ln1", layer)
        gathered = self.partial_forward(at, qkv, None, attn_out, self.model.hidden * self.model.kv_fraction, held)
        self.rotary(at, layer, backward=False)
        self.flash_input_copies(at, layer)
        gathered = self.linear_forward(at, attn_out, gathered, up, held)
        self.elementwise(*self.kernel(at, "resid1", "fwd", layer), res, RESIDUAL_ADD_BYTES, 1)
        self.norm_forward(at, "ln2", layer)
        gathered = self.partial_forward(at, up, gathered, down, f, held)
        self.swiglu(at, layer, backward=False)
        if not held:  # the backward's first linear: its weights gathered back too
            self.forward_gather(at, down, gathered, None)

    def write_block_forward(self, at: Pass, linears: list[Linear], gathered: int | None,
                            after: Linear | None, held: bool = False) -> int | None:
        """block_forward, op by op; `held`: the block's weights are still gathered (holds_cached_weights)."""
        res, f, gx = self.residual_elements(), self.model.ffn, self.sizes["x"]
        m = self.tokens
        qkv, attn_out, up, down = linears
        layer = qkv.layer
        biased = self.model.biased
        self.norm_forward(at, "ln1", layer)
        gathered = self.linear_forward(at, qkv, gathered, attn_out, held)
        if biased:
            self.elementwise(*self.named(at, qkv, "bias"), self.output_elements(qkv), BIAS_ADD_BYTES, 1)
        else:
            self.rotary(at, layer, backward=False)
        self.attention_forward(at, layer)
        gathered = self.linear_forward(at, attn_out, gathered, up, held)
        residual_bytes, dropped = (RESIDUAL_DROPOUT_BYTES, 1) if self.model.dropout else (RESIDUAL_ADD_BYTES, 0)
        self.elementwise(*self.kernel(at, "resid1", "fwd", layer), res, residual_bytes, 1 + biased + dropped)
        self.norm_forward(at, "ln2", layer)
        gathered = self.linear_forward(at, up, gathered, down, held)
        if self.model.gated:
            self.swiglu(at, layer, backward=False)
        else:
            self.elementwise(*self.kernel(at, "gelu", "fwd", layer), m * f / gx, GELU_BYTES, 8)
        gathered = self.linear_forward(at, down, gathered, after, held)
        if biased:
            self.elementwise(*self.named(at, down, "bias"), self.output_elements(down), BIAS_ADD_BYTES, 1)
        self.elementwise(*self.kernel(at, "resid2", "fwd", layer), res, residual_bytes, 1 + dropped)
        return gathered

    def rotary(self, at: Pass, layer: int, backward: bool) -> None:
        """Rotary position embedding (Llama): one kernel on q and one on k (kv_heads of them), each direction; three
        each in eager PyTorch (twin.builders.eager_kernels)."""
        if self.plan.kernels == "eager":
            kernels = ROPE_BACKWARD if backward else ROPE_FORWARD
        else:
            kernels = (("bwd" if backward else "fwd", ROPE_BYTES, ROPE_FLOPS),)
        for which, fraction in (("q", 1.0), ("k", self.model.kv_fraction)):
            for role, nbytes, flops in kernels:
                self.elementwise(*self.kernel(at, f"rope_{which}", role, layer), self.head_elements() * fraction,
                                 nbytes, flops)

    def swiglu(self, at: Pass, layer: int, backward: bool) -> None:
        """SwiGLU's element-wise work on the ffn/gx products of each token: Megatron-Core's fused kernel each way, or
        eager PyTorch's silu and multiply (twin.builders.eager_kernels)."""
        if self.plan.kernels == "eager":
            kernels = SWIGLU_BACKWARD if backward else SWIGLU_FORWARD
        else:
            kernels = (("bwd", SWIGLU_BACKWARD_BYTES, SWIGLU_FLOPS) if backward else ("fwd", SWIGLU_BYTES, SWIGLU_FLOPS),)
        for role, nbytes, flops in kernels:
            self.elementwise(*self.kernel(at, "swiglu", role, layer), self.tokens * self.model.ffn / self.sizes["x"],
                             nbytes, flops)

    def write_block_backward(self, at: Pass, linears: list[Linear], gathered: int | None, after: Linear | None,
                             regather: bool) -> int | None:
        """block_backward, op by op: each linear's gather prefetched by the one before where the block gathers
        again."""
        res, f, gx = self.residual_elements(), self.model.ffn, self.sizes["x"]
        m = self.tokens
        qkv, attn_out, up, down = linears
        assert regather or gathered is None, "a block that does not gather its weights again has none prefetched"

        def inside(lin: Linear) -> Linear | None:
            """The block's next linear to prefetch: none where the block does not gather again."""
            return lin if regather else None

        layer = qkv.layer
        biased = self.model.biased
        if self.model.dropout:
            self.elementwise(*self.kernel(at, "resid2", "bwd", layer), res, DROPOUT_BACKWARD_BYTES, 2)
        if biased:
            self.bias_backward(at, down)
        gathered = self.linear_backward(at, down, gathered=gathered, prefetch=inside(up), regather=regather)
        if self.model.gated:
            self.swiglu(at, layer, backward=True)
        else:
            self.elementwise(*self.kernel(at, "gelu", "bwd", layer), m * f / gx, GELU_BACKWARD_BYTES, 8)
        if biased:
            self.bias_backward(at, up)
        gathered = self.linear_backward(at, up, gathered=gathered, prefetch=inside(attn_out), regather=regather)
        self.layernorm_backward(at, layer, "ln2", grad_add=True)
        if self.model.dropout:
            self.elementwise(*self.kernel(at, "resid1", "bwd", layer), res, DROPOUT_BACKWARD_BYTES, 2)
        if biased:
            self.bias_backward(at, attn_out)
        gathered = self.linear_backward(at, attn_out, gathered=gathered, prefetch=inside(qkv), regather=regather)
        self.attention_backward(at, layer)
        if not biased:
            self.rotary(at, layer, backward=True)
        gathered = self.linear_backward(at, qkv, bias=biased, gathered=gathered, prefetch=after,
                                        regather=regather)
        self.layernorm_backward(at, layer, "ln1", grad_add=True)
        return gathered

    def norm_forward(self, at: Pass, block: str, layer: int | None) -> None:
        """A layer norm's forward (ln1, ln2, the final ln_f) in the pass `at`: one fused kernel, or under norm=eager
        torch's RMSNorm module op by op (twin.builders.eager_kernels)."""
        if self.plan.norm == "eager":
            self.eager_norm(at, block, layer, RMSNORM_FORWARD)
        else:
            self.elementwise(*self.kernel(at, block, "fwd", layer), self.residual_elements(), LAYERNORM_BYTES, 5)

    def eager_norm(self, at: Pass, block: str, layer: int | None, kernels: tuple) -> None:
        """torch's RMSNorm kernels `kernels` (RMSNORM_FORWARD or _BACKWARD), each over the residual stream's
        elements or over its tokens (the hidden is whole on a rank: plan_checks refuses gy > 1)."""
        res = self.residual_elements()
        for role, nbytes, flops, per in kernels:
            self.elementwise(*self.kernel(at, block, role, layer), res / self.model.hidden if per == ROW else res,
                             nbytes, flops)

    def layernorm_backward(self, at: Pass, layer: int | None, block: str, grad_add: bool) -> None:
        """A layer norm's backward kernels (LAYERNORM_* constants, or torch's RMSNorm's under norm=eager) in the pass
        `at`, autograd's sum of the residual stream's two gradients when it has two consumers (`grad_add`), then
        the accumulation of gamma and beta."""
        res, hidden = self.residual_elements(), self.norm_params()
        partial_flops = 2 * LAYERNORM_PARTIAL_ROWS
        sum_bytes = LAYERNORM_PARTIAL_SUM_BYTES if self.model.biased else RMSNORM_PARTIAL_SUM_BYTES
        if self.plan.norm == "eager":
            self.eager_norm(at, block, layer, RMSNORM_BACKWARD)
        elif self.model.hidden in PERSISTENT_LAYERNORM_HIDDEN:
            self.elementwise(*self.kernel(at, block, "bwd", layer), res, LAYERNORM_BACKWARD_BYTES, 8)
            self.elementwise(*self.kernel(at, block, "bwd_params_sum", layer), hidden, sum_bytes, partial_flops)
        else:
            self.elementwise(*self.kernel(at, block, "bwd_params", layer), res, LAYERNORM_PARTIAL_BYTES, 4)
            self.elementwise(*self.kernel(at, block, "bwd_params_sum", layer), hidden, sum_bytes, partial_flops)
            self.elementwise(*self.kernel(at, block, "bwd", layer), res, LAYERNORM_BACKWARD_BYTES, 8)
        if grad_add:
            self.elementwise(*self.kernel(at, block, "grad_add", layer), res, GRAD_ADD_BYTES, 1)
        self.accumulate(at, block, layer, "weight", hidden)
        if self.model.biased:  # LayerNorm's beta; RMSNorm has none
            self.accumulate(at, block, layer, "bias", hidden)
