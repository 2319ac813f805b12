"""The network flows a schedule will create, prepared before the clock starts.

Every collective op of a simulated rank becomes one flow per phase of its
*type*: (family, kind, algorithm, protocol); every point-to-point transfer one
flow of type (family, "p2p", sender position, receiver position), whose load
sums the route of that transfer in every concurrent instance (every pipeline). A type's load in a phase is the sum, over the
family's concurrent instances, of each instance's per-link bytes per buffer
byte (twin.sim.collectives), divided by the protocol's bandwidth efficiency,
and divided by each link's capacity: seconds per byte on each link.

Flows only interact through the links they share, so links whose columns
(their seconds-per-byte under every type) are equal are one constraint, and
a link whose column is below another's everywhere can never be the one that
saturates first. Both are removed before the simulation, which leaves a few
dozen link classes even for a 32,768-GPU job: that is what keeps the flow
network's max-min computation cheap.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from twin.ir import Collective, P2P, Schedule
from twin.sim.collectives import CollectiveModel
from twin.sim.symmetry import Symmetry

_DOMINANCE_PRUNE_MAX_TYPES = 64

Row = tuple[np.ndarray, np.ndarray]  # one (type, phase): the links it loads, seconds per byte on each


@dataclass(frozen=True)
class CommCall:
    """What one communication op of a simulated rank does in the simulation.

    `key` names the call across the classes that take part (the rendezvous):
    a collective's (family, axis, sequence number on the axis); a transfer's
    (family, sender position, receiver position, tag, sequence number).
    """

    key: tuple
    expected: int  # arrivals that start it: one per class in a collective, sender and receiver for p2p
    members: tuple[int, ...]  # classes whose compute it slows
    type_id: int
    nbytes: float


@dataclass(frozen=True)
class FlowTypes:
    per_op: tuple[dict[int, CommCall], ...]  # class -> op id -> its call
    latency_s: tuple[float, ...]  # per type
    phase_rows: tuple[tuple[int, ...], ...]  # per type: its phases' rows in `loads`
    loads: np.ndarray  # (type, phase) rows x link classes, each row's max = 1 (or all zero)
    s_per_byte: np.ndarray  # per row: seconds per byte alone
    keys: tuple[tuple, ...]  # per type: (family, kind, algorithm, protocol) or (family, "p2p", src, dst)
    # per row: the [node.link_efficiency] entry of its slowest link alone (Fabric.efficiency_key; "" when it
    # loads none, or when its kind's own NIC efficiency sets that link's rate): the level whose achieved
    # bandwidth sets the phase's time, which `twin fit` attributes it to
    bottleneck: tuple[str, ...] = ()

    @property
    def n_classes(self) -> int:
        return self.loads.shape[1]

    def cost(self, type_id: int) -> tuple[float, list[tuple[np.ndarray, np.ndarray, float]]]:
        """Latency, then per phase (link classes, loads there, seconds per byte alone)."""
        phases = self._sparse_phases[type_id]
        return self.latency_s[type_id], phases

    def __post_init__(self) -> None:
        sparse = []
        for rows in self.phase_rows:
            phases = []
            for row in rows:
                index = np.flatnonzero(self.loads[row])
                phases.append((index, self.loads[row][index], float(self.s_per_byte[row])))
            sparse.append(phases)
        object.__setattr__(self, "_sparse_phases", sparse)

    @classmethod
    def build(cls, schedule: Schedule, sym: Symmetry, model: CollectiveModel, gpu_of: list[int]) -> "FlowTypes":
        type_ids: dict[tuple, int] = {}
        choices: dict[tuple[int, str, float], tuple[str, str]] = {}
        candidates: dict[tuple[int, str], tuple[str, ...]] = {}  # (family, kind) -> algorithms every instance has
        per_op: list[dict[int, CommCall]] = []
        p2p_members: dict[tuple, tuple[int, ...]] = {}  # p2p type -> the classes of its sender and receiver

        gpus_of_family: dict[int, tuple[tuple[int, ...], ...]] = {}
        ranks_are_gpus = list(gpu_of) == list(range(len(gpu_of)))  # the default placement

        def family_gpus(family: int) -> tuple[tuple[int, ...], ...]:
            """Every instance of the family, as GPUs: one choice of algorithm must apply to them all."""
            if family not in gpus_of_family:
                instances = sym.families[family].instances
                gpus_of_family[family] = instances if ranks_are_gpus else tuple(
                    tuple(gpu_of[r] for r in members) for members in instances)
            return gpus_of_family[family]

        position = _Positions(schedule, sym)
        for c, prog_index in enumerate(sym.programs):
            counters: dict[tuple, int] = defaultdict(int)
            calls: dict[int, CommCall] = {}
            for op in schedule.programs[prog_index].ops:
                work = op.work
                if not work.comm:
                    continue
                if isinstance(work, Collective):
                    family = sym.family_of[(c, work.group)]
                    seq = counters[work.group]
                    counters[work.group] += 1
                    choice_key = (family, work.kind, work.nbytes)
                    if choice_key not in choices:
                        instances = family_gpus(family)
                        if (family, work.kind) not in candidates:  # the same for the family's every size
                            candidates[(family, work.kind)] = model.common(instances[0], work.kind, instances[1:])
                        lowering, protocol = model.choose(instances[0], work.kind, work.nbytes,
                                                          candidates=candidates[(family, work.kind)])
                        choices[choice_key] = (lowering.algorithm, protocol)
                    algorithm, protocol = choices[choice_key]
                    type_id = type_ids.setdefault((family, work.kind, algorithm, protocol), len(type_ids))
                    members = sym.families[family].classes
                    calls[op.id] = CommCall((family, work.group, seq), len(members), members, type_id, work.nbytes)
                elif isinstance(work, P2P):
                    family = sym.family_of[(c, work.group)]
                    own = position.of(c, work.group)
                    src, dst = (own, own + work.peer) if work.kind == "send" else (own + work.peer, own)
                    channel = (family, src, dst, work.tag)
                    seq = counters[(work.kind,) + channel]
                    counters[(work.kind,) + channel] += 1
                    type_key = (family, "p2p", src, dst)
                    type_id = type_ids.setdefault(type_key, len(type_ids))
                    if type_key not in p2p_members:
                        instance = sym.families[family].instances[0]
                        p2p_members[type_key] = tuple(sorted({sym.class_of[instance[src]],
                                                              sym.class_of[instance[dst]]}))
                    calls[op.id] = CommCall(channel + (seq,), 2, p2p_members[type_key], type_id, work.nbytes)
            per_op.append(calls)

        keys = tuple(type_ids)
        rows: list[Row] = []  # one per (type, phase)
        phase_rows: list[tuple[int, ...]] = []
        latencies = []
        row_kinds: list[str | None] = []  # per row: its collective's kind (None: a transfer), for its bottleneck
        for key in keys:
            family, kind = key[0], key[1]
            instances = sym.families[family].instances
            if kind == "p2p":
                _, _, src, dst = key
                flows = tuple((gpu_of[m[src]], gpu_of[m[dst]]) for m in instances)
                latency, phases = model.cached_rows(("p2p", flows), lambda: _p2p_rows(model, flows))
            else:
                _, _, algorithm, protocol = key
                groups = family_gpus(family)
                latency, phases = model.cached_rows(
                    (kind, algorithm, protocol, groups),
                    lambda: _collective_rows(model, groups, kind, algorithm, protocol))
            phase_rows.append(tuple(range(len(rows), len(rows) + len(phases))))
            rows.extend(phases)
            row_kinds.extend([None if kind == "p2p" else kind] * len(phases))
            latencies.append(latency)
        loads, s_per_byte = _compress(rows, prune=len(rows) <= _DOMINANCE_PRUNE_MAX_TYPES)
        bottleneck = tuple(model.fabric.efficiency_key(int(links[np.argmax(values)]), kind) if len(links) else ""
                           for (links, values), kind in zip(rows, row_kinds))
        return cls(tuple(per_op), tuple(latencies), tuple(phase_rows), loads, s_per_byte, keys, bottleneck)


def _seconds_per_byte(capacity: np.ndarray, phases, fraction: float) -> tuple[Row, ...]:
    """Per phase, the loaded links and seconds per buffer byte on each: its load (a vector over the links) over
    the achieved bandwidth (the protocol's fraction of each link's `capacity`, as the kind achieves it)."""
    rows = []
    for loads in phases:
        links = np.flatnonzero(loads)
        rows.append((links, loads[links] / (fraction * capacity[links])))
    return tuple(rows)


def _p2p_rows(model: CollectiveModel, flows: tuple[tuple[int, int], ...]) -> tuple[float, tuple[Row, ...]]:
    """A transfer type's latency and its one phase: every concurrent instance's route (src, dst GPUs)."""
    first = model.transfer(*flows[0])
    loads = model.fabric.route_dense((src, dst, 1.0, None) for src, dst in flows)
    return model.latency_s(first, "simple"), _seconds_per_byte(model.fabric.capacity_bytes_per_s, (loads,), 1.0)


def _collective_rows(model: CollectiveModel, groups: tuple[tuple[int, ...], ...], kind: str, algorithm: str,
                     protocol: str) -> tuple[float, tuple[Row, ...]]:
    """A collective type's latency and its phases: every instance's loads, summed."""
    first = model.lowering(groups[0], kind, algorithm)
    phases = model.family_loads(groups, kind, algorithm)
    return model.latency_s(first, protocol), _seconds_per_byte(model.fabric.capacity_for(kind), phases,
                                                               model.bw_fraction(kind, protocol))


class _Positions:
    """A class representative's position in its instance of a point-to-point axis (for its peers), each axis's
    positions listed when its first transfer asks (scanning every op for the axes took a pipeline's build longer)."""

    def __init__(self, schedule: Schedule, sym: Symmetry) -> None:
        self._schedule, self._sym = schedule, sym
        self._by_axis: dict[str, dict[int, int]] = {}

    def of(self, cls: int, axis: str) -> int:
        where = self._by_axis.get(axis)
        if where is None:
            where = self._by_axis[axis] = {rank: i for members in self._schedule.group(axis).instances
                                           for i, rank in enumerate(members)}
        return where[self._sym.representatives[cls]]


def _compress(rows: list[Row], prune: bool) -> tuple[np.ndarray, np.ndarray]:
    """Types x link-class matrix of seconds per byte, normalised per row; equal and dominated links merged.

    Links are compared by their sparse columns (a 32,768-GPU pipeline has ~10^5 links but only a few loads on
    each): a dense links x rows matrix and numpy's unique over its rows took seconds and ~10^8 bytes.
    """
    if not rows:
        return np.zeros((0, 1)), np.zeros(0)
    link_of = np.concatenate([links for links, _ in rows]).astype(np.int64)
    row_of = np.repeat(np.arange(len(rows)), [len(links) for links, _ in rows])
    value = np.concatenate([values for _, values in rows]).astype(float)
    nonzero = value != 0
    link_of, row_of, value = link_of[nonzero], row_of[nonzero], value[nonzero]
    if not len(value):
        return np.zeros((len(rows), 1)), np.zeros(len(rows))
    keyed = np.round(value / value.max(), 12)
    order = np.lexsort((row_of, link_of))  # by link, then row
    link_of, row_of, value, keyed = link_of[order], row_of[order], value[order], keyed[order]
    starts = np.flatnonzero(np.r_[True, link_of[1:] != link_of[:-1]])
    first = _first_of_equal_columns(starts, row_of, keyed)
    kept = np.flatnonzero(first == np.arange(len(starts)))  # the first link (in link order) of each distinct column
    column = np.full(len(starts), -1)
    column[kept] = np.arange(len(kept))
    link_index = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(link_of)]))
    mine = column[link_index] >= 0  # the entries of the kept links
    matrix = np.zeros((len(rows), len(kept)))
    matrix[row_of[mine], column[link_index[mine]]] = value[mine]
    if prune:
        matrix = _drop_dominated(matrix)
    s_per_byte = matrix.max(axis=1)
    safe = np.where(s_per_byte > 0, s_per_byte, 1.0)
    return matrix / safe[:, None], s_per_byte


