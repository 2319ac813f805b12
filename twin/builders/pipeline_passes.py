"""Pipeline stages and their schedule: a stage's forward and backward passes in the pipeline's order.

A stage holds plan.vpp model chunks (twin.builders.stage); this pass runs
them in twin.builders.pipeline's 1F1B or interleaved order, each forward
from the embedding (first virtual stage) or a received activation through
the chunk's blocks to the loss (last virtual stage) or a send, each backward
the other way, with the recompute of full recompute before each block's
backward (only the chunk's first plan.rcl blocks', where rcl is given), or
with recompute=op the part of the block per-operator checkpointing reruns.
Pipeline transfers carry the residual stream's share on this rank (tokens x
hidden / (gy [x gx with sp])); sends never block compute, receives do.
Without sequence parallelism every tensor-parallel rank holds the whole
residual stream, and Megatron sends a 1/gx slice of it from each and
all-gathers the slices after the receive (Megatron-LM's
scatter_gather_tensors_in_pipeline, on by default, in Megatron-DeepSpeed's
p2p_communication.py: split_tensor_into_1d_equal_chunks before the send,
gather_split_1d_tensor after it; DeepSpeed's pipeline engine likewise sends
a PartitionedTensor over the tensor-parallel group and rebuilds it with
full()): the transfer carries 1/gx of the bytes, and an all-gather over x
rebuilds them before the compute that waits for them (plan.p2p "split", the
default; "full" sends the whole tensor from each rank, as megatron.core does
without sequence parallelism). Without a pipeline it is the same loop over
micro-batches, with no transfers.
"""

from __future__ import annotations

from twin.builders.data_parallel import DataParallelWriter
from twin.builders.ends import EndsWriter
from twin.builders.layer import LayerWriter
from twin.builders.pipeline import pipeline_order
from twin.builders.stage import Linear
from twin.builders.tags import Pass
from twin.ir import P2P, Op


