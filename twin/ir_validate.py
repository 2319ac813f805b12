"""Static checks on a Schedule, run before anything executes it.

A schedule that is wrong in any of these ways would not fail cleanly later: a
dangling dependency or a collective issued in a different order by two members
of a group hangs a real job (NCCL waits forever) and deadlocks the simulator.
So every backend calls `validate_schedule` first and the user gets one line
that names the program, the op and what to change.

Cost is O(total ops + world_size x axes): ranks that share a Program are
checked once, and the collective-order check compares *programs*, not ranks,
once per distinct set of member programs. A 32,768-rank schedule with one
6,000-op program validates in well under a second.
"""

from __future__ import annotations

import math
from typing import Callable, NoReturn

from twin.errors import TwinError
from twin.ir import (
    COLLECTIVE_KINDS,
    GEMM_LAYOUTS,
    IR_VERSION,
    P2P,
    P2P_KINDS,
    Attention,
    Collective,
    Elementwise,
    Gemm,
    Op,
    Program,
    Schedule,
    Work,
)


def validate_schedule(s: Schedule) -> None:
    """Raise TwinError (one line) on the first problem found; return None if the schedule is sound."""
    if s.version != IR_VERSION:
        raise TwinError(f"schedule version {s.version} is not supported; this exatwin runs IR version {IR_VERSION}: rebuild the schedule")
    if type(s.world_size) is not int or s.world_size < 1:
        raise TwinError(f"schedule world_size={s.world_size!r} must be a positive integer: set it to the number of ranks")
    instance_of = _check_groups(s)
    program_of = _check_programs(s)
    uses = [_check_ops(p, prog, instance_of) for p, prog in enumerate(s.programs)]
    for p, prog in enumerate(s.programs):
        _check_membership(s, p, prog, uses[p], instance_of)
    if len(s.programs) > 1:
        _check_collective_order(s, uses, instance_of, program_of)


class _Uses:
    """What one program asks of the groups: first op per axis, p2p peers, and its collectives per axis."""

    def __init__(self) -> None:
        self.first_op: dict[str, Op] = {}
        self.peers: dict[tuple[str, int], Op] = {}
        self.collectives: dict[str, list[Op]] = {}
        self.keys: dict[str, tuple[tuple[str, float], ...]] = {}


def _check_groups(s: Schedule) -> dict[str, list[int]]:
    """Axis name -> (rank -> index of its instance, or -1): each rank at most once per axis."""
    instance_of: dict[str, list[int]] = {}
    for axis in s.groups:
        if axis.name in instance_of:
            raise TwinError(f"group axis '{axis.name}' is defined twice: give each axis a unique name")
        inst = [-1] * s.world_size
        for i, members in enumerate(axis.instances):
            if not members:
                raise TwinError(f"group '{axis.name}' instance {i} is empty: remove it or give it ranks")
            for r in members:
                if type(r) is not int or not 0 <= r < s.world_size:
                    raise TwinError(f"group '{axis.name}' instance {i} holds rank {r!r}, outside 0..{s.world_size - 1}: use ranks below world_size")
                if inst[r] >= 0:
                    where = "twice" if inst[r] == i else f"in instances {inst[r]} and {i}"
                    raise TwinError(f"rank {r} appears {where} of group '{axis.name}': each rank may be in at most one instance per axis")
                inst[r] = i
        instance_of[axis.name] = inst
    return instance_of


def _check_programs(s: Schedule) -> list[int]:
    """rank -> index of its program: programs must cover 0..world_size-1 exactly once."""
    program_of = [-1] * s.world_size
    for p, prog in enumerate(s.programs):
        if not prog.ranks:
            raise TwinError(f"program {p} has no ranks: remove it or assign it ranks")
        for r in prog.ranks:
            if type(r) is not int or not 0 <= r < s.world_size:
                raise TwinError(f"program {p} names rank {r!r}, outside 0..{s.world_size - 1}: use ranks below world_size={s.world_size}")
            if program_of[r] >= 0:
                raise TwinError(f"rank {r} is in programs {program_of[r]} and {p}: each rank runs exactly one program")
            program_of[r] = p
    if -1 in program_of:
        r = program_of.index(-1)
        raise TwinError(f"rank {r} is in no program: every rank 0..{s.world_size - 1} must run exactly one program")
    return program_of


