"""Static checks on a Schedule, run before anything executes it.

A schedule that is wrong in any of these ways would not fail cleanly later: a
dangling dependency or a collective issued in a different order by two members
of a group hangs a real job (NCCL waits forever) and deadlocks the simulator.
So every backend calls `validate_schedule` first and the user gets one line
that names the program, the op and what to change. The values of single
records (works, tags, the step's info and plan) are checked by twin.ir_values.

Cost is O(total ops + world_size x axes): ranks that share a Program are
checked once, and the collective-order check compares *programs*, not ranks,
once per distinct set of member programs. A 32,768-rank schedule with one
6,000-op program validates in well under a second.

Memory is bounded by what the file holds: `world_size` is a claim, so it is
checked first against a ceiling (MAX_WORLD_SIZE) and against the ranks the
programs list, before anything is allocated per rank; a file claiming 10^9
ranks is an error, not a 10^9-entry table. Each point-to-point send must be
matched by a receive of the same size on its peer (a mismatch would hang NCCL
or corrupt the data the receive expects).
"""

from __future__ import annotations

from typing import NoReturn

from twin.errors import TwinError
from twin.ir import IR_VERSION, P2P, Collective, Op, Program, Schedule
from twin.ir_values import bad_tag, bad_work, check_info

# The most ranks a schedule may have: 4,194,304, fifty times the largest machine the twin models (Frontier's
# 75,264 GCDs). It bounds what validation, and every backend after it, allocates per rank.
MAX_WORLD_SIZE = 1 << 22
_MATE = {"send": "recv", "recv": "send"}
_VERBS = {"send": ("sends", "to"), "recv": ("receives", "from")}  # how a message says what a p2p op does


def validate_schedule(s: Schedule) -> None:
    """Raise TwinError (one line) on the first problem found; return None if the schedule is sound."""
    if s.version != IR_VERSION:
        raise TwinError(f"schedule version {s.version} is not supported; this exatwin runs IR version {IR_VERSION}: rebuild the schedule")
    _check_world_size(s)  # first: everything after it allocates per rank
    check_info(s.info, s.world_size)
    instance_of = _check_groups(s)
    program_of = _check_programs(s)
    uses = [_check_ops(p, prog, instance_of) for p, prog in enumerate(s.programs)]
    for p, prog in enumerate(s.programs):
        _check_membership(s, p, prog, uses[p], instance_of)
    _check_transfers(s, uses, instance_of, program_of)
    if len(s.programs) > 1:
        _check_collective_order(s, uses, instance_of, program_of)


def _check_world_size(s: Schedule) -> None:
    """world_size is a positive integer, at most MAX_WORLD_SIZE, and no more than the ranks the programs list.

    Programs must cover every rank exactly once, so a world_size above the ranks listed leaves some rank
    without a program; finding which one here, from the ranks the file holds, keeps a claimed world_size
    of 10^6 with four ranks listed from allocating 10^6 of anything. (More ranks listed than world_size
    is a rank out of range or a duplicate: _check_programs names it.)"""
    ws = s.world_size
    if type(ws) is not int or ws < 1:
        raise TwinError(f"schedule world_size={ws!r} must be a positive integer: set it to the number of ranks")
    if ws > MAX_WORLD_SIZE:
        raise TwinError(f"schedule world_size={ws} is above {MAX_WORLD_SIZE:,} ranks, more than any machine has: "
                        f"set it to the number of ranks the programs list")
    if sum(len(prog.ranks) for prog in s.programs) < ws:
        present = {r for prog in s.programs for r in prog.ranks}
        missing = next(r for r in range(ws) if r not in present)
        raise TwinError(f"rank {missing} is in no program: every rank 0..{ws - 1} must run exactly one program "
                        "(or lower world_size)")


class _Uses:
    """What one program asks of the groups: first op per axis, p2p peers, and its collectives per axis."""

    def __init__(self) -> None:
        self.first_op: dict[str, Op] = {}
        self.peers: dict[tuple[str, int], Op] = {}
        self.collectives: dict[str, list[Op]] = {}
        self.keys: dict[str, tuple[tuple[str, float], ...]] = {}
        self.transfers: dict[tuple[str, str, int, str], list[Op]] = {}  # (kind, axis, peer, tag) -> ops in order


def _check_groups(s: Schedule) -> dict[str, dict[int, int]]:
    """Axis name -> (rank -> index of its instance): each rank at most once per axis.

    A dict per axis, not a world_size list: its size is what the file lists, however many axes it has."""
    instance_of: dict[str, dict[int, int]] = {}
    for axis in s.groups:
        if axis.name in instance_of:
            raise TwinError(f"group axis '{axis.name}' is defined twice: give each axis a unique name")
        inst: dict[int, int] = {}
        for i, members in enumerate(axis.instances):
            if not members:
                raise TwinError(f"group '{axis.name}' instance {i} is empty: remove it or give it ranks")
            for r in members:
                if type(r) is not int or not 0 <= r < s.world_size:
                    raise TwinError(f"group '{axis.name}' instance {i} holds rank {r!r}, outside 0..{s.world_size - 1}: use ranks below world_size")
                if r in inst:
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
        if not prog.ops:
            raise TwinError(f"program {p} has no ops: a rank's program holds at least one op; re-export the schedule")
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


