"""One linear layer's forward and backward on the 4D mesh: GEMMs, their collectives, the bias, the accumulations.

The convention is twin.builders.schedule's (its module docstring): W's (x, y)
block sharded along Z (z+data under ZeRO-3), gathered before the forward
GEMM (and, with reshard, again before the backward's dI GEMM in a layer
that does not recompute) and its gradient reduce-scattered after dW; the
forward output all-reduced over the linear's forward axis, dI over its
backward axis; sequence parallelism (sp=1, over X) gathers and scatters the
activations instead. The overlap switches decide only the waits (oar, ors) and when the
next linear's weights are gathered (oag); under axonn the first forward gathers each linear's
weights at the linear itself, and a gather AxoNN's code would not prefetch is followed by its
copies (twin.builders.axonn_kernels).

With fp8 (ParallelPlan.fp8) a layer's linears quantise their input in the
forward and their output's gradient in the backward ("fp8_in", "fp8_grad"),
on the rank's own rows before any sequence-parallel gather, which then moves
the 1-byte copies (under current scaling after an all-reduce of the
tensor's amax over x, so that every rank casts with one scale); their
forward, dI and dW GEMMs run in FP8. The reductions of outputs and input
gradients stay in the model's dtype.

With tpo (Megatron-Core's --tp-comm-overlap: Transformer Engine splits the
GEMM into gx chunks along the tokens and moves one chunk's rows while it
multiplies another's) a sequence-parallel gather in front of a GEMM runs
under all of it but its last chunk, which waits for the gather ("gemm_tail",
"dI_tail"): the rank's own rows need no transfer, so the first chunks start
at once; and the reduce-scatter behind a row-parallel GEMM starts after its
first chunk and runs under the rest ("gemm" is then that first chunk,
"gemm_rest" the others). As a time, max(GEMM, collective) plus one chunk,
where the blocking form pays their sum; the collective's share of the
device's compute (comm_compute_slowdown) applies while both run.
"""

from __future__ import annotations

from twin.builders.axonn_kernels import CAT_PASSES, LIST_COPY_OUT_PASSES, gather_stream
from twin.builders.fsdp_kernels import COPY_OUT_PASSES
from twin.builders.megatron_kernels import BIAS_GRAD_BYTES, FP8_AMAX_BYTES, FP8_QUANTIZE_BYTES
from twin.builders.stage import Linear, StageBase
from twin.builders.tags import Pass
from twin.ir import FP8, Collective, Elementwise, Gemm, OpTag