def _check_ops(p: int, prog: Program, instance_of: dict[str, list[int]]) -> _Uses:
    """Ids, dependencies and work fields of every op; collect what the program asks of the groups."""
    uses = _Uses()
    n = len(prog.ops)
    for i, op in enumerate(prog.ops):
        if op.id != i:
            raise TwinError(f"program {p} op at position {i} ('{op.name}') has id {op.id}: op ids must be 0, 1, 2, ... in program order")
        for d in op.deps:
            if d < 0:
                _fail(p, op, f"dependency {d} is negative: deps are ids of earlier ops")
            if d >= n:
                _fail(p, op, f"dangling dependency {d}: the program has ops 0..{n - 1}")
            if d >= i:
                _fail(p, op, f"depends on op {d}, which is not earlier: deps must point to earlier ops (program order is issue order)")
        check = _WORK_CHECKS.get(type(op.work))
        if check is None:
            _fail(p, op, f"work {type(op.work).__name__} is not an IR work type: use one of twin.ir.WORK_TYPES")
        problem = check(op.work)
        if problem:
            _fail(p, op, problem)
        if isinstance(op.work, (Collective, P2P)):
            axis = op.work.group
            if axis not in instance_of:
                known = ", ".join(f"'{a}'" for a in instance_of) or "none"
                _fail(p, op, f"unknown group axis '{axis}' (schedule has {known}): add the axis to groups or fix the op")
            uses.first_op.setdefault(axis, op)
            if isinstance(op.work, P2P):
                uses.peers.setdefault((axis, op.work.peer), op)
            else:
                uses.collectives.setdefault(axis, []).append(op)
    uses.keys = {a: tuple((op.work.kind, op.work.nbytes) for op in ops) for a, ops in uses.collectives.items()}
    return uses


def _check_membership(s: Schedule, p: int, prog: Program, uses: _Uses, instance_of: dict[str, list[int]]) -> None:
    """Group mismatch (a rank in no instance of an axis its program uses) and p2p peers outside the instance."""
    for axis, op in uses.first_op.items():
        inst = instance_of[axis]
        for r in prog.ranks:
            if inst[r] < 0:
                _fail(p, op, f"group mismatch: uses group '{axis}' but rank {r} of this program is in no instance of "
                             f"'{axis}'; add rank {r} to an instance or give it a program without '{axis}' ops")
    if not uses.peers:
        return
    positions: dict[str, list[int]] = {}
    for (axis, peer), op in uses.peers.items():
        instances = s.group(axis).instances
        if axis not in positions:
            positions[axis] = _positions(instances, s.world_size)
        position, inst = positions[axis], instance_of[axis]
        for r in prog.ranks:
            members = instances[inst[r]]
            q = position[r] + peer
            if not 0 <= q < len(members):
                _fail(p, op, f"rank {r} is at position {position[r]} of group '{axis}' instance {_fmt_members(members)}, "
                             f"so peer {peer:+d} does not exist: give the ranks at the ends of the instance their own program")


def _positions(instances: tuple[tuple[int, ...], ...], world_size: int) -> list[int]:
    position = [-1] * world_size
    for members in instances:
        for j, r in enumerate(members):
            position[r] = j
    return position


def _check_collective_order(s: Schedule, uses: list[_Uses], instance_of: dict[str, list[int]], program_of: list[int]) -> None:
    """Every member of an instance must issue the same collectives on its axis in the same order.

    Members sharing a program agree by construction, so only instances whose
    members run different programs are compared, once per distinct set of programs.
    """
    for axis in s.groups:
        if not any(axis.name in u.first_op for u in uses):
            continue
        checked: set[tuple[int, ...]] = set()
        for members in axis.instances:
            progs = {program_of[r] for r in members}
            if len(progs) == 1:
                continue
            key = tuple(sorted(progs))
            if key in checked:
                continue
            checked.add(key)
            ref_rank = members[0]
            ref = program_of[ref_rank]
            seen = {ref}
            for r in members:
                other = program_of[r]
                if other in seen:
                    continue
                seen.add(other)
                if uses[ref].keys.get(axis.name, ()) != uses[other].keys.get(axis.name, ()):
                    _order_error(axis.name, members, (ref_rank, uses[ref]), (r, uses[other]))


