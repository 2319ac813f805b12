"""Data parallelism and ZeRO: the gradients synchronised over the ranks that hold the same weights.

After the last micro-batch, by ZeRO stage, over the gradient group (data,
or cp+data with context parallelism: twin.mesh.gradient_axis): stage 0
all-reduces each gradient bucket; stages 1 and 2 reduce-scatter it (the
optimizer then steps its shard) and all-gather the updated bf16 weights
after the optimizer; stage 3 already sharded the weights inside the layers
(twin.builders.linears), so nothing is left to do here. With a pipeline the
tied embedding and LM head all-reduce their gradient between the first and
last stage first. Ops are tagged with the pass "step" and no micro-batch.
"""

from __future__ import annotations

from twin.builders.stage import Bucket, StageBase
from twin.builders.tags import STEP
from twin.ir import Collective

class DataParallelWriter(StageBase):
    """Writes the gradient synchronisation around the optimizer step."""

    def synchronise_gradients(self) -> list[Bucket]:
        """The tied embedding's all-reduce (GPT's, with pp > 1), then each bucket's all-reduce or reduce-scatter (waited); returns the
        buckets whose updated weights must be gathered after the optimizer (ZeRO-1/2)."""
        plan, tp = self.plan, self.plan.tensor_parallel_size
        buckets = self.gradient_buckets()
        if plan.pp > 1 and self.stage in (0, plan.pp - 1) and self.model.tied_head:
            self.blocking("tied.embed.ar", STEP.tag("embed", "ar_tied"), "all_reduce", "tied",
                          self.b * self.model.vocab * self.model.hidden / tp)
        group = self.gradient_axis  # data, or cp+data: the ranks holding the same weights
        if self.sizes[group] == 1 or plan.zero not in (0, 1, 2):
            return []
        kind, short = ("all_reduce", "ar") if plan.zero == 0 else ("reduce_scatter", "rs")
        ops = [self.w.collective(self.bucket_name(block, layer, f"{short}_data"), group,
                                 Collective(kind, group, self.b * params / tp, self.dtype),
                                 tag=STEP.tag(block, f"{short}_data", layer))
               for block, layer, params in buckets]
        self.w.wait(*ops)
        return buckets if plan.zero in (1, 2) else []

    def gather_weights(self, buckets: list[Bucket]) -> None:
        """ZeRO-1/2: every rank needs the updated weights of the other shards back."""
        for block, layer, params in buckets:
            self.blocking(self.bucket_name(block, layer, "ag_data"), STEP.tag(block, "ag_data", layer), "all_gather",
                          self.gradient_axis, self.b * params / self.plan.tensor_parallel_size)

    @staticmethod
    def bucket_name(block: str, layer: int | None, role: str) -> str:
        """dp.<bucket>.<role>: the bucket is L<n> for a layer's gradients, else the block."""
        return f"dp.{block if layer is None else f'L{layer}'}.{role}"
