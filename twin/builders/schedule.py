"""The training step's schedule, written by ordered passes: AxoNN's 4D hybrid parallelism, Megatron's on top.

build_schedule(model, plan) writes one program per pipeline stage. As
torchtitan applies its parallelisms one after the other, each stage's
program is written by passes with one job each, in this order (each a
module of twin.builders, assembled into one writer below):

1. the optimizer's main_grad zeroed (optimizer);
2. the pipeline's schedule (pipeline_passes, with pipeline's 1F1B or
   interleaved order): each micro-batch's forward and backward pass over the
   stage's model chunks, the transfers between stages, and in each pass
     - the embedding and the loss on the first and last stage (ends),
     - the transformer blocks (layer), whose linears are the tensor-parallel
       pass (linears: AxoNN's 3D grid, Megatron's 1D as gx alone, sequence
       parallelism) and whose attention is flash, unfused or, with context
       parallelism, a ring (attention, ring_attention); each kind of block
       pass is written once and copied for the other layers and
       micro-batches (replay: the same ops, op for op);
   then, under axonn, the gradients it does not shard over Z all-reduced over Z
   (one all-reduce of their sum: replicated_grads);
3. the gradients scaled, then synchronised over the data-parallel group and
   ZeRO's shards, and the tied embedding's between the first and last
   stages (optimizer, data_parallel);
4. the optimizer's passes on the (sharded) state (optimizer);
5. ZeRO-1/2's updated weights gathered back (data_parallel).

A new axis is an entry of twin.axes and the pass that uses its groups (cp:
ring_attention). build_stage_programs is the search's partial build: only
some stages' programs, for its lower bounds (twin.search.bound); the
simulator refuses such a schedule.

The convention the passes share:


reference/algorithms.md sections 1, 2 and 5. Convention (written down once,
used by the simulator and the executor alike): for a linear O[m, n] = I[m, k] W[k, n]
on rank (x, y, z, d) of a gx x gy x gz x gdata mesh (X innermost),

- I is split over Z (rows: tokens) and Y (columns: k), replicated along X;
- W is split over Y (k) and X (n), and its (x, y) block is sharded along Z;
- forward:  W = ALL_GATHER_z(W_shard); O_part = I W; O = ALL_REDUCE_y(O_part)
- backward: dI_part = dO W^T; dI = ALL_REDUCE_x(dI_part);
            dW_part = I^T dO; dW_shard = REDUCE_SCATTER_z(dW_part)
- after the whole backward: ALL_REDUCE_data(gradient shards), blocking.

This is Algorithm 1 of the AxoNN paper with the forward all-reduce over Y, and
matches the communication model of its section V-B (algorithms.md section 3):
the forward all-reduce moves m n / (gz gx) elements, the backward one
m k / (gz gy). Every other linear is transposed (X and Y swap roles), so the
QKV output (split over X) is the attention-output linear's input, and so on:
the residual stream is split over Z (tokens) and Y (hidden).

Overlap switches (AxoNN's axonn/intra_layer):
- oar: dI's all-reduce is issued async and overlaps the dW GEMM; waited
  before the layer's backward returns;
- ors: dW's reduce-scatter is issued async and waited after the whole
  backward of the micro-batch (of the model chunk, with a pipeline);
- oag: the next linear's weight all-gather is issued one linear ahead in
  module order; the chain restarts in each activation-checkpoint recompute.

With full recompute each block's forward is recomputed (all-gathers and
forward all-reduces included) right before its backward, whose GEMMs then use
the weights gathered by the recompute.

Megatron-DeepSpeed on top (algorithms.md section 5):
- gx alone is Megatron tensor parallelism; sp=1 turns its all-reduces into
  reduce-scatter + all-gather and splits the residual stream over gx as well;
- pp stages run twin.builders.pipeline's 1F1B (or interleaved, vpp chunks)
  order; activations go forward and gradients back by point-to-point
  transfers of tokens x hidden / (gy [x gx with sp]) bf16 values per micro-batch.
  Sends never block compute (they complete in the background), receives do;
- ZeRO over gdata: stage 0 all-reduces gradients; stages 1 and 2
  reduce-scatter them, step the optimizer on the local shard and all-gather
  the updated bf16 weights; stage 3 shards the weights over gz x gdata, so the
  per-linear all-gather and reduce-scatter run on that combined group;
- with pp > 1 the embedding and the LM head (tied, GPT) all-reduce their
  gradient between the first and last stage.

Attention (plan.attention), on the heads / gx local heads of each of the mbs
sequences (replicated over gy, like every op between the QKV and attention
output linears):
- flash: one fused kernel per direction (the IR's Attention), what AxoNN and
  the Frontier paper ran;
- unfused: Megatron-LM's core attention before FlashAttention. Forward: the
  batched GEMM Q K^T, the fused scale + causal mask + softmax
  (FusedScaleMaskSoftmax), dropout on the probabilities, the batched GEMM
  probs x V. Backward: dV and d(probs) (batched GEMMs), dropout and softmax
  backward, dQ and dK (batched GEMMs). The full s x s scores are computed and
  then masked, so unlike flash's causal kernel no GEMM skips the masked half.

Recompute (plan.recompute): full reruns each block's forward right before its
backward (above), or only the first plan.rcl blocks' of each model chunk
(Megatron-Core's --recompute-method block); selective (Korthikanti et al.,
arXiv 2205.05198, as Megatron's checkpointed core attention) reruns only the
unfused core attention's forward, under the recompute tag, right before
that layer's attention backward. Flash attention keeps nothing of size s^2 and already
recomputes its scores inside its backward kernel, so with flash selective
recomputes nothing: the schedule is the one without recompute. op
(torchtitan's per-operator checkpointing of a Llama block) reruns, under the
recompute tag before each block's backward, ln1, the k columns of the QKV
GEMM ("gemm_part"), the rotary embedding and flash's q/k/v copies, the
attention output GEMM, the residual add, ln2, the up half of the gate-and-up
GEMM ("gemm_part") and SwiGLU: 12 kernels (twin.builders.layer).

A Llama layer's element-wise work is counted as Megatron-Core fuses it
below; with plan.kernels = "eager", as torchtitan's Llama launches it op by
op in eager PyTorch (twin.builders.eager_kernels: the rotary embedding in
three kernels each way on q and on k, SwiGLU in two forward and three
backward, grouped-query attention's k and v copied out to every head).

Everything that is not a GEMM, attention or communication: one op per kernel
that Megatron-DeepSpeed launches for it (the simulator issues ops one host
launch apart, so their number matters as well as their bytes), each counted
in bytes moved (reads + writes) and flops. The kernels are those of
microsoft/Megatron-DeepSpeed, the code line of the Frontier paper's fork and
of vTrain's A100 measurements, at commit c08e2cc2 (August 2023), for a GPT in
bf16 or fp16 with its defaults: apex's fused layer norm (apex.contrib's
persistent kernel for the hidden sizes it supports), TorchScript-fused
bias-GeLU and bias-dropout-add, FusedScaleMaskSoftmax, gradient accumulation
into DistributedDataParallel's main_grad buffers (gradient_accumulation_fusion
is commented out in its layers.py) and Megatron's mixed-precision optimizer
with apex's FusedAdam. Megatron-LM differs in two places: dense_4h_to_h's bias
goes to the dropout-add (one forward kernel fewer) and its weights' gradients
accumulate inside the dW GEMM (8 accumulation kernels a layer, not 12); with
--deepspeed, DeepSpeed's engine replaces the accumulation and optimizer with
passes of the same kind. Each module-level constant below names the code it
counts. Per layer and micro-batch (c = 1 when mbs > 1, else 0; LN = a layer
norm's backward kernels: 2 persistent, 3 apex's):

  forward (and each full recompute): 16 + c flash, 16 unfused
    ln1 | qkv GEMM, qkv bias add | attention | attn_out GEMM |
    bias-dropout-add | ln2 | mlp_up GEMM, bias-GeLU | mlp_down GEMM,
    mlp_down bias add | dropout-add
    attention, flash:   3 q/k/v copies (rearrange + contiguous), the
                        cu_seqlens arange, the kernel, c context copy
    attention, unfused: Q K^T, softmax, dropout, probs V, the context's
                        permute + contiguous copy (selective recompute
                        reruns these 5; where Megatron cannot fuse the
                        softmax, torch's 5 kernels replace it, each way:
                        megatron_kernels.fused_softmax_available)
  backward: 29 + 2 LN + attention's (35 flash at mbs = 1, 44 unfused)
    dropout-add bwd | mlp_down: dbias, bias acc, dI, dW, weight acc |
    bias-GeLU bwd | mlp_up: dbias, bias acc, dI, dW, weight acc |
    ln2 bwd (LN), residual-gradient add, 2 parameter accs |
    bias-dropout-add bwd | attn_out: dbias, bias acc, dI, dW, weight acc |
    attention bwd | qkv: dI, dW, dbias, weight acc, bias acc |
    ln1 bwd (LN), residual-gradient add, 2 parameter accs
    attention, flash:   c dO copy, the kernel, the q/k/v gradient
                        concatenation (1 kernel; 3 copies when mbs > 1)
    attention, unfused: dV, d(probs), dropout bwd, softmax bwd, dQ and its
                        1/sqrt(d) scale, dK and its scale, the q/k/v
                        gradient concatenation (3 copies)

A Llama model (ModelSpec.arch "llama", which Megatron-DeepSpeed at c08e2cc2
does not have; its kernels are Megatron-Core's fused ones, marked estimates in
megatron_kernels) has no bias kernels (no bias adds, dbias or bias
accumulations) and RMSNorm's gamma alone to accumulate; it rotates q and k
after the QKV GEMM (one kernel each, again in the backward before the QKV's
dI), runs SwiGLU where GPT runs bias-GeLU (one kernel each way over the ffn
outputs, reading the gate and up halves), and its embedding has no position
table (nor its lookup and add). Its LM head is its own tensor: no tied
gradient add on one stage and no all-reduce between the first and last.
With grouped-query attention (kv_heads < heads, either architecture) k and v,
their copies and gradients are kv_heads/heads of q's; unfused attention
expands them to every head first (a copy each) and sums their gradients back.

"acc" is main_grad.add_(grad), one per parameter tensor and micro-batch,
tagged with its block and layer and an accumulation role (acc_weight,
acc_bias, ...; named e.g. mb0.bwd.acc.L3.qkv.weight): the search's layer
passes leave them out, because their size follows the parameters' sharding
(gz, and gdata under ZeRO-3), which the search's screening bound, built on
the tensor-parallel grid alone, does not see (twin.search.screen).

The loss, per micro-batch on the last stage: 6 kernels over the logits (38
bytes per logit element: fp32 cast, max, subtract, exp, sum, divide), 3
all-reduces of one fp32 per token over X, and LOSS_TOKEN_KERNELS small
per-token kernels (masks, gathers, the loss function); backward 2 kernels (14
bytes per logit) and LOSS_BACKWARD_TOKEN_KERNELS per-token ones. The
embedding: lookups, add, dropout forward (with gx > 1 the vocabulary masking
and the all-reduce over X); backward, its dropout, the dense gradient of
each table (zeroed, then scattered into), the tied LM head's gradient added,
and the tables' accumulations. The step: the main_grad buffer zeroed, scaled
by 1 / data-parallel size, then the optimizer's multi-tensor passes
(OPTIMIZER_PASSES): 58 bytes per parameter in bf16, 66 in fp16 (with the
plan's optimizer=flat, DeepSpeed's fused fp16 step, FLAT_OPTIMIZER_PASSES:
34 after main_grad's zeroing and scaling).

Every op carries its meaning as a tag (twin.ir.OpTag, in the words of
twin.builders.tags): micro-batch, chunk, pass, layer, block and role. Its
name is a label with the same parts (mb3.c1.bwd.L12.mlp_up.dW), which no
consumer parses.

Not counted (each under 1% of a step in the cases checked, or not expressible
in the IR): the data loader's per-micro-batch mask and position kernels, the
loss's logging all-reduce over the data-parallel group, the model-parallel
all-reduces of the gradient norm and the fp16 inf flag and the host syncs of
their .item(), the host syncs of ParallelTransformerLayer.forward's two
torch.tensor(0.0, device=...) per layer (the IR has no host synchronisation),
flash attention's internal extra backward kernels (the IR's Attention is one
kernel per direction), and sequence parallelism's all-reduce of layer-norm
gradients.
"""

