"""The 1F1B pipeline's terms of the full lower bound (twin.search.bound): the bubble no single program's ops show.

A stage cannot start its first forward before the stages before it ran
theirs on the first micro-batch and handed its activation on, and after its
last backward the stages before it still run theirs on the last micro-batch,
each after its gradient arrives: one term per stage, each a chain through
the other stages plus the stage's own work on every micro-batch.
"""

from __future__ import annotations

from typing import Protocol

from twin.builders.program import COMPUTE_STREAM
from twin.ir import P2P, Program, Schedule
from twin.search.passes import chains_s, micro_batch_of, micro_batch_runs


class StageCosts(Protocol):
    """What the terms take from twin.search.bound.BoundModel: each op's duration and each boundary's transfers."""

    def op_durations_s(self, schedule: Schedule, program: Program) -> list[float]: ...

    def stage_hops_s(self, schedule: Schedule, stages: int) -> list[float]: ...


def pipeline_terms_s(bounds: StageCosts, schedule: Schedule, durations: list[list[float]] | None = None
                     ) -> tuple[float, ...]:
    """One bound per stage of a 1F1B pipeline (programs = stages, blocks of consecutive ranks; ops tagged with
    their micro-batch).

    Stage k cannot start its first forward before stages 0..k-1 ran theirs
    on micro-batch 0; it then runs all m forwards and m backwards itself;
    its last backward is followed by stages k-1..0's backward of the same
    micro-batch. So step >= sum_{s<k} (T_s + H_s) + A_k, with T_s what a
    forward and a backward take on stage s at the least, H_s the transfers
    across the boundary of s and s + 1 (the activation on, the gradient back:
    BoundModel.stage_hops_s), A_k all of stage k's work: the bubble the
    per-program bounds cannot see. Each is the larger
    of compute alone (every micro-batch's compute is the same) and chains
    (twin.search.passes.chains_s) through the stage's runs of one
    micro-batch on its compute stream, with the collectives and transfers
    they wait on: A_k all runs' chains and the receives between them
    (received_s); T_s, where every micro-batch has
    a forward run and a later backward run, the least forward plus the
    least backward. Chains are taken on each stage's first rank (the
    ranks a micro-batch passes through from stage to stage). Interleaved
    schedules (ops tagged with a chunk) get no term.

    Each term bounds when stage 0's last backward run ends; what stage 0
    must still do after it (the collectives and the optimizer that wait on
    that run: tail_s) adds to every term.

    The schedule may hold some stages only (twin.build.build_stages): a stage
    between the first and the last that is missing counts its compute
    alone, that of the nearest present stage before it (every middle stage
    runs the same layers per micro-batch, only in another order).
    """
    if len(schedule.programs) < 2 or "pp" not in {g.name for g in schedule.groups}:
        return ()
    per_stage = len(schedule.programs[0].ranks)
    stages = schedule.world_size // per_stage
    compute: dict[int, float] = {}  # per stage: a micro-batch's compute
    through: dict[int, float] = {}  # T_s
    own: dict[int, float] = {}  # A_s
    micro_batches, tail = 0, 0.0
    for index, program in enumerate(schedule.programs):
        program_durations = bounds.op_durations_s(schedule, program) if durations is None else durations[index]
        seen: set[int] = set()
        total = 0.0
        for op in program.ops:
            mb = micro_batch_of(op)
            if mb is None:
                continue
            if op.tag.chunk is not None:
                return ()  # interleaved: a micro-batch crosses each rank more than once
            seen.add(mb)
            if op.stream == COMPUTE_STREAM and not op.work.comm:
                total += program_durations[op.id]
        if not seen:
            return ()
        stage = program.ranks[0] // per_stage
        if stage == 0:
            tail = tail_s(program, program_durations)
        micro_batches = len(seen)
        chains = chains_s(program, program_durations, micro_batch_runs(program))
        runs: dict[int, list[float]] = {}
        for (mb, _), value in sorted(chains.items()):
            runs.setdefault(mb, []).append(value)
        compute[stage] = total / micro_batches
        two_runs = len(runs) == micro_batches and all(len(r) == 2 for r in runs.values())
        forward_backward = min(r[0] for r in runs.values()) + min(r[1] for r in runs.values()) if two_runs else 0.0
        through[stage] = max(compute[stage], forward_backward)
        own[stage] = max(total, sum(chains.values()) + received_s(program, program_durations))
    if 0 not in compute or stages - 1 not in compute or (len(compute) < stages and 1 not in compute):
        return ()  # the first and last stages, and a middle one to stand for any missing, are needed
    hops = bounds.stage_hops_s(schedule, stages)
    terms, before, last_seen = [], 0.0, compute[0]
    for stage in range(stages):
        last_seen = compute.get(stage, last_seen)
        terms.append(before + own.get(stage, micro_batches * last_seen) + tail)
        before += through.get(stage, last_seen) + hops[stage]
    return tuple(terms)


def received_s(program: Program, durations: list[float]) -> float:
    """The receives that sit between two consecutive micro-batch runs: issued after the last compute op of one
    (the writer issues a transfer after its last compute op) and waited for by the first of the next, so each
    lies between the two runs' chains, which leave it out, and adds to them. The first forward's receive,
    before any run, is in the chain of earlier stages (their boundaries' transfers: BoundModel.stage_hops_s),
    not the stage's own."""
    runs = micro_batch_runs(program)
    first_op: dict[tuple[int, int], int] = {}
    last_op: dict[tuple[int, int], int] = {}
    for op_id, run in runs.items():  # in op order
        first_op.setdefault(run, op_id)
        last_op[run] = op_id
    order = sorted(first_op, key=first_op.get)
    follows = {last_op[a]: first_op[b] for a, b in zip(order, order[1:])}  # a run's last op -> the next's first
    waited_by: dict[int, set[int]] = {}
    for op in program.ops:
        for d in op.deps:
            waited_by.setdefault(d, set()).add(op.id)
    return sum(durations[op.id] for op in program.ops
               if isinstance(op.work, P2P) and op.work.kind == "recv"
               and any(follows.get(d) in waited_by.get(op.id, ()) for d in op.deps))


def tail_s(program: Program, durations: list[float]) -> float:
    """The longest chain of ops that must follow the program's last micro-batch op on the compute stream (through
    their dependencies and stream order), each at its duration here: the least time from that op's end to the
    program's."""
    last = max((op.id for op in program.ops if op.stream == COMPUTE_STREAM and not op.work.comm
                and micro_batch_of(op) is not None), default=None)
    if last is None:
        return 0.0
    end = {last: 0.0}
    stream_last: dict[str, int] = {}  # per stream: its latest op after `last` that follows `last`
    for op in program.ops[last + 1:]:
        before = [end[d] for d in op.deps if d in end]
        if op.stream in stream_last:
            before.append(end[stream_last[op.stream]])
        elif op.stream == COMPUTE_STREAM:
            before.append(0.0)  # the compute stream's next op follows `last` itself
        if not before:
            continue  # nothing ties it to the last micro-batch: it may run before that op ends
        end[op.id] = max(before) + durations[op.id]
        stream_last[op.stream] = op.id
    return max(end.values())
