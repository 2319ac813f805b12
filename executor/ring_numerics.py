"""Prove ring attention right by execution: real Q, K, V through a cp > 1 schedule's attention steps and shifts.

executor.numerics checks the linears; with context parallelism
(twin.builders.ring_attention) this checks each layer's attention too. On
every rank, for each (layer, micro-batch) and pass, the ops of block "attn"
are bound to real float32 tensors (one head group: the rank's heads/gx local
heads, its mbs sequences, head_dim):

    fwd/rc  kv_shift     kv[i+1 mod 2]  = SHIFT_cp(kv[i mod 2])       (K and V together)
            fwd step i   attend the queries to kv[i mod 2], merged into (O, lse) by log-sum-exp
    bwd     kv_shift     as in the forward
            bwd step i   dQ += ...; dK, dV of the block held -> the step's partial
                         (at step 0 it starts the travelling sum itself)
            dkv_shift    acc[i mod 2]  = SHIFT_cp(acc[i-1 mod 2])     (the sum so far, onward)
            dkv_add      acc[i mod 2] += the step's partial
            last shift   acc[cp mod 2] = the rank's own block's dK, dV

Step i of a kernel attends to the block the ring convention says it holds,
the K/V of cp rank (c - i) mod cp (the shift sends to the next member, so a
block moves one rank on per step), with the causal mask of that block's
global token positions: rank c holds chunks c and 2 cp - 1 - c of the
sequence's 2 cp. The convention is the builder's, written here on its own;
a shift to the wrong peer, a missing wait or a wrong count of steps makes a
kernel attend to another block than it masks for, and the result is wrong.
The out correction kernels run as scratch (the merge is done in the step).

Reference: the whole sequence's causal attention in float64 (autograd for
dQ, dK, dV against a fixed dO), from the same seeds on every rank; a rank
compares its O (each forward pass), dQ and its own block's dK and dV, under
executor.numerics's bound. The seeds follow the rank's heads (x) and
sequences (z, data), not y (attention is replicated over gy) or cp.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from dataclasses import dataclass, field

import torch

from twin.ir import Attention, Collective, Op
from twin.model import DTYPE_BYTES

_PHASES = ("fwd", "rc", "bwd")
_ROLES = ("kv_shift", "dkv_shift", "dkv_add", "fwd", "bwd")


@dataclass
class _Attention:
    """The tensors of one layer's attention for one micro-batch on this rank."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    d_out: torch.Tensor
    kv: dict[str, list[torch.Tensor]] = field(default_factory=dict)  # pass -> the two K/V buffers
    out: dict[str, torch.Tensor] = field(default_factory=dict)  # forward pass -> O
    lse: dict[str, torch.Tensor] = field(default_factory=dict)  # forward pass -> log-sum-exp
    d_q: torch.Tensor | None = None
    acc: list[torch.Tensor] = field(default_factory=list)  # the travelling dK, dV sums
    part: torch.Tensor | None = None  # a backward step's dK, dV of the block held


