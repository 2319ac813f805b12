"""The step around the micro-batches: main_grad zeroed, the gradients scaled and synchronised, the optimizer.

Gradient sync over data (cp+data with context parallelism) by ZeRO stage (twin.builders.axonn's module
docstring): stage 0 all-reduces each bucket; stages 1 and 2 reduce-scatter
it, step the optimizer on the local shard and all-gather the updated weights;
stage 3 already sharded them inside the layers. With a pipeline the tied
embedding and LM head all-reduce their gradient between the first and last
stage. The optimizer's passes are OPTIMIZER_PASSES. Ops are tagged with the
pass "step" and no micro-batch.
"""

from __future__ import annotations

from math import ceil

from twin.builders.megatron_kernels import FP16_GRAD_CAST_BYTES, FP16_UNSCALE_PASS, OPTIMIZER_PASSES, main_grad_bytes
from twin.builders.stage import StageBase
from twin.builders.tags import STEP
from twin.ir import Collective


class StepWriter(StageBase):
    """Writes what a stage does before its first micro-batch and after its last."""

    def gradient_buckets(self) -> list[tuple[str, int | None, float]]:
        """(block, layer, parameters) per gradient bucket, in the order backward finishes them: each layer ("layer"),
        the embedding, the LM head and final norm."""
        layers = [block[0].layer for chunk in reversed(self.chunks) for block in reversed(chunk)]
        buckets: list[tuple[str, int | None, float]] = [("layer", layer, float(self.model.params_per_layer))
                                                         for layer in layers]
        final_norm = 2.0 * self.model.hidden
        if self.plan.pp == 1:
            buckets.append(("embed", None, self.model.embedding_params + final_norm))  # the LM head is tied to it
            return buckets
        if self.stage == self.plan.pp - 1:
            buckets.insert(0, ("lm_head", None, final_norm + self.model.vocab * self.model.hidden))
        if self.stage == 0:
            buckets.append(("embed", None, float(self.model.embedding_params)))
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
        local_params = sum(params for *_, params in self.gradient_buckets()) / self.plan.tensor_parallel_size
        self.elementwise("zero_grad", STEP.tag("main_grad", "zero"), local_params, main_grad_bytes(self.dtype), 0)

    def data_parallel_and_optimizer(self) -> None:
        """Gradient scaling and sync over data (by ZeRO stage), the tied-embedding sync, then the optimizer's passes."""
        plan, tp = self.plan, self.plan.tensor_parallel_size
        buckets = self.gradient_buckets()
        local_params = sum(params for *_, params in buckets) / tp
        main = main_grad_bytes(self.dtype)
        self.elementwise("dp.grad_scale", STEP.tag("main_grad", "scale"), local_params, 2 * main, 1)  # /= dp size
        if plan.pp > 1 and self.stage in (0, plan.pp - 1):
            self.blocking("tied.embed.ar", STEP.tag("embed", "ar_tied"), "all_reduce", "tied",
                          self.b * self.model.vocab * self.model.hidden / tp)
        gathers = []
        group = self.gradient_axis  # data, or cp+data: the ranks holding the same weights
        if self.sizes[group] > 1 and plan.zero in (0, 1, 2):
            kind, short = ("all_reduce", "ar") if plan.zero == 0 else ("reduce_scatter", "rs")
            ops = [self.w.collective(self.bucket_name(block, layer, f"{short}_data"), group,
                                     Collective(kind, group, self.b * params / tp, self.dtype),
                                     tag=STEP.tag(block, f"{short}_data", layer))
                   for block, layer, params in buckets]
            self.w.wait(*ops)
            gathers = buckets if plan.zero in (1, 2) else []
        shards = plan.gradient_replicas if plan.zero else 1
        optimizer_params = local_params / shards
        passes = list(OPTIMIZER_PASSES)
        if self.dtype == "fp16":
            casts = ceil(self.parameter_tensors() / shards)  # one .float() per parameter tensor (of the shard)
            for i in range(casts):
                self.elementwise(f"optimizer.grad_cast{i}", STEP.tag("optimizer", "grad_cast"), optimizer_params / casts,
                                 FP16_GRAD_CAST_BYTES, 0)
            passes.insert(0, FP16_UNSCALE_PASS)
        for name, nbytes, flops in passes:
            self.elementwise(f"optimizer.{name}", STEP.tag("optimizer", name), optimizer_params, nbytes, flops)
        for block, layer, params in gathers:  # ZeRO-1/2: every rank needs the updated weights back
            self.blocking(self.bucket_name(block, layer, "ag_data"), STEP.tag(block, "ag_data", layer), "all_gather",
                          group, self.b * params / tp)

    @staticmethod
    def bucket_name(block: str, layer: int | None, role: str) -> str:
        """dp.<bucket>.<role>: the bucket is L<n> for a layer's gradients, else the block."""
        return f"dp.{block if layer is None else f'L{layer}'}.{role}"
