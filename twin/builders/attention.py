"""The attention core of one transformer layer: flash, or Megatron's unfused core attention (plan.attention).

twin.builders.schedule's module docstring lists the kernels of each. The core
runs on the heads / gx local heads of each of the mbs sequences, replicated
over gy like every op between the QKV and attention-output linears. Its ops
are tagged block "attn", each kernel its role ("fwd" and "bwd" for the flash
kernels themselves). With context parallelism (cp > 1) the flash kernel is
ring attention's steps (twin.builders.ring_attention), or with
cpcomm=allgather the kernels around K and V all-gathered
(twin.builders.gathered_attention).

With grouped-query attention (ModelSpec.kv_heads < heads) k and v, and their
copies and gradients, are kv_heads / heads the size of q. The flash kernel
reads them in place (its FLOPs are the query heads'); unfused attention first
expands them to every query head (a copy each, repeat_interleave) and sums the
expanded gradients back (a reduction each).
"""

from __future__ import annotations

from twin.builders.megatron_kernels import (
    ATTENTION_DROPOUT_BACKWARD_BYTES, ATTENTION_DROPOUT_BYTES, COPY_BYTES, DROPOUT_FLOPS, FLASH_COPIED,
    SEQLENS_BYTES, SOFTMAX_BACKWARD_BYTES, SOFTMAX_BYTES, SOFTMAX_FLOPS, fused_softmax_available, torch_softmax_kernels,
)
from twin.builders.eager_kernels import REPEAT_KV_BYTES
from twin.builders.gathered_attention import GatheredAttentionWriter
from twin.builders.ring_attention import RingAttentionWriter
from twin.builders.tags import Pass
from twin.ir import Attention, Gemm, OpTag


