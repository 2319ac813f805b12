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
  not executed: the IR counts them, they do not bound the time. With
  kernels > 1 the copy is cut into that many launches (equal parts).
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

Buffers are allocated once, one arena per role (GEMM A, B and C, attention
q, k, v, an element-wise op's source and destination, and per stream each
collective's input and output), as large as the role's largest request; every
op's tensor is a view of the first elements of its role's arena. A rank's
compute ops run one after another (on one stream on GPU, on the host thread on
CPU) and a stream's communication likewise, so two ops sharing an arena are
never in flight together. (One tensor per role and shape, as before, held a
hidden-4096 step's every element-wise size at once: 67 GB where the step
needs 20.) An element-wise op moves its bytes through at most EW_CHUNK_BYTES
a side, in passes, so its buffers stay small however large the op (an
optimizer's pass over every parameter and state). GEMM and attention inputs
and element-wise sources are random (never written), everything else starts
at zero, so repeated steps never overflow or hit denormals; the random values
are drawn on the device they live on (drawn on one CPU thread and copied,
a hidden-4096 step's 17 G elements would take over a minute at 200 M a
second before its first op).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from twin.ir import P2P, Attention, Collective, Elementwise, Gemm, Op

Fn = Callable[[], object]


EW_CHUNK_BYTES = 1 << 30  # an element-wise op's bytes per side per pass: far above any cache, so passes stream as one


@dataclass(frozen=True)
class Request:
    """A tensor an op's kernel uses: `shape`, a view of the arena of `role`."""

    role: tuple
    shape: tuple[int, ...]
    random: bool = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class Buffers:
    """One arena per role (module docstring): `reserve` the requests of every op first, then `get` views."""

    def __init__(self, device: torch.device, dtype: torch.dtype, seed: int = 0) -> None:
        self.device, self.dtype = device, dtype
        self._gen = torch.Generator(device=device).manual_seed(seed)
        self._reserved: dict[tuple, int] = {}
        self._arenas: dict[tuple, torch.Tensor] = {}
        self.nbytes = 0

    def reserve(self, requests: Iterable[Request]) -> None:
        for r in requests:
            self._reserved[r.role] = max(self._reserved.get(r.role, 0), r.numel)

    def get(self, request: Request) -> torch.Tensor:
        arena = self._arenas.get(request.role)
        if arena is None or arena.numel() < request.numel:  # unreserved or larger: a new arena for what follows
            n = max(request.numel, self._reserved.get(request.role, 0))
            if request.random:
                arena = torch.randn(n, generator=self._gen, device=self.device, dtype=torch.float32).to(self.dtype)
            else:
                arena = torch.zeros(n, device=self.device, dtype=self.dtype)
            self._arenas[request.role] = arena
            self.nbytes += arena.numel() * arena.element_size()
        return arena[:request.numel].view(request.shape)


def elements(nbytes: float, dtype: torch.dtype, multiple: int = 1) -> int:
    """Elements of `dtype` holding nbytes, at least one per `multiple`, rounded up to a multiple of it."""
    size = torch.empty((), dtype=dtype).element_size()
    n = max(multiple, int(round(nbytes / size)))
    return -(-n // multiple) * multiple


def op_requests(op: Op, dtype: torch.dtype, n_members: int = 1, layout: str | None = None) -> list[Request]:
    """The tensors op's kernel uses (n_members: its group's size, for a collective); `layout` for a GEMM (default
    its own: a layout changes shapes, never sizes)."""
    w = op.work
    if isinstance(w, Gemm):
        return gemm_requests(w, layout or w.layout)
    if isinstance(w, Attention):
        return attention_requests(w)
    if isinstance(w, Elementwise):
        return elementwise_requests(w, dtype)[0]
    if isinstance(w, Collective):
        return collective_requests(op, n_members, dtype)
    if isinstance(w, P2P):
        return [Request(("comm", op.stream, w.kind), (elements(w.nbytes, dtype),))]
    raise TypeError(f"op {op.id} '{op.name}': the executor cannot run {type(w).__name__}")


# ---- compute ---------------------------------------------------------------------


def gemm_requests(g: Gemm, layout: str) -> list[Request]:
    """A, B and C for `g` run with `layout`: A stored (m, k) for "N", (k, m) for "T"; B (k, n) or (n, k)."""
    lead = (g.batch,) if g.batch > 1 else ()
    return [Request(("gemm.a",), lead + ((g.m, g.k) if layout[0] == "N" else (g.k, g.m)), random=True),
            Request(("gemm.b",), lead + ((g.k, g.n) if layout[1] == "N" else (g.n, g.k)), random=True),
            Request(("gemm.c",), lead + (g.m, g.n))]


def gemm_operands(g: Gemm, layout: str, bufs: Buffers) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(op(A), op(B), C) for `g` run with `layout`."""
    a, b, c = (bufs.get(r) for r in gemm_requests(g, layout))
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


def attention_requests(a: Attention) -> list[Request]:
    """q, k and v, and for a backward op the output gradient, each (batch, heads, seq, head_dim)."""
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    return [Request((f"attn.{what}",), shape, random=True) for what in ("q", "k", "v", "dout")[:4 if a.backward else 3]]


def attention_fn(a: Attention, bufs: Buffers, graphs: dict) -> Fn:
    q, k, v, *dout = (bufs.get(r) for r in attention_requests(a))
    if not a.backward:
        return functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=a.causal)
    key = (q.shape, a.causal)
    if key not in graphs:
        leaves = tuple(t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with torch.enable_grad():
            out = F.scaled_dot_product_attention(*leaves, is_causal=a.causal)
        graphs[key] = (out, leaves, dout[0])
    out, leaves, grad_out = graphs[key]
    return functools.partial(torch.autograd.grad, (out,), leaves, (grad_out,), retain_graph=True)


def elementwise_requests(e: Elementwise, dtype: torch.dtype) -> tuple[list[Request], int]:
    """The source and destination one pass copies (at most EW_CHUNK_BYTES each), and the op's elements a side
    (nbytes / 2: what it reads, and writes again)."""
    n = elements(e.nbytes / 2, dtype)
    chunk = min(n, elements(EW_CHUNK_BYTES, dtype))
    return [Request(("ew.src",), (chunk,), random=True), Request(("ew.dst",), (chunk,))], n


def elementwise_fn(e: Elementwise, bufs: Buffers) -> Fn:
    requests, n = elementwise_requests(e, bufs.dtype)
    src, dst = (bufs.get(r) for r in requests)
    if n == src.numel() and e.kernels == 1:
        return functools.partial(dst.copy_, src)
    passes, rest = divmod(n, src.numel())
    pieces = [(dst, src)] * passes + ([(dst[:rest], src[:rest])] if rest else [])
    if e.kernels > 1:  # the same elements in `kernels` launches: each piece cut into its share
        parts = max(1, -(-e.kernels // len(pieces)))
        pieces = [pair for d, s in pieces for pair in zip(d.chunk(parts), s.chunk(parts))]

    def copy_in_passes() -> None:
        for d, s in pieces:
            d.copy_(s)

    return copy_in_passes


# ---- communication -------------------------------------------------------------------


def collective_requests(op: Op, n_members: int, dtype: torch.dtype) -> list[Request]:
    """[output, input] (input absent where the collective works in place): the IR's nbytes is the full buffer, as
    nccl-tests counts (the all-gather output, the reduce-scatter input; a shift's each way), rounded up to a
    multiple of the group size."""
    c: Collective = op.work
    n = elements(c.nbytes, dtype, n_members)
    roles = {"all_reduce": ("ar", n, None), "all_gather": ("ag", n, n // n_members),
             "reduce_scatter": ("rs", n // n_members, n), "broadcast": ("bc", n, None),
             "all_to_all": ("a2a", n, n), "shift": ("shift", n, n)}
    if c.kind not in roles:
        raise ValueError(f"op {op.id} '{op.name}': unknown collective kind {c.kind!r}")
    name, n_out, n_in = roles[c.kind]
    out = [Request(("comm", op.stream, name + ".out"), (n_out,))]
    return out + ([Request(("comm", op.stream, name + ".in"), (n_in,))] if n_in is not None else [])


def collective_fn(op: Op, channel, bufs: Buffers) -> Fn:
    """The op's collective on preallocated (output, input) buffers; `channel` is an executor.channels channel
    (gloo or torch.distributed). Kinds: twin.ir.COLLECTIVE_KINDS (all_reduce, all_gather, reduce_scatter,
    broadcast, all_to_all, shift)."""
    out, *inp = (bufs.get(r) for r in collective_requests(op, len(channel.members), bufs.dtype))
    return channel.collective(op.work.kind, out, inp[0] if inp else None)


def p2p_fn(op: Op, channel, peer: int, bufs: Buffers) -> Fn:
    (buf,) = (bufs.get(r) for r in op_requests(op, bufs.dtype))
    return channel.p2p(op.work.kind, buf, peer)
