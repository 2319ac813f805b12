"""The copies PyTorch's FSDP2 launches around its collectives (ParallelPlan.fsdp2), as data.

FSDP2 (torch.distributed._composable.fsdp, per-parameter sharding: the FSDP of
torchtitan; PyTorch's `_fsdp_collectives.py` of 2024-25) gathers a module's
parameter shards into one flat buffer and then, on the compute stream when the
module waits for them (`foreach_all_gather_copy_out`:
torch.split_with_sizes_copy), copies each parameter out of that buffer into its
own unsharded tensor: one kernel reading and writing every gathered element.
Flat-parameter schemes (AxoNN's buffers, Megatron's, FSDP1's FlatParameter)
use the gathered buffer in place.

Its reduce-scatter copies the unsharded gradients into the collective's input
the same way (`foreach_reduce_scatter_copy_in`: torch._chunk_cat, casting to
the reduce dtype), but on the reduce-scatter's own stream, under the next
module's backward; the simulator runs one compute op at a time per rank, so
that copy is not counted (its cost there is the HBM it shares with the
backward: 6 bytes an element of the gradient, read in bf16 and written in
fp32).
"""

from __future__ import annotations

# foreach_all_gather_copy_out: each gathered element read from the all-gather's buffer and written to its parameter,
# in the weights' dtype (bf16: 2 + 2 bytes).
COPY_OUT_PASSES = 2