from __future__ import annotations

from twin.builders.optimizer import OptimizerWriter
from twin.builders.pipeline_passes import PipelineWriter
from twin.builders.replicated_grads import ReplicatedGradWriter
from twin.ir import GroupAxis, Op, Program, Schedule, StepInfo
from twin.memory import memory_per_gpu
from twin.mesh import plan_mesh
from twin.model import ModelSpec
from twin.plan import ParallelPlan


class StageProgramWriter(PipelineWriter, OptimizerWriter, ReplicatedGradWriter):
    """Writes the program every rank of one pipeline stage runs: the passes of the module docstring, in order
    (PipelineWriter brings DataParallelWriter, which odp calls from the backward)."""

    def write(self) -> list[Op]:
        self.zero_grad()  # 1. optimizer: main_grad zeroed
        self.prefetch_weights()  # odp under ZeRO-1/2: the previous step's updated weights, gathered under the forward
        self.run_pipeline()  # 2. the pipeline's passes through the embedding, the blocks and the loss
        self.sync_replicated_gradients()  # axonn: the gradients it leaves whole over Z, all-reduced over Z
        self.scale_gradients()  # 3. scaled, then synchronised over data (and ZeRO's shards)
        gathers = self.synchronise_gradients()
        self.optimizer_step()  # 4. the optimizer's passes
        self.gather_weights(gathers)  # 5. ZeRO-1/2: the updated weights back
        return self.w.ops