class PipelineWriter(LayerWriter, EndsWriter, DataParallelWriter):
    """Writes a stage's micro-batch passes in the pipeline's order, with the transfers between stages."""

    def virtual_stage(self, chunk: int) -> int:
        return chunk * self.plan.pp + self.stage

    def is_first(self, chunk: int) -> bool:
        return self.virtual_stage(chunk) == 0

    def is_last(self, chunk: int) -> bool:
        return self.virtual_stage(chunk) == self.n_virtual - 1

    # ---- pipeline transfers ------------------------------------------------
    def p2p_split(self) -> int:
        """How many slices a transfer's tensor is cut into, one per tensor-parallel rank (module docstring): gx
        where each of them holds the whole residual stream (no sequence parallelism) and plan.p2p splits it,
        else 1."""
        split = self.plan.p2p == "split" and not self.plan.sp
        return self.sizes["x"] if split and self.sizes["x"] > 1 else 1

    def p2p_bytes(self) -> float:
        return self.b * self.residual_elements() / self.p2p_split()

    def receive(self, at: Pass, what: str, peer: int) -> None:
        role = f"recv_{what}"
        op = self.w.collective(f"{at.micro_label}.{role}", "pp", P2P("recv", "pp", peer, self.p2p_bytes(), what),
                               stream=f"p2p:{role}", tag=at.tag("p2p", role))
        self.w.wait(op)
        if self.p2p_split() > 1:  # the slices gathered back into the residual stream
            gather = f"gather_{what}"
            self.blocking(f"{at.micro_label}.{gather}", at.tag("p2p", gather), "all_gather", "x",
                          self.b * self.residual_elements())

    def send(self, at: Pass, what: str, peer: int) -> None:
        role = f"send_{what}"
        self.w.collective(f"{at.micro_label}.{role}", "pp", P2P("send", "pp", peer, self.p2p_bytes(), what),
                          stream=f"p2p:{role}", tag=at.tag("p2p", role))

    def neighbour(self, chunk: int, step: int) -> int:
        """Offset along the pp axis to the virtual stage `step` (+1 or -1) away (wrapping chunks)."""
        target = (self.virtual_stage(chunk) + step) % self.plan.pp
        return target - self.stage

    # ---- passes --------------------------------------------------------------
    @property
    def op_recompute(self) -> bool:
        """recompute=op: each block's backward starts with what per-operator checkpointing reruns
        (LayerWriter.block_op_recompute), which gathers the block's weights as a full recompute does."""
        return self.plan.recompute == "op"

    def pass_of(self, phase: str, mb: int, chunk: int) -> Pass:
        """The pass `phase` of micro-batch `mb` on model chunk `chunk` (chunks tagged with interleaving only)."""
        return Pass(phase, mb, chunk if self.plan.vpp > 1 else None)

    def forward_chunk(self, mb: int, chunk: int) -> None:
        at = self.pass_of("fwd", mb, chunk)
        blocks = self.chunks[chunk]
        if self.is_first(chunk):
            self.wait_for_weights("embed")  # odp: the first use of weights gathered ahead (no-op otherwise)
            self.embedding_forward(at)
        else:
            self.receive(at, "act", self.neighbour(chunk, -1))
        order = [lin for block in blocks for lin in block] + ([self.lm_head] if self.is_last(chunk) else [])
        gathered = None
        for i, block in enumerate(blocks):
            after = order[4 * i + 4] if 4 * i + 4 < len(order) else None
            self.wait_for_weights("layer", block[0].layer)
            gathered = self.block_forward(at, block, gathered, after)
        if self.is_last(chunk):
            self.wait_for_weights("lm_head")
            self.norm_forward(at, "ln_f", None)
            self.linear_forward(at, self.lm_head, gathered, None)
            self.loss(at)
        else:
            self.send(at, "act", self.neighbour(chunk, +1))

    def backward_chunk(self, mb: int, chunk: int) -> None:
        at = self.pass_of("bwd", mb, chunk)
        blocks = self.chunks[chunk][::-1]
        # Whether each block recomputes (its position in the chunk: plan.rcl), so whether, with reshard, its
        # backward gathers its weights again; and the first linear of each block's backward that does, whose
        # gather the one before prefetches (the LM head's for the first block).
        positions = [len(blocks) - 1 - i for i in range(len(blocks))]
        regathers = [self.regathers_block(block, position) for block, position in zip(blocks, positions)]
        firsts = [block[-1] if again else None for block, again in zip(blocks, regathers)] + [None]
        gathered = None
        if self.is_last(chunk):
            # Tied to the word table on one stage: its gradient is summed with the lookup's and accumulated there.
            gathered = self.linear_backward(at, self.lm_head, accumulate=self.plan.pp > 1 or not self.model.tied_head,
                                            prefetch=firsts[0], regather=self.regathers_backward)
            self.layernorm_backward(at, None, "ln_f", grad_add=False)
        else:
            self.receive(at, "grad", self.neighbour(chunk, +1))
        recompute = at.to("rc")
        last = mb == self.plan.ga - 1  # odp: each bucket reduced once its last gradient is in (no-op otherwise)
        for i, block in enumerate(blocks):
            self.rerun_block(recompute, block, positions[i])
            gathered = self.block_backward(at, block, gathered, firsts[i + 1], regathers[i])
            if last:
                self.reduce_buckets_of(("layer",), block[0].layer)
        if self.is_first(chunk):
            self.embedding_backward(at)
        else:
            self.send(at, "grad", self.neighbour(chunk, -1))
        if last:
            self.reduce_buckets_of(("lm_head",) * self.is_last(chunk) + ("embed",) * self.is_first(chunk))
        self.w.wait(*self.deferred_waits)
        self.deferred_waits.clear()

    def layer_passes(self) -> list[Op]:
        """Only the blocks of this stage's first chunk in micro-batch 0's passes (forward, full recompute,
        backward), with nothing around them (no embedding, loss, pipeline transfers, waits at the end of the
        backward, gradient synchronisation or optimizer): what a layer's compute is made of, for the search's
        screen (twin.builders.schedule.build_layer_passes)."""
        forward, backward = self.pass_of("fwd", 0, 0), self.pass_of("bwd", 0, 0)
        for block in self.chunks[0]:
            self.block_forward(forward, block, None, None)
        for position, block in reversed(list(enumerate(self.chunks[0]))):
            self.rerun_block(backward.to("rc"), block, position)
            self.block_backward(backward, block, None, None, self.regathers_block(block, position))
        return self.w.ops

    def rerun_block(self, at: Pass, block: list[Linear], position: int) -> None:
        """What the block at `position` of its model chunk reruns before its backward, in the recompute pass `at`:
        its whole forward where that position recomputes in full (plan.recomputes), recompute=op's part of it
        (LayerWriter.block_op_recompute), or nothing."""
        if self.plan.recomputes(position):
            self.block_forward(at, block, None, None)
        elif self.op_recompute:
            self.block_op_recompute(at, block)

    def regathers_block(self, block: list[Linear], position: int) -> bool:
        """Whether `block`, at `position` in its chunk, gathers its weights again for its backward
        (LinearWriter.regathers): where what it reruns first (rerun_block: a full recompute, or recompute=op's,
        which gathers the block's weights as the full one does) has not gathered them back."""
        return self.regathers(self.plan.recomputes(position) or self.op_recompute, block[0].layer)

    def run_pipeline(self) -> None:
        """Every micro-batch's forward and backward on this stage, in the pipeline's order."""
        for step in pipeline_order(self.plan.pp, self.plan.vpp, self.plan.ga, self.stage):
            if step.kind == "F":
                self.forward_chunk(step.micro_batch, step.chunk)
            else:
                self.backward_chunk(step.micro_batch, step.chunk)
