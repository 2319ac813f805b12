"""A small helper for writing one rank program in issue order.

It encodes the stream semantics real frameworks have, so builders state only
the algorithm:

- a collective issued from PyTorch on an NCCL/RCCL stream first waits for the
  work already enqueued on the compute stream (ProcessGroupNCCL syncs the comm
  stream with the current stream), so every collective depends on the last
  compute op issued before it;
- `wait(op)` is a handle's .wait(): the next compute op depends on it, and
  so does every communication op issued before that compute op.
"""

from __future__ import annotations

from twin.ir import Op, OpTag, Work

COMPUTE_STREAM = "compute"


def comm_stream(group: str) -> str:
    """One stream per process group, as ProcessGroupNCCL has one per communicator."""
    return f"comm:{group}"


class ProgramWriter:
    def __init__(self) -> None:
        self.ops: list[Op] = []
        self._last_compute: int | None = None
        self._pending_waits: list[int] = []
        self.axes: set[str] = set()  # the group axes of the communication ops written (the schedule's groups)

    def compute(self, name: str, work: Work, deps: tuple[int, ...] = (), tag: OpTag | None = None) -> int:
        """Enqueue a compute op; it also waits on everything `wait`ed so far."""
        if self._pending_waits:
            all_deps = tuple(sorted(set(deps) | set(self._pending_waits)))
            self._pending_waits.clear()
        else:
            all_deps = deps
        op_id = self._append(name, COMPUTE_STREAM, work, all_deps, tag)
        self._last_compute = op_id
        return op_id

    def collective(self, name: str, group: str, work: Work, deps: tuple[int, ...] = (), stream: str | None = None,
                   tag: OpTag | None = None) -> int:
        """Issue an async communication op on the group's stream (or `stream`); `wait` blocks on it.

        It starts after the last compute op and after everything waited for
        since: a wait orders the compute stream behind the waited op, and the
        new op's stream syncs with the compute stream.
        """
        ordered = deps + tuple(self._pending_waits) + ((self._last_compute,) if self._last_compute is not None else ())
        self.axes.add(work.group)
        return self._append(name, stream or comm_stream(group), work, tuple(sorted(set(ordered))), tag)

    def wait(self, *op_ids: int) -> None:
        self._pending_waits.extend(op_ids)

    def state(self) -> tuple[int | None, tuple[int, ...]]:
        """(the last compute op, the waits pending): what the next ops written will depend on besides their own
        dependencies (twin.builders.replay records and restores it)."""
        return self._last_compute, tuple(self._pending_waits)

    def set_state(self, last_compute: int | None, pending: list[int]) -> None:
        self._last_compute = last_compute
        self._pending_waits[:] = pending

    def _append(self, name: str, stream: str, work: Work, deps: tuple[int, ...], tag: OpTag | None) -> int:
        op_id = len(self.ops)
        self.ops.append(Op(op_id, name, stream, work, deps, tag))  # positional: a step has thousands of ops
        return op_id
