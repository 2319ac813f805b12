"""Prove a schedule right by execution: real data through its 4D linear layers, checked against one process.

`twin run --check-numerics` runs one step of the schedule exactly as the
performance run does (same issue order, same channels, waits only where the
IR's dependencies put them, every overlap switch as the plan has it), except
that the ops of the linear layers are bound to real float32 tensors:

    fwd/rc  ag_<shard>  W_block   = ALL_GATHER(W_shard)        over the op's group
            gemm        O_part    = I  W_block^T                 (IR layout NT)
            ar_<axis>   O         = ALL_REDUCE(O_part)          over the op's group
    bwd     dI          dI_part   = dO W_block                   (NN)
            ar_<axis>   dI        = ALL_REDUCE(dI_part)
            dW          dW_part   = dO^T I                       (TN)
            rs_<shard>  dW_shard  = REDUCE_SCATTER(dW_part)

(ops found by their tags, twin.ir.OpTag: a linear's block, its layer, the
pass and the role above; twin.builders.tags). Every other op runs on scratch
buffers as usual. After the step the gradient shards
are summed over micro-batches and, unless ZeRO-3 already sharded over
"z+data", all-reduced over the data group; a linear left whole where the
others are sharded over Z (axonn's LM head) over Z first, as the step's own
all-reduce of it (the embedding's, on scratch buffers) does.

What each rank is given, and what it must end up with, follows from the 4D
convention of twin.builders.schedule, not from the ops being tested: for a
linear O[R, n] = I[R, k] W^T (W stored n x k, as torch.nn.Linear), on the
rank at positions (x, y, z, d) of the IR's groups,

- rows: block d gz + z of R = m gz gdata (m = the forward GEMM's rows), where d
  is the position on the gradient axis (data, or cp+data with context
  parallelism: cp ranks hold other tokens of the same sequences);
- k is split over Y and n over X (transposed linears, attn_out and mlp_down:
  the other way round, from twin.model.ModelSpec.linear_shapes);
- the (n-block, k-block) of W is flattened and sharded over Z (over
  "z+data" with ZeRO-3) in contiguous chunks.

The positions come from the mesh convention (twin.mesh.plan_mesh over the
plan recorded in the schedule, as the builder lays it out), never from the
IR's groups under test, so a
wrong group, shard, split or missing wait in the schedule gives wrong
numbers. Each rank builds the full tensors from fixed seeds and computes the
reference in float64 on its own (the single-process reference), then compares
its O, dI (per micro-batch) and gradient shard. Bound: relative Frobenius
error <= 1e-4 in float32 (rounding gives about 1e-6 at these sizes; any
wrong group gives errors of order 1). Byte counts of the bound collectives are
checked against the tensors they move as well.

Sequence parallelism (sp=1, Megatron: over X with gy = 1) keeps the
activations between linears split by rows over X: rank x holds row block x
of its rows. A column-parallel linear (k split over Y, so not transposed)
then starts from its sequence shard of I,

    fwd/rc  ag_x        I         = ALL_GATHER_x(I_seq)        (bwd: ag_in_x, again for dW)
    bwd     rs_x        dI_seq    = REDUCE_SCATTER_x(dI_part)

and a row-parallel (transposed) one ends in it:

    fwd/rc  rs_x        O_seq     = REDUCE_SCATTER_x(O_part)
    bwd     ag_x        dO        = ALL_GATHER_x(dO_seq)

so what is checked is O_seq or dI_seq, the rank's row block of the full
result, and a gather that concatenates in the wrong order gives wrong rows.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from executor.ring_numerics import RingAttentionChecker
from twin.builders.tags import ACCUMULATE_ROLES, SEQUENCE_ROLES
from twin.ir import Attention, Collective, Gemm, Op, Schedule
from twin.mesh import gradient_axis, plan_mesh, weight_shard_axis
from twin.model import CATALOG, DTYPE_BYTES, ModelSpec

REL_ERROR_BOUND = 1e-4
_LINEAR_PHASES = ("fwd", "rc", "bwd")


def transposed_linears() -> dict[str, bool]:
    """Linear block -> transposed, from the model's own definition; lm_head is not."""
    probe = ModelSpec(name="probe", layers=1, hidden=64, heads=1, seq=8, vocab=64)
    return {name: t for name, _, _, t in probe.linear_shapes()} | {"lm_head": False}


