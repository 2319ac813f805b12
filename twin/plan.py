"""ParallelPlan: how one training step is split over the GPUs.

One dataclass for every parallel scheme the twin models (what a plan must
satisfy for a model and a GPU count: twin.plan_checks), in AxoNN's
names: G = gdata x gx x gy x gz, a 3D tensor-parallel matrix multiply on the
gx x gy x gz grid inside each of gdata data-parallel groups (gz also shards
the weights, ZeRO-3 style, and splits the batch). gx only = Megatron-LM
tensor parallelism; gz only = FSDP; gz + gdata = HSDP.

Megatron-DeepSpeed's knobs live in the same plan: `pp` pipeline stages (1F1B,
or interleaved with `vpp` model chunks per rank), `zero` (ZeRO stage 0-3 over
gdata), `sp` (sequence parallelism over gx), `recompute` (full, selective,
op, none); `tp` and `dp` are accepted as Megatron's names for gx and gdata.
`cp` is context parallelism (Megatron-Core's, torchtitan's): each sequence's
tokens split over cp ranks, attention as a ring passing K/V blocks around
them, gradients summed over cp and gdata together (and ZeRO sharded over
both). G = gx gy gz cp gdata pp. The degrees are the axes of twin.axes, which
parsing, validation, `describe`, the mesh and the search all read.

`rcl` recomputes only some layers (Megatron-Core's --recompute-method block
with --recompute-num-layers N, with recompute=full): in each model chunk
(the stage's layers, or each interleaved chunk's) the first rcl layers
rerun their forward before their backward and keep only their input, the
others keep every activation as without recompute. 0, the default, is
every layer: full recompute as Korthikanti et al. count it. It sits
between none and full in memory and in time, which is how runs whose
activations would not fit without recompute avoid recomputing all of them.

`attention` is the attention kernel the run uses: "flash" (one fused
FlashAttention kernel per direction, what AxoNN and the Frontier paper ran:
the default) or "unfused" (Megatron-LM's "core attention" before
FlashAttention: batched GEMMs around a fused softmax, or torch's where
Megatron cannot fuse it, and a dropout, which also stores the s x s scores
for backward). Selective recompute (Korthikanti
et al., arXiv 2205.05198) recomputes exactly that core attention, so it only
differs from `recompute=none` with unfused attention.

`recompute=op` is torchtitan's per-operator selective checkpointing of a
Llama block (its "selective op", 2024): the attention's and every other
matrix multiply's outputs kept, the rest rerun before the block's backward
(twin.builders.layer; its limits: twin.plan_checks).

`optimizer` is the optimizer step's implementation: "megatron" (Megatron's
mixed-precision optimizer with apex's FusedAdam, several multi-tensor passes
and, in fp16, one cast per parameter tensor: the default) or "flat"
(DeepSpeed's fused fp16 step under --deepspeed: the gradients in one flat
buffer, their norm, one fused Adam that writes the 16-bit weights too; ZeRO 0
only). twin.builders.megatron_kernels counts both.

Batch bookkeeping. `global_batch` sequences per step are split over the
gdata x gz ranks that see different data, so each rank processes
global_batch / (gdata gz) sequences per step, in `ga` micro-batches of `mbs`
sequences (with a pipeline, `ga` is the number of micro-batches m per step).
When neither mbs nor ga is given, twin.memory.resolve_micro_batch picks one.

`kernels` is how a Llama layer's element-wise work is launched: "fused"
(Megatron-Core's one kernel per module, the default) or "eager" (op by op,
as torchtitan's Llama of 2024 runs without torch.compile;
twin.builders.eager_kernels); `norm` the same for its RMSNorms, which
torchtitan's configs choose apart ("fused" its Triton kernel, "eager"
torch's RMSNorm module).

`fsdp2` counts what PyTorch's FSDP2 (per-parameter sharding, torchtitan's)
does beside the gathers: after each all-gather of sharded weights, a copy out
of the gather's buffer into each parameter on the compute stream
(twin.builders.fsdp_kernels).

`axonn` gathers the linears' sharded weights as the AxoNN paper's code
(Megatron-AxoNN on axonn's Gordon Bell branch) does (twin.builders.axonn_kernels), on a second
communicator over Z: the first forward's all-gathers block and are copied out of the collective's buffer
(oag prefetches only in the recompute); in bf16 its gradient buffer, and its
data-parallel all-reduce, are fp32; the embedding is not sharded over Z, and
what it leaves whole is all-reduced over Z (replicated_grads). One pipeline
stage. `cache` (its --num-layers-for-caching-weights-in-depth-tensor-parallel-all-gather) keeps the
weights the first `cache` layers' first forward gathers until the optimizer
step: no later forward or recompute gathers them again. Needs axonn=1.

`reshard` is what the weights sharded over gz (or gdata under ZeRO-3) do
between a layer's forward and its backward: 0 keeps the gathered weights for
the backward (AxoNN's Algorithm 1, FSDP's SHARD_GRAD_OP: the default); 1
frees them after the forward and gathers them again for the backward
(PyTorch FSDP's FULL_SHARD, reshard_after_forward). With full recompute both
gather again for the recompute, so they differ only in the layers that do
not recompute: every layer without full recompute, and with rcl the layers
of each chunk after its first rcl.

`tpo` is Megatron-Core's tensor-parallel communication overlap
(--tp-comm-overlap, Transformer Engine's userbuffers; torchtitan's AsyncTP):
with sequence parallelism, the all-gather in front of a column-parallel GEMM
and the reduce-scatter behind a row-parallel one (and the gradient's gather in
a row-parallel backward) run in chunks under the GEMM instead of around it
(twin.builders.linears). Needs sp=1.

`pemb` and `ploss` count the embedding, and the LM head with the loss, as
one layer each where the layers are split over the pipeline's chunks
(Megatron-Core's --account-for-embedding-in-pipeline-split and
--account-for-loss-in-pipeline-split; Llama 3 405B's 126 layers on 16
stages): the first and the last stage then hold fewer layers
(twin.pipeline_split).

`cpcomm=allgather` runs context parallelism's attention as Transformer
Engine's all-gather variant (Megatron-Core's --cp-comm-type all_gather; the
Llama 3 paper's sec. 3.3.2): K and V all-gathered over the cp ranks before
the kernels, their gradients reduce-scattered after, where the default
(`p2p`) passes them around a ring under the kernels
(twin.builders.gathered_attention, twin.builders.ring_attention).

`dpouter` places the ranks in the order tp-cp-pp-dp: each pipeline's stages
on consecutive GPUs and the data-parallel replicas outermost (Megatron's
--use-tp-pp-dp-mapping; Meta's Llama 3 405B runs), where the default puts
the stages outermost (Megatron's tp-cp-dp-pp). Only where the ranks run
changes (twin.mesh.rank_gpus), not their groups or programs.

`fp8` runs the layers' linears in FP8, as Transformer Engine does under
Megatron-Core's --fp8-format: each linear's input and output gradient
quantised, its three GEMMs at the device's FP8 rate, and sequence
parallelism's gathers of those inputs moved in FP8; the weights quantised
once a step, and their FP8 copies held beside the bf16 ones. The LM head,
attention and everything else stay in the model's dtype
(twin.builders.linears, twin.memory). `fp8recipe` names how a tensor is
quantised: `current` scaling (--fp8-recipe tensorwise, the default: an amax
pass, then a cast writing the row-wise and the transposed copy) or
`delayed` scaling (--fp8-recipe delayed, Transformer Engine's only recipe
before 2.0: the scale from earlier steps' amax, the new amax taken inside
the cast, one pass). `fp8pg` is Megatron-Core's --fp8-param-gather (which
Megatron-Bridge's current-scaling recipe sets): the layers' linear weights
are kept in FP8 only (no bf16 copy), each rank quantises its own ZeRO shard
from the fp32 master weights after the optimizer, ZeRO-1/2's gather of the
updated weights moves them in FP8, and the transposed copy is made after
the gather.
`gradfp32` accumulates the gradients in fp32 and reduces them in fp32 over
the ranks that hold the same weights: the data-parallel all-reduce or
reduce-scatter, the tied embedding's all-reduce and, with weights sharded
over gz (or gdata under ZeRO-3), the weight gradients' reduce-scatter, each
4 bytes an element where the model's dtype moves 2, and the gradient buffer
4 bytes a parameter in memory. Megatron-LM with --bf16 does so by default
(--accumulate-allreduce-grads-in-fp32, Megatron-Core's grad_reduce_in_fp32),
as does PyTorch FSDP with MixedPrecision(reduce_dtype=torch.float32)
(torchtitan's default) and Meta's Llama 3 training; the default (0) reduces
them in the model's dtype, as Megatron-DeepSpeed in fp16,
Megatron-Bridge's performance recipes and FSDP's "PURE" mixed precision do.

`odp` overlaps the data-parallel synchronisation with the step: each
gradient bucket (a layer's, the embedding's, the LM head's) is all-reduced or
reduce-scattered as soon as the last micro-batch's backward has finished it,
under the rest of the backward (PyTorch DDP's buckets, Megatron's
--overlap-grad-reduce), and under ZeRO-1/2 the updated weights are gathered
under the next step's forward, each layer's waited before its first use
(--overlap-param-gather); without it all of that runs after the backward and
after the optimizer (twin.builders.data_parallel).

The overlap switches are AxoNN's (reference/algorithms.md section 2):
oar (backward all-reduce of dI overlaps the dW GEMM), ors (reduce-scatter of dW
waited only at the end of backward), oag (next layer's weight all-gather
prefetched one layer ahead). `tune_gemm` picks, per GEMM, the fastest of the
NN/NT/TN layouts as AxoNN does in its first batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from twin import axes, limits
from twin.errors import TwinError

RECOMPUTE_MODES = ("full", "selective", "op", "none")
ATTENTION_KINDS = ("flash", "unfused")
OPTIMIZER_KINDS = ("megatron", "flat")
# How a pipeline transfer crosses a stage boundary where every tensor-parallel rank holds the whole tensor (no
# sequence parallelism): each rank sends 1/tp of it, all-gathered after the receive (Megatron-LM's scatter-gather,
# Megatron-DeepSpeed, DeepSpeed's pipeline engine), or each sends all of it (megatron.core without sequence
# parallelism; --no-scatter-gather-tensors-in-pipeline). twin.builders.pipeline_passes.
P2P_KINDS = ("split", "full")
# How context parallelism's attention meets the other ranks' keys and values: passed around a ring under the
# attention kernels (Megatron-Core's --cp-comm-type p2p, the default), or all-gathered before them and their
# gradients reduce-scattered after (--cp-comm-type all_gather: Transformer Engine's, Llama 3's).
CP_COMM_KINDS = ("p2p", "allgather")
# How an FP8 linear's tensors are quantised (ParallelPlan.fp8): current scaling (an amax pass, then the cast) or
# delayed scaling (the scale from an amax history, the cast alone). twin.builders.megatron_kernels.
FP8_RECIPES = ("current", "delayed")
# How a Llama layer's element-wise work is launched (ParallelPlan.kernels): Megatron-Core's fused kernels, or op by
# op in eager PyTorch as torchtitan's Llama of 2024 runs it. twin.builders.eager_kernels.
KERNEL_KINDS = ("fused", "eager")
# How a Llama layer's RMSNorms are launched (ParallelPlan.norm): one fused kernel each way, or torch's RMSNorm module
# op by op (torchtitan's norm_type "rmsnorm"). twin.builders.eager_kernels.
NORM_KINDS = ("fused", "eager")
ZERO_STAGES = (0, 1, 2, 3)
_BOOL_WORDS = {"1": True, "true": True, "on": True, "yes": True, "0": False, "false": False, "off": False, "no": False}


@dataclass(frozen=True)
class ParallelPlan:
    gx: int = 1
    gy: int = 1
    gz: int = 1
    gdata: int = 1
    cp: int = 1  # context parallel ranks: each sequence's tokens split over them (ring attention)
    global_batch: int = 0
    mbs: int = 0  # sequences per rank per micro-batch; 0 = derive
    ga: int = 0  # micro-batches per step (gradient accumulation); 0 = derive
    recompute: str = "full"
    rcl: int = 0  # with recompute=full, only the first rcl layers of each model chunk recompute; 0 = every layer
    attention: str = "flash"  # ATTENTION_KINDS: the fused kernel, or Megatron's unfused core attention
    optimizer: str = "megatron"  # OPTIMIZER_KINDS: Megatron's mixed-precision optimizer, or DeepSpeed's flat fused one
    p2p: str = "split"  # P2P_KINDS: pipeline transfers cut over the tensor-parallel ranks, or whole on each
    cpcomm: str = "p2p"  # CP_COMM_KINDS: context parallelism's K/V passed in a ring, or all-gathered
    pp: int = 1  # pipeline stages (1F1B schedule)
    vpp: int = 1  # virtual stages (model chunks) per pipeline rank: interleaved 1F1B when > 1
    pemb: bool = False  # the embedding counts as one layer in the pipeline's split (twin.pipeline_split)
    ploss: bool = False  # the LM head and loss count as one layer in the pipeline's split
    zero: int = 0  # ZeRO stage over the data axis
    sp: bool = False  # Megatron sequence parallelism over gx (needs gy = 1)
    reshard: bool = False  # sharded weights freed after each layer's forward, gathered again for its backward (FSDP)
    tpo: bool = False  # sequence-parallel gathers and scatters chunked under their GEMMs (--tp-comm-overlap)
    odp: bool = False  # data-parallel buckets synchronised under the backward, weights gathered under the forward
    dpouter: bool = False  # ranks placed tp-cp-pp-dp (data-parallel replicas outermost), not tp-cp-dp-pp (twin.mesh)
    fp8: bool = False  # the layers' linears in FP8 (Transformer Engine)
    fp8recipe: str = "current"  # FP8_RECIPES: how fp8's tensors are quantised
    fp8pg: bool = False  # the linears' weights kept, and ZeRO-1/2's weights gathered, in FP8 (--fp8-param-gather)
    gradfp32: bool = False  # gradients accumulated and reduced in fp32 (Megatron's bf16 default; FSDP reduce_dtype)
    kernels: str = "fused"  # KERNEL_KINDS: a Llama layer's element-wise work fused (Megatron-Core) or eager (torchtitan)
    norm: str = "fused"  # NORM_KINDS: a Llama layer's RMSNorms fused, or torch's RMSNorm module op by op (torchtitan)
    fsdp2: bool = False  # the gathered weights copied out of FSDP2's all-gather buffer into each parameter
    axonn: bool = False  # weight gathers as Megatron-AxoNN runs them: the forward's blocking, copied, then concatenated
    cache: int = 0  # under axonn, the first `cache` layers' gathered weights kept for the step (AxoNN's weight cache)
    oar: bool = True
    ors: bool = True
    oag: bool = True
    tune_gemm: bool = True

    @property
    def degrees(self) -> dict[str, int]:
        """Each axis of twin.axes -> its degree, in the registry's (the mesh's) order."""
        return {key: getattr(self, key) for key in axes.KEYS}

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees.values())

    @property
    def tensor_parallel_size(self) -> int:
        """GPUs that split one pipeline stage's weights (the 3D tensor-parallel grid)."""
        return self.gx * self.gy * self.gz

    @property
    def gradient_replicas(self) -> int:
        """Ranks that hold the same weights and sum their gradients: gdata, times cp (whose ranks saw other tokens
        of the same sequences). ZeRO shards over them."""
        return self.gdata * self.cp

    @property
    def gathered_shards(self) -> int:
        """How many ways each (gx, gy) weight block is sharded and all-gathered before its use: gz, times the
        gradient replicas under ZeRO-3."""
        return self.gz * (self.gradient_replicas if self.zero == 3 else 1)

    @property
    def weight_shards(self) -> int:
        """How many ways each stage's weights are split: the 3D grid, times the gradient replicas under ZeRO-3."""
        return self.gx * self.gy * self.gathered_shards

    @property
    def batch_split(self) -> int:
        """How many ways the global batch's sequences are split: the degrees of the axes that split it (gz, gdata)."""
        return math.prod(getattr(self, key) for key in axes.BATCH_KEYS)

    @property
    def sequences_per_rank(self) -> int:
        return self.global_batch // self.batch_split

    @property
    def overlap(self) -> bool:
        return self.oar or self.ors or self.oag

    def recomputes(self, position: int) -> bool:
        """Whether the layer at `position` (0-based) within its model chunk reruns its forward before its
        backward: every layer under full recompute, the first rcl of each chunk where rcl is given."""
        return self.recompute == "full" and (self.rcl == 0 or position < self.rcl)

    def recomputed_layers(self, chunk_layers: int) -> int:
        """How many of a model chunk's `chunk_layers` layers recompute (those `recomputes` says so of)."""
        if self.recompute != "full":
            return 0
        return chunk_layers if self.rcl == 0 else min(self.rcl, chunk_layers)

    def fp32_main_grads(self, dtype: str) -> bool:
        """Whether the gradient buffer, and its data-parallel reduction, are fp32: under gradfp32, and under axonn in
        bf16 (Megatron-LM's main_grad under --bf16; axonn's reduce-scatters over Z stay in the model's dtype)."""
        return self.gradfp32 or (self.axonn and dtype == "bf16")

    def without_overlap(self) -> "ParallelPlan":
        return replace(self, oar=False, ors=False, oag=False)

    def describe(self) -> str:
        """The plan as the --plan string that reproduces it."""
        parts = [axes.degrees_text(self.degrees)]
        if self.vpp > 1:
            parts.append(f"vpp={self.vpp}")
        parts += [f"{key}=1" for key in ("pemb", "ploss") if getattr(self, key)]
        if self.zero:
            parts.append(f"zero={self.zero}")
        parts += [f"{key}=1" for key in _SWITCHES_SHOWN if getattr(self, key)]
        if self.mbs:
            parts.append(f"mbs={self.mbs}")
        if self.ga:
            parts.append(f"ga={self.ga}")
        for key in WORD_KEYS:  # a word at its default is left out: plans keep the text (and cache keys) they had
            if key != "recompute" and getattr(self, key) != WORD_KEYS[key][0]:
                parts.append(f"{key}={getattr(self, key)}")
        parts.append(f"recompute={self.recompute}")
        parts += [f"{key}={getattr(self, key)}" for key in ("rcl", "cache") if getattr(self, key)]
        for switch in ("oar", "ors", "oag"):
            parts.append(f"{switch}={int(getattr(self, switch))}")
        parts.append(f"tune={int(self.tune_gemm)}")
        return ",".join(parts)


