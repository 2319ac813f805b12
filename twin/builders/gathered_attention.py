"""Context parallelism's attention with K and V all-gathered (plan.cpcomm "allgather").

Transformer Engine's AttnFuncWithCPAndKVAllGather (Megatron-Core's
--cp-comm-type all_gather), the variant the Llama 3 paper describes (sec.
3.3.2: with grouped-query attention K and V are small, so gathering them
costs less than passing them around a ring under the kernels). Each rank
holds chunks r and 2 cp - 1 - r of each sequence's 2 cp chunks, as with the
ring (twin.builders.ring_attention), and per layer:

- forward: K, then V, all-gathered over the cp ranks (each a blocking
  all-gather of the whole sequence's K or V on this rank's local heads), each
  reordered into sequence order (an index_select copy); then one attention
  kernel per local chunk, its queries against the gathered keys up to the
  chunk's end (TE runs the two on two streams at once); then the two halves'
  outputs copied into one tensor;
- backward: K and V gathered and reordered again (TE saves only the local K
  and V), the two chunks' backward kernels, dQ's copy, dK and dV built over
  the whole sequence (zeroed, each chunk's partial copied and added in),
  reordered back, and reduce-scattered over the cp ranks, dK then dV, each
  blocking.

The two kernels of a pass do as much work together as the ring's cp steps:
chunk j's queries (c = s / 2 cp of them) meet j whole c x c blocks and one
causal one, and chunks r and 2 cp - 1 - r together meet 2 cp - 1 whole
blocks and two causal ones, 4 cp causal c x c squares in all, on every rank.
The IR's Attention is causal and square, so each kernel is written as 2 cp
causal squares of c tokens (batch mbs x 2 cp): the FLOPs of each rank's two
real kernels, split evenly between them (the real split, 2 r + 1 against
4 cp - 2 r - 1 squares, differs by rank, and the two run at once). The
gathered K and V, like the ring's blocks in flight, are transient and left
out of memory (twin.memory).
"""

from __future__ import annotations

from twin.builders.megatron_kernels import COPY_BYTES, GATHERED_DKV_BYTES
from twin.builders.stage import StageBase
from twin.builders.tags import Pass
from twin.ir import Attention

LOCAL_CHUNKS = 2  # each rank's two chunks of every sequence (load-balanced causal attention)


class GatheredAttentionWriter(StageBase):
    """Writes the all-gather variant's forward and backward for one layer (module docstring)."""

    def gathered_forward(self, at: Pass, layer: int) -> None:
        self.gathered_kernels(at, layer, backward=False)
        self.elementwise(*self.kernel(at, "attn", "out_copy", layer), self.head_elements(), COPY_BYTES, 0)

    def gathered_backward(self, at: Pass, layer: int) -> None:
        self.gathered_kernels(at, layer, backward=True)
        self.elementwise(*self.kernel(at, "attn", "dq_copy", layer), self.head_elements(), COPY_BYTES, 0)
        whole = 2 * self.gathered_elements()  # dK and dV over the whole sequence
        self.elementwise(*self.kernel(at, "attn", "dkv_accumulate", layer), whole, GATHERED_DKV_BYTES, 1)
        self.elementwise(*self.kernel(at, "attn", "dkv_reorder", layer), whole, COPY_BYTES, 0)
        for which in ("dk", "dv"):
            self.blocking(*self.kernel(at, "attn", f"{which}_scatter", layer), "reduce_scatter", "cp",
                          self.b * self.gathered_elements())

    def gathered_kernels(self, at: Pass, layer: int, backward: bool) -> None:
        """K, then V, all-gathered over cp (blocking) and each reordered into sequence order; then the two local
        chunks' kernels, one way."""
        for which in ("k", "v"):
            self.blocking(*self.kernel(at, "attn", f"{which}_gather", layer), "all_gather", "cp",
                          self.b * self.gathered_elements())
            self.elementwise(*self.kernel(at, "attn", f"{which}_reorder", layer), self.gathered_elements(),
                             COPY_BYTES, 0)
        name, tag = self.kernel(at, "attn", "bwd" if backward else "fwd", layer)
        for chunk in range(LOCAL_CHUNKS):
            self.w.compute(f"{name}.chunk{chunk}", self.gathered_block(backward), tag=tag)

    def gathered_elements(self) -> float:
        """K (or V) of the whole sequence on this rank's local K/V heads: cp shares, in elements."""
        return self.plan.cp * self.head_elements() * self.model.kv_fraction

    def gathered_block(self, backward: bool) -> Attention:
        """One local chunk's kernel: 2 cp causal squares of a chunk's s / 2 cp tokens (module docstring)."""
        model, chunks = self.model, LOCAL_CHUNKS * self.plan.cp
        return Attention(batch=self.plan.mbs * chunks, seq=model.seq // chunks, heads=model.heads // self.sizes["x"],
                         head_dim=model.head_dim, backward=backward, causal=True, dtype=self.dtype)
