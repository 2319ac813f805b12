"""What every part of a pipeline stage's program shares: the plan's sizes on this rank, and how ops are written.

twin.builders.schedule writes one program per pipeline stage with a writer
assembled from its passes, one module per job (its module docstring lists
them in order); each is a subclass of StageBase, which holds the sizes they
all need, the stage's layers and parameters, and writes each op with its
name and its tag (twin.builders.tags) together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from twin.builders.axonn_kernels import rank_params
from twin.builders.megatron_kernels import FP8_GATHER_BYTES, grad_accumulation_bytes
from twin.builders.program import ProgramWriter
from twin.builders.tags import Pass
from twin.ir import FP8, Collective, Elementwise, OpTag
from twin.mesh import gradient_axis, plan_mesh, weight_shard_axis
from twin.model import ModelSpec
from twin.pipeline_split import chunk_layers
from twin.plan import ParallelPlan


Bucket = tuple[str, "int | None", float]  # a gradient bucket: (block, layer, parameters)


@dataclass(frozen=True)
class Linear:
    """One linear of the model; `transposed` swaps the X and Y roles. `layer` is None for the LM head."""

    block: str
    layer: int | None
    k: int
    n: int
    transposed: bool
    name: str = field(init=False, repr=False, compare=False)  # in op names: L<layer>.<block>, or the block alone

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.block if self.layer is None else f"L{self.layer}.{self.block}")

    @property
    def forward_axis(self) -> str:
        """The axis the forward output is all-reduced over (k is split over it)."""
        return "x" if self.transposed else "y"

    @property
    def backward_axis(self) -> str:
        """The axis dI is all-reduced over (n is split over it)."""
        return "y" if self.transposed else "x"


class StageBase:
    """The sizes of one pipeline stage's ranks, and the writing of single ops; one instance per stage."""

    def __init__(self, model: ModelSpec, plan: ParallelPlan, stage: int) -> None:
        self.model, self.plan, self.stage = model, plan, stage
        mesh = plan_mesh(plan)
        self.shard_axis = weight_shard_axis(plan)
        self.gradient_axis = gradient_axis(plan)
        self.sizes = {axis: mesh.axis_size(axis) for axis in {*mesh.names, self.shard_axis, self.gradient_axis}}
        self.tokens = plan.mbs * model.seq // plan.cp  # rows of every GEMM on this rank: cp splits each sequence
        self.residual_split = plan.gy * (plan.gx if plan.sp else 1)  # of the residual stream's hidden/tokens
        self.dtype = model.dtype
        self.b = model.dtype_bytes
        # the gradients' reductions: in fp32 under plan.gradfp32, else in the model's dtype
        self.grad_dtype, self.grad_b = ("fp32", 4) if plan.gradfp32 else (model.dtype, model.dtype_bytes)
        # the data-parallel reductions of the gradient buffer: fp32 also under axonn (ParallelPlan.fp32_main_grads)
        self.data_grad_dtype, self.data_grad_b = ("fp32", 4) if plan.fp32_main_grads(model.dtype) else \
            (self.grad_dtype, self.grad_b)
        self.acc_bytes = grad_accumulation_bytes(model.dtype)
        self.w = ProgramWriter()
        self.n_virtual = plan.pp * plan.vpp
        self.chunks = [  # per chunk: the blocks (each four Linears) of this stage
            [[Linear(name, layer, k, n, t) for name, k, n, t in model.linear_shapes()]
             for layer in chunk_layers(model.layers, plan, stage, chunk)]
            for chunk in range(plan.vpp)
        ]
        self.lm_head = Linear("lm_head", None, model.hidden, model.vocab, False)
        self.deferred_waits: list[int] = []  # ors: reduce-scatters waited at the end of backward
        self.reduced_buckets: list[int] = []  # odp: gradient buckets' reductions issued by the backward
        self.weight_gathers: dict[tuple[str, int | None], int] = {}  # odp: ZeRO-1/2's gathers issued ahead

    def gradient_buckets(self) -> list[Bucket]:
        """(block, layer, parameters) per gradient bucket, in the order backward finishes them: each layer ("layer"),
        the embedding, the LM head and final norm."""
        layers = [block[0].layer for chunk in reversed(self.chunks) for block in reversed(chunk)]
        buckets: list[Bucket] = [("layer", layer, float(self.model.params_per_layer))
                                                         for layer in layers]
        final_norm = float(self.model.norm_params)
        if self.plan.pp == 1:  # the LM head is tied to the word table (GPT) or its own tensor (Llama)
            buckets.append(("embed", None, self.model.embedding_params + self.model.lm_head_params + final_norm))
            return buckets
        if self.stage == self.plan.pp - 1:
            buckets.insert(0, ("lm_head", None, final_norm + self.model.vocab * self.model.hidden))
        if self.stage == 0:
            buckets.append(("embed", None, float(self.model.embedding_params)))
        return buckets

    def bucket_elements(self, block: str, params: float) -> float:
        """A gradient bucket's elements on this rank: its parameters over the tensor-parallel grid, but under axonn
        the embedding's tables as Megatron-AxoNN holds them (twin.builders.axonn_kernels), not sharded over Z."""
        return rank_params(self.model, self.plan, params, with_embedding=block == "embed")

    def weight_shards(self, lin: Linear) -> int:
        """Over how many ranks `lin`'s (x, y) block of weights is sharded, to be gathered before its GEMMs: the
        shard axis, but under axonn the LM head is the word table, which Megatron-AxoNN does not shard over Z."""
        return 1 if self.plan.axonn and lin.layer is None else self.sizes[self.shard_axis]

    # ---- sizes -------------------------------------------------------------
    def residual_elements(self) -> float:
        """Elements of the residual stream (tokens x hidden) this rank holds."""
        return self.tokens * self.model.hidden / self.residual_split

    def head_elements(self) -> float:
        """Elements of q, k, v or the attention context (tokens x hidden/gx: the local heads) on this rank."""
        return self.tokens * self.model.hidden / self.sizes["x"]

    def norm_params(self) -> float:
        """Elements of one norm parameter (gamma, or LayerNorm's beta) on this rank: the hidden split over gy."""
        return self.model.hidden / self.sizes["y"]

    def weight_block_bytes(self, lin: Linear) -> float:
        """The gathered (x, y) block of W: what the weight all-gather returns."""
        return self.b * lin.k * lin.n / (self.sizes["x"] * self.sizes["y"])

    def weight_grad_block_bytes(self, lin: Linear) -> float:
        """The (x, y) block of dW, in the gradients' dtype: what the weight gradient's reduce-scatter takes."""
        return self.weight_block_bytes(lin) / self.b * self.grad_b

    def gemm_dims(self, lin: Linear) -> tuple[int, int, int]:
        """(rows, k_local, n_local) of this rank's forward GEMM."""
        return (self.tokens, lin.k // self.sizes[lin.forward_axis], lin.n // self.sizes[lin.backward_axis])

    def gemm_dtype(self, lin: Linear) -> str:
        """A linear's GEMMs' dtype: FP8 for a layer's linears under plan.fp8 (Transformer Engine's modules; the LM
        head, Megatron's own ColumnParallelLinear, stays in the model's dtype), else the model's."""
        return FP8 if self.plan.fp8 and lin.layer is not None else self.dtype

    def gathered_bytes(self, lin: Linear) -> float:
        """Bytes per element of a sequence-parallel all-gather of the linear's input or output gradient: FP8 copies
        where its GEMMs run in FP8 (they are quantised before the gather), else the model's dtype."""
        return FP8_GATHER_BYTES if self.gemm_dtype(lin) == FP8 else self.b

    def output_elements(self, lin: Linear) -> float:
        """Elements of the linear's output where its bias is added: the residual stream's share after a
        transposed (row-parallel) linear, tokens x n_local after the others."""
        return self.residual_elements() if lin.transposed else self.tokens * self.gemm_dims(lin)[2]

    # ---- writing ops ---------------------------------------------------------
    def elementwise(self, name: str, tag: OpTag, elements: float, bytes_per_element: float,
                    flops_per_element: float = 1.0) -> int:
        work = Elementwise(elements * bytes_per_element, elements * flops_per_element)  # (nbytes, flops)
        return self.w.compute(name, work, (), tag)

    def blocking(self, name: str, tag: OpTag, kind: str, axis: str, nbytes: float, dtype: str | None = None) -> int:
        """A collective the next compute op waits for."""
        op = self.w.collective(name, axis, Collective(kind, axis, nbytes, dtype or self.dtype), tag=tag)
        self.w.wait(op)
        return op

    @staticmethod
    def kernel(at: Pass, block: str, role: str, layer: int | None = None) -> tuple[str, OpTag]:
        """A module's kernel in the pass `at`, its name and its tag. Named <mb>.<pass>.L<n>.<block>_<role> in a layer,
        <mb>.<block>_<role> outside (ln_f); the module's own forward kernel (role "fwd") by the block alone."""
        kernel = block if role == "fwd" else f"{block}_{role}"
        name = f"{at.micro_label}.{kernel}" if layer is None else f"{at.label}.L{layer}.{kernel}"
        return name, at.tag(block, role, layer)

    def accumulate(self, at: Pass, block: str, layer: int | None, parameter: str, elements: float) -> int:
        """main_grad.add_(grad) of one parameter tensor (DistributedDataParallel's hook) in the backward pass `at`:
        named <mb>.bwd.acc.[L<n>.]<block>.<parameter>, role acc_<parameter> (twin.builders.tags.ACCUMULATE_ROLES)."""
        where = block if layer is None else f"L{layer}.{block}"
        return self.elementwise(f"{at.label}.acc.{where}.{parameter}", at.tag(block, f"acc_{parameter}", layer),
                                elements, self.acc_bytes, 1)