class RingAttentionChecker:
    """Binds one rank's ring-attention ops to tensors, then compares them with the reference (module docstring)."""

    def __init__(self, plan, kernel: Attention, position: dict[str, int], device: torch.device,
                 errors: list[str]) -> None:
        """`kernel`: one of the program's ring steps, which gives the local heads and head_dim; `position`: the
        rank's position on each mesh axis (from the mesh convention)."""
        self.cp, self.c = plan.cp, position["cp"]
        self.mbs, self.heads = plan.mbs, kernel.heads
        self.seq, self.d = kernel.seq * plan.cp, kernel.head_dim
        self.local = self.seq // self.cp
        self.device, self.errors = device, errors
        self.seed = f"x{position['x']}:z{position['z']}:d{position['data']}"
        half = self.seq // (2 * self.cp)
        self.positions = [torch.cat([torch.arange(r * half, (r + 1) * half),
                                     torch.arange((2 * self.cp - 1 - r) * half, (2 * self.cp - r) * half)])
                          for r in range(self.cp)]  # global token positions of each cp rank's share
        self.layers: dict[tuple[int, int], _Attention] = {}
        self.steps: Counter = Counter()  # (layer, mb, pass, role) -> ops bound so far
        self.reference: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    # ---- tensors ----------------------------------------------------------------------
    def _randn(self, key: str, scale: float = 1.0) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(f"{key}:{self.seed}".encode()))
        return torch.randn((self.mbs, self.heads, self.seq, self.d), generator=g, dtype=torch.float64) * scale

    def _attention(self, layer: int, mb: int) -> _Attention:
        key = (layer, mb)
        if key not in self.layers:
            q, k, v, d_out = (self._randn(f"{what}:L{layer}:{mb}") for what in ("Q", "K", "V", "dO"))
            self.reference[key] = self._reference(q, k, v, d_out)
            mine = self.positions[self.c]
            f32 = dict(device=self.device, dtype=torch.float32)
            self.layers[key] = _Attention(*(t[:, :, mine].contiguous().to(**f32) for t in (q, k, v, d_out)))
        return self.layers[key]

    def _reference(self, q, k, v, d_out) -> dict[str, torch.Tensor]:
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        scores = leaves[0] @ leaves[1].transpose(-1, -2) / math.sqrt(self.d)
        causal = torch.ones(self.seq, self.seq, dtype=torch.bool).tril()
        out = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ leaves[2]
        grads = torch.autograd.grad(out, leaves, d_out)
        mine = self.positions[self.c]
        return {name: t.detach()[:, :, mine] for name, t in zip(("O", "dQ", "dK", "dV"), (out, *grads))}

    def _buffers(self, att: _Attention, phase: str) -> list[torch.Tensor]:
        """The pass's two K/V buffers, the first holding this rank's own K and V."""
        if phase not in att.kv:
            att.kv[phase] = [torch.stack([att.k, att.v]), torch.zeros_like(torch.stack([att.k, att.v]))]
        return att.kv[phase]

    # ---- binding ----------------------------------------------------------------------
    def bind(self, op: Op, channel):
        """The bound callable for a ring-attention op, or None (a scratch kernel)."""
        tag = op.tag
        if tag.block != "attn" or tag.role not in _ROLES or tag.phase not in _PHASES or tag.micro_batch is None:
            return None
        layer, mb, phase, role = tag.layer, tag.micro_batch, tag.phase, tag.role
        step = self.steps[(layer, mb, phase, role)]
        self.steps[(layer, mb, phase, role)] += 1
        att = self._attention(layer, mb)
        if role == "kv_shift":
            kv = self._buffers(att, phase)
            return self._shift(op, channel, kv[step % 2], kv[(step + 1) % 2])
        if role == "fwd":
            return lambda: self._forward_step(att, phase, step)
        if role == "bwd":
            return lambda: self._backward_step(att, step)
        if not att.acc:
            att.acc = [torch.zeros_like(torch.stack([att.k, att.v])) for _ in range(2)]
        if role == "dkv_shift":  # the (step+1)-th shift carries the sum after step `step` on
            return self._shift(op, channel, att.acc[step % 2], att.acc[(step + 1) % 2])
        return lambda: att.acc[(step + 1) % 2].add_(att.part)  # dkv_add of step + 1

    def _shift(self, op: Op, channel, source: torch.Tensor, target: torch.Tensor):
        if not isinstance(op.work, Collective) or op.work.kind != "shift":
            self.errors.append(f"op {op.id} '{op.name}': ring attention expects a shift here, not {op.work}")
            return None
        want = source.numel() * DTYPE_BYTES.get(op.work.dtype, 2)
        if abs(op.work.nbytes - want) > 0.5:
            self.errors.append(f"op {op.id} '{op.name}' moves {op.work.nbytes:g} bytes but K and V are "
                               f"{source.numel()} {op.work.dtype} elements ({want} bytes)")
        return channel.collective("shift", target.view(-1), source.view(-1))

    def _block(self, att: _Attention, step: int, buffers: list[torch.Tensor]):
        """(K, V, mask) of the block held at `step`: cp rank (c - step) mod cp's, masked causally by position."""
        k, v = buffers[step % 2]
        source = (self.c - step) % self.cp
        mask = self.positions[source][None, :] <= self.positions[self.c][:, None]
        return k, v, mask.to(self.device)

    def _forward_step(self, att: _Attention, phase: str, step: int) -> None:
        k, v, mask = self._block(att, step, self._buffers(att, phase))
        scores = (att.q @ k.transpose(-1, -2) / math.sqrt(self.d)).masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)  # -inf where the block hides every key from a query
        safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
        out = torch.exp(scores - safe[..., None]) @ v
        if step == 0:
            att.out[phase], att.lse[phase] = out, lse
            return
        merged = torch.logaddexp(att.lse[phase], lse)
        att.out[phase] = (att.out[phase] * torch.exp(att.lse[phase] - merged)[..., None]
                          + out * torch.exp(torch.where(torch.isfinite(lse), lse - merged, lse))[..., None])
        att.lse[phase] = merged

    def _backward_step(self, att: _Attention, step: int) -> None:
        phase = "rc" if "rc" in att.out else "fwd"  # the forward the backward's recompute (if any) left
        k, v, mask = self._block(att, step, self._buffers(att, "bwd"))
        out, lse = att.out[phase], att.lse[phase]
        scale = 1 / math.sqrt(self.d)
        probs = torch.exp((att.q @ k.transpose(-1, -2) * scale) - lse[..., None]).masked_fill(~mask, 0.0)
        d_v = probs.transpose(-1, -2) @ att.d_out
        d_probs = att.d_out @ v.transpose(-1, -2)
        d_scores = probs * (d_probs - (att.d_out * out).sum(-1, keepdim=True))
        d_q = d_scores @ k * scale
        att.d_q = d_q if step == 0 else att.d_q + d_q
        part = torch.stack([d_scores.transpose(-1, -2) @ att.q * scale, d_v])
        if step == 0:  # the travelling sum of this rank's own block starts here
            if not att.acc:
                att.acc = [torch.zeros_like(part) for _ in range(2)]
            att.acc[0].copy_(part)
        else:
            att.part = part

    # ---- checking ---------------------------------------------------------------------
    def checks(self, rel) -> list[dict]:
        """This rank's comparisons with the reference: O of each forward pass, dQ, and its own block's dK and dV."""
        out = []
        for (layer, mb), att in sorted(self.layers.items()):
            ref = self.reference[(layer, mb)]
            name = f"L{layer}.attn"
            got = {f"O.{phase}": (o, ref["O"]) for phase, o in att.out.items()}
            if att.d_q is not None and att.acc:
                home = att.acc[self.cp % 2]
                got |= {"dQ": (att.d_q, ref["dQ"]), "dK": (home[0], ref["dK"]), "dV": (home[1], ref["dV"])}
            for what, (value, want) in got.items():
                out.append({"linear": name, "mb": mb, "what": what, "rel_err": rel(value, want)})
        return out