def _first_of_equal_columns(starts: np.ndarray, row_of: np.ndarray, keyed: np.ndarray) -> np.ndarray:
    """For each link (its entries from starts[i] on, sorted by row), the first link with the same column: the same
    rows with the same keyed loads.

    A 32,768-GPU job loads ~10^5 links, so the columns are compared by a hash of their entries, summed per
    link, and every link is then checked entry by entry against the first link of its hash (exact: a collision
    would fail the check, and the columns are then compared one by one instead)."""
    n_links, ends = len(starts), np.r_[starts[1:], len(row_of)]
    counts = ends - starts
    bits = keyed.view(np.uint64)  # equal loads, equal bits (each load is rounded once, above)
    signature = _column_hashes(starts, row_of, bits, counts)
    _, first_index, inverse = np.unique(signature, return_index=True, return_inverse=True)
    first = first_index[inverse.ravel()]  # np.unique's first occurrence: the lowest link of each hash
    if np.array_equal(counts, counts[first]):  # then each entry has its counterpart in the first link's column
        link_index = np.repeat(np.arange(n_links), counts)
        theirs = starts[first[link_index]] + np.arange(len(row_of)) - starts[link_index]
        if np.array_equal(row_of, row_of[theirs]) and np.array_equal(bits, bits[theirs]):
            return first
    signatures: dict[tuple, int] = {}  # a hash collision: compare the columns themselves
    rows_list, keyed_list = row_of.tolist(), keyed.tolist()
    return np.array([signatures.setdefault((tuple(rows_list[a:b]), tuple(keyed_list[a:b])), i)
                     for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist()))])


def _column_hashes(starts: np.ndarray, row_of: np.ndarray, bits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """One 64-bit hash per link of its entries (row, load bits), independent of their order, and of its count."""
    with np.errstate(over="ignore"):
        entry = row_of.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ bits
        mixed = (entry * np.uint64(0xBF58476D1CE4E5B9)) ^ (entry >> np.uint64(29))
        return np.add.reduceat(mixed, starts) + counts.astype(np.uint64) * np.uint64(0x94D049BB133111EB)


def _drop_dominated(matrix: np.ndarray) -> np.ndarray:
    """Keep only link columns not bounded above, elementwise, by another column."""
    order = np.argsort(-matrix.sum(axis=0), kind="stable")
    kept: list[int] = []
    for j in order:
        col = matrix[:, j]
        if kept and np.any(np.all(matrix[:, kept] >= col[:, None] * (1 - 1e-12), axis=0)):
            continue
        kept.append(int(j))
    return matrix[:, sorted(kept)]
