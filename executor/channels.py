"""Process groups for the channels of a compiled program (executor.program), created once per run.

A channel is a stream of communication ops on one group instance; the IR
says the ops of a stream run one after another. How each backend gets there:

- NCCL (GPUs): `torch.distributed.new_group` per (channel, instance), called
  by every rank in the same order (NCCL needs that); a NCCL process group has
  its own communicator and stream, so its ops run in issue order, and ops of
  different channels overlap. Ops are issued with the torch.distributed
  functions and `async_op=True`.
- gloo (CPU): a ProcessGroupGloo constructed per (channel, instance) with
  **one** worker thread, by the members only, in the same global order (so the
  rendezvous cannot deadlock), from the default store under the key prefix
  "exatwin/AXIS/LANE/INSTANCE". `torch.distributed.new_group` would give it
  two worker threads (and ignores gloo options), which runs two queued ops of
  one group at once: not a stream. Ops are the same C++ calls that
  `dist.all_reduce(..., async_op=True)` makes (`ProcessGroupGloo.allreduce`
  etc.), each returning its Work at once.

A shift (ring attention's exchange) is an all-to-all whose only non-empty
splits go to the next member and come from the previous one (`shift_splits`).

Every group gets the run's timeout: a collective whose peers never arrive
fails after it (gloo raises, NCCL's watchdog aborts) instead of hanging.
"""

from __future__ import annotations

import datetime
import functools

import torch.distributed as dist

from executor.program import Channel, ChannelKey, channel_keys
from twin.ir import Schedule

# torch 2.13 renamed the single-tensor all-gather and reduce-scatter; keep working on both names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def shift_splits(n_members: int, to: int, source: int, numel: int) -> tuple[list[int], list[int]]:
    """(output, input) split sizes, in elements, of the all-to-all that is a shift: all `numel` elements go to
    group rank `to` (the next member) and come from group rank `source` (the previous one).

    A shift is one all-to-all with a single non-empty split each way, so it is one op on the channel's stream,
    as the IR's one collective is (a send and a receive would be two ops). With two members the next and the
    previous are the same rank; with one, the rank sends to itself: a copy of its input into its output."""
    out_splits, in_splits = [0] * n_members, [0] * n_members
    in_splits[to] = numel
    out_splits[source] = numel
    return out_splits, in_splits


def _check_shift(out, inp) -> None:
    if out.numel() != inp.numel():
        raise ValueError(f"a shift sends what it receives: output of {out.numel()} elements, input of {inp.numel()}")


class GlooChannel:
    """One gloo process group with a single worker thread: a stream."""

    def __init__(self, pg, members: tuple[int, ...]) -> None:
        self.pg, self.members = pg, members

    def collective(self, kind: str, out, inp):
        pg = self.pg
        if kind == "all_reduce":
            return functools.partial(pg.allreduce, [out])
        if kind == "all_gather":
            return functools.partial(pg._allgather_base, out, inp)
        if kind == "reduce_scatter":
            return functools.partial(pg._reduce_scatter_base, out, inp)
        if kind == "broadcast":
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            return functools.partial(pg.broadcast, [out], opts)
        if kind == "all_to_all":
            return functools.partial(pg.alltoall_base, out, inp, [], [])
        if kind == "shift":  # the group was built with each member's position in the instance as its rank
            _check_shift(out, inp)
            p, n = pg.rank(), len(self.members)
            out_splits, in_splits = shift_splits(n, (p + 1) % n, (p - 1) % n, inp.numel())
            return functools.partial(pg.alltoall_base, out, inp, out_splits, in_splits)
        raise ValueError(f"unknown collective kind {kind!r}")

    def p2p(self, kind: str, buf, peer: int):
        where = self.members.index(peer)
        if kind == "send":
            return functools.partial(self.pg.send, [buf], where, 0)
        return functools.partial(self.pg.recv, [buf], where, 0)


class TorchChannel:
    """A torch.distributed process group (NCCL): ops through the public functions, async."""

    def __init__(self, pg, members: tuple[int, ...]) -> None:
        self.pg, self.members = pg, members

    def collective(self, kind: str, out, inp):
        pg = self.pg
        if kind == "all_reduce":
            return functools.partial(dist.all_reduce, out, group=pg, async_op=True)
        if kind == "all_gather":
            return functools.partial(_all_gather, out, inp, group=pg, async_op=True)
        if kind == "reduce_scatter":
            return functools.partial(_reduce_scatter, out, inp, group=pg, async_op=True)
        if kind == "broadcast":
            return functools.partial(dist.broadcast, out, group=pg, async_op=True, group_src=0)
        if kind == "all_to_all":
            return functools.partial(dist.all_to_all_single, out, inp, group=pg, async_op=True)
        if kind == "shift":  # new_group numbers its ranks in sorted order, not the instance's: translate
            _check_shift(out, inp)
            p, n = self.members.index(dist.get_rank()), len(self.members)
            to, source = (dist.get_group_rank(pg, self.members[(p + step) % n]) for step in (1, -1))
            out_splits, in_splits = shift_splits(n, to, source, inp.numel())
            return functools.partial(dist.all_to_all_single, out, inp, out_splits, in_splits, group=pg, async_op=True)
        raise ValueError(f"unknown collective kind {kind!r}")

    def p2p(self, kind: str, buf, peer: int):
        if kind == "send":
            return functools.partial(dist.isend, buf, dst=peer, group=self.pg)
        return functools.partial(dist.irecv, buf, src=peer, group=self.pg)


def _gloo_group(key: ChannelKey, instance: int, members: tuple[int, ...], rank: int, timeout_s: float):
    store = dist.distributed_c10d._get_default_store()
    prefix = dist.PrefixStore(f"exatwin/{key.axis}/{key.lane}/{instance}", store)
    opts = dist.ProcessGroupGloo._Options()
    opts._threads = 1
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(prefix, members.index(rank), len(members), opts)


def create_channels(schedule: Schedule, rank: int, backend: str, timeout_s: float,
                    mine: tuple[Channel, ...]) -> dict[int, GlooChannel | TorchChannel]:
    """This rank's process group for each of its channels (index -> channel), created in the global order."""
    wanted = {ch.index: ch for ch in mine}
    out: dict[int, GlooChannel | TorchChannel] = {}
    for index, key in enumerate(channel_keys(schedule)):
        for i, members in enumerate(schedule.group(key.axis).instances):
            if backend == "gloo":
                if rank in members:
                    out[index] = GlooChannel(_gloo_group(key, i, members, rank, timeout_s), members)
            else:
                pg = dist.new_group(list(members), timeout=datetime.timedelta(seconds=timeout_s), backend=backend)
                if rank in members:
                    out[index] = TorchChannel(pg, members)
    missing = set(wanted) - set(out)
    if missing:
        raise RuntimeError(f"rank {rank}: no process group for channels {sorted(missing)}")
    return out
