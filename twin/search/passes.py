"""The passes of a program's layers: each layer's forward, recompute and backward on one micro-batch.

A pass's compute ops sit together on a rank's compute stream (the builders
write a layer's pass in one go), so on any rank the passes of all its
layers and micro-batches follow one another. Two lower bounds use that: the
screening bound (twin.search.screen) and the 1F1B pipeline term of the full
bound (twin.search.bound.BoundModel.pipeline_terms_s). Which pass an op is in
comes from its tag (twin.ir.OpTag), never its name.
"""

from __future__ import annotations

from typing import Hashable, NamedTuple

from twin.builders.program import COMPUTE_STREAM
from twin.builders.tags import ACCUMULATE_ROLES
from twin.ir import Op, Program


class LayerPass(NamedTuple):
    """One layer's forward, recompute or backward (`phase`) on one micro-batch (and chunk); a tuple, as the
    search hashes one per compute op of every plan it bounds."""

    micro_batch: int
    chunk: int | None
    phase: str
    layer: int


def pass_of(op: Op) -> LayerPass | None:
    """The layer pass an op belongs to; None outside the layers and micro-batches, and for accumulations into
    main_grad (sized by the weights' sharding, which the screening bound does not see: twin.builders.tags)."""
    tag = op.tag
    if tag is None or tag.layer is None or tag.micro_batch is None or tag.role in ACCUMULATE_ROLES:
        return None
    return LayerPass(tag.micro_batch, tag.chunk, tag.phase, tag.layer)


def pass_compute_s(program: Program, durations: list[float]) -> dict[LayerPass, float]:
    """Each layer pass's compute: the sum of its compute ops."""
    out: dict[LayerPass, float] = {}
    for op in program.ops:
        key = pass_of(op) if op.stream == COMPUTE_STREAM and not op.work.comm else None
        if key:
            out[key] = out.get(key, 0.0) + durations[op.id]
    return out


def chains_s(program: Program, durations: list[float], group_of: dict[int, Hashable]) -> dict[Hashable, float]:
    """Each group's chain: from its first compute op to the end of its last, through its compute ops in stream
    order and the collectives whose every dependency is in the group (those a later op of it may wait for).

    `group_of` maps compute op ids to groups that each sit together on the compute stream. A group's ops all
    start after its first compute op, and every op takes at least its duration here, so the group spans at
    least its chain; groups follow one another, so their chains add.
    """
    end: dict[int, float] = {}
    owner: dict[int, Hashable] = {}  # op id -> its group, for the ops of a chain
    last_compute: dict[Hashable, float] = {}  # per group: the end of its latest compute op
    for op in program.ops:
        if op.stream == COMPUTE_STREAM and not op.work.comm:
            key = group_of.get(op.id)
            if key is None:
                continue
            start = last_compute.get(key, 0.0)
        else:
            groups = {owner.get(d) for d in op.deps}
            if len(groups) != 1 or None in groups:
                continue  # waits on something outside a single group (or on nothing): on no chain
            key, start = groups.pop(), 0.0
        for dep in op.deps:
            if owner.get(dep) == key and end[dep] > start:
                start = end[dep]
        end[op.id] = start + durations[op.id]
        owner[op.id] = key
        if op.stream == COMPUTE_STREAM and not op.work.comm:
            last_compute[key] = end[op.id]
    return last_compute


def pass_chains_s(program: Program, durations: list[float]) -> dict[LayerPass, float]:
    """Each layer pass's chain (chains_s): its compute ops and the collectives between them."""
    passes = {op.id: pass_of(op) for op in program.ops if op.stream == COMPUTE_STREAM and not op.work.comm}
    return chains_s(program, durations, {i: key for i, key in passes.items() if key})


def busiest_stream_s(program: Program, durations: list[float]) -> float:
    """The busiest communication stream's least per layer: per stream, each kind of pass's least over the
    program's layer passes (a pass with none of the stream's ops counts 0), summed; the most of the streams.

    A stream runs its ops one after another, and a layer's pass issues the same communication whatever its
    micro-batch (weights are gathered again in each pass, prefetches stay inside a micro-batch's pass), so
    a rank whose layers make N passes of each kind keeps some stream busy for at least N times this.
    """
    passes = set(pass_compute_s(program, durations))  # every layer pass, from its compute ops
    per_stream: dict[str, dict[LayerPass, float]] = {}
    for op in program.ops:
        key = pass_of(op) if op.work.comm else None
        if key:
            loads = per_stream.setdefault(op.stream, {})
            loads[key] = loads.get(key, 0.0) + durations[op.id]
    busiest = 0.0
    for loads in per_stream.values():
        least: dict[str, float] = {}
        for key in passes:
            value = loads.get(key, 0.0)
            least[key.phase] = min(value, least.get(key.phase, value))
        busiest = max(busiest, sum(least.values()))
    return busiest


def micro_batch_of(op: Op) -> int | None:
    """The micro-batch an op works on (None for the step's own ops and ops without a tag)."""
    return op.tag.micro_batch if op.tag is not None else None


def micro_batch_runs(program: Program) -> dict[int, tuple[int, int]]:
    """Compute op id -> (micro-batch, run): the longest runs of one micro-batch's compute ops on the compute
    stream (a 1F1B stage's forward of a micro-batch, then later its backward; ops of no micro-batch end a run)."""
    out: dict[int, tuple[int, int]] = {}
    runs: dict[int, int] = {}
    previous = None
    for op in program.ops:
        if op.stream != COMPUTE_STREAM or op.work.comm:
            continue
        mb = micro_batch_of(op)
        if mb is None:
            previous = None
            continue
        if mb != previous:
            runs[mb] = runs.get(mb, -1) + 1
            previous = mb
        out[op.id] = (mb, runs[mb])
    return out


def least_per_layer_s(per_pass: dict[LayerPass, float]) -> float:
    """A layer's smallest possible total: for each kind of pass (fwd, rc, bwd), the least any layer's pass of that
    kind has, summed."""
    least: dict[str, float] = {}
    for key, value in per_pass.items():
        least[key.phase] = min(value, least.get(key.phase, value))
    return sum(least.values())
