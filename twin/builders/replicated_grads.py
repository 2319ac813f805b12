"""Megatron-AxoNN's all-reduces over Z of the gradients AxoNN does not shard (ParallelPlan.axonn).

Under axonn only the blocks' linear weights are sharded over Z; the word and
position tables, the norms and the linears' biases are on every rank of a Z
group (twin.builders.axonn_kernels), and each rank's gradient of them covers
only its own share of the batch. `forward_backward_no_pipelining` makes them
whole after the last micro-batch's backward with axonn's `sync_gradients(model,
gradient_attr_name="main_grad", vectorize=False)`: a `dist.all_reduce` over
the depth (Z) group of each such parameter tensor's main_grad, in the order of
`model.parameters()` (the tables, then per layer its first norm, the QKV and
attention-output biases, its second norm, the two MLP biases; the final norm:
replicated_tensors), each a synchronous call the compute stream waits for, in
main_grad's dtype (fp32 under --bf16: ParallelPlan.fp32_main_grads).
Megatron's data-parallel reduction over gdata follows
(twin.builders.data_parallel).

The twin writes them as one blocking all-reduce of their sum (tagged block
"main_grad", role "ar_z"): the same bytes, one latency where the code pays
8 a layer more. Both measured before the dragonfly's local pools: simulated
call by call the step was 0.01-0.33% longer (GPT-5B to 640B, the plans
`twin validate` chose on 512-8,192 GPUs), and each call size is a collective
type of its own for the simulator to lower over every Z group: `twin
validate` took 75 s cold that way, 58 s with one op.
"""

from __future__ import annotations

from twin.builders.ends import EndsWriter
from twin.builders.tags import STEP


class ReplicatedGradWriter(EndsWriter):
    """Writes the all-reduce over Z of axonn's replicated gradients."""

    def sync_replicated_gradients(self) -> None:
        """Under axonn with gz > 1: one blocking all-reduce over Z of every replicated parameter tensor's gradient
        (module docstring); nothing otherwise."""
        if not self.plan.axonn or self.sizes["z"] == 1:
            return
        elements = sum(elements for *_, elements in self.replicated_tensors())
        self.blocking("sync_z", STEP.tag("main_grad", "ar_z"), "all_reduce", "z", self.data_grad_b * elements,
                      self.data_grad_dtype)

    def replicated_tensors(self) -> list[tuple[str, int | None, str, float]]:
        """(block, layer, parameter, elements on this rank) of every parameter tensor axonn leaves whole over Z, in
        `model.parameters()`' order."""
        tensors: list[tuple[str, int | None, str, float]] = []
        if self.stage == 0:
            tensors += [("embed", None, table, elements) for table, elements in self.tables()[::-1]]
        norm = ["weight", "bias"] if self.model.biased else ["weight"]
        for chunk in self.chunks:
            for block in chunk:
                layer = block[0].layer
                for i, lin in enumerate(block):
                    if i in (0, 2):  # each sublayer's norm before its first linear
                        tensors += [(f"ln{1 + i // 2}", layer, p, self.norm_params()) for p in norm]
                    if self.model.biased:
                        tensors.append((lin.block, layer, "bias", self.gemm_dims(lin)[2]))
        if self.stage == self.plan.pp - 1:
            tensors += [("ln_f", None, p, self.norm_params()) for p in norm]
        return tensors
