"""The model's two ends on a pipeline's first and last stage: the embedding, and the vocabulary-parallel loss.

Their kernels are counted in twin.builders.megatron_kernels (EMBEDDING_* and
LOSS_* constants) and listed in twin.builders.schedule's module docstring. Ops
are tagged block "embed" or "loss", outside any layer, in the forward or
backward pass of their micro-batch.
"""

from __future__ import annotations

from twin.builders.megatron_kernels import (
    COPY_BYTES, DROPOUT_BACKWARD_BYTES, DROPOUT_FLOPS, EMBEDDING_ADD_BYTES, EMBEDDING_DIRECT_MAX_INDICES,
    EMBEDDING_DROPOUT_BYTES, EMBEDDING_LOOKUP_BYTES, EMBEDDING_MASK_BYTES, EMBEDDING_SCATTER_BYTES,
    EMBEDDING_SORTED_KERNELS, EMBEDDING_VOCAB_TOKEN_KERNELS, GRAD_ADD_BYTES, LOSS_BACKWARD_KERNELS,
    LOSS_BACKWARD_TOKEN_KERNELS, LOSS_KERNELS, LOSS_TOKEN_KERNELS, TOKEN_KERNEL_BYTES,
)
from twin.builders.stage import StageBase
from twin.builders.tags import Pass
from twin.ir import OpTag