def linear_of(op: Op, transposed: dict[str, bool]) -> str | None:
    """The linear a step of which `op` is (its label, L<layer>.<block> or the block: also the tensors' seed), or
    None: an op of another block, of no micro-batch's pass, or an accumulation into main_grad."""
    tag = op.tag
    if (tag is None or tag.block not in transposed or tag.micro_batch is None or tag.phase not in _LINEAR_PHASES
            or tag.role in ACCUMULATE_ROLES):
        return None
    return tag.block if tag.layer is None else f"L{tag.layer}.{tag.block}"


@dataclass
class _Linear:
    name: str
    block: str
    transposed: bool
    rows: int = 0
    k_loc: int = 0
    n_loc: int = 0
    mbs: set[int] = field(default_factory=set)
    gathered: bool = False  # an all-gather fills W_block
    scattered: bool = False  # a reduce-scatter makes the gradient shard
    whole: bool = False  # not sharded where the plan shards weights (axonn's LM head): W whole, dW summed over Z
    out_key: str = "O"  # the forward result checked: "O_seq" when sequence parallelism scatters it
    din_key: str = "dI"  # the input gradient checked: "dI_seq" when sequence parallelism scatters it


class NumericsChecker:
    """Binds the linear ops of one rank's program to real tensors, then checks them (see module docstring)."""

    def __init__(self, schedule: Schedule, rank: int, device: torch.device) -> None:
        self.schedule, self.rank, self.device = schedule, rank, device
        self.errors: list[str] = []  # structural problems found while binding
        program = schedule.programs[schedule.program_of()[rank]]
        plan = schedule.info.plan
        if plan is None:
            raise ValueError("--check-numerics needs a schedule from twin's builder: this one records no parallel plan")
        mesh = plan_mesh(plan)  # validated on load: its size is the schedule's (twin.ir_values)
        # Coordinates from the mesh convention (twin.mesh), not from the IR's groups under test.
        self.shard_axis = weight_shard_axis(plan)
        self.gradient_axis = gradient_axis(plan)  # data, or cp+data: ranks whose gradients are summed
        axes = {*mesh.names, self.shard_axis, self.gradient_axis}
        self.size = {axis: mesh.axis_size(axis) for axis in axes}
        self.pos = {axis: mesh.position(rank, axis) for axis in axes}
        self.sp = plan.sp and plan.gx > 1
        self.transposed = transposed_linears()
        self.linears: dict[str, _Linear] = {}
        for op in program.ops:
            lin = linear_of(op, self.transposed)
            if lin is None:
                continue
            role = op.tag.role
            info = self.linears.setdefault(lin, _Linear(lin, op.tag.block, self.transposed[op.tag.block]))
            info.mbs.add(op.tag.micro_batch)
            if role == "gemm" and isinstance(op.work, Gemm):
                info.rows, info.n_loc, info.k_loc = op.work.m, op.work.n, op.work.k
            if role in SEQUENCE_ROLES:
                continue
            if role.startswith("ag_"):
                info.gathered = True
            if role.startswith("rs_"):
                info.scattered = True
        self._check_model_shapes()
        self.ring = None  # context parallelism: ring attention is checked too (executor.ring_numerics)
        if plan.cp > 1:
            kernel = next((op.work for op in program.ops if isinstance(op.work, Attention)), None)
            if kernel is not None:
                self.ring = RingAttentionChecker(plan, kernel, self.pos, device, self.errors)
        self.t: dict[tuple, torch.Tensor] = {}
        self.ref: dict[tuple, torch.Tensor] = {}
        for info in self.linears.values():
            self._make_tensors(info)

    # ---- layout ---------------------------------------------------------------------
    def axes(self, info: _Linear) -> tuple[str, str]:
        """(axis splitting k, axis splitting n)."""
        return ("x", "y") if info.transposed else ("y", "x")

    def _sz(self, axis: str) -> int:
        return self.size.get(axis, 1)

    def _ps(self, axis: str) -> int:
        return self.pos.get(axis, 0)

    def full_dims(self, info: _Linear) -> tuple[int, int, int]:
        """(R, k, n) of the whole linear."""
        ka, na = self.axes(info)
        rows = info.rows * self._sz("z") * self._sz(self.gradient_axis)
        return rows, info.k_loc * self._sz(ka), info.n_loc * self._sz(na)

    def _check_model_shapes(self) -> None:
        model = CATALOG.get(self.schedule.info.model)
        if model is None:
            return
        shapes = {name: (k, n) for name, k, n, _ in model.linear_shapes()} | {"lm_head": (model.hidden, model.vocab)}
        for info in self.linears.values():
            if not info.rows:
                continue
            _, k, n = self.full_dims(info)
            want = shapes[info.block]
            if (k, n) != want:
                self.errors.append(f"{info.name}: forward GEMM {info.rows}x{info.n_loc}x{info.k_loc} implies k x n = {k} x {n} "
                                   f"with this rank's groups, but {model.name}'s linear is {want[0]} x {want[1]}")

    @staticmethod
    def _randn(key: str, shape: tuple[int, ...], scale: float) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        return torch.randn(shape, generator=g, dtype=torch.float64) * scale

    def _make_tensors(self, info: _Linear) -> None:
        if not info.rows:
            self.errors.append(f"{info.name}: no forward GEMM found on rank {self.rank}")
            return
        R, k, n = self.full_dims(info)
        ka, na = self.axes(info)
        rb = self._ps(self.gradient_axis) * self._sz("z") + self._ps("z")
        rows = slice(rb * info.rows, (rb + 1) * info.rows)
        ks = slice(self._ps(ka) * info.k_loc, (self._ps(ka) + 1) * info.k_loc)
        ns = slice(self._ps(na) * info.n_loc, (self._ps(na) + 1) * info.n_loc)
        shards, s = self._sz(self.shard_axis), self._ps(self.shard_axis)
        info.whole = shards > 1 and not (info.gathered or info.scattered)
        if info.whole:
            shards, s = 1, 0
        block = info.k_loc * info.n_loc
        if block % shards:
            self.errors.append(f"{info.name}: W block of {block} elements does not split over {shards} shards")
            return
        chunk = slice(s * block // shards, (s + 1) * block // shards)
        dev, f32 = self.device, torch.float32
        seq = slice(None)
        if self.sp:  # the row block of this rank's rows that sequence parallelism leaves on it
            if info.rows % self._sz("x"):
                self.errors.append(f"{info.name}: {info.rows} rows do not split over x = {self._sz('x')}")
                return
            part = info.rows // self._sz("x")
            seq = slice(self._ps("x") * part, (self._ps("x") + 1) * part)
            info.out_key, info.din_key = ("O_seq", "dI") if info.transposed else ("O", "dI_seq")
        W = self._randn(f"W:{info.name}", (n, k), k ** -0.5)
        w_block = W[ns, ks].contiguous().reshape(-1)
        lin = info.name
        self.t[(lin, "W_shard")] = w_block[chunk].to(dev, f32)
        self.t[(lin, "W_block")] = (torch.zeros(block) if info.gathered else w_block).to(dev, f32)
        dw_full = torch.zeros(n, k, dtype=torch.float64)
        for mb in sorted(info.mbs):
            I = self._randn(f"I:{lin}:{mb}", (R, k), 1.0)
            dO = self._randn(f"dO:{lin}:{mb}", (R, n), n ** -0.5)
            mine_I, mine_dO = I[rows, ks].contiguous(), dO[rows, ns].contiguous()
            self.t[(lin, mb, "I")] = mine_I.to(dev, f32)
            self.t[(lin, mb, "dO")] = mine_dO.to(dev, f32)
            for what, shape in (("O", (info.rows, info.n_loc)), ("dI", (info.rows, info.k_loc)),
                                ("dW", (info.n_loc, info.k_loc)), ("dW_shard", (block // shards,))):
                self.t[(lin, mb, what)] = torch.zeros(shape, device=dev, dtype=f32)
            if self.sp:  # the sequence shards it starts from are given; the gathered tensors start empty
                given, whole = ("dO", mine_dO) if info.transposed else ("I", mine_I)
                self.t[(lin, mb, f"{given}_seq")] = whole[seq].contiguous().to(dev, f32)
                self.t[(lin, mb, given)].zero_()
                result, cols = (("O_seq", info.n_loc) if info.transposed else ("dI_seq", info.k_loc))
                self.t[(lin, mb, result)] = torch.zeros((seq.stop - seq.start, cols), device=dev, dtype=f32)
            self.ref[(lin, mb, info.out_key)] = (I @ W.T)[rows, ns][seq if info.out_key == "O_seq" else slice(None)]
            self.ref[(lin, mb, info.din_key)] = (dO @ W)[rows, ks][seq if info.din_key == "dI_seq" else slice(None)]
            dw_full += dO.T @ I
        self.ref[(lin, "dW_shard")] = dw_full[ns, ks].contiguous().reshape(-1)[chunk]

    # ---- binding --------------------------------------------------------------------
    def bind(self, rop, channel):
        """The bound callable for a linear op of this rank, or None (the executor's scratch kernel)."""
        op = rop.op
        lin = linear_of(op, self.transposed)
        if lin is None and self.ring is not None:
            return self.ring.bind(op, channel)
        if lin is None or lin not in self.linears:
            return None
        role, phase, mb = op.tag.role, op.tag.phase, op.tag.micro_batch
        if (lin, "W_block") not in self.t:
            return None
        t = self.t
        w = t[(lin, "W_block")]
        info = self.linears[lin]
        wv = w.view(info.n_loc, info.k_loc)
        if role == "gemm":
            return lambda: torch.matmul(t[(lin, mb, "I")], wv.t(), out=t[(lin, mb, "O")])
        if role == "dI":
            return lambda: torch.matmul(t[(lin, mb, "dO")], wv, out=t[(lin, mb, "dI")])
        if role == "dW":
            return lambda: torch.matmul(t[(lin, mb, "dO")].t(), t[(lin, mb, "I")], out=t[(lin, mb, "dW")])
        if not isinstance(op.work, Collective):
            return None
        kind = op.work.kind
        if role in SEQUENCE_ROLES:
            return self._bind_sequence(op, lin, role, phase, mb, channel)
        if role.startswith("ag_") and kind == "all_gather":
            out, inp = w, t[(lin, "W_shard")]
            self._check_bytes(op, out)
            return channel.collective("all_gather", out, inp)
        if role.startswith("rs_") and kind == "reduce_scatter":
            out, inp = t[(lin, mb, "dW_shard")], t[(lin, mb, "dW")].view(-1)
            self._check_bytes(op, inp)
            return channel.collective("reduce_scatter", out, inp)
        if role.startswith("ar_") and kind == "all_reduce":
            buf = t[(lin, mb, "dI" if phase == "bwd" else "O")]
            self._check_bytes(op, buf)
            return channel.collective("all_reduce", buf, None)
        self.errors.append(f"op {op.id} '{op.name}': a {kind} where the linear's '{role}' step was expected")
        return None

    def _bind_sequence(self, op, lin: str, role: str, phase: str, mb: int, channel):
        """Sequence parallelism's gathers and scatters of one linear's activations (module docstring)."""
        info, t, kind = self.linears[lin], self.t, op.work.kind
        forward = phase in ("fwd", "rc")
        if not self.sp:
            self.errors.append(f"op {op.id} '{op.name}': a sequence-parallel {kind} in a plan without sp=1")
            return None
        pair = None  # (full tensor, sequence shard)
        if kind == "all_gather" and info.transposed and not forward and role == "ag_x":
            pair = ("dO", "dO_seq")
        elif kind == "all_gather" and not info.transposed and role == ("ag_x" if forward else "ag_in_x"):
            pair = ("I", "I_seq")
        elif kind == "reduce_scatter" and role == "rs_x" and forward == info.transposed:
            pair = ("O", "O_seq") if info.transposed else ("dI", "dI_seq")
        if pair is not None:
            full, part = t[(lin, mb, pair[0])], t[(lin, mb, pair[1])]
            self._check_bytes(op, full)
            if kind == "all_gather":
                return channel.collective("all_gather", full.view(-1), part.view(-1))
            return channel.collective("reduce_scatter", part.view(-1), full.view(-1))
        self.errors.append(f"op {op.id} '{op.name}': a {kind} where {'a transposed' if info.transposed else 'a'} "
                           f"linear's {phase} has no sequence-parallel '{role}'")
        return None

    def _check_bytes(self, op, tensor: torch.Tensor) -> None:
        want = tensor.numel() * DTYPE_BYTES.get(op.work.dtype, 2)
        if abs(op.work.nbytes - want) > 0.5:
            self.errors.append(f"op {op.id} '{op.name}' moves {op.work.nbytes:g} bytes but the layer's tensor is "
                               f"{tensor.numel()} {op.work.dtype} elements ({want} bytes)")

    # ---- checking -------------------------------------------------------------------
    def _group_of(self, name: str):
        """A gloo group over this rank's instance of the IR's axis `name`, created by every rank in the same order."""
        mine = None
        for axis in self.schedule.groups:
            if axis.name != name:
                continue
            for members in axis.instances:
                g = dist.new_group(list(members), backend="gloo")
                if self.rank in members:
                    mine = g
        return mine

    def check(self, executor) -> dict:
        """Compare with the reference after one executed step; returns this rank's report."""
        checks = []

        def rel(got: torch.Tensor, want: torch.Tensor) -> float:
            got = got.detach().to("cpu", torch.float64).reshape(want.shape)
            return float(torch.linalg.vector_norm(got - want) / max(float(torch.linalg.vector_norm(want)), 1e-30))

        summed = self.shard_axis == "z" and self._sz(self.gradient_axis) > 1
        data_group = self._group_of(self.gradient_axis) if summed else None
        z_group = self._group_of("z") if any(info.whole for info in self.linears.values()) else None
        for lin, info in sorted(self.linears.items()):
            if (lin, "W_block") not in self.t:
                continue
            grad = None
            for mb in sorted(info.mbs):
                for what in (info.out_key, info.din_key):
                    checks.append({"linear": lin, "mb": mb, "what": what,
                                   "rel_err": rel(self.t[(lin, mb, what)], self.ref[(lin, mb, what)])})
                part = self.t[(lin, mb, "dW_shard" if info.scattered else "dW")].reshape(-1).clone()
                grad = part if grad is None else grad + part
            for group in (z_group if info.whole else None, data_group):
                if group is not None:
                    cpu = grad.to("cpu")
                    dist.all_reduce(cpu, group=group)
                    grad = cpu
            checks.append({"linear": lin, "mb": -1, "what": "dW_shard", "rel_err": rel(grad, self.ref[(lin, "dW_shard")])})
        if self.ring is not None:
            checks += self.ring.checks(rel)
        worst = max((c["rel_err"] for c in checks), default=0.0)
        bad = [c for c in checks if not c["rel_err"] <= REL_ERROR_BOUND]
        return {
            "rank": self.rank, "bound": REL_ERROR_BOUND, "dtype": "float32", "checks": checks,
            "linears": len(self.linears), "max_rel_err": worst, "structure_errors": self.errors,
            "ok": not bad and not self.errors and bool(checks),
        }


def merge_numerics(out_dir: str, world: int) -> dict:
    """OUT/numerics.json from the ranks' reports."""
    reports = []
    for r in range(world):
        with open(os.path.join(out_dir, f"numerics-rank{r}.json")) as f:
            reports.append(json.load(f))
    failures = []
    for rep in reports:
        failures += [f"rank {rep['rank']}: {e}" for e in rep["structure_errors"]]
        failures += [f"rank {rep['rank']} {c['linear']} mb{c['mb']} {c['what']}: relative error {c['rel_err']:.3g}"
                     for c in rep["checks"] if not c["rel_err"] <= rep["bound"]]
        if not rep["checks"]:
            failures.append(f"rank {rep['rank']}: no linear layer found to check")
    result = {
        "ok": all(rep["ok"] for rep in reports), "bound": REL_ERROR_BOUND, "dtype": "float32",
        "checks": sum(len(rep["checks"]) for rep in reports), "linears_per_rank": [rep["linears"] for rep in reports],
        "max_rel_err": max(rep["max_rel_err"] for rep in reports), "failures": failures[:20],
        "n_failures": len(failures),
    }
    with open(os.path.join(out_dir, "numerics.json"), "w") as f:
        json.dump(result, f, indent=2)
    return result
