"""Run one rank's compiled program for real, step after step, and time every op.

Built once (executor.program decides what and when, executor.kernels builds
the torch work, executor.channels the process groups); a step is then one
tight loop over prebuilt callables: wait what must be waited, issue, record a
time. No tensor is allocated in the loop (attention kernels allocate their
outputs inside torch, as any framework's do).

Timing, in host seconds from perf_counter (CLOCK_MONOTONIC: one clock for
every process of a host):

- CPU (gloo): a compute op runs to completion on the calling thread, so its
  start and end are perf_counter before and after. A collective's end is
  taken by a callback on its Work's future, which runs on gloo's worker
  thread the moment the op completes; a send/recv's (gloo gives those no
  future) by a waiter thread per channel that blocks on the Work in issue
  order. When the host thread was blocked waiting for a comm op, the op
  ends when the host resumes: that is when the ops depending on it can
  start (on a small VM waking a blocked thread can take milliseconds, a
  real cost of every blocking collective there).
- GPU (NCCL): a CUDA event before and after each compute op; for a comm op
  an event on the compute stream at issue, and one recorded on a per-channel
  side stream made to wait on the Work, i.e. when the collective completes.
  Converted to host time from an event recorded at the step's start.

A comm op's start is when it could start on its stream: the later of its
issue and the end of the previous op on its stream (the IR's rule; the
waiting for the other members is part of its time, as in the simulator).

Failures: anything raised while issuing or waiting becomes an OpFailure
naming the rank, the step and the op (id, name, kind, group members), which
the worker reports before exiting.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from executor import kernels
from executor.channels import create_channels
from executor.program import RankOp, RankProgram, compile_rank
from executor.target import Target
from twin.ir import P2P, Attention, Collective, Elementwise, Gemm, Schedule, op_class

class OpFailure(RuntimeError):
    """An op failed or timed out on this rank."""

    def __init__(self, rank: int, step: int, rop: RankOp | None, members: tuple[int, ...] | None, doing: str, cause: BaseException):
        self.rank, self.step, self.cause = rank, step, cause
        self.op_id = rop.op.id if rop else -1
        self.op_name = rop.op.name if rop else ""
        what = ""
        if rop is not None:
            work = rop.op.work
            what = f" op {rop.op.id} '{rop.op.name}' ({op_class(work)}"
            if isinstance(work, (Collective, P2P)):
                what += f" on group '{work.group}' {list(members or ())}"
            what += ")"
        detail = " ".join(str(cause).split()) or type(cause).__name__
        if len(detail) > 300:
            detail = detail[:297] + "..."
        super().__init__(f"rank {rank}, step {step}: {doing}{what} failed: {detail}")


class _Completion:
    """What the host waits on for an op a waiter thread completes: set when done, with the error if any."""

    __slots__ = ("event", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: BaseException | None = None

    def reset(self) -> None:
        self.event.clear()
        self.error = None

    def wait(self) -> None:
        self.event.wait()
        if self.error is not None:
            raise self.error


@dataclass
class StepRecord:
    """One step of one rank: host-clock t0 and per-op start/end in seconds after t0. On CPU, `woke`: for each comm
    op the host thread blocked on, by op id, the seconds from the op's completion (its future's callback or its
    waiter thread) to the host's resuming. A blocking op's end is the resume (what the ops after it wait for),
    so this is the part of it that is the host thread waiting to be scheduled again, on a host whose cores the
    other ranks' compute holds (fit_local's 4 ranks on 2 cores: benchmarks/wake_ups.py)."""

    t0: float
    start: list[float]
    end: list[float]
    woke: dict[int, float] = field(default_factory=dict)


Binder = Callable[[RankOp, object], Callable[[], object] | None]


class Executor:
    """One rank's program, compiled: call `step()` to run and time it once."""

    def __init__(self, schedule: Schedule, rank: int, target: Target, timeout_s: float = 30.0, tune: bool = True,
                 bind: Binder | None = None, progress=None, fault: str | None = None) -> None:
        t_compile = time.perf_counter()
        self.schedule, self.rank, self.target = schedule, rank, target
        self.rp: RankProgram = compile_rank(schedule, rank)
        self.channels = create_channels(schedule, rank, target.backend, timeout_s, self.rp.channels)
        self.bufs = kernels.Buffers(target.device, target.dtype, seed=1234 + rank)
        self.progress = progress  # a writable int64 view: [step, op]
        self.step_index = 0
        sync = torch.cuda.synchronize if target.is_cuda else (lambda: None)
        layouts: dict = {}
        graphs: dict = {}
        bound = [bind(rop, self.channels.get(rop.channel)) if bind else None for rop in self.rp.ops]
        for rop, fn in zip(self.rp.ops, bound):  # every arena at its largest op's size before any is made
            if fn is None:
                members = self.members(rop)  # a collective's group, for its buffers' rounding
                self.bufs.reserve(kernels.op_requests(rop.op, target.dtype, len(members) if members else 1))
        self.fns = [fn if fn is not None else self._kernel(rop, self.channels.get(rop.channel), tune, sync, layouts,
                                                           graphs)
                    for rop, fn in zip(self.rp.ops, bound)]
        if fault:
            self._inject(fault)
        self.tuned_layouts = dict(layouts)
        n = len(self.rp.ops)
        self._end = [0.0] * n
        # (op id, fn, is comm, waits, completion): completion 1 = future callback (gloo collectives),
        # 2 = waiter thread (gloo p2p), 0 = none (compute, or GPU where events time everything).
        self.plan = []
        for rop, fn in zip(self.rp.ops, self.fns):
            completion = 0
            if rop.comm and not target.is_cuda:
                completion = 2 if isinstance(rop.op.work, P2P) else 1
            self.plan.append((rop.op.id, fn, rop.comm, rop.waits, completion))
        self._callbacks = [self._make_callback(i) for i in range(n)]
        self._waiters: dict[int, queue.Queue] = {}
        self._waiter_error: list[BaseException] = []
        self._completions: list[_Completion | None] = [None] * n
        self.waiter_of: list[queue.Queue | None] = [None] * n
        for i, (_, _, _, _, completion) in enumerate(self.plan):
            if completion == 2:
                self._use_waiter(i)
        if target.is_cuda:
            self._events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            self._step_event = torch.cuda.Event(enable_timing=True)
            self._side = {idx: torch.cuda.Stream() for idx in self.channels}
        self.compile_s = time.perf_counter() - t_compile

    # ---- building -----------------------------------------------------------------
    def _kernel(self, rop: RankOp, channel, tune: bool, sync, layouts: dict, graphs: dict):
        work = rop.op.work
        if isinstance(work, Gemm):
            layout = kernels.fastest_layout(work, self.bufs, sync, layouts) if (tune and work.tunable) else work.layout
            return kernels.gemm_fn(work, layout, self.bufs)
        if isinstance(work, Attention):
            return kernels.attention_fn(work, self.bufs, graphs)
        if isinstance(work, Elementwise):
            return kernels.elementwise_fn(work, self.bufs)
        if isinstance(work, Collective):
            return kernels.collective_fn(rop.op, channel, self.bufs)
        if isinstance(work, P2P):
            return kernels.p2p_fn(rop.op, channel, rop.peer, self.bufs)
        raise TypeError(f"op {rop.op.id} '{rop.op.name}': the executor cannot run {type(work).__name__}")

    def _inject(self, fault: str) -> None:
        """Testing aid (EXATWIN_FAULT="kill|hang:rank=R:step=S:op=I"): this rank dies or hangs at that op."""
        mode, *fields = fault.split(":")
        spec = {k: int(v) for k, v in (f.split("=") for f in fields)}
        if spec.get("rank") != self.rank:
            return
        i, step, fn = spec.get("op", 0), spec.get("step", 0), self.fns[spec.get("op", 0)]

        def faulty():
            if self.step_index == step:
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)
            return fn()

        self.fns[i] = faulty

    def _make_callback(self, i: int):
        pc, end = time.perf_counter, self._end

        def done(_future):
            end[i] = pc()

        return done

    def _use_waiter(self, i: int) -> None:
        """From now on op i's completion is taken by its channel's waiter thread.

        The host then waits on the op's _Completion, never on the Work itself:
        gloo's send/recv Works must be waited exactly once (a second waitRecv
        waits for another message), and the waiter thread does that.
        """
        self._completions[i] = self._completions[i] or _Completion()
        channel = self.rp.ops[i].channel
        if channel not in self._waiters:
            q: queue.Queue = queue.Queue()
            threading.Thread(target=self._waiter, args=(q,), daemon=True, name=f"exatwin-wait-{channel}").start()
            self._waiters[channel] = q
        self.waiter_of[i] = self._waiters[channel]
        op_id, fn, comm, waits, _ = self.plan[i]
        self.plan[i] = (op_id, fn, comm, waits, 2)

    def _waiter(self, q: queue.Queue) -> None:
        pc, end, completions = time.perf_counter, self._end, self._completions
        while True:
            i, work = q.get()
            done = completions[i]
            try:
                work.wait()
                end[i] = pc()
            except BaseException as e:  # noqa: BLE001 - raised by the host thread when it waits
                done.error = e
                self._waiter_error.append(e)
            finally:
                done.event.set()
                q.task_done()

    # ---- running --------------------------------------------------------------------
    def members(self, rop: RankOp) -> tuple[int, ...] | None:
        ch = self.channels.get(rop.channel)
        return ch.members if ch is not None else None

    def step(self) -> StepRecord:
        record = self._step_gpu() if self.target.is_cuda else self._step_cpu()
        self.step_index += 1
        return record

    def _fail(self, i: int, doing: str, cause: BaseException) -> OpFailure:
        rop = self.rp.ops[i] if 0 <= i < len(self.rp.ops) else None
        return OpFailure(self.rank, self.step_index, rop, self.members(rop) if rop else None, doing, cause)

    def _step_cpu(self) -> StepRecord:
        pc = time.perf_counter
        n = len(self.plan)
        start, end = [0.0] * n, self._end
        blocked, resumed = [0.0] * n, [0.0] * n  # when the host began waiting for a comm op, and resumed
        handles: list = [None] * n
        chained = []
        callbacks, waiter_of, progress, completions = self._callbacks, self.waiter_of, self.progress, self._completions
        for c in completions:
            if c is not None:
                c.reset()
        if progress is not None:
            progress[0] = self.step_index
        i, w = -1, -1
        t0 = pc()
        try:
            for i, fn, comm, waits, completion in self.plan:
                for w in waits:
                    blocked[w] = pc()
                    handles[w].wait()
                    resumed[w] = pc()
                w = -1
                if progress is not None:
                    progress[1] = i
                t = pc()
                if comm:
                    h = fn()
                    start[i] = t
                    handles[i] = h
                    if completion == 1:
                        try:
                            chained.append(h.get_future().then(callbacks[i]))
                        except RuntimeError:  # this gloo op has no future: time it with a waiter thread
                            self._use_waiter(i)
                            handles[i] = self._completions[i]
                            waiter_of[i].put((i, h))
                    else:
                        handles[i] = completions[i]
                        waiter_of[i].put((i, h))
                else:
                    fn()
                    start[i] = t
                    end[i] = pc()
            i = -1
            for w in self.rp.final_waits:
                blocked[w] = pc()
                handles[w].wait()
                resumed[w] = pc()
            w = -1
            for f in chained:
                f.wait()
            for q in self._waiters.values():
                q.join()
            if self._waiter_error:
                error, self._waiter_error[:] = self._waiter_error[0], []
                raise error
        except OpFailure:
            raise
        except Exception as e:
            if w >= 0:
                raise self._fail(w, "waiting for", e) from e
            raise self._fail(i, "issuing", e) from e
        end = list(end)
        woke = {}
        for w, b in enumerate(blocked):
            if b and end[w] > b:  # the host was blocked on it: it completed, for the program, when the host resumed
                woke[w] = max(resumed[w] - end[w], 0.0)
                end[w] = max(end[w], resumed[w])
        record = self._finish(t0, start, end)
        record.woke = woke
        return record

    def _step_gpu(self) -> StepRecord:
        n = len(self.plan)
        handles: list = [None] * n
        events, side, ops = self._events, self._side, self.rp.ops
        progress = self.progress
        if progress is not None:
            progress[0] = self.step_index
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        self._step_event.record()
        i, w = -1, -1
        try:
            for i, fn, comm, waits, _ in self.plan:
                for w in waits:
                    handles[w].wait()
                w = -1
                if progress is not None:
                    progress[1] = i
                a, b = events[i]
                a.record()
                if comm:
                    h = fn()
                    handles[i] = h
                    with torch.cuda.stream(side[ops[i].channel]):
                        h.wait()
                        b.record()
                else:
                    fn()
                    b.record()
            i = -1
            for w in self.rp.final_waits:
                handles[w].wait()
            w = -1
            torch.cuda.synchronize()
        except Exception as e:
            if w >= 0:
                raise self._fail(w, "waiting for", e) from e
            raise self._fail(i, "issuing", e) from e
        s0 = self._step_event
        start = [s0.elapsed_time(a) / 1e3 for a, _ in events]
        end = [s0.elapsed_time(b) / 1e3 for _, b in events]
        return self._finish(0.0, start, end, t0)

    def _finish(self, t0: float, start: list[float], end: list[float], host_t0: float | None = None) -> StepRecord:
        """Times relative to the step's t0; a comm op starts no earlier than the end of its stream predecessor."""
        base = t0
        rel_start = [s - base for s in start]
        rel_end = [e - base for e in end]
        for rop in self.rp.ops:
            if rop.comm and rop.prev_on_stream >= 0:
                i = rop.op.id
                rel_start[i] = max(rel_start[i], rel_end[rop.prev_on_stream])
                rel_start[i] = min(rel_start[i], rel_end[i])
        return StepRecord(host_t0 if host_t0 is not None else t0, rel_start, rel_end)
