"""Data parallelism and ZeRO: the gradients synchronised over the ranks that hold the same weights.

After the last micro-batch, by ZeRO stage, over the gradient group (data,
or cp+data with context parallelism: twin.mesh.gradient_axis): stage 0
all-reduces each gradient bucket; stages 1 and 2 reduce-scatter it (the
optimizer then steps its shard) and all-gather the updated bf16 weights
after the optimizer; stage 3 already sharded the weights inside the layers
(twin.builders.linears), so nothing is left to do here. With a pipeline the
tied embedding and LM head all-reduce their gradient between the first and
last stage first. Ops are tagged with the pass "step" and no micro-batch.
The gradients move in the model's dtype, or in fp32 under the plan's
gradfp32 (twin.plan), as do the weight gradients' reduce-scatters inside the
layers; under axonn in bf16 these reductions move fp32 and those reduce-scatters
the model's dtype (ParallelPlan.fp32_main_grads).

With the plan's odp each bucket's reduction is issued by the backward instead
(twin.builders.pipeline_passes: right after the last micro-batch's backward
of its layer, the embedding's and LM head's at the end of their chunk) and only
waited here, and ZeRO-1/2's gathers of the updated weights are issued at the
start of the step, the previous step's, each layer's first forward waiting for
its own: the steady state of Megatron's --overlap-grad-reduce and
--overlap-param-gather (PyTorch DDP's bucketed all-reduce for ZeRO-0).

Under fp8pg (--fp8-param-gather) a layer's linear weights are gathered in
FP8 and, once gathered, given their transposed FP8 copy.
"""

from __future__ import annotations

from functools import cached_property

from twin.builders.megatron_kernels import FP8_GATHER_BYTES, FP8_TRANSPOSE_BYTES
from twin.builders.stage import Bucket, StageBase
from twin.builders.tags import STEP
from twin.ir import FP8, Collective

