"""Run a benchmark case in a process of its own and report its peak resident memory and CPU time (issue 15).

A process's peak RSS (getrusage's ru_maxrss) only grows, so cases measured in
one process would each report the largest so far. Each case runs in a forked
process instead; its peak is the larger of its own and its children's (a
search's or validation's worker processes), in MB. The interpreter and the
imports are included: `baseline_mb()` is a process that does nothing. The
case's CPU seconds (its process's and its children's, user and system) are
reported too: with them a case's wall time says whether it kept the cores
busy (wall about CPU / cores) or waited. On this shared host both vary with
its load (twin validate: 117 s of CPU in a quiet hour, 164 s in a busy one,
2026-12-03), so compare runs alternated in one sitting.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from typing import Callable


def _peak_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # the largest waited-for child
    return max(own, children) / 1024  # Linux reports KiB


def _cpu_s() -> float:
    """User and system seconds of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _in_child(conn, fn: Callable, args: tuple) -> None:
    try:
        result = fn(*args)
        _end_children()
        result["peak_mb"] = _peak_mb()
        result["cpu_s"] = _cpu_s()
        conn.send(("ok", result))
    except BaseException as e:  # the parent re-raises it: a case's error is the benchmark's error
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()
        _end_children()
        # Leave at once: the interpreter's exit would join what is left of a pool the case shut down without
        # waiting (twin validate's second process) forever.
        os._exit(0)


def _end_children() -> None:
    """End the worker processes a case left running (a pool shut down without waiting: twin validate's second
    process) and wait for them, so that their memory counts in the peak and none outlives the benchmark (they
    did: a forked pool worker holds its own task pipe's write end, so it never sees the pipe close)."""
    for child in multiprocessing.active_children():
        child.terminate()
        child.join()


def isolated(fn: Callable, *args) -> dict:
    """fn(*args) (returning a dict) in a forked process of its own, with "peak_mb" and "cpu_s" added.

    A plain Process, not a Pool worker: those are daemonic and may not start the worker processes a search
    or a validation starts."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_in_child, args=(send, fn, args))
    child.start()
    send.close()
    status, value = receive.recv()
    child.join()
    if status != "ok":
        raise RuntimeError(f"{fn.__name__}{args}: {value}")
    return value


def _nothing() -> dict:
    return {}


def baseline_mb() -> float:
    """The peak memory of a case that does nothing: what every case's figure includes."""
    return isolated(_nothing)["peak_mb"]
