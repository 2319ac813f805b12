"""Compile a Schedule into what one rank executes: ops in issue order, their channels, and their waits.

Torch-free: this is the part of the executor that decides *what* to run and
*when to block*; executor.runtime turns it into tensors and torch.distributed
calls. Keeping it separate lets the tests check the wait placement without
starting processes, and keeps the rules in one readable place.

Issue order and waits (the IR's semantics, twin.ir): ops are issued in program
order by one host thread. Compute ops run on the device's compute queue in
that order (on CPU they run to completion before the next is issued; a
program's compute streams, if it had several, are therefore serialized in
program order: always a valid order, since dependencies point backwards).
Communication ops are issued asynchronously (`async_op=True`) on a
**channel**: a process group the executor creates once per (group axis,
stream) for collectives, and per (group axis, tag) for point-to-point
transfers. One channel is one NCCL communicator, hence one NCCL stream, and on
gloo a process group with one worker thread, so the ops of a channel run one
after another in issue order, as the ops of an IR stream do.

Before op X is issued, the host waits (`work.wait()`) for every comm op X
must follow and that nothing else orders: each comm op in X's `deps` and the
previous op on X's stream, except a comm op on X's own channel (the channel
orders those). A compute dependency of a comm op needs no wait: on CPU it is
complete at issue, and on GPU ProcessGroupNCCL makes its stream wait for the
current stream. Each comm op is waited at most once, at the first op that
needs it, which is exactly where `handle.wait()` sits in the framework code
the builder describes (twin.builders.program). Whatever is still in flight at
the end of the program is waited for there: a step ends when all its ops have.

Example (AxoNN with OAR): `dI` GEMM, then `ar_x` of dI issued async, then the
`dW` GEMM (no wait: it does not depend on the all-reduce), then the next op
depends on `ar_x`, so the host waits for it right before issuing that op. The
all-reduce and the dW GEMM overlap, as the simulator models.
"""

from __future__ import annotations

from dataclasses import dataclass

from twin.errors import TwinError
from twin.ir import P2P, Collective, Op, Schedule


@dataclass(frozen=True)
class ChannelKey:
    """A family of process groups: one per instance of `axis`, for one `lane` (stream or p2p tag)."""

    axis: str
    lane: str


@dataclass(frozen=True)
class Channel:
    """This rank's process group of a ChannelKey: its instance's global ranks, and its own position."""

    key: ChannelKey
    index: int  # in channel_keys(schedule): the order every rank creates groups in
    members: tuple[int, ...]
    position: int


@dataclass(frozen=True)
class RankOp:
    op: Op
    comm: bool
    channel: int  # index of its ChannelKey in channel_keys(schedule) (= Channel.index); -1 for compute ops
    peer: int  # p2p: the peer's global rank; -1 otherwise
    waits: tuple[int, ...]  # comm op ids to wait for before issuing this op
    prev_on_stream: int  # id of the previous op on this op's stream, -1 if none


@dataclass(frozen=True)
class RankProgram:
    rank: int
    program: int  # index of the IR Program this rank runs
    ops: tuple[RankOp, ...]
    channels: tuple[Channel, ...]
    final_waits: tuple[int, ...]  # comm ops nothing waited for: waited at the end of the step


def lane_of(op: Op) -> ChannelKey:
    """The channel family an op's communication runs on."""
    work = op.work
    if isinstance(work, P2P):
        return ChannelKey(work.group, f"p2p:{work.tag}")
    if isinstance(work, Collective):
        return ChannelKey(work.group, op.stream)
    raise TypeError(f"op {op.id} '{op.name}' is not a communication op")


def channel_keys(schedule: Schedule) -> list[ChannelKey]:
    """Every channel family any program uses, in a fixed order (every rank creates groups in it)."""
    keys = {lane_of(op) for prog in schedule.programs for op in prog.ops if op.is_comm}
    return sorted(keys, key=lambda k: (k.axis, k.lane))


def compile_rank(schedule: Schedule, rank: int) -> RankProgram:
    """What `rank` runs, with its channels and the host waits placed (see the module docstring)."""
    if not 0 <= rank < schedule.world_size:
        raise TwinError(f"rank {rank} is outside this schedule's 0..{schedule.world_size - 1}")
    program_index = schedule.program_of()[rank]
    program = schedule.programs[program_index]
    keys = channel_keys(schedule)
    key_index = {k: i for i, k in enumerate(keys)}
    instance_of = {axis.name: (axis.instances, axis.instance_of()) for axis in schedule.groups}

    channels: dict[int, Channel] = {}

    def channel_for(op: Op) -> Channel:
        key = lane_of(op)
        idx = key_index[key]
        if idx not in channels:
            instances, where = instance_of[key.axis]
            if rank not in where:
                raise TwinError(f"rank {rank} runs op {op.id} '{op.name}' on group '{key.axis}' but is in no instance of it")
            members = instances[where[rank]]
            channels[idx] = Channel(key, idx, members, members.index(rank))
        return channels[idx]

    ops: list[RankOp] = []
    chan_of: list[int] = []  # per op id: channel index or -1
    last_on_stream: dict[str, int] = {}
    waited: set[int] = set()
    for i, op in enumerate(program.ops):
        if op.id != i:
            raise TwinError(f"program {program_index} op at position {i} has id {op.id}: re-export the schedule")
        chan, peer = -1, -1
        if op.is_comm:
            ch = channel_for(op)
            chan = ch.index
            if isinstance(op.work, P2P):
                pos = ch.position + op.work.peer
                if not 0 <= pos < len(ch.members):
                    raise TwinError(f"op {op.id} '{op.name}': peer offset {op.work.peer} leaves group '{ch.key.axis}' {ch.members}")
                peer = ch.members[pos]
        chan_of.append(chan)
        prev = last_on_stream.get(op.stream, -1)
        needed = set(op.deps) | ({prev} if prev >= 0 else set())
        waits = []
        for d in sorted(needed):
            if chan_of[d] < 0 or d in waited:
                continue  # compute: complete (CPU) or ordered by the stream (GPU); or already waited
            if op.is_comm and chan_of[d] == chan:
                continue  # the channel runs its ops in issue order
            waits.append(d)
            waited.add(d)
        ops.append(RankOp(op, op.is_comm, chan, peer, tuple(waits), prev))
        last_on_stream[op.stream] = i
    final = tuple(i for i, c in enumerate(chan_of) if c >= 0 and i not in waited)
    ordered = tuple(channels[i] for i in sorted(channels))
    return RankProgram(rank, program_index, tuple(ops), ordered, final)