class DataParallelWriter(StageBase):
    """Writes the gradient synchronisation around the optimizer step."""

    @property
    def synchronises_buckets(self) -> bool:
        """Whether the step reduces gradient buckets over the gradient group: ZeRO 0-2 with more than one replica."""
        return self.sizes[self.gradient_axis] > 1 and self.plan.zero in (0, 1, 2)

    def synchronise_gradients(self) -> list[Bucket]:
        """The tied embedding's all-reduce (GPT's, with pp > 1), then each bucket's all-reduce or reduce-scatter,
        waited (with odp issued by the backward already); returns the buckets whose updated weights must be gathered
        after the optimizer (ZeRO-1/2)."""
        plan, tp = self.plan, self.plan.tensor_parallel_size
        buckets = self.gradient_buckets()
        if plan.pp > 1 and self.stage in (0, plan.pp - 1) and self.model.tied_head:
            self.blocking("tied.embed.ar", STEP.tag("embed", "ar_tied"), "all_reduce", "tied",
                          self.data_grad_b * self.model.vocab * self.model.hidden / tp, self.data_grad_dtype)
        if not self.synchronises_buckets:
            return []
        ops = self.reduced_buckets if plan.odp else [self.reduce_bucket(*bucket) for bucket in buckets]
        self.w.wait(*ops)
        return buckets if plan.zero in (1, 2) else []

    def reduce_bucket(self, block: str, layer: int | None, params: float, after: tuple[int, ...] = ()) -> int:
        """One gradient bucket's all-reduce (ZeRO-0) or reduce-scatter (ZeRO-1/2) over the gradient group, issued
        (after the ops `after` as well as the last compute op)."""
        kind, short = ("all_reduce", "ar") if self.plan.zero == 0 else ("reduce_scatter", "rs")
        group = self.gradient_axis  # data, or cp+data: the ranks holding the same weights
        return self.w.collective(self.bucket_name(block, layer, f"{short}_data"), group,
                                 Collective(kind, group, self.data_grad_b * self.bucket_elements(block, params),
                                            self.data_grad_dtype),
                                 after, tag=STEP.tag(block, f"{short}_data", layer))

    def reduce_buckets_of(self, blocks: tuple[str, ...], layer: int | None = None) -> None:
        """odp: issue the reductions of this stage's buckets of `blocks` (and `layer`), from the backward, each after
        the weight-shard reduce-scatters still in flight (ors), which complete its gradients."""
        if self.plan.odp and self.synchronises_buckets:
            after = tuple(self.deferred_waits)
            params = self.bucket_params
            self.reduced_buckets += [self.reduce_bucket(block, layer, params[(block, layer)], after)
                                     for block in blocks if (block, layer) in params]

    @cached_property
    def bucket_params(self) -> dict[tuple[str, int | None], float]:
        """(block, layer) -> parameters of this stage's gradient bucket: odp looks one up per layer's backward."""
        return {(block, layer): params for block, layer, params in self.gradient_buckets()}

    def gathers_weights_ahead(self) -> bool:
        """odp under ZeRO-1/2: the updated weights are gathered under the forward, not after the optimizer."""
        return self.plan.odp and self.plan.zero in (1, 2) and self.synchronises_buckets

    def prefetch_weights(self) -> None:
        """odp: every bucket's gather of the (previous step's) updated weights issued at the start of the step; the
        forward waits for each before its first use (wait_for_weights)."""
        if self.gathers_weights_ahead():
            for block, layer, params in self.gradient_buckets()[::-1]:  # in the forward's order
                self.weight_gathers[(block, layer)] = self.gather_bucket(block, layer, params)

    def wait_for_weights(self, block: str, layer: int | None = None) -> None:
        """odp: the next compute op waits for this bucket's gathered weights (the first forward that uses them)."""
        op = self.weight_gathers.pop((block, layer), None)
        if op is not None:
            self.w.wait(op)
            self.transpose_fp8_weights(block, layer)

    def gather_weights(self, buckets: list[Bucket]) -> None:
        """ZeRO-1/2: every rank needs the updated weights of the other shards back (with odp, at the start of the
        next step instead: prefetch_weights)."""
        if self.gathers_weights_ahead():
            return
        for block, layer, params in buckets:
            self.w.wait(self.gather_bucket(block, layer, params))
            self.transpose_fp8_weights(block, layer)

    def gather_bucket(self, block: str, layer: int | None, params: float) -> int:
        """One bucket's all-gather of the updated weights over the gradient group, issued: in the model's dtype, but
        for a layer's linear weights in FP8 under fp8pg (twin.builders.megatron_kernels)."""
        fp8 = self.plan.fp8pg and block == "layer"
        linear = self.model.linear_weights_per_layer if fp8 else 0
        nbytes = self.b * self.bucket_elements(block, params - linear) + \
            FP8_GATHER_BYTES * linear / self.plan.tensor_parallel_size
        return self.w.collective(self.bucket_name(block, layer, "ag_data"), self.gradient_axis,
                                 Collective("all_gather", self.gradient_axis, nbytes, FP8 if fp8 else self.dtype),
                                 tag=STEP.tag(block, "ag_data", layer))

    def transpose_fp8_weights(self, block: str, layer: int | None) -> None:
        """fp8pg: a layer's gathered FP8 weights get their transposed copy (the dgrad and wgrad GEMMs read it)."""
        if self.plan.fp8pg and block == "layer":
            elements = self.model.linear_weights_per_layer / (self.sizes["x"] * self.sizes["y"])
            self.elementwise(self.bucket_name(block, layer, "fp8_transpose"), STEP.tag(block, "fp8_transpose", layer),
                             elements, FP8_TRANSPOSE_BYTES, 0)

    @staticmethod
    def bucket_name(block: str, layer: int | None, role: str) -> str:
        """dp.<bucket>.<role>: the bucket is L<n> for a layer's gradients, else the block."""
        return f"dp.{block if layer is None else f'L{layer}'}.{role}"