class LinearWriter(StageBase):
    """Writes the ops of single linears."""

    @staticmethod
    def named(at: Pass, lin: Linear, role: str) -> tuple[str, OpTag]:
        """An op of `lin` in the pass `at`: its name (<mb>.<pass>.<linear>.<role>) and its tag."""
        return f"{at.label}.{lin.name}.{role}", at.tag(lin.block, role, lin.layer)

    def gather_weight(self, at: Pass, lin: Linear) -> int | None:
        """The all-gather of `lin`'s sharded weights over the shard axis, issued; None where they are not sharded."""
        axis = self.shard_axis
        if self.weight_shards(lin) == 1:
            return None
        work = Collective("all_gather", axis, self.weight_block_bytes(lin), self.dtype)
        name, tag = self.named(at, lin, f"ag_{axis.replace('+', '')}")
        stream = gather_stream(axis) if self.plan.axonn else None  # AxoNN's second process group over Z
        return self.w.collective(name, axis, work, stream=stream, tag=tag)

    def linear_forward(self, at: Pass, lin: Linear, gathered: int | None, prefetch: Linear | None,
                       held: bool = False) -> int | None:
        """Forward of one linear; returns the prefetched all-gather of `prefetch`, if issued. `held`: its weights are
        still gathered from the forward (recompute=op's rerun without reshard; a cached layer's:
        holds_cached_weights), so nothing is gathered."""
        w, sp = self.w, self.plan.sp and self.sizes["x"] > 1
        next_gather = None if held else self.forward_gather(at, lin, gathered, prefetch)
        rows, k_loc, n_loc = self.gemm_dims(lin)
        tune, tpo, dtype = self.tunes(lin), self.overlaps_tp(lin), self.gemm_dtype(lin)
        gathered_input = sp and not lin.transposed  # sequence-parallel input gathered before a column-parallel linear
        self.quantize(at, lin, "fp8_in", rows * k_loc / (self.sizes["x"] if gathered_input else 1), gathered_input)
        if gathered_input:
            nbytes = self.gathered_bytes(lin) * rows * k_loc
            if tpo:
                self.gemm_under_gather(at, lin, "gemm", rows, n_loc, k_loc, "NT", nbytes)
                return next_gather
            self.blocking(*self.named(at, lin, "ag_x"), "all_gather", "x", nbytes, dtype)
        axis = lin.forward_axis
        if tpo and lin.transposed:  # row-parallel: the reduce-scatter under all but the first chunk
            first = rows // self.sizes["x"]
            name, tag = self.named(at, lin, "gemm")
            w.compute(name, Gemm(first, n_loc, k_loc, "NT", dtype, tunable=tune), tag=tag)
            name, tag = self.named(at, lin, "rs_x")
            scatter = w.collective(name, "x", Collective("reduce_scatter", "x", self.b * rows * n_loc, self.dtype),
                                   tag=tag)
            name, tag = self.named(at, lin, "gemm_rest")
            w.compute(name, Gemm(rows - first, n_loc, k_loc, "NT", dtype, tunable=tune), tag=tag)
            w.wait(scatter)
            return next_gather
        name, tag = self.named(at, lin, "gemm")
        w.compute(name, Gemm(rows, n_loc, k_loc, "NT", dtype, tunable=tune), tag=tag)
        if self.sizes[axis] > 1:
            if sp and lin.transposed:
                self.blocking(*self.named(at, lin, "rs_x"), "reduce_scatter", "x", self.b * rows * n_loc)
            else:
                self.blocking(*self.named(at, lin, f"ar_{axis}"), "all_reduce", axis, self.b * rows * n_loc)
        return next_gather

    def forward_gather(self, at: Pass, lin: Linear, gathered: int | None, prefetch: Linear | None) -> int | None:
        """Before a forward's GEMM: wait for `lin`'s sharded weights (`gathered`, prefetched by the linear before, or
        gathered here) and, with oag, prefetch those of `prefetch`, the next linear; returns that prefetched gather.
        Under axonn the first forward prefetches nothing, and a gather made here that AxoNN's code would not have
        prefetched is followed by its copies (list_gather_copies)."""
        prefetching = self.plan.oag and not (self.plan.axonn and at.phase == "fwd")
        listed = False  # gathered here through axonn's list all-gather (twin.builders.axonn_kernels)
        if self.weight_shards(lin) > 1 and gathered is None:
            gathered = self.gather_weight(at, lin)
            listed = self.plan.axonn and not prefetching  # a recompute's first gather is the iterator's, in place
        if gathered is not None:
            self.w.wait(gathered)
            self.copy_out(at, lin)
            if listed:
                self.list_gather_copies(at, lin)
        return self.gather_weight(at, prefetch) if (prefetch and prefetching) else None

    def list_gather_copies(self, at: Pass, lin: Linear) -> None:
        """Under axonn, the copies of a weight gather AxoNN does not prefetch (twin.builders.axonn_kernels)."""
        elements, shards = self.weight_block_bytes(lin) / self.b, self.weight_shards(lin)
        name, tag = self.named(at, lin, "ag_copy")  # one copy kernel per shard, issued by one host call
        self.w.compute(name, Elementwise(elements * LIST_COPY_OUT_PASSES * self.b, 0.0, shards), (), tag)
        self.elementwise(*self.named(at, lin, "ag_cat"), elements, CAT_PASSES * self.b, 0)

    def copy_out(self, at: Pass, lin: Linear) -> None:
        """Under fsdp2, FSDP2's copy of `lin`'s gathered weights out of the all-gather's buffer into the parameter,
        once the gather is waited (twin.builders.fsdp_kernels)."""
        if self.plan.fsdp2:
            self.elementwise(*self.named(at, lin, "copy_out"), self.weight_block_bytes(lin) / self.b,
                             COPY_OUT_PASSES * self.b, 0)

    def partial_forward(self, at: Pass, lin: Linear, gathered: int | None, prefetch: Linear | None,
                        columns: float, held: bool) -> int | None:
        """The forward GEMM of `lin` for only `columns` of its output features (role "gemm_part"): what per-operator
        checkpointing reruns of a fused linear whose separate matrix multiplies it keeps in part (twin.plan's
        recompute=op: the k of QKV, the up half of SwiGLU's gate and up), after the weights' gather as in
        linear_forward (none where they are `held`). Only for plans without tensor parallelism in the block, which
        recompute=op requires."""
        next_gather = None if held else self.forward_gather(at, lin, gathered, prefetch)
        rows, k_loc, _ = self.gemm_dims(lin)
        name, tag = self.named(at, lin, "gemm_part")
        self.w.compute(name, Gemm(rows, round(columns), k_loc, "NT", self.gemm_dtype(lin),
                                  tunable=self.tunes(lin)), tag=tag)
        return next_gather

    def tunes(self, lin: Linear, weight_gradient: bool = False) -> bool:
        """Whether `lin`'s GEMM takes its fastest layout (tune_gemm): every GEMM, except under axonn those AxoNN's
        tuner never times (axonn-ai/axonn tuned_matmul, fa5be81, July 2024, on its Gordon Bell runs' branch: its
        Linear's forward and input-gradient products, not the weight gradient's; the LM head is Megatron's own)."""
        if not self.plan.tune_gemm:
            return False
        return not self.plan.axonn or (lin.layer is not None and not weight_gradient)

    def overlaps_tp(self, lin: Linear) -> bool:
        """tpo applies to `lin`: sequence parallelism over gx > 1, and a layer's linear (Transformer Engine's modules;
        the LM head is Megatron's own ColumnParallelLinear, whose gather stays in front of it)."""
        return self.plan.tpo and self.plan.sp and self.sizes["x"] > 1 and lin.layer is not None

    def gemm_under_gather(self, at: Pass, lin: Linear, role: str, m: int, n: int, k: int, layout: str,
                          nbytes: float) -> None:
        """tpo: the sequence-parallel all-gather of `nbytes` issued, the GEMM's first gx - 1 chunks of m rows under
        it, the last chunk (role <role>_tail) after its wait (module docstring)."""
        w, tune, dtype = self.w, self.tunes(lin), self.gemm_dtype(lin)
        name, tag = self.named(at, lin, "ag_x")
        gather = w.collective(name, "x", Collective("all_gather", "x", nbytes, dtype), tag=tag)
        last = m // self.sizes["x"]
        name, tag = self.named(at, lin, role)
        w.compute(name, Gemm(m - last, n, k, layout, dtype, tunable=tune), tag=tag)
        w.wait(gather)
        name, tag = self.named(at, lin, f"{role}_tail")
        w.compute(name, Gemm(last, n, k, layout, dtype, tunable=tune), tag=tag)

    def quantize(self, at: Pass, lin: Linear, role: str, elements: float, gathered: bool) -> None:
        """Under plan.fp8, Transformer Engine's quantisation of `elements` of the linear's input ("fp8_in") or
        output gradient ("fp8_grad") before its GEMMs (and before their sequence-parallel gather): the cast to the
        row-wise and transposed FP8 copies, after an amax pass under current scaling (twin.builders.megatron_kernels).
        A tensor sequence parallelism then gathers (`gathered`) shares one scale over the tensor-parallel ranks: under
        current scaling its amax is all-reduced over x ("amax_x") between the amax pass and the cast; written after
        the quantisation, whose two passes it separates, the chain to the gather takes as long."""
        if self.gemm_dtype(lin) != FP8:
            return
        self.elementwise(*self.named(at, lin, role), elements, FP8_QUANTIZE_BYTES[self.plan.fp8recipe], 2)
        if gathered and self.plan.fp8recipe == "current":
            self.blocking(*self.named(at, lin, "amax_x"), "all_reduce", "x", FP8_AMAX_BYTES, "fp32")

    def caches_weights(self, layer: int | None) -> bool:
        """Whether `layer` keeps the weights its first forward of the step gathers until the optimizer step
        (ParallelPlan.cache: axonn's weights cache, the model's first `cache` layers)."""
        return layer is not None and layer < self.plan.cache

    def holds_cached_weights(self, at: Pass, layer: int | None) -> bool:
        """Whether the block of `layer` finds its weights still gathered in the pass `at`: a cached layer's
        (caches_weights) in every forward after the step's first and in every recompute."""
        return self.caches_weights(layer) and (at.phase == "rc" or bool(at.micro_batch))

    def regathers(self, recomputed: bool, layer: int | None = None) -> bool:
        """Whether a backward gathers its sharded weights again: FSDP's reshard after forward freed them, no
        recompute of its block (`recomputed`) gathered them back (the recompute's forward does that itself), and
        its layer (None: the LM head) does not keep them for the step (caches_weights)."""
        return self.plan.reshard and not recomputed and self.sizes[self.shard_axis] > 1 and \
            not self.caches_weights(layer)

    @property
    def regathers_backward(self) -> bool:
        """regathers for the plan's recompute as a whole: what the LM head's backward does (no recompute reruns
        it), and every block's where all of them recompute or none does (recompute=op's gathers its block's weights
        as full recompute's does: twin.builders.layer)."""
        return self.regathers(self.plan.recompute in ("full", "op"))

    def backward_gather(self, at: Pass, lin: Linear, gathered: int | None, prefetch: Linear | None,
                        regather: bool) -> int | None:
        """Where the backward gathers `lin`'s weights again (`regather`): wait for them (`gathered`, prefetched by
        the linear before in the backward's order, or gathered here). Then, with oag, prefetch those of
        `prefetch`, the next linear of the backward that gathers again (FSDP's BACKWARD_PRE; None where there is
        none); returns that prefetched gather."""
        if regather and self.weight_shards(lin) > 1:
            if gathered is None:
                gathered = self.gather_weight(at, lin)
            self.w.wait(gathered)
            self.copy_out(at, lin)
        return self.gather_weight(at, prefetch) if (prefetch and self.plan.oag) else None

    def linear_backward(self, at: Pass, lin: Linear, bias: bool = False, accumulate: bool = True,
                        gathered: int | None = None, prefetch: Linear | None = None,
                        regather: bool = False) -> int | None:
        """dI, dW (and, for a linear that adds its bias itself, dbias: LinearWithGradAccumulationAndAsyncCommunication
        .backward), then the accumulation of its weight (and that bias) into main_grad. Where the backward gathers
        its weights again (`regather`: regathers for its block, regathers_backward for the LM head) they are
        gathered first (backward_gather: `gathered`, `prefetch`); returns the prefetched gather of `prefetch`.

        A z-sharded weight accumulates its reduce-scattered shard, after the reduce-scatter's wait without ors;
        with ors the reduce-scatter is waited only at the end of the backward (AxoNN), and the add is issued in
        its place here all the same: its wait on the shard is not modelled."""
        w, plan = self.w, self.plan
        next_gather = self.backward_gather(at, lin, gathered, prefetch, regather)
        sp = plan.sp and self.sizes["x"] > 1
        rows, k_loc, n_loc = self.gemm_dims(lin)
        tune, dtype, gathered = self.tunes(lin), self.gemm_dtype(lin), self.gathered_bytes(lin)
        regather = None
        gathered_grad = sp and lin.transposed  # the output gradient arrives sequence-split: gathered in FP8
        self.quantize(at, lin, "fp8_grad", rows * n_loc / (self.sizes["x"] if gathered_grad else 1), gathered_grad)
        if lin.transposed and self.overlaps_tp(lin):  # the gradient's gather under the dI GEMM's chunks
            self.gemm_under_gather(at, lin, "dI", rows, k_loc, n_loc, "NN", gathered * rows * n_loc)
        else:
            if sp and lin.transposed:  # the gradient arrives sequence-split: gather it first
                self.blocking(*self.named(at, lin, "ag_x"), "all_gather", "x", gathered * rows * n_loc, dtype)
            elif sp:  # the saved input is sequence-split: gather it again for dW, behind the dI GEMM
                name, tag = self.named(at, lin, "ag_in_x")
                regather = w.collective(name, "x", Collective("all_gather", "x", gathered * rows * k_loc, dtype),
                                        tag=tag)
            name, tag = self.named(at, lin, "dI")
            w.compute(name, Gemm(rows, k_loc, n_loc, "NN", dtype, tunable=tune), tag=tag)
        axis = lin.backward_axis
        reduce_dI = None
        if self.sizes[axis] > 1 and not (sp and lin.transposed):
            kind, short = ("reduce_scatter", "rs") if sp else ("all_reduce", "ar")
            name, tag = self.named(at, lin, f"{short}_{axis}")
            reduce_dI = w.collective(name, axis, Collective(kind, axis, self.b * rows * k_loc, self.dtype), tag=tag)
            if not plan.oar:
                w.wait(reduce_dI)
        if regather is not None:
            w.wait(regather)
        name, tag = self.named(at, lin, "dW")
        w.compute(name, Gemm(n_loc, k_loc, rows, "TN", dtype, tunable=self.tunes(lin, weight_gradient=True)), tag=tag)
        if bias:  # grad_output.sum(dim=0), before the handle's wait
            self.elementwise(*self.named(at, lin, "dbias"), rows * n_loc, BIAS_GRAD_BYTES, 1)
        if reduce_dI is not None and plan.oar:
            w.wait(reduce_dI)
        axis, shards = self.shard_axis, self.weight_shards(lin)
        if shards > 1:
            work = Collective("reduce_scatter", axis, self.weight_grad_block_bytes(lin), self.grad_dtype)
            name, tag = self.named(at, lin, f"rs_{axis.replace('+', '')}")
            scatter = w.collective(name, axis, work, tag=tag)
            if plan.ors:
                self.deferred_waits.append(scatter)
            else:
                w.wait(scatter)
        if accumulate:
            self.accumulate(at, lin.block, lin.layer, "weight", k_loc * n_loc / shards)
            if bias:
                self.accumulate(at, lin.block, lin.layer, "bias", n_loc)
        return next_gather

    def bias_backward(self, at: Pass, lin: Linear) -> None:
        """The gradient of a bias added outside the linear's GEMM (a reduction over tokens), and its accumulation."""
        self.elementwise(*self.named(at, lin, "dbias"), self.output_elements(lin), BIAS_GRAD_BYTES, 1)
        self.accumulate(at, lin.block, lin.layer, "bias", self.gemm_dims(lin)[2])
