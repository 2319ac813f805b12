"""Context parallelism's attention: ring attention over the cp ranks, as Megatron-Core runs it.

With cp > 1 each rank holds 2 of the sequence's 2 cp chunks (chunks r and
2 cp - 1 - r, so every rank has as much causal work as the others) and the
K and V of its own tokens. Attention runs in cp steps around the group's
ring (Megatron-Core's AttnFuncWithCPAndKVP2P, torchtitan's ring attention):

- forward, step i: the K/V block held is sent on to the next rank while the
  kernel attends this rank's queries to it (the shift is issued before the
  kernel and waited before the next step's); from step 1 on, the partial
  output is merged into the running one by its log-sum-exp ("out
  correction");
- backward, step i: the K/V block moves on as in the forward, and so does
  the gradient of the block held before (dK and dV, summed by each rank it
  visits: "dkv_shift" then "dkv_add"); after the last step one more shift
  brings each block's summed gradient home, and the rank waits for it.

Each step's kernel is the IR's causal Attention over the cp-th share of the
sequence: step 0 is causal within the rank's two chunks, and every later
step attends half a block (queries of the later chunk to the whole block, or
all queries to its earlier chunk), which is the same number of FLOPs as a
causal square of the share. Shifts are the IR's "shift" collective over the
"cp" group (each member to the next, the last to the first), K and V
together (two tensors of the share's tokens x local K/V heads: kv_heads / heads
of q's with grouped-query attention), and dK and dV in the model's dtype. Not
counted: the kernels that split and re-join the two chunks, and the loss's
all-reduce over cp (one number per micro-batch).
"""

from __future__ import annotations

from twin.builders.megatron_kernels import RING_ADD_BYTES, RING_CORRECTION_BYTES
from twin.builders.stage import StageBase
from twin.builders.tags import Pass
from twin.ir import Attention, Collective


class RingAttentionWriter(StageBase):
    """Writes ring attention's forward and backward steps for one layer (module docstring)."""

    def ring_forward(self, at: Pass, layer: int) -> None:
        name, _ = self.kernel(at, "attn", "fwd", layer)
        for step in range(self.plan.cp):
            shift = self.shift(at, layer, "kv", step) if step < self.plan.cp - 1 else None
            self.w.compute(f"{name}.ring{step}", self.ring_block(backward=False), tag=at.tag("attn", "fwd", layer))
            if step:
                self.elementwise(f"{name}.ring{step}.out_correction", at.tag("attn", "out_correction", layer),
                                 self.head_elements(), RING_CORRECTION_BYTES, 4)
            if shift is not None:
                self.w.wait(shift)

    def ring_backward(self, at: Pass, layer: int) -> None:
        name, _ = self.kernel(at, "attn", "bwd", layer)
        for step in range(self.plan.cp):
            shift = self.shift(at, layer, "kv", step) if step < self.plan.cp - 1 else None
            travelling = self.shift(at, layer, "dkv", step) if step else None  # the sum of the block held before
            self.w.compute(f"{name}.ring{step}", self.ring_block(backward=True), tag=at.tag("attn", "bwd", layer))
            if travelling is not None:
                self.w.wait(travelling)
                self.elementwise(f"{name}.ring{step}.dkv_add", at.tag("attn", "dkv_add", layer),
                                 self.kv_elements(), RING_ADD_BYTES, 1)
            if shift is not None:
                self.w.wait(shift)
        self.w.wait(self.shift(at, layer, "dkv", self.plan.cp))  # each block's gradient home

    def shift(self, at: Pass, layer: int, what: str, step: int) -> int:
        """`what` on to the next rank at `step`: "kv", K and V of the block held (the next step's there), or
        "dkv", dK and dV summed so far for the block held at step - 1. Role <what>_shift."""
        return self.w.collective(f"{at.label}.L{layer}.attn_{what}_shift{step}", "cp",
                                 Collective("shift", "cp", self.b * self.kv_elements(), self.dtype),
                                 tag=at.tag("attn", f"{what}_shift", layer))

    def kv_elements(self) -> float:
        """K and V of this rank's share together (or their gradients): what one shift carries, in elements."""
        return 2 * self.head_elements() * self.model.kv_fraction

    def ring_block(self, backward: bool) -> Attention:
        """One step's kernel: causal attention over this rank's share of each sequence (module docstring)."""
        model = self.model
        return Attention(batch=self.plan.mbs, seq=model.seq // self.plan.cp, heads=model.heads // self.sizes["x"],
                         head_dim=model.head_dim, backward=backward, causal=True, dtype=self.dtype)