class AttentionWriter(RingAttentionWriter, GatheredAttentionWriter):
    """Writes a layer's attention core, forward (in the forward pass and in either recompute) and backward."""

    def attention_forward(self, at: Pass, layer: int) -> None:
        """The attention core's forward, in the forward pass and in either recompute."""
        heads = self.head_elements()
        if self.plan.attention == "flash":
            eager = self.plan.kernels == "eager"  # torchtitan's SDPA call: no cu_seqlens, the output always copied
            self.flash_input_copies(at, layer)
            if not eager:
                self.elementwise(*self.kernel(at, "attn", "seqlens", layer), self.plan.mbs + 1, SEQLENS_BYTES, 1)
            if self.plan.cp > 1 and self.plan.cpcomm == "allgather":
                self.gathered_forward(at, layer)
            elif self.plan.cp > 1:
                self.ring_forward(at, layer)
            else:
                name, tag = self.kernel(at, "attn", "fwd", layer)
                self.w.compute(name, self.flash_attention(backward=False), tag=tag)
            if self.plan.mbs > 1 or eager:
                self.elementwise(*self.kernel(at, "attn", "context_copy", layer), heads, COPY_BYTES, 0)
            return
        s, d = self.model.seq, self.model.head_dim
        if self.model.kv_heads < self.model.heads:
            for which in ("k", "v"):
                self.elementwise(*self.kernel(at, "attn", f"{which}_expand", layer), heads, COPY_BYTES, 0)
        self.batched_gemm(*self.kernel(at, "attn", "scores", layer), s, s, d, "NT")  # Q K^T
        self.softmax(at, layer, backward=False)
        if self.model.dropout:
            self.score_elementwise(*self.kernel(at, "attn", "dropout", layer), ATTENTION_DROPOUT_BYTES, DROPOUT_FLOPS)
        self.batched_gemm(*self.kernel(at, "attn", "context", layer), s, d, s, "NN")  # probs V
        self.elementwise(*self.kernel(at, "attn", "context_copy", layer), heads, COPY_BYTES, 0)

    def flash_input_copies(self, at: Pass, layer: int) -> None:
        """The copies that lay q, k and v out for the flash kernel (FLASH_COPIED; eager, grouped-query attention's
        k and v copied out to every head, twin.builders.eager_kernels), in the forward and in what recompute=op
        reruns: the kernel's inputs, which its backward reads."""
        if self.plan.kernels == "eager":
            if self.model.kv_heads < self.model.heads:
                for which in ("k", "v"):
                    self.elementwise(*self.kernel(at, "attn", f"{which}_repeat", layer), self.head_elements(),
                                     REPEAT_KV_BYTES, 0)
            return
        for which in FLASH_COPIED:
            self.elementwise(*self.kernel(at, "attn", f"{which}_copy", layer), self.qkv_part_elements(which),
                             COPY_BYTES, 0)

    def eager_flash_backward(self, at: Pass, layer: int) -> None:
        """torchtitan's SDPA backward (kernels=eager, one rank a sequence): the kernel, then grouped-query
        attention's expanded k and v gradients summed back to their heads (twin.builders.eager_kernels)."""
        name, tag = self.kernel(at, "attn", "bwd", layer)
        self.w.compute(name, self.flash_attention(backward=True), tag=tag)
        if self.model.kv_heads < self.model.heads:
            for which in ("k", "v"):
                self.elementwise(*self.kernel(at, "attn", f"{which}_repeat_bwd", layer), self.head_elements(),
                                 2 + 2 * self.model.kv_fraction, 1)

    def attention_backward(self, at: Pass, layer: int) -> None:
        """The attention core's backward (pass `at`); selective recompute first reruns the unfused forward."""
        heads = self.head_elements()
        if self.plan.attention == "flash" and self.plan.kernels == "eager":
            self.eager_flash_backward(at, layer)
            return
        if self.plan.attention == "flash":  # nothing to recompute: the kernel rebuilds its scores itself
            if self.plan.mbs > 1:
                self.elementwise(*self.kernel(at, "attn", "bwd_copy", layer), heads, COPY_BYTES, 0)
            if self.plan.cp > 1 and self.plan.cpcomm == "allgather":
                self.gathered_backward(at, layer)
            elif self.plan.cp > 1:
                self.ring_backward(at, layer)
            else:
                name, tag = self.kernel(at, "attn", "bwd", layer)
                self.w.compute(name, self.flash_attention(backward=True), tag=tag)
            if self.plan.mbs == 1:
                self.elementwise(*self.kernel(at, "attn", "qkv_grad", layer),
                                 sum(self.qkv_part_elements(which) for which in FLASH_COPIED), COPY_BYTES, 0)
            else:
                self.qkv_gradient_copies(at, layer)
            return
        if self.plan.recompute == "selective":
            self.attention_forward(at.to("rc"), layer)
        s, d = self.model.seq, self.model.head_dim
        self.batched_gemm(*self.kernel(at, "attn", "context_dV", layer), s, d, s, "TN")  # probs^T dO
        self.batched_gemm(*self.kernel(at, "attn", "context_dP", layer), s, s, d, "NT")  # dO V^T
        if self.model.dropout:
            self.score_elementwise(*self.kernel(at, "attn", "dropout_bwd", layer), ATTENTION_DROPOUT_BACKWARD_BYTES,
                                   DROPOUT_FLOPS)
        self.softmax(at, layer, backward=True)
        self.batched_gemm(*self.kernel(at, "attn", "scores_dQ", layer), s, d, s, "NN")  # dS K
        self.elementwise(*self.kernel(at, "attn", "scores_dQ_scale", layer), heads, COPY_BYTES, 1)
        self.batched_gemm(*self.kernel(at, "attn", "scores_dK", layer), s, d, s, "TN")  # dS^T Q
        self.elementwise(*self.kernel(at, "attn", "scores_dK_scale", layer), heads, COPY_BYTES, 1)
        if self.model.kv_heads < self.model.heads:
            for which in ("k", "v"):
                self.elementwise(*self.kernel(at, "attn", f"{which}_expand_bwd", layer), heads, COPY_BYTES, 1)
        self.qkv_gradient_copies(at, layer)

    def softmax(self, at: Pass, layer: int, backward: bool) -> None:
        """FusedScaleMaskSoftmax, one direction: the fused kernel where Megatron can run it on these scores, else
        torch's five kernels (twin.builders.megatron_kernels: at tp=8 of 16 heads and mbs=1 every layer has them)."""
        if fused_softmax_available(self.model.seq, self.attention_heads(), self.b):
            role, nbytes = ("softmax_bwd", SOFTMAX_BACKWARD_BYTES) if backward else ("softmax", SOFTMAX_BYTES)
            self.score_elementwise(*self.kernel(at, "attn", role, layer), nbytes, SOFTMAX_FLOPS)
            return
        for role, nbytes, flops in torch_softmax_kernels(backward, self.b):
            self.score_elementwise(*self.kernel(at, "attn", role, layer), nbytes, flops)

    def qkv_gradient_copies(self, at: Pass, layer: int) -> None:
        """torch.cat of strided q, k, v gradients into the QKV output's gradient: one copy each."""
        for which in FLASH_COPIED:
            self.elementwise(*self.kernel(at, "attn", f"{which}_grad", layer), self.qkv_part_elements(which),
                             COPY_BYTES, 0)

    def qkv_part_elements(self, which: str) -> float:
        """Elements of q, k or v on this rank: k and v are kv_heads / heads of q's with grouped-query attention."""
        return self.head_elements() * (1.0 if which == "q" else self.model.kv_fraction)

    def attention_heads(self) -> int:
        """Independent (sequence, local head) pairs: the batch of every unfused attention GEMM."""
        return self.plan.mbs * self.model.heads // self.sizes["x"]

    def batched_gemm(self, name: str, tag: OpTag, m: int, n: int, k: int, layout: str) -> int:
        """One per-head GEMM of unfused attention (torch.bmm/baddbmm in Megatron: not layout-tuned)."""
        return self.w.compute(name, Gemm(m, n, k, layout, self.dtype, batch=self.attention_heads()), tag=tag)

    def score_elementwise(self, name: str, tag: OpTag, bytes_per_element: float, flops_per_element: float) -> int:
        """A memory-bound kernel over the whole score tensor (attention_heads x s x s elements)."""
        return self.elementwise(name, tag, self.attention_heads() * self.model.seq**2, bytes_per_element,
                                flops_per_element)

    def flash_attention(self, backward: bool) -> Attention:
        model = self.model
        return Attention(
            batch=self.plan.mbs, seq=model.seq, heads=model.heads // self.sizes["x"],
            head_dim=model.head_dim, backward=backward, causal=True, dtype=self.dtype,
        )
