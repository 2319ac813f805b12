"""The torch work behind each IR op, built once, as zero-argument callables over preallocated tensors.

What each op runs (the IR keeps sizes, the executor keeps them too):

- Gemm(m, n, k, layout): `torch.matmul(op(A), op(B), out=C)` with A stored
  (m, k) for "N" and (k, m) for "T", B stored (k, n) for "N" and (n, k) for
  "T": the transposed operand is a strided view, so BLAS sees the layout the
  IR names (torch.nn.Linear's forward is NT, its dI is NN, its dW is TN).
  `batch > 1` uses a leading batch dimension. A tunable GEMM runs the fastest
  of NN/NT/TN for its shape, timed once at compile time, as AxoNN times them
  in its first batch (twin.sim.compute takes the best layout likewise).
- Attention (forward): torch.nn.functional.scaled_dot_product_attention on
  (batch, heads, seq, head_dim) tensors with the IR's causal flag (the fused
  flash kernel on CUDA and on CPU). Backward: one forward is recorded with
  autograd at compile time and every backward op calls
  `torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)` on it,
  which runs exactly the backward kernel the fused forward chose (FlashAttention's
  backward recomputes P blockwise: the IR's 2.5x forward flops), and nothing else.
- Elementwise(nbytes): `dst.copy_(src)`, src and dst nbytes/2 bytes each: a
  memory-bound kernel that moves exactly nbytes (read + write). Its flops are
  not executed: the IR counts them, they do not bound the time.
- Collectives: all_reduce, all_gather (into one tensor), reduce_scatter (from
  one tensor), broadcast (from the instance's first member), all_to_all
  (single tensor), shift (input to the next member, output from the previous
  one: an all-to-all with one split each way), each issued asynchronously on
  the op's channel (executor.channels). The buffer
  holds the IR's nbytes (the full buffer, as nccl-tests counts: the all-gather
  output, the reduce-scatter input; for a shift, what each rank sends, so its
  input and output are that size each) in the executor's element type, rounded
  up to a multiple of the group size.
- P2P: isend / irecv of nbytes to / from the peer's global rank on the
  (axis, tag) channel.

Buffers are allocated once and shared: compute operands by (role, shape),
communication buffers by (stream, role, size), so two ops in flight at once
never share a buffer unless they run one after the other on one stream.
GEMM and attention inputs are random (never written), everything else starts
at zero, so repeated steps never overflow or hit denormals.
"""

from __future__ import annotations

import functools
import time
from typing import Callable

import torch
import torch.nn.functional as F

from twin.ir import P2P, Attention, Collective, Elementwise, Gemm, Op

Fn = Callable[[], object]


class Buffers:
    """Tensors shared by key; created on first request."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        self.device, self.dtype = device, dtype
        self._pool: dict[tuple, torch.Tensor] = {}
        self._gen = torch.Generator(device="cpu").manual_seed(seed)
        self.nbytes = 0

    def get(self, key: tuple, shape: tuple[int, ...], random: bool = False) -> torch.Tensor:
        full = (*key, shape)
        t = self._pool.get(full)
        if t is None:
            if random:
                t = torch.randn(shape, generator=self._gen, dtype=torch.float32).to(self.device, self.dtype)
            else:
                t = torch.zeros(shape, device=self.device, dtype=self.dtype)
            self._pool[full] = t
            self.nbytes += t.numel() * t.element_size()
        return t


def elements(nbytes: float, dtype: torch.dtype, multiple: int = 1) -> int:
    """Elements of `dtype` holding nbytes, at least one per `multiple`, rounded up to a multiple of it."""
    size = torch.empty((), dtype=dtype).element_size()
    n = max(multiple, int(round(nbytes / size)))
    return -(-n // multiple) * multiple


# ---- compute ---------------------------------------------------------------------


def gemm_operands(g: Gemm, layout: str, bufs: Buffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(op(A), op(B), C) for `g` run with `layout`."""
    lead = (g.batch,) if g.batch > 1 else ()
    a = bufs.get(("gemm.a",), lead + ((g.m, g.k) if layout[0] == "N" else (g.k, g.m)), random=True)
    b = bufs.get(("gemm.b",), lead + ((g.k, g.n) if layout[1] == "N" else (g.n, g.k)), random=True)
    c = bufs.get(("gemm.c",), lead + (g.m, g.n))
    a = a if layout[0] == "N" else a.transpose(-1, -2)
    b = b if layout[1] == "N" else b.transpose(-1, -2)
    return a, b, c


