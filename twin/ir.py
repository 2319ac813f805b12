"""The schedule IR: what every rank does in one training step.

Plain, typed, frozen data. A Schedule holds

- `groups`: named process-group axes ("x", "y", "z", "data", ...), each a
  partition of (some of) the ranks into instances;
- `programs`: ordered op lists, each shared by the set of ranks that run it.
  Ranks whose programs are identical up to group membership share one Program;
  a collective names a group *axis* and each rank resolves its own instance.
  That is what makes one representative per class enough for the simulator
  (twin.sim.symmetry) and keeps a 32,768-rank schedule small on disk.

Semantics every backend implements:

- ops of a program are issued in program order; an op starts when each op in
  `deps` has completed and the previous op on the same `stream` has completed;
- a collective completes for all members of its group instance together, and
  starts once every member has started it;
- overlap is expressed, not flagged: a collective on a comm stream that a
  later op depends on is an async collective waited at that later op.

Byte conventions (as nccl-tests): `Collective.nbytes` is the full buffer: the
all-reduce buffer, the all-gather *output*, the reduce-scatter *input*, the
all-to-all input (nbytes / n to each member); for a shift, what each rank sends.

"shift" is the ring exchange of context parallelism (ring attention): every
member sends its buffer to the next member of its instance, in instance order,
the last to the first, and receives as much from the previous one (XLA's
collective-permute on a ring; Megatron-Core's ring-attention K/V exchange).
It is a collective, not a pair of P2Ps, because P2P cannot wrap around, and
one op lets every rank of a stage run the same program.

What an op means in the model travels as data, not in its name: a builder's
op carries an OpTag (micro-batch, chunk, pass, layer, block, role) that the
search's bounds and the executor's numerics read, and `name` is only a label
for traces and figures. Likewise the step's parallel plan travels as the
ParallelPlan itself (StepInfo.plan), not as its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

from twin.plan import ParallelPlan
from twin.quick_init import quick_init

# The file format leaves out fields equal to their dataclass default
# (twin.ir_io), so changing a default here changes the format: bump the version.
# Version 2: ops carry an OpTag, StepInfo.plan is the ParallelPlan (version 1: names and plan text only).
# Version 3: the plan has a context-parallel degree (cp), and collectives a "shift" kind (ring attention).
IR_VERSION = 3

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "shift")
GEMM_LAYOUTS = ("NN", "NT", "TN")
FP8 = "fp8"  # the dtype of a plan's FP8 linears' GEMMs and of their sequence-parallel gathers (ParallelPlan.fp8)
P2P_KINDS = ("send", "recv")
# The passes an op can belong to: a micro-batch's forward, recompute (activation checkpointing) and backward, and
# the step around the micro-batches (zeroing and syncing gradients, the optimizer).
PHASES = ("fwd", "rc", "bwd", "step")


@quick_init
@dataclass(frozen=True, slots=True)
class Gemm:
    """C[m, n] = op(A)[m, k] op(B)[k, n], repeated `batch` times.

    `layout` is (A, B) as BLAS sees them, N = as stored, T = transposed.
    `tunable`: the layout may be replaced by the fastest equivalent one.
    """

    comm: ClassVar[bool] = False  # communication (a collective or a transfer), not compute

    m: int
    n: int
    k: int
    layout: str = "NN"
    dtype: str = "bf16"
    batch: int = 1
    tunable: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


@quick_init
@dataclass(frozen=True, slots=True)
class Attention:
    """Fused (flash) attention over `batch` sequences of `seq` tokens and `heads` local heads."""

    comm: ClassVar[bool] = False  # communication (a collective or a transfer), not compute

    batch: int
    seq: int
    heads: int
    head_dim: int
    backward: bool = False
    causal: bool = False
    dtype: str = "bf16"

    @property
    def flops(self) -> float:
        # QK^T and PV: 2 GEMMs of 2 b s^2 d flops per head; backward does 2.5x
        # the forward's matmul work (dQ, dK, dV, dP and the recomputed P).
        fwd = 4.0 * self.batch * self.seq * self.seq * self.heads * self.head_dim
        if self.causal:
            fwd /= 2
        return fwd * (2.5 if self.backward else 1.0)


@quick_init
@dataclass(frozen=True, slots=True)
class Elementwise:
    """Memory-bound work: bytes moved to and from HBM, and the flops it does.

    `kernels` > 1: that many launches of one kind that a single host call
    issues back to back (a collective's copy-out loop in C++), each paying the
    device's per-kernel overhead, the bytes and flops theirs together; the host
    issues the op once. Every other op is one kernel."""

    comm: ClassVar[bool] = False  # communication (a collective or a transfer), not compute

    nbytes: float
    flops: float = 0.0
    kernels: int = 1


@quick_init
@dataclass(frozen=True, slots=True)
class Collective:
    """A collective on every member of this rank's instance of the `group` axis.

    `nbytes` is the full buffer: the all-reduce buffer, the all-gather output,
    the reduce-scatter input (as nccl-tests counts); for "shift", the buffer
    each rank sends to its successor (and receives from its predecessor).
    """

    comm: ClassVar[bool] = True  # communication (a collective or a transfer), not compute

    kind: str
    group: str
    nbytes: float
    dtype: str = "bf16"


@quick_init
@dataclass(frozen=True, slots=True)
class P2P:
    """A send to, or receive from, the rank `peer` steps along the `group` axis.

    The peer is the member at (own position in the instance + peer); it must
    lie inside the instance (no wrap-around).
    """

    comm: ClassVar[bool] = True  # communication (a collective or a transfer), not compute

    kind: str
    group: str
    peer: int
    nbytes: float
    tag: str = ""  # sends and receives match in order per (sender, receiver, tag)


Work = Union[Gemm, Attention, Elementwise, Collective, P2P]
WORK_TYPES: dict[str, type] = {
    "gemm": Gemm,
    "attention": Attention,
    "elementwise": Elementwise,
    "collective": Collective,
    "p2p": P2P,
}


def work_type_name(work: Work) -> str:
    for name, cls in WORK_TYPES.items():
        if isinstance(work, cls):
            return name
    raise TypeError(type(work))


def op_class(work: Work) -> str:
    """The class an op is reported under: gemm, attention, elementwise, or the collective kind."""
    if isinstance(work, Collective):
        return work.kind
    if isinstance(work, P2P):
        return work.kind
    return work_type_name(work)


@quick_init
@dataclass(frozen=True, kw_only=True, slots=True)
class OpTag:
    """What an op is in the training step, for the consumers that must know (search bounds, executor numerics).

    `phase` is the pass (a Python keyword, hence the name), one of PHASES.
    `micro_batch` is None for the step's own ops, `chunk` None without
    interleaved pipeline chunks, `layer` None outside the transformer layers
    (embedding, LM head, final norm, loss, optimizer). `block` is the linear or
    module ("qkv", "ln1", "attn", "embed", "optimizer", ...) and `role` what the
    op does in it ("gemm", "dI", "dW", "ag_z", "ar_x", "acc_weight", ...):
    twin.builders.tags lists the builder's words.
    """

    micro_batch: int | None = None
    chunk: int | None = None
    phase: str
    layer: int | None = None
    block: str
    role: str


@quick_init
@dataclass(frozen=True, slots=True)
class Op:
    """One op of a program; `name` labels it in traces and messages, `tag` (if any) says what it is.

    Slotted, as its work and tag are: a step of a deep pipeline holds over a million ops, and a __dict__ each
    cost the 1T preset on 3,072 GCDs 140 MB."""

    id: int
    name: str
    stream: str
    work: Work
    deps: tuple[int, ...] = ()
    tag: OpTag | None = None

    @property
    def is_comm(self) -> bool:
        return self.work.comm


@dataclass(frozen=True)
class Program:
    """The ops run, in this order, by every rank in `ranks`."""

    ranks: tuple[int, ...]
    ops: tuple[Op, ...]


@dataclass(frozen=True)
class GroupAxis:
    """A named family of process groups: `instances` partition the ranks that use it."""

    name: str
    instances: tuple[tuple[int, ...], ...]

    def instance_of(self) -> dict[int, int]:
        """rank -> index of the instance that holds it."""
        return {rank: i for i, members in enumerate(self.instances) for rank in members}


@dataclass(frozen=True)
class StepInfo:
    """What the step computes, for reports: not needed to run it.

    `plan` is the plan the builder laid the step out by (None for a schedule
    written by hand or a microbenchmark, which `label` may describe instead).
    """

    model: str
    plan: ParallelPlan | None
    global_batch: int
    seq: int
    flops_hardware: float
    flops_model: float
    memory_per_gpu_bytes: float
    label: str = ""

    @property
    def plan_text(self) -> str:
        """The plan as reports print it: its --plan text (ParallelPlan.describe), else the label."""
        return self.plan.describe() if self.plan is not None else self.label


@dataclass(frozen=True)
class Schedule:
    world_size: int
    groups: tuple[GroupAxis, ...]
    programs: tuple[Program, ...]
    info: StepInfo
    version: int = IR_VERSION

    def group(self, name: str) -> GroupAxis:
        for axis in self.groups:
            if axis.name == name:
                return axis
        raise KeyError(name)

    def program_of(self) -> dict[int, int]:
        """rank -> index of its program."""
        return {rank: i for i, prog in enumerate(self.programs) for rank in prog.ranks}
