"""Executor overhead: the compiled program against a hand-written torch.distributed loop doing the same ops.

    .venv/bin/python benchmarks/executor_overhead.py [--nproc 2] [--plan gz=2] [--model tiny] [--steps 20]

Launches itself under torchrun. Every rank builds the plan's schedule and
compiles it (executor.runtime.Executor), and also sets up `HandWritten`: the
same training step written out by hand the way a framework does it (AxoNN's
4D linear: all-gather the weight, GEMM, all-reduce; backward dI, async
all-reduce, dW, async reduce-scatter; prefetch, recompute, data-parallel
buckets, Adam as a memory-bound pass), with its own preallocated tensors and
the same process groups (so the comparison is of the executors, not of the
transports). Before timing, the hand-written step runs once in trace mode and
its op sequence (kind, sizes, group) is checked equal to the IR program's.

Then both run in the same processes, alternating, `--steps` times each after
warm-up; per step a barrier, then the step, timed on every rank (the step time
is the slowest rank's). Printed: the median step of each, and the ratio
compiled / hand-written (target: within 5%).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class HandWritten:
    """One training step of a 4D plan (no pipeline, no sequence parallelism), written by hand.

    `self.trace` is None when running; a list when recording the op sequence instead.
    """

    def __init__(self, model, plan, channels: dict, dtype, device, trace_only: bool = False) -> None:
        import torch

        self.torch = torch
        self.model, self.plan = model, plan
        self.ch = channels  # axis -> executor channel (same process groups as the executor's)
        self.dtype, self.device = dtype, device
        self.trace = [] if trace_only else None
        self.size = {"x": plan.gx, "y": plan.gy, "z": plan.gz, "data": plan.gdata}
        self.shard = "z+data" if plan.zero == 3 and plan.gdata > 1 else "z"
        self.size["z+data"] = plan.gz * plan.gdata
        self.b = model.dtype_bytes
        self.tokens = plan.mbs * model.seq
        self.bufs: dict = {}
        self.itemsize = torch.empty((), dtype=dtype).element_size()
        self.linears = {}
        for layer in range(model.layers):
            for name, k, n, t in model.linear_shapes():
                self.linears[f"L{layer}.{name}"] = (k, n, t)
        self.linears["lm_head"] = (model.hidden, model.vocab, False)

    # ---- tensors (allocated once, on first use) -------------------------------------
    def t(self, key, numel: int, shape: tuple | None = None, transpose: bool = False):
        """The tensor for `key` (numel elements), viewed as `shape` (and transposed); allocated once, views cached."""
        full = (key, numel, shape, transpose)
        buf = self.bufs.get(full)
        if buf is None:
            base = self.bufs.get((key, numel, None, False))
            if base is None:
                base = self.bufs[(key, numel, None, False)] = self.torch.zeros(numel, dtype=self.dtype, device=self.device)
            buf = base.view(shape) if shape else base
            buf = self.bufs[full] = buf.t() if transpose else buf
        return buf

    def elems(self, nbytes: float, multiple: int = 1) -> int:
        n = max(multiple, int(round(nbytes / self.itemsize)))
        return -(-n // multiple) * multiple

    # ---- the ops ----------------------------------------------------------------------
    def gemm(self, m, n, k, layout):
        if self.trace is not None:
            return self.trace.append(("gemm", m, n, k))
        a = self.t(("a", layout), m * k, (m, k) if layout[0] == "N" else (k, m), layout[0] == "T")
        b = self.t(("b", layout), k * n, (k, n) if layout[1] == "N" else (n, k), layout[1] == "T")
        self.torch.matmul(a, b, out=self.t("c", m * n, (m, n)))

    def ew(self, nbytes):
        if self.trace is not None:
            return self.trace.append(("elementwise", round(nbytes)))
        n = self.elems(nbytes / 2)
        self.t("dst", n).copy_(self.t("src", n))

    def attention(self, backward):
        m, plan = self.model, self.plan
        shape = (plan.mbs, m.heads // plan.gx, m.seq, m.head_dim)
        if self.trace is not None:
            return self.trace.append(("attention", backward))
        torch, F = self.torch, self.torch.nn.functional
        if not backward:
            numel = shape[0] * shape[1] * shape[2] * shape[3]
            q, k, v = (self.t(name, numel, shape) for name in ("q", "k", "v"))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if "graph" not in self.bufs:
            leaves = tuple(torch.randn(shape, dtype=self.dtype, device=self.device, requires_grad=True) for _ in range(3))
            with torch.enable_grad():
                out = F.scaled_dot_product_attention(*leaves, is_causal=True)
            self.bufs["graph"] = (out, leaves, torch.randn(shape, dtype=self.dtype, device=self.device))
        out, leaves, g = self.bufs["graph"]
        torch.autograd.grad((out,), leaves, (g,), retain_graph=True)

    def comm(self, kind, axis, nbytes):
        """Issue a collective on `axis`, async; returns its handle (a no-op handle in trace mode)."""
        if self.trace is not None:
            self.trace.append((kind, axis, round(nbytes)))
            return _Done
        ch = self.ch[axis]
        n_members = len(ch.members)
        n = self.elems(nbytes, n_members)
        if kind == "all_reduce":
            return ch.collective(kind, self.t(("ar", axis), n), None)()
        if kind == "all_gather":
            return ch.collective(kind, self.t(("ag", axis), n), self.t(("agi", axis), n // n_members))()
        return ch.collective(kind, self.t(("rsi", axis, "out"), n // n_members), self.t(("rs", axis), n))()

    # ---- the step, as a framework writes it -------------------------------------------
    def step(self) -> None:
        for mb in range(self.plan.ga):
            self.forward()
            self.backward()
        self.optimizer()

    def gemm_dims(self, name):
        k, n, t = self.linears[name]
        fwd, bwd = ("x", "y") if t else ("y", "x")
        return self.tokens, k // self.size[fwd], n // self.size[bwd], fwd, bwd

    def gather(self, name):
        if self.size[self.shard] == 1:
            return None
        k, n, _ = self.linears[name]
        return self.comm("all_gather", self.shard, self.b * k * n / (self.size["x"] * self.size["y"]))

    def linear_fwd(self, name, gathered, prefetch):
        if self.size[self.shard] > 1 and gathered is None:
            gathered = self.gather(name)
        nxt = self.gather(prefetch) if (prefetch and self.plan.oag) else None
        if gathered is not None:
            gathered.wait()
        rows, k_loc, n_loc, fwd, _ = self.gemm_dims(name)
        self.gemm(rows, n_loc, k_loc, "NT")
        if self.size[fwd] > 1:
            self.comm("all_reduce", fwd, self.b * rows * n_loc).wait()
        return nxt

    def linear_bwd(self, name, deferred):
        rows, k_loc, n_loc, _, bwd = self.gemm_dims(name)
        self.gemm(rows, k_loc, n_loc, "NN")
        h = self.comm("all_reduce", bwd, self.b * rows * k_loc) if self.size[bwd] > 1 else None
        if h is not None and not self.plan.oar:
            h.wait()
        self.gemm(n_loc, k_loc, rows, "TN")
        if h is not None and self.plan.oar:
            h.wait()
        if self.size[self.shard] > 1:
            k, n, _ = self.linears[name]
            rs = self.comm("reduce_scatter", self.shard, self.b * k * n / (self.size["x"] * self.size["y"]))
            if self.plan.ors:
                deferred.append(rs)
            else:
                rs.wait()

    def block_fwd(self, layer, gathered, after):
        m, res = self.model, self.tokens * self.model.hidden / self.size["y"]
        q, o, u, d = (f"L{layer}.{n}" for n in ("qkv", "attn_out", "mlp_up", "mlp_down"))
        self.ew(res * 4)
        gathered = self.linear_fwd(q, gathered, o)
        self.attention(False)
        gathered = self.linear_fwd(o, gathered, u)
        self.ew(res * 7)
        self.ew(res * 4)
        gathered = self.linear_fwd(u, gathered, d)
        self.ew(self.tokens * m.ffn / self.size["x"] * 4)
        gathered = self.linear_fwd(d, gathered, after)
        self.ew(res * 7)
        return gathered

    def forward(self):
        res = self.tokens * self.model.hidden / self.size["y"]
        self.ew(res * 2 * self.b)
        gathered = None
        for layer in range(self.model.layers):
            after = f"L{layer + 1}.qkv" if layer + 1 < self.model.layers else "lm_head"
            gathered = self.block_fwd(layer, gathered, after)
        self.ew(res * 4)
        self.linear_fwd("lm_head", gathered, None)
        logits = self.tokens * self.model.vocab / self.size["x"]
        self.ew(logits * 10)
        if self.size["x"] > 1:
            self.comm("all_reduce", "x", 2 * 4 * self.tokens).wait()
        self.ew(logits * 10)

    def backward(self):
        m, res = self.model, self.tokens * self.model.hidden / self.size["y"]
        deferred = []
        self.linear_bwd("lm_head", deferred)
        self.ew(res * 2 * 4)
        for layer in reversed(range(m.layers)):
            if self.plan.recompute == "full":
                self.block_fwd(layer, None, None)
            q, o, u, d = (f"L{layer}.{n}" for n in ("qkv", "attn_out", "mlp_up", "mlp_down"))
            self.ew(res * 2 * 7)
            self.linear_bwd(d, deferred)
            self.ew(self.tokens * m.ffn / self.size["x"] * 2 * 4)
            self.linear_bwd(u, deferred)
            self.ew(res * 2 * 4)
            self.ew(res * 2 * 7)
            self.linear_bwd(o, deferred)
            self.attention(True)
            self.linear_bwd(q, deferred)
            self.ew(res * 2 * 4)
        self.ew(res * 2 * self.b)
        for h in deferred:
            h.wait()

    def optimizer(self):
        m, plan = self.model, self.plan
        tp = plan.gx * plan.gy * plan.gz
        buckets = [float(m.params_per_layer)] * m.layers + [m.embedding_params + 2.0 * m.hidden]
        if self.size["data"] > 1 and plan.zero in (0, 1, 2):
            kind = "all_reduce" if plan.zero == 0 else "reduce_scatter"
            handles = [self.comm(kind, "data", self.b * p / tp) for p in buckets]
            for h in handles:
                h.wait()
        local = sum(buckets) / tp / (plan.gdata if plan.zero else 1)
        self.ew(28 * local)
        if self.size["data"] > 1 and plan.zero in (1, 2):
            for p in buckets:
                self.comm("all_gather", "data", self.b * p / tp).wait()


class _Done:
    @staticmethod
    def wait() -> None:
        return None


def ir_sequence(program) -> list[tuple]:
    """The IR program as the hand-written trace records it."""
    from twin.ir import Attention, Collective, Elementwise, Gemm

    out = []
    for op in program.ops:
        w = op.work
        if isinstance(w, Gemm):
            out.append(("gemm", w.m, w.n, w.k))
        elif isinstance(w, Elementwise):
            out.append(("elementwise", round(w.nbytes)))
        elif isinstance(w, Attention):
            out.append(("attention", w.backward))
        elif isinstance(w, Collective):
            out.append((w.kind, w.group, round(w.nbytes)))
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from executor.runtime import Executor
    from executor.target import choose_target
    from topologies.machine import load_machine
    from twin.build import build_step
    from twin.model import get_model
    from twin.plan import parse_plan

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = get_model(args.model)
    plan = parse_plan(args.plan[0], parse_plan(f"global_batch={args.global_batch}"))
    built = build_step(model, plan, load_machine(args.machine), world)
    schedule = built.schedule
    target = choose_target("bf16")
    ex = Executor(schedule, rank, target, tune=False)
    channels = {ch.key.axis: ex.channels[ch.index] for ch in ex.rp.channels}
    hand = HandWritten(model, built.plan, channels, target.dtype, target.device, trace_only=True)
    hand.step()
    want = ir_sequence(schedule.programs[ex.rp.program])
    if hand.trace != want:
        first = next(i for i, (a, b) in enumerate(zip(hand.trace + [None] * len(want), want)) if a != b)
        raise SystemExit(f"rank {rank}: the hand-written step differs from the IR at op {first}: "
                         f"{hand.trace[first] if first < len(hand.trace) else None} vs {want[first]}")
    hand.trace = None
    flag = torch.zeros(1)

    def timed(fn) -> float:
        dist.all_reduce(flag)
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    for _ in range(args.warmup):
        timed(ex.step)
        timed(hand.step)
    compiled, handwritten = [], []
    for i in range(args.steps):
        first, second = (ex.step, hand.step) if i % 2 == 0 else (hand.step, ex.step)
        a, b = timed(first), timed(second)
        compiled.append(a if i % 2 == 0 else b)
        handwritten.append(b if i % 2 == 0 else a)
    if rank == 0:
        import statistics

        result = {"model": args.model, "plan": built.plan.describe(), "ranks": world, "ops": len(want),
                  "dtype": target.dtype_name, "compiled_steps_s": compiled, "handwritten_steps_s": handwritten,
                  "compiled_median_s": statistics.median(compiled), "handwritten_median_s": statistics.median(handwritten),
                  "pair_ratio_median": statistics.median(a / b for a, b in zip(compiled, handwritten))}
        result["ratio"] = result["compiled_median_s"] / result["handwritten_median_s"]
        with open(args.result, "w") as f:
            json.dump(result, f, indent=2)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--plan", action="append", help="plans (repeatable); default: gx=N and gz=N")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--machine", default="frontier", help="only for building the plan (memory check)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    plans = args.plan or [f"gx={args.nproc}", f"gz={args.nproc}"]
    rows = []
    os.makedirs(REPO / "out", exist_ok=True)
    for plan in plans:
        result = REPO / "out" / "executor_overhead.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               str(Path(__file__).resolve()), "--worker", "--result", str(result), "--model", args.model,
               "--plan", plan, "--global-batch", str(args.global_batch), "--machine", args.machine,
               "--steps", str(args.steps), "--warmup", str(args.warmup)]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(result.read_text()))
    print(f"{'model':<7}{'plan':<74}{'ranks':>6}{'ops':>5}{'compiled s':>12}{'by hand s':>11}{'ratio':>8}{'pairs':>8}")
    for r in rows:
        print(f"{r['model']:<7}{r['plan']:<74}{r['ranks']:>6}{r['ops']:>5}{r['compiled_median_s']:>12.4f}"
              f"{r['handwritten_median_s']:>11.4f}{r['ratio']:>8.3f}{r['pair_ratio_median']:>8.3f}")
    print(f"medians of {args.steps} alternating steps each ({rows[0]['dtype']}); ratio = compiled / by hand of the medians, "
          "pairs = median of the per-pair ratios; target: within 1 +- 0.05")
    return 0


if __name__ == "__main__":
    sys.exit(main())