class EndsWriter(StageBase):
    """Writes the embedding's forward and backward and the loss of one micro-batch."""

    @staticmethod
    def end_op(at: Pass, block: str, role: str, label: str | None = None) -> tuple[str, OpTag]:
        """An op of the embedding or the loss in the pass `at`, its name and its tag: named <mb>.<block>.<label> in
        the forward, <mb>.<block>_bwd.<label> in the backward (`label` defaults to the role)."""
        part = block if at.phase == "fwd" else f"{block}_{at.phase}"
        return f"{at.micro_label}.{part}.{label or role}", at.tag(block, role)

    # ---- the loss ----------------------------------------------------------
    def loss(self, at: Pass) -> None:
        """Vocabulary-parallel cross entropy (LOSS_* constants) of the forward pass `at`: logits split over X; the
        max, the target logit and the sum of exponentials all-reduced over X, one fp32 per token each; then the
        backward's kernels, which run in the same place (Megatron computes them with the loss)."""
        logits = self.tokens * self.model.vocab / self.sizes["x"]
        kernels = dict((name, (nbytes, flops)) for name, nbytes, flops in LOSS_KERNELS)
        backward = at.to("bwd")
        tokens = 0

        def token_kernels(count: int, where: Pass) -> None:
            nonlocal tokens
            for _ in range(count):
                self.elementwise(*self.end_op(where, "loss", "token", f"token{tokens}"), self.tokens,
                                 TOKEN_KERNEL_BYTES, 1)
                tokens += 1

        def kernel(name: str) -> None:
            nbytes, flops = kernels[name]
            self.elementwise(*self.end_op(at, "loss", name), logits, nbytes, flops)

        def all_reduce(what: str) -> None:
            if self.sizes["x"] > 1:
                self.blocking(*self.end_op(at, "loss", "ar_x", f"{what}.ar_x"), "all_reduce", "x", 4 * self.tokens,
                              "fp32")

        kernel("cast")
        kernel("max")
        all_reduce("max")
        kernel("sub")
        token_kernels(10, at)  # the vocabulary-range masks and the target gather
        all_reduce("target")
        kernel("exp")
        kernel("sum")
        all_reduce("sum")
        kernel("div")
        token_kernels(LOSS_TOKEN_KERNELS - 10, at)  # log, subtract; the loss function; the scalings
        tokens = 0
        token_kernels(LOSS_BACKWARD_TOKEN_KERNELS, backward)
        for name, nbytes, flops in LOSS_BACKWARD_KERNELS:
            self.elementwise(*self.end_op(backward, "loss", name), logits, nbytes, flops)

    # ---- the embedding -------------------------------------------------------
    def embedding_elements(self) -> float:
        """Elements of the embedding's output before the residual stream's split over X (sp): tokens x hidden/gy."""
        return self.tokens * self.model.hidden / self.sizes["y"]

    def word_table_elements(self) -> float:
        """The word table (and tied LM head) on this rank: split over vocabulary (X) and hidden (Y), sharded over Z;
        under axonn split over X and Y only (twin.builders.axonn_kernels)."""
        shards = self.plan.gx * self.plan.gy if self.plan.axonn else self.plan.tensor_parallel_size
        return self.model.vocab * self.model.hidden / shards

    def position_table_elements(self) -> float:
        """The position table on this rank: replicated over X (Megatron's Embedding), split like the word table else;
        under axonn whole (torch.nn.Embedding in Megatron-AxoNN)."""
        shards = 1 if self.plan.axonn else self.sizes["y"] * self.sizes["z"]
        return self.model.seq * self.model.hidden / shards

    def embedding_forward(self, at: Pass) -> None:
        """Embedding.forward (EMBEDDING_* constants) in the forward pass `at`: lookups, sum, transpose, dropout."""
        out = self.embedding_elements()
        if self.sizes["x"] > 1:
            for i in range(EMBEDDING_VOCAB_TOKEN_KERNELS):
                self.elementwise(*self.end_op(at, "embed", "token", f"token{i}"), self.tokens, TOKEN_KERNEL_BYTES, 1)
        self.elementwise(*self.end_op(at, "embed", "word"), out, EMBEDDING_LOOKUP_BYTES, 0)
        if self.sizes["x"] > 1:
            self.elementwise(*self.end_op(at, "embed", "mask"), out, EMBEDDING_MASK_BYTES, 1)
            self.blocking(*self.end_op(at, "embed", "ar_x"), "all_reduce", "x", self.b * out)
        if self.model.learned_positions:  # GPT's position table; Llama's rotary embedding is in each layer
            self.elementwise(*self.end_op(at, "embed", "pos"), out, EMBEDDING_LOOKUP_BYTES, 0)
            self.elementwise(*self.end_op(at, "embed", "add"), out, EMBEDDING_ADD_BYTES, 1)
        if self.plan.mbs > 1:
            self.elementwise(*self.end_op(at, "embed", "transpose"), out, COPY_BYTES, 0)
        if self.model.dropout:
            self.elementwise(*self.end_op(at, "embed", "dropout"), self.residual_elements(), EMBEDDING_DROPOUT_BYTES,
                             DROPOUT_FLOPS)

    def embedding_backward(self, at: Pass) -> None:
        """The embedding's backward in the pass `at`: dropout, each table's dense gradient, the tied head's, the
        accumulations."""
        out = self.embedding_elements()
        if self.model.dropout:
            self.elementwise(*self.end_op(at, "embed", "dropout"), self.residual_elements(), DROPOUT_BACKWARD_BYTES, 2)
        for table, elements in self.tables():
            if self.plan.mbs > 1:
                self.elementwise(*self.end_op(at, "embed", f"{table}_copy"), out, COPY_BYTES, 0)
            self.elementwise(*self.end_op(at, "embed", f"{table}_zero"), elements, 2, 0)
            if self.tokens > EMBEDDING_DIRECT_MAX_INDICES:
                for i in range(EMBEDDING_SORTED_KERNELS):
                    self.elementwise(*self.end_op(at, "embed", f"{table}_sort", f"{table}_sort{i}"), self.tokens,
                                     TOKEN_KERNEL_BYTES, 1)
            self.elementwise(*self.end_op(at, "embed", table), out, EMBEDDING_SCATTER_BYTES, 1)
        if self.plan.pp == 1 and self.model.tied_head:  # the LM head's gradient of the same (tied) table
            self.elementwise(*self.end_op(at, "embed", "tied_grad_add"), self.word_table_elements(), GRAD_ADD_BYTES, 1)
        for table, elements in self.tables()[::-1]:
            self.accumulate(at, "embed", None, table, elements)

    def tables(self) -> list[tuple[str, float]]:
        """The embedding's tables on this rank, (name, elements), in the order their gradients are built: GPT's
        position table, then the word table (Llama has no position table)."""
        word = [("word", self.word_table_elements())]
        if self.model.learned_positions:
            return [("pos", self.position_table_elements())] + word
        return word