def _order_error(axis: str, members: tuple[int, ...], a: tuple[int, _Uses], b: tuple[int, _Uses]) -> NoReturn:
    """Report the first position at which two members' collectives on `axis` differ."""
    (ra, ua), (rb, ub) = a, b
    keys_a, keys_b = ua.keys.get(axis, ()), ub.keys.get(axis, ())
    i = next((j for j, (x, y) in enumerate(zip(keys_a, keys_b)) if x != y), min(len(keys_a), len(keys_b)))
    if len(keys_a) <= i:  # rank a ran out first: put the longer sequence first
        (ra, ua, keys_a), (rb, ub, keys_b) = (rb, ub, keys_b), (ra, ua, keys_a)
    first = f"rank {ra} issues {_fmt_op(ua.collectives[axis][i])} as its {_ordinal(i + 1)} '{axis}' collective"
    if i < len(keys_b):
        second = f"rank {rb} issues {_fmt_op(ub.collectives[axis][i])}"
    else:
        second = f"rank {rb} issues only {i} '{axis}' collective{'' if i == 1 else 's'}"
    raise TwinError(
        f"collectives on group '{axis}' instance {_fmt_members(members)} would deadlock: {first}, {second}; "
        "make every member issue the same collectives in the same order"
    )


def _fail(p: int, op: Op, problem: str) -> NoReturn:
    raise TwinError(f"program {p} op {op.id} '{op.name}': {problem}")


def _fmt_op(op: Op) -> str:
    return f"op {op.id} '{op.name}' {op.work.kind} {_fmt_bytes(op.work.nbytes)}"


def _fmt_bytes(nbytes: float) -> str:
    return f"{int(nbytes)} B" if float(nbytes).is_integer() else f"{nbytes} B"


def _fmt_members(members: tuple[int, ...]) -> str:
    """A group instance, shortened so the message stays one readable line at 32k ranks."""
    if len(members) <= 8:
        return str(tuple(members))
    head = ", ".join(str(r) for r in members[:4])
    return f"({head}, ..., {members[-1]}; {len(members)} ranks)"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _bad_size(name: str, value: float) -> str | None:
    if not (value >= 0 and math.isfinite(value)):
        return f"{name}={value} must be a finite number >= 0"
    return None


def _bad_dims(kind: str, work: Work, names: tuple[str, ...]) -> str | None:
    for name in names:
        value = getattr(work, name)
        if type(value) is not int or value <= 0:
            return f"{kind} {name}={value!r} must be a positive integer"
    return None


def _check_gemm(w: Gemm) -> str | None:
    if w.layout not in GEMM_LAYOUTS:
        return f"unknown GEMM layout {w.layout!r}: use one of {', '.join(GEMM_LAYOUTS)}"
    return _bad_dims("gemm", w, ("m", "n", "k", "batch"))


def _check_attention(w: Attention) -> str | None:
    return _bad_dims("attention", w, ("batch", "seq", "heads", "head_dim"))


def _check_elementwise(w: Elementwise) -> str | None:
    return _bad_size("nbytes", w.nbytes) or _bad_size("flops", w.flops)


def _check_collective(w: Collective) -> str | None:
    if w.kind not in COLLECTIVE_KINDS:
        return f"unknown collective kind {w.kind!r}: use one of {', '.join(COLLECTIVE_KINDS)}"
    return _bad_size("nbytes", w.nbytes)


def _check_p2p(w: P2P) -> str | None:
    if w.kind not in P2P_KINDS:
        return f"unknown p2p kind {w.kind!r}: use one of {', '.join(P2P_KINDS)}"
    if type(w.peer) is not int:
        return f"p2p peer={w.peer!r} must be an integer offset along '{w.group}'"
    return _bad_size("nbytes", w.nbytes)


# One checker per work type: a new Work type registers its checker here.
_WORK_CHECKS: dict[type, Callable[..., str | None]] = {
    Gemm: _check_gemm,
    Attention: _check_attention,
    Elementwise: _check_elementwise,
    Collective: _check_collective,
    P2P: _check_p2p,
}