def build_schedule(model: ModelSpec, plan: ParallelPlan) -> Schedule:
    """The whole training step; `plan` validated, mbs and ga resolved (twin.build does both). One Program per
    pipeline stage."""
    return _assemble(model, plan, range(plan.pp))


def build_stage_programs(model: ModelSpec, plan: ParallelPlan, stages: tuple[int, ...]) -> Schedule:
    """Only the programs of pipeline stages `stages`: the search's partial build. Its lower bound
    (twin.search.bound) of a long pipeline needs the first, a middle and the last stage; the other stages' ranks
    have no program, so the simulator refuses the schedule (twin.sim.engine)."""
    return _assemble(model, plan, sorted(set(stages)))


def build_layer_passes(model: ModelSpec, plan: ParallelPlan) -> Program:
    """Stage 0's blocks alone, in micro-batch 0's passes (PipelineWriter.layer_passes): not a step, only the ops
    whose compute twin.search.screen's W sums. Every layer pass's compute ops are those of the whole step's
    (tests/test_search.py compares W from both), about 40% of the ops of a step of one layer."""
    if plan.mbs <= 0:
        raise ValueError("build_layer_passes needs a plan with mbs resolved")
    per_stage = plan_mesh(plan).size // plan.pp
    return Program(tuple(range(per_stage)), tuple(StageProgramWriter(model, plan, 0).layer_passes()))