# The switches describe() writes after zero, in its order (pemb and ploss come before), when they are on.
_SWITCHES_SHOWN = ("sp", "reshard", "tpo", "odp", "dpouter", "fp8", "fp8pg", "gradfp32", "fsdp2", "axonn")
_INT_KEYS = {*axes.KEYS, "mbs", "ga", "global_batch", "vpp", "zero", "rcl", "cache"}
# What each integer key counts (twin.limits). mbs and ga, when left out, are chosen by the twin: a user gives
# them positive or not at all (no 0 meaning "choose").
_INT_RANGES = {"mbs": limits.SEQUENCES, "ga": limits.SEQUENCES, "global_batch": limits.SEQUENCES,
               "zero": limits.Range(0, 3, "(a ZeRO stage)"), "rcl": limits.RECOMPUTED_LAYERS,
               "cache": limits.CACHED_LAYERS}
_BOOL_KEYS = {"oar", "ors", "oag", "tune", "pemb", "ploss", *_SWITCHES_SHOWN}
_ALIASES = axes.ALIASES  # Megatron-LM's names
# key -> its allowed values, the default first (in the order describe() writes them)
WORD_KEYS = {"recompute": RECOMPUTE_MODES, "attention": ATTENTION_KINDS, "optimizer": OPTIMIZER_KINDS,
             "p2p": P2P_KINDS, "cpcomm": CP_COMM_KINDS, "fp8recipe": FP8_RECIPES, "kernels": KERNEL_KINDS,
             "norm": NORM_KINDS}
