"""AxoNN's 4D hybrid parallel training step as a schedule IR.

reference/algorithms.md sections 1-2. Convention (written down once, used by
the simulator and the executor alike): for a linear O[m, n] = I[m, k] W[k, n]
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
  backward of the micro-batch;
- oag: the next linear's weight all-gather is issued one linear ahead in
  module order; the chain restarts in each activation-checkpoint recompute.

With full recompute each block's forward is recomputed (all-gathers and
forward all-reduces included) right before its backward, whose GEMMs then use
the weights gathered by the recompute.

Memory-bound work (layer norms, GeLU, residual adds, dropout, loss, the
embedding and the optimizer) is counted in bytes moved; attention is one fused
(flash) kernel per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.builders.program import ProgramWriter
from twin.ir import Attention, Collective, Elementwise, Gemm, GroupAxis, Program, Schedule, StepInfo
from twin.memory import memory_per_gpu
from twin.mesh import axonn_mesh
from twin.model import ModelSpec
from twin.plan import ParallelPlan

# Adam step per local parameter: read fp32 master, two moments and the bf16
# gradient, write master, moments and the bf16 weight: 4*3+2 + 4*3+2 bytes.
OPTIMIZER_BYTES_PER_PARAM = 28
OPTIMIZER_FLOPS_PER_PARAM = 12
# Forward bytes per element of simple element-wise kernels (read + write, bf16).
LAYERNORM_BYTES = 2 * 2
RESIDUAL_DROPOUT_BYTES = 3 * 2 + 1  # two inputs, one output, a 1-byte mask
GELU_BYTES = 2 * 2
LOSS_BYTES = 2 + 4 + 4  # bf16 logits, fp32 copy, fp32 softmax
BACKWARD_ELEMENTWISE_FACTOR = 2.0  # backward reads the saved input and the incoming gradient


@dataclass(frozen=True)
class Linear:
    """One linear of the model; `transposed` swaps the X and Y roles."""

    name: str
    k: int
    n: int
    transposed: bool

    @property
    def forward_axis(self) -> str:
        """The axis the forward output is all-reduced over (k is split over it)."""
        return "x" if self.transposed else "y"

    @property
    def backward_axis(self) -> str:
        """The axis dI is all-reduced over (n is split over it)."""
        return "y" if self.transposed else "x"


class _StepWriter:
    """Writes the program every rank of the 4D mesh runs; one instance per build."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan) -> None:
        self.model, self.plan = model, plan
        self.sizes = {"x": plan.gx, "y": plan.gy, "z": plan.gz, "data": plan.gdata}
        self.tokens = plan.mbs * model.seq  # rows of every GEMM on this rank
        self.dtype = model.dtype
        self.b = model.dtype_bytes
        self.w = ProgramWriter()
        self.blocks = [
            [Linear(f"L{layer}.{name}", k, n, t) for name, k, n, t in model.linear_shapes()]
            for layer in range(model.layers)
        ]
        self.lm_head = Linear("lm_head", model.hidden, model.vocab, False)
        self.deferred_waits: list[int] = []  # ors: reduce-scatters waited at the end of backward

    # ---- sizes -------------------------------------------------------------
    def weight_block_bytes(self, lin: Linear) -> float:
        """The gathered (x, y) block of W: what ALL_GATHER_z returns."""
        return self.b * lin.k * lin.n / (self.sizes["x"] * self.sizes["y"])

    def gemm_dims(self, lin: Linear) -> tuple[int, int, int]:
        """(rows, k_local, n_local) of this rank's forward GEMM."""
        return (self.tokens, lin.k // self.sizes[lin.forward_axis], lin.n // self.sizes[lin.backward_axis])

    def elementwise(self, name: str, elements: float, bytes_per_element: float, flops_per_element: float = 1.0) -> int:
        return self.w.compute(name, Elementwise(nbytes=elements * bytes_per_element, flops=elements * flops_per_element))

    # ---- one linear --------------------------------------------------------
    def gather_weight(self, tag: str, lin: Linear) -> int | None:
        if self.sizes["z"] == 1:
            return None
        work = Collective("all_gather", "z", self.weight_block_bytes(lin), self.dtype)
        return self.w.collective(f"{tag}.{lin.name}.ag_z", "z", work)

    def linear_forward(self, tag: str, lin: Linear, gathered: int | None, prefetch: Linear | None) -> int | None:
        """Forward of one linear; returns the prefetched all-gather of `prefetch`, if issued."""
        w = self.w
        if self.sizes["z"] > 1 and gathered is None:
            gathered = self.gather_weight(tag, lin)
        if gathered is not None:
            w.wait(gathered)
        next_gather = self.gather_weight(tag, prefetch) if (prefetch and self.plan.oag) else None
        rows, k_loc, n_loc = self.gemm_dims(lin)
        w.compute(f"{tag}.{lin.name}.gemm", Gemm(rows, n_loc, k_loc, "NT", self.dtype, tunable=self.plan.tune_gemm))
        axis = lin.forward_axis
        if self.sizes[axis] > 1:
            work = Collective("all_reduce", axis, self.b * rows * n_loc, self.dtype)
            w.wait(w.collective(f"{tag}.{lin.name}.ar_{axis}", axis, work))
        return next_gather

    def linear_backward(self, tag: str, lin: Linear) -> None:
        w, plan = self.w, self.plan
        rows, k_loc, n_loc = self.gemm_dims(lin)
        tune = plan.tune_gemm
        w.compute(f"{tag}.{lin.name}.dI", Gemm(rows, k_loc, n_loc, "NN", self.dtype, tunable=tune))
        axis = lin.backward_axis
        reduce_dI = None
        if self.sizes[axis] > 1:
            work = Collective("all_reduce", axis, self.b * rows * k_loc, self.dtype)
            reduce_dI = w.collective(f"{tag}.{lin.name}.ar_{axis}", axis, work)
            if not plan.oar:
                w.wait(reduce_dI)
        w.compute(f"{tag}.{lin.name}.dW", Gemm(n_loc, k_loc, rows, "TN", self.dtype, tunable=tune))
        if reduce_dI is not None and plan.oar:
            w.wait(reduce_dI)
        if self.sizes["z"] > 1:
            work = Collective("reduce_scatter", "z", self.weight_block_bytes(lin), self.dtype)
            scatter = w.collective(f"{tag}.{lin.name}.rs_z", "z", work)
            if plan.ors:
                self.deferred_waits.append(scatter)
            else:
                w.wait(scatter)

    # ---- blocks ------------------------------------------------------------
    def block_forward(self, tag: str, linears: list[Linear], gathered: int | None, after: Linear | None) -> int | None:
        """One transformer block; `after` is the next linear in module order (for oag)."""
        m, h, f = self.tokens, self.model.hidden, self.model.ffn
        gy, gx = self.sizes["y"], self.sizes["x"]
        qkv, attn_out, up, down = linears
        layer = qkv.name.split(".")[0]
        self.elementwise(f"{tag}.{layer}.ln1", m * h / gy, LAYERNORM_BYTES, 5)
        gathered = self.linear_forward(tag, qkv, gathered, attn_out)
        self.w.compute(f"{tag}.{layer}.attn", self.attention(backward=False))
        gathered = self.linear_forward(tag, attn_out, gathered, up)
        self.elementwise(f"{tag}.{layer}.resid1", m * h / gy, RESIDUAL_DROPOUT_BYTES, 2)
        self.elementwise(f"{tag}.{layer}.ln2", m * h / gy, LAYERNORM_BYTES, 5)
        gathered = self.linear_forward(tag, up, gathered, down)
        self.elementwise(f"{tag}.{layer}.gelu", m * f / gx, GELU_BYTES, 8)
        gathered = self.linear_forward(tag, down, gathered, after)
        self.elementwise(f"{tag}.{layer}.resid2", m * h / gy, RESIDUAL_DROPOUT_BYTES, 2)
        return gathered

    def block_backward(self, tag: str, linears: list[Linear]) -> None:
        m, h, f = self.tokens, self.model.hidden, self.model.ffn
        gy, gx = self.sizes["y"], self.sizes["x"]
        qkv, attn_out, up, down = linears
        layer = qkv.name.split(".")[0]
        k = BACKWARD_ELEMENTWISE_FACTOR
        self.elementwise(f"{tag}.{layer}.resid2_bwd", m * h / gy, k * RESIDUAL_DROPOUT_BYTES, 2)
        self.linear_backward(tag, down)
        self.elementwise(f"{tag}.{layer}.gelu_bwd", m * f / gx, k * GELU_BYTES, 8)
        self.linear_backward(tag, up)
        self.elementwise(f"{tag}.{layer}.ln2_bwd", m * h / gy, k * LAYERNORM_BYTES, 8)
        self.elementwise(f"{tag}.{layer}.resid1_bwd", m * h / gy, k * RESIDUAL_DROPOUT_BYTES, 2)
        self.linear_backward(tag, attn_out)
        self.w.compute(f"{tag}.{layer}.attn_bwd", self.attention(backward=True))
        self.linear_backward(tag, qkv)
        self.elementwise(f"{tag}.{layer}.ln1_bwd", m * h / gy, k * LAYERNORM_BYTES, 8)

    def attention(self, backward: bool) -> Attention:
        model = self.model
        return Attention(
            batch=self.plan.mbs, seq=model.seq, heads=model.heads // self.sizes["x"],
            head_dim=model.head_dim, backward=backward, causal=True, dtype=self.dtype,
        )

    # ---- the loss ----------------------------------------------------------
    def loss(self, tag: str) -> None:
        """Vocabulary-parallel cross entropy: logits split over X, max and sum all-reduced over X."""
        logits = self.tokens * self.model.vocab / self.sizes["x"]
        self.elementwise(f"{tag}.loss", logits, LOSS_BYTES, 6)
        if self.sizes["x"] > 1:
            work = Collective("all_reduce", "x", 2 * 4 * self.tokens, "fp32")
            self.w.wait(self.w.collective(f"{tag}.loss.ar_x", "x", work))
        self.elementwise(f"{tag}.loss_bwd", logits, LOSS_BYTES, 4)

    # ---- the step ----------------------------------------------------------
    def micro_batch(self, mb: int) -> None:
        tag = f"mb{mb}"
        m, h, gy = self.tokens, self.model.hidden, self.sizes["y"]
        recompute = self.plan.recompute == "full"
        self.elementwise(f"{tag}.embed", m * h / gy, 2 * self.b, 1)
        order = [lin for block in self.blocks for lin in block] + [self.lm_head]
        gathered = None
        for layer, block in enumerate(self.blocks):
            after = order[4 * layer + 4]
            gathered = self.block_forward(f"{tag}.fwd", block, gathered, after)
        self.elementwise(f"{tag}.ln_f", m * h / gy, LAYERNORM_BYTES, 5)
        self.linear_forward(f"{tag}.fwd", self.lm_head, gathered, None)
        self.loss(tag)
        self.linear_backward(f"{tag}.bwd", self.lm_head)
        self.elementwise(f"{tag}.ln_f_bwd", m * h / gy, BACKWARD_ELEMENTWISE_FACTOR * LAYERNORM_BYTES, 8)
        for block in reversed(self.blocks):
            if recompute:
                self.block_forward(f"{tag}.rc", block, None, None)
            self.block_backward(f"{tag}.bwd", block)
        self.elementwise(f"{tag}.embed_bwd", m * h / gy, 2 * self.b, 1)
        self.w.wait(*self.deferred_waits)
        self.deferred_waits.clear()

    def data_parallel_and_optimizer(self) -> None:
        """Blocking gradient all-reduce over data (one bucket per block, embedding last), then Adam."""
        tp = self.plan.gx * self.plan.gy * self.plan.gz
        local_params = self.model.params / tp
        if self.sizes["data"] > 1:
            buckets = [(f"L{layer}", self.model.params_per_layer) for layer in reversed(range(self.model.layers))]
            buckets.append(("embed", self.model.embedding_params + 2 * self.model.hidden))
            reduces = []
            for name, params in buckets:
                work = Collective("all_reduce", "data", self.b * params / tp, self.dtype)
                reduces.append(self.w.collective(f"dp.{name}.ar_data", "data", work))
            self.w.wait(*reduces)
        self.w.compute(
            "optimizer",
            Elementwise(nbytes=OPTIMIZER_BYTES_PER_PARAM * local_params, flops=OPTIMIZER_FLOPS_PER_PARAM * local_params),
        )


def build_axonn(model: ModelSpec, plan: ParallelPlan) -> Schedule:
    """The whole training step of AxoNN's 4D algorithm; `plan` validated, mbs and ga resolved."""
    if plan.mbs <= 0 or plan.ga <= 0:
        raise ValueError("build_axonn needs a plan with mbs and ga resolved (twin.memory.resolve_micro_batch)")
    writer = _StepWriter(model, plan)
    for mb in range(plan.ga):
        writer.micro_batch(mb)
    writer.data_parallel_and_optimizer()

    mesh = axonn_mesh(plan.gx, plan.gy, plan.gz, plan.gdata)
    used_axes = sorted({op.work.group for op in writer.w.ops if isinstance(op.work, Collective)})
    groups = tuple(GroupAxis(axis, tuple(mesh.groups(axis))) for axis in used_axes)
    info = StepInfo(
        model=model.name,
        plan=plan.describe(),
        global_batch=plan.global_batch,
        seq=model.seq,
        flops_hardware=model.flops_per_step(plan.global_batch, "hardware"),
        flops_model=model.flops_per_step(plan.global_batch, "model"),
        memory_per_gpu_bytes=memory_per_gpu(model, plan).total,
    )
    program = Program(ranks=tuple(range(mesh.size)), ops=tuple(writer.w.ops))
    return Schedule(world_size=mesh.size, groups=groups, programs=(program,), info=info)
