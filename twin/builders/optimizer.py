"""The optimizer around the micro-batches: main_grad zeroed before them, scaled after them, the optimizer's passes.

Megatron's mixed-precision optimizer with apex's FusedAdam
(OPTIMIZER_PASSES, over the shard ZeRO leaves this rank: the local
parameters / (cp x gdata) with ZeRO 1-3); in fp16 first one cast per
parameter tensor and the unscale pass. With the plan's `optimizer=flat`,
DeepSpeed's fused fp16 step instead (FLAT_OPTIMIZER_PASSES: three passes over
one flat buffer, ZeRO 0 only). Under the plan's fp8, last, the layers'
linear weights are quantised for the next step (Transformer Engine casts
them in the first micro-batch's forward; here at the step's end, where the
same time is spent on the same rank); under fp8pg, each rank's ZeRO shard
of them, from the fp32 master weights, before twin.builders.data_parallel
gathers them in FP8. The gradients' synchronisation
between the scaling and the step is twin.builders.data_parallel's. Ops are
tagged with the pass "step" and no micro-batch.
"""

from __future__ import annotations

from math import ceil

from twin.builders.megatron_kernels import (FLAT_OPTIMIZER_PASSES, FP8_AMAX_BYTES, FP8_MASTER_QUANTIZE_BYTES,
                                           FP8_QUANTIZE_BYTES, FP8_TRANSPOSE_BYTES, FP16_GRAD_CAST_BYTES,
                                           FP16_UNSCALE_PASS, OPTIMIZER_PASSES, main_grad_bytes)
from twin.builders.stage import StageBase
from twin.builders.tags import STEP


class OptimizerWriter(StageBase):
    """Writes what the optimizer does before the first micro-batch and after the last."""

    @property
    def held_layers(self) -> int:
        """The transformer layers this stage holds, over all its chunks."""
        return sum(len(chunk) for chunk in self.chunks)

    def parameter_tensors(self) -> int:
        """Parameter tensors of this stage: a layer's 4 weights, 4 biases and 2 x 2 LayerNorm parameters (GPT; Llama:
        4 weights, 2 RMSNorm gammas), the word (and position) table, the final norm, the LM head where it is a
        tensor of its own (untied, or GPT's copy on the last stage)."""
        model = self.model
        norm_tensors = 2 if model.biased else 1
        tensors = (4 + (4 if model.biased else 0) + 2 * norm_tensors) * self.held_layers
        if self.stage == 0:
            tensors += 1 + (1 if model.learned_positions else 0)
        if self.stage == self.plan.pp - 1:
            tensors += norm_tensors + (1 if self.plan.pp > 1 or not model.tied_head else 0)
        return tensors

    def local_parameters(self) -> float:
        """Parameters of this stage on this rank (split over the tensor-parallel grid: StageBase.bucket_elements)."""
        return sum(self.bucket_elements(block, params) for block, _, params in self.gradient_buckets())

    def zero_grad(self) -> None:
        """train_step's zero_grad_buffer: main_grad zeroed before the first micro-batch."""
        self.elementwise("zero_grad", STEP.tag("main_grad", "zero"), self.local_parameters(),
                         main_grad_bytes(self.dtype), 0)

    def scale_gradients(self) -> None:
        """main_grad /= the data-parallel size, before the gradients are synchronised."""
        self.elementwise("dp.grad_scale", STEP.tag("main_grad", "scale"), self.local_parameters(),
                         2 * main_grad_bytes(self.dtype), 1)

    def optimizer_step(self) -> None:
        """The optimizer's passes over this rank's shard of the state (Megatron's in fp16: casts, unscale first)."""
        shards = self.plan.gradient_replicas if self.plan.zero else 1
        optimizer_params = self.local_parameters() / shards
        passes = list(OPTIMIZER_PASSES)
        if self.plan.optimizer == "flat":
            passes = list(FLAT_OPTIMIZER_PASSES)
        elif self.dtype == "fp16":
            casts = ceil(self.parameter_tensors() / shards)  # one .float() per parameter tensor (of the shard)
            for i in range(casts):
                self.elementwise(f"optimizer.grad_cast{i}", STEP.tag("optimizer", "grad_cast"), optimizer_params / casts,
                                 FP16_GRAD_CAST_BYTES, 0)
            passes.insert(0, FP16_UNSCALE_PASS)
        for name, nbytes, flops in passes:
            self.elementwise(f"optimizer.{name}", STEP.tag("optimizer", name), optimizer_params, nbytes, flops)
        if self.plan.fp8pg:
            self.quantize_weight_shard(shards)
        elif self.plan.fp8:  # the updated weights quantised for the next step's FP8 GEMMs
            self.elementwise("optimizer.fp8_weights", STEP.tag("optimizer", "fp8_weights"), self.fp8_weights(),
                             FP8_QUANTIZE_BYTES[self.plan.fp8recipe], 2)

    def quantize_weight_shard(self, shards: int) -> None:
        """fp8pg: this rank's shard of the linears' weights quantised from the fp32 master weights into the FP8
        parameter buffer, under current scaling after the amaxes' all-reduce over the gradient group (module
        docstring); without a gather to follow (one replica) the transposed copies are made here."""
        recipe, group = self.plan.fp8recipe, self.gradient_axis
        self.elementwise("optimizer.fp8_weights", STEP.tag("optimizer", "fp8_weights"), self.fp8_weights() / shards,
                         FP8_MASTER_QUANTIZE_BYTES[recipe], 2)
        if recipe == "current" and self.sizes[group] > 1:
            tensors = len(self.model.linear_shapes()) * self.held_layers  # one weight tensor a linear
            self.blocking("optimizer.fp8_amax", STEP.tag("optimizer", "fp8_amax"), "all_reduce", group,
                          FP8_AMAX_BYTES * tensors, "fp32")
        if self.sizes[group] == 1:  # fp8pg needs ZeRO-1/2: with more than one replica the gathers follow
            self.elementwise("optimizer.fp8_transpose", STEP.tag("optimizer", "fp8_transpose"), self.fp8_weights(),
                             FP8_TRANSPOSE_BYTES, 0)

    def fp8_weights(self) -> float:
        """Elements of the (x, y) weight blocks of this stage's FP8 linears: the layers', not the LM head's."""
        return self.held_layers * self.model.linear_weights_per_layer / (self.sizes["x"] * self.sizes["y"])