_KEYS = _INT_KEYS | _BOOL_KEYS | set(_ALIASES) | set(WORD_KEYS)


def parse_plan(text: str, base: ParallelPlan | None = None) -> ParallelPlan:
    """Parse 'gx=8,gy=1,gz=16,gdata=64[,cp=..,pp=..,vpp=..,pemb=..,ploss=..,zero=..,sp=..,tpo=..,odp=..,dpouter=..,
    fp8=..,fp8recipe=..,fp8pg=..,gradfp32=..,fsdp2=..,axonn=..,reshard=..,mbs=..,ga=..,attention=..,optimizer=..,p2p=..,
    cpcomm=..,kernels=..,norm=..,recompute=..,rcl=..,cache=..,oar=0,..,tune=0]'.

    Megatron's names are accepted too: tp = gx, dp = gdata (so
    'tp=4,pp=16,dp=16,zero=1' is a Megatron-DeepSpeed plan). Unknown keys and
    malformed values are one-line TwinErrors naming the item.
    """
    values: dict[str, object] = {}
    seen: dict[str, str] = {}  # canonical key -> the name it was given under
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = item.partition("=")
        key, raw = key.strip().lower(), raw.strip()
        if not sep or not raw:
            raise TwinError(f"--plan: {item!r} is not key=value (example: gx=8,gy=1,gz=16,gdata=64)")
        if key not in _KEYS:
            raise TwinError(f"--plan: unknown key {key!r}; allowed keys are {', '.join(sorted(_KEYS))}")
        given = key
        key = _ALIASES.get(key, key)
        if key in seen:
            same = "is given twice" if seen[key] == given else f"and {seen[key]} are two names for {key}"
            raise TwinError(f"--plan: {given} {same}; give it once")
        seen[key] = given
        if key in _INT_KEYS:
            try:
                value = int(raw)
            except ValueError:
                raise TwinError(f"--plan: {key}={raw!r} is not an integer") from None
            values[key] = limits.check_count(value, f"--plan: {given}", _INT_RANGES.get(key, limits.DEGREE))
        elif key in _BOOL_KEYS:
            if raw.lower() not in _BOOL_WORDS:
                raise TwinError(f"--plan: {key}={raw!r} must be 0 or 1")
            values["tune_gemm" if key == "tune" else key] = _BOOL_WORDS[raw.lower()]
        else:
            values[key] = checked_word(key, raw)
    plan = base or ParallelPlan()
    return replace(plan, **values)  # type: ignore[arg-type]


def plan_keys(text: str) -> set[str]:
    """The keys a plan text gives, under their canonical names (tp -> gx, dp -> gdata): for commands that
    must refuse a key another flag also sets."""
    keys = {item.partition("=")[0].strip().lower() for item in text.split(",") if item.strip()}
    return {_ALIASES.get(k, k) for k in keys}


def checked_word(key: str, value: str) -> str:
    """`value` if it is one of the words `key` allows, else a one-line TwinError listing them."""
    allowed = WORD_KEYS[key]
    if value not in allowed:
        raise TwinError(f"--plan: {key}={value!r} is unknown; use one of {', '.join(allowed)}")
    return value


def divisors(n: int) -> list[int]:
    """The divisors of n, smallest first, in O(sqrt n): micro-batch sizes and degrees are divisors of batches
    and GPU counts, which may be large (trial division up to n hung on a batch of 10^8 sequences)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def with_micro_batch(plan: ParallelPlan, mbs: int) -> ParallelPlan:
    """The plan with its micro-batch size fixed (and gradient accumulation implied)."""
    return replace(plan, mbs=mbs, ga=plan.sequences_per_rank // mbs)
