"""A transformer block's pass written once per kind and copied for every other layer and micro-batch.

Every layer of a model has the same linears, so a block's forward, recompute
or backward writes the same ops in every layer and micro-batch: only their
ids, the micro-batch, chunk and layer in their tags and names, and the ops
outside the block that its first ops wait on (the last compute op, the
handles waited for, a weight gather prefetched by the block before) differ.
A deep pipeline's stage writes its blocks hundreds of times and a search
builds thousands of schedules; writing each op through the builder's methods
was over a quarter of a search's CPU (docs/speed.md).

So LayerWriter records a block of each kind the second time one is written
(the kind: the pass's phase, whether it is chunked, the linear whose weights
the block prefetches for, and which of the ops outside it coincide; a kind
written once, as in a schedule of one layer and micro-batch, is never
recorded) and copies it for the others: ids
shifted, dependencies outside the block mapped to the new block's, tags and
names relabelled, the writer left as writing the block would have left it.
A block that does not fit that description (an op without a tag, or whose tag
is of another micro-batch or chunk, a dependency on any other op outside the
block, a name that is not the pass's label and the op's layer around fixed
text) is never copied: it is written every time. tests/test_replay.py
compares copied programs with written ones, op by op, over plans of every
axis and switch; `REPLAY = False` writes every block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from twin.builders.program import COMPUTE_STREAM, ProgramWriter
from twin.builders.tags import Pass, new_tag
from twin.ir import Op
from twin.quick_init import positional

new_op = positional(Op)  # (id, name, stream, work, deps, tag), without __init__'s call

REPLAY = True  # False: write every block through the builder (the reference tests/test_replay.py compares with)

# An op id in a recording: n >= 0 the block's own n-th op, -1 - k the block's k-th outside op (BlockRecorder.write's
# `outside`: the writer's last compute op, its pending waits, then the block's `gathered`).


@dataclass(frozen=True)
class Recording:
    """A block's ops and its effect on the writer, with ids relative to it (module docstring)."""

    # per op: name before the layer, name after it (None: no layer in the tag), stream, work, dependencies,
    # whether they reach outside (then re-sorted), the tag's layer less the block's (None: no layer), phase,
    # block, role
    ops: tuple[tuple, ...]
    last_compute: int | None
    pending: tuple[int, ...]
    deferred: tuple[int, ...]  # appended to the writer's deferred waits (ors reduce-scatters)
    result: int | None  # what the block returns (a prefetched gather)
    axes: frozenset[str]


def outside_pattern(outside: tuple[int | None, ...]) -> tuple[int | None, ...]:
    """Which of the outside ops coincide: each one's first position among them (None where there is none)."""
    return tuple(None if op is None else outside.index(op) for op in outside)


def record(w: ProgramWriter, start: int, outside: tuple[int | None, ...], at: Pass, layer: int,
           deferred: list[int], result: int | None) -> Recording | None:
    """The recording of the block written from op `start` on, or None where it cannot be copied."""

    def relative(op_id: int | None) -> int | None:
        if op_id is None:
            return None
        if op_id >= start:
            return op_id - start
        if op_id in outside:
            return -1 - outside.index(op_id)
        raise LookupError(op_id)

    ops = []
    micro = at.micro_label
    try:
        for op in w.ops[start:]:
            tag = op.tag
            if tag is None or tag.micro_batch != at.micro_batch or tag.chunk != at.chunk \
                    or not op.name.startswith(micro + "."):
                return None
            rest, tail = op.name[len(micro):], None
            if tag.layer is not None:
                marker = f".L{tag.layer}."
                rest, found, tail = rest.partition(marker)
                if not found or marker in tail or f".L{tag.layer}" in rest:
                    return None
            deps = tuple(relative(d) for d in op.deps)
            ops.append((rest, tail, op.stream, op.work, deps, any(d < 0 for d in deps),
                        None if tag.layer is None else tag.layer - layer, tag.phase, tag.block, tag.role))
        state = w.state()
        return Recording(tuple(ops), relative(state[0]), tuple(relative(p) for p in state[1]),
                         tuple(relative(d) for d in deferred), relative(result),
                         frozenset(op.work.group for op in w.ops[start:] if op.stream != COMPUTE_STREAM))
    except LookupError:
        return None


def replay(w: ProgramWriter, recording: Recording, outside: tuple[int | None, ...], at: Pass, layer: int,
           deferred: list[int]) -> int | None:
    """Write `recording` as the block of `layer` in the pass `at` (its outside ops `outside`); returns what the
    recorded block returned, mapped."""
    base = len(w.ops)

    def actual(op_id: int | None) -> int | None:
        if op_id is None:
            return None
        return base + op_id if op_id >= 0 else outside[-1 - op_id]

    micro, mb, chunk = at.micro_label, at.micro_batch, at.chunk
    ops, tag_of, make, shift = w.ops, new_tag, new_op, base.__add__
    for op_id, (head, tail, stream, work, deps, reaches_out, delta, phase, block, role) in enumerate(
            recording.ops, base):
        if delta is None:
            name, tag_layer = micro + head, None
        else:
            tag_layer = layer + delta
            name = f"{micro}{head}.L{tag_layer}.{tail}"
        deps = tuple(sorted(map(actual, deps))) if reaches_out else tuple(map(shift, deps))
        ops.append(make(op_id, name, stream, work, deps, tag_of(mb, chunk, phase, tag_layer, block, role)))
    w.set_state(actual(recording.last_compute), [actual(p) for p in recording.pending])
    deferred.extend(actual(d) for d in recording.deferred)
    w.axes |= recording.axes
    return actual(recording.result)


class BlockRecorder:
    """One stage writer's recordings, by kind of block (module docstring). A kind is recorded the second time it
    is written, not the first: a schedule of one layer and micro-batch (the search's screen) writes each kind
    once, and recording it would only cost."""

    _SEEN = "seen"  # written once, not recorded

    def __init__(self) -> None:
        self._recordings: dict[tuple, Recording | str | None] = {}
        self.copies = 0  # blocks copied rather than written

    def write(self, w: ProgramWriter, kind: tuple, at: Pass, layer: int, gathered: int | None,
              deferred: list[int], write: Callable[[], int | None]) -> int | None:
        """The block `kind` (a hashable of what decides its ops besides layer, micro-batch and chunk) of `layer`
        in the pass `at`: copied where one like it was recorded, else written by `write` (and recorded the
        second time)."""
        if not REPLAY:
            return write()
        last_compute, pending = w.state()
        outside = (last_compute, *pending, gathered)
        key = (kind, at.phase, at.chunk is None, outside_pattern(outside))
        recording = self._recordings.get(key)
        if isinstance(recording, Recording):
            self.copies += 1
            return replay(w, recording, outside, at, layer, deferred)
        if recording is None and key in self._recordings:  # refused: written every time
            return write()
        start, deferred_before = len(w.ops), len(deferred)
        result = write()
        self._recordings[key] = (self._SEEN if recording is None else
                                 record(w, start, outside, at, layer, deferred[deferred_before:], result))
        return result