def _check_ops(p: int, prog: Program, instance_of: dict[str, dict[int, int]]) -> _Uses:
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
        problem = bad_work(op.work) or (bad_tag(op.tag) if op.tag is not None else None)
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
                uses.transfers.setdefault((op.work.kind, axis, op.work.peer, op.work.tag), []).append(op)
            else:
                uses.collectives.setdefault(axis, []).append(op)
    uses.keys = {a: tuple((op.work.kind, op.work.nbytes) for op in ops) for a, ops in uses.collectives.items()}
    return uses


def _check_membership(s: Schedule, p: int, prog: Program, uses: _Uses, instance_of: dict[str, dict[int, int]]) -> None:
    """Group mismatch (a rank in no instance of an axis its program uses) and p2p peers outside the instance."""
    for axis, op in uses.first_op.items():
        inst = instance_of[axis]
        for r in prog.ranks:
            if r not in inst:
                _fail(p, op, f"group mismatch: uses group '{axis}' but rank {r} of this program is in no instance of "
                             f"'{axis}'; add rank {r} to an instance or give it a program without '{axis}' ops")
    if not uses.peers:
        return
    positions: dict[str, dict[int, int]] = {}
    for (axis, peer), op in uses.peers.items():
        instances = s.group(axis).instances
        if axis not in positions:
            positions[axis] = _positions(instances)
        position, inst = positions[axis], instance_of[axis]
        for r in prog.ranks:
            members = instances[inst[r]]
            q = position[r] + peer
            if not 0 <= q < len(members):
                _fail(p, op, f"rank {r} is at position {position[r]} of group '{axis}' instance {_fmt_members(members)}, "
                             f"so peer {peer:+d} does not exist: give the ranks at the ends of the instance their own program")


def _positions(instances: tuple[tuple[int, ...], ...]) -> dict[int, int]:
    """rank -> its position in its instance of one axis."""
    return {r: j for members in instances for j, r in enumerate(members)}


def _check_transfers(s: Schedule, uses: list[_Uses], instance_of: dict[str, dict[int, int]],
                     program_of: list[int]) -> None:
    """Each rank's sends to a peer (per axis and tag, in order) are that peer's receives from it, size for size.

    Sends and receives match in order per (sender, receiver, tag), on one axis as the simulator pairs them;
    a missing receive hangs a real job and one of another size is an error in NCCL (or a wrong result).
    Ranks sharing a program agree by construction, so a (program, peer's program, transfer) is compared once:
    O(ranks x distinct transfers) lookups, not O(ranks x transfer ops)."""
    positions: dict[str, dict[int, int]] = {}
    checked: set[tuple] = set()
    for p, prog in enumerate(s.programs):
        for (kind, axis, peer, tag), ops in uses[p].transfers.items():
            instances = s.group(axis).instances
            if axis not in positions:
                positions[axis] = _positions(instances)
            position = positions[axis]
            inst = instance_of[axis]
            for r in prog.ranks:
                q = instances[inst[r]][position[r] + peer]  # inside the instance: _check_membership saw to it
                other = program_of[q]
                if (p, other, kind, axis, peer, tag) in checked:
                    continue
                checked.add((p, other, kind, axis, peer, tag))
                mates = uses[other].transfers.get((_MATE[kind], axis, -peer, tag), [])
                _match_transfers((p, r, ops), (other, q, mates), axis, tag)


def _match_transfers(a: tuple[int, int, list[Op]], b: tuple[int, int, list[Op]], axis: str, tag: str) -> None:
    """Rank a's ops towards rank b and b's matching ops towards a: same count, same sizes, position by position."""
    (pa, ra, ops_a), (pb, rb, ops_b) = a, b
    i = next((j for j, (x, y) in enumerate(zip(ops_a, ops_b)) if x.work.nbytes != y.work.nbytes),
             min(len(ops_a), len(ops_b)))
    if i == len(ops_a) == len(ops_b):
        return
    if i == len(ops_a):  # a ran out first: report b's extra op, from b's side
        (pa, ra, ops_a), (pb, rb, ops_b) = (pb, rb, ops_b), (pa, ra, ops_a)
    op = ops_a[i]
    verb, prep = _VERBS[op.work.kind]
    named = f"tag '{tag}' " if tag else ""
    what = (f"rank {ra} {verb} {_fmt_bytes(op.work.nbytes)} {prep} rank {rb} on '{axis}' "
            f"(its {_ordinal(i + 1)} {named}{op.work.kind})")
    if i < len(ops_b):
        mate = ops_b[i]
        other = (f"rank {rb} {_VERBS[mate.work.kind][0]} {_fmt_bytes(mate.work.nbytes)} "
                 f"(program {pb} op {mate.id} '{mate.name}')")
        _fail(pa, op, f"{what}, but {other}: a send and its receive must move the same bytes")
    _fail(pa, op, f"{what}, but rank {rb} posts only {i} matching {_MATE[op.work.kind]}(s) (program {pb}): "
                  "every send needs a receive and every receive a send, or the run hangs")


def _check_collective_order(s: Schedule, uses: list[_Uses], instance_of: dict[str, dict[int, int]], program_of: list[int]) -> None:
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