def _assemble(model: ModelSpec, plan: ParallelPlan, stages) -> Schedule:
    if plan.mbs <= 0 or plan.ga <= 0:
        raise ValueError("build_schedule needs a plan with mbs and ga resolved (twin.memory.resolve_micro_batch)")
    mesh = plan_mesh(plan)
    per_stage = mesh.size // plan.pp  # pp is the outermost axis: each stage is a block of consecutive ranks
    writers = [StageProgramWriter(model, plan, s) for s in stages]
    programs = tuple(Program(tuple(range(s * per_stage, (s + 1) * per_stage)), tuple(writer.write()))
                     for s, writer in zip(stages, writers))
    used = sorted(set().union(*(writer.w.axes for writer in writers)))  # every communication op's axis
    groups = []
    for axis in used:
        if axis == "tied":
            instances = tuple((g[0], g[-1]) for g in mesh.group_instances("pp"))
        else:
            instances = mesh.group_instances(axis)
        groups.append(GroupAxis(axis, instances))
    info = StepInfo(
        model=model.name,
        plan=plan,
        global_batch=plan.global_batch,
        seq=model.seq,
        flops_hardware=model.flops_per_step(plan.global_batch, "hardware"),
        flops_model=model.flops_per_step(plan.global_batch, "model"),
        memory_per_gpu_bytes=memory_per_gpu(model, plan).total,
    )
    return Schedule(world_size=mesh.size, groups=tuple(groups), programs=programs, info=info)