def gemm_fn(g: Gemm, layout: str, bufs: Buffers) -> Fn:
    a, b, c = gemm_operands(g, layout, bufs)
    return functools.partial(torch.matmul, a, b, out=c)


def fastest_layout(g: Gemm, bufs: Buffers, sync: Callable[[], None], cache: dict) -> str:
    """The fastest of NN/NT/TN for g's shape: best of 3 timed runs each, cached by shape."""
    key = (g.m, g.n, g.k, g.batch)
    if key not in cache:
        times = {}
        for layout in ("NN", "NT", "TN"):
            fn = gemm_fn(g, layout, bufs)
            fn()
            best = float("inf")
            for _ in range(3):
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                best = min(best, time.perf_counter() - t0)
            times[layout] = best
        cache[key] = min(times, key=times.get)
    return cache[key]


def attention_fn(a: Attention, bufs: Buffers, graphs: dict) -> Fn:
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    q = bufs.get(("attn.q",), shape, random=True)
    k = bufs.get(("attn.k",), shape, random=True)
    v = bufs.get(("attn.v",), shape, random=True)
    if not a.backward:
        return functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=a.causal)
    key = (shape, a.causal)
    if key not in graphs:
        leaves = tuple(t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(*leaves, is_causal=a.causal)
        grad_out = bufs.get(("attn.dout",), shape, random=True)
        graphs[key] = (out, leaves, grad_out)
    out, leaves, grad_out = graphs[key]
    return functools.partial(torch.autograd.grad, (out,), leaves, (grad_out,), retain_graph=True)


def elementwise_fn(e: Elementwise, bufs: Buffers) -> Fn:
    n = elements(e.nbytes / 2, bufs.dtype)
    src = bufs.get(("ew.src",), (n,), random=True)
    dst = bufs.get(("ew.dst",), (n,))
    return functools.partial(dst.copy_, src)


# ---- communication -------------------------------------------------------------------


def collective_fn(op: Op, channel, bufs: Buffers) -> Fn:
    """The op's collective on preallocated (output, input) buffers; `channel` is an executor.channels channel
    (gloo or torch.distributed). Kinds: twin.ir.COLLECTIVE_KINDS (all_reduce, all_gather, reduce_scatter,
    broadcast, all_to_all, shift)."""
    c: Collective = op.work
    n_members = len(channel.members)
    n = elements(c.nbytes, bufs.dtype, n_members)
    role = {"all_reduce": ("ar", n, None), "all_gather": ("ag", n, n // n_members),
            "reduce_scatter": ("rs", n // n_members, n), "broadcast": ("bc", n, None),
            "all_to_all": ("a2a", n, n), "shift": ("shift", n, n)}
    if c.kind not in role:
        raise ValueError(f"op {op.id} '{op.name}': unknown collective kind {c.kind!r}")
    name, n_out, n_in = role[c.kind]
    out = bufs.get(("comm", op.stream, name + ".out"), (n_out,))
    inp = bufs.get(("comm", op.stream, name + ".in"), (n_in,)) if n_in is not None else None
    return channel.collective(c.kind, out, inp)


def p2p_fn(op: Op, channel, peer: int, bufs: Buffers) -> Fn:
    p: P2P = op.work
    n = elements(p.nbytes, bufs.dtype)
    buf = bufs.get(("comm", op.stream, p.kind), (n,))
    return channel.p2p(p.kind, buf, peer)
