"""How AxoNN's code gathers a linear's sharded weights (ParallelPlan.axonn), as data.

The runs of the AxoNN paper used Megatron-AxoNN (axonn-ai/Megatron-AxoNN at
6d60f45, January 2024: Megatron-LM's GPT with AxoNN's `Linear`; the branch that
launched its Perlmutter runs, gordon-bell-perlmutter at 885d2e7, August 2024,
keeps the same schedule) on the axonn package's Gordon Bell branch
(axonn-ai/axonn add-timers-gordon-bell at 56b2b51, August 2024): that
launcher's "Compatibility with latest axonn" (1d943b4) reads a process group
only that branch has, and only that branch has the GEMM tuner the paper
reports (fa5be81, July 2024). Against the axonn of early 2024 (08f9722-8d7e47b)
the branch changes one thing the schedule sees: from 73e102b (April 2024)
the weights' all-gathers over Z, blocking or prefetched, run on a second
process group of the same ranks (`depth_intra_layer_parallel_group_2`), so
on their own communicator and stream (gather_stream), beside the gradients'
reduce-scatters on the first. Three things differ from the overlap rules of
the paper's text (reference/algorithms.md section 2), the two below and that one:

- The overlaps are switched on only around the backward pass:
  `forward_backward_no_pipelining` enters `optimize_communication` (which
  starts the prefetching iterator of `--overlap-axonn-all-gather`) for
  `backward_step` alone. The forward pass runs outside it, so each linear's
  weight all-gather over Z there is blocking; only the recompute, which runs
  inside the backward, prefetches (`overlap_all_gathers_for_checkpointed_forward`:
  each layer's first gather issued as its recompute starts, the next one ahead
  of each linear, as twin.builders.linears' oag does).
- A gather that is not prefetched goes through `axonn.intra_layer.communication._gather`:
  `torch.distributed.all_gather` into a list of gz tensors, which PyTorch's
  NCCL process group gathers into one flat buffer and copies out to each
  tensor of the list on the collective's stream (one copy kernel each), and
  then `torch.cat` of the list into the weight the GEMM reads. The prefetched
  gathers use `all_gather_into_tensor` into one buffer, used in place.

So with axonn=1 a gather the plan does not prefetch is waited at once and
followed by the two copies below, each reading and writing every gathered
element; the forward never prefetches. Its gradients take Megatron-LM's path
under --bf16: the reduce-scattered shards are added into an fp32 main_grad
buffer, which is all-reduced over the data-parallel replicas in fp32
(ParallelPlan.fp32_main_grads); the reduce-scatters over Z move the 16-bit
gradients.

Only the blocks' linears are AxoNN's. The rest of the model is Megatron-LM's
and is not sharded over Z: the word table (VocabParallelEmbedding with
`for_embedding_and_clf_layer`, over the X-Y group, `outer_inner_intra_layer_parallel_group`
and on the Gordon Bell branch `middle_inner_intra_layer_parallel_group`) is split over X and Y, the
position table (torch.nn.Embedding) is whole on every rank, the norms' and
biases' parameters are replicated over Z, and the LM head, the word table
itself (tied), is never gathered. Their gradients are made whole by
`sync_gradients(..., vectorize=False)`, which `forward_backward_no_pipelining`
calls after the last micro-batch: one all-reduce over Z of each parameter
tensor's main_grad that is not an AxoNN weight (the linears' biases, the
norms, the tables), one after the other (twin.builders.replicated_grads).
Megatron's data-parallel all-reduce (gdata ranks) follows, and the optimizer
steps them whole on every rank (twin.memory counts their 18 bytes a
parameter on each).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from twin.builders.program import comm_stream

if TYPE_CHECKING:
    from twin.model import ModelSpec
    from twin.plan import ParallelPlan

# ProcessGroupNCCL::allgather with a list of outputs: the flat buffer copied out to the gz tensors (read + write in
# the weights' dtype, bf16: 2 + 2 bytes an element), then torch.cat of the list into one tensor (the same again).
LIST_COPY_OUT_PASSES = 2
CAT_PASSES = 2


def gather_stream(axis: str) -> str:
    """The stream of the weights' all-gathers over `axis` (Z) under axonn: the second process group's, beside the
    first's, which keeps the gradients' reduce-scatters (module docstring)."""
    return f"{comm_stream(axis)}.gather"


def replicated_embedding_params(model: ModelSpec, plan: ParallelPlan) -> float:
    """Under axonn, the embedding's parameters on one rank (module docstring): the word table split over X and Y
    only, GPT's position table whole."""
    word = model.vocab * model.hidden / (plan.gx * plan.gy)
    return word + (model.seq * model.hidden if model.learned_positions else 0)


def rank_params(model: ModelSpec, plan: ParallelPlan, params: float, with_embedding: bool) -> float:
    """Of `params` parameters (the embedding's among them where `with_embedding`), those on one rank: split over the
    tensor-parallel grid, but under axonn the embedding's tables as Megatron-AxoNN holds them. One count for the
    builder's gradient buckets (StageBase.bucket_elements) and for memory (twin.memory)."""
    if plan.axonn and with_embedding:
        return (params - model.embedding_params) / plan.tensor_parallel_size + replicated_embedding_params(model, plan)
    return params / plan.tensor_parallel_size
