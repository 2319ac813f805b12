"""The network flows a schedule will create, prepared before the clock starts.

Every collective op of a simulated rank becomes one flow per phase of its
*type*: (family, kind, algorithm, protocol). A type's load in a phase is the sum, over the
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

from twin.errors import TwinError
from twin.ir import Collective, P2P, Schedule
from twin.sim.collectives import CollectiveModel
from twin.sim.symmetry import Symmetry

_DOMINANCE_PRUNE_MAX_TYPES = 64


@dataclass(frozen=True)
class FlowTypes:
    per_op: tuple[dict[int, tuple[int, int, int, float]], ...]  # class -> op id -> (family, seq, type, nbytes)
    latency_s: tuple[float, ...]  # per type
    phase_rows: tuple[tuple[int, ...], ...]  # per type: its phases' rows in `loads`
    loads: np.ndarray  # (type, phase) rows x link classes, each row's max = 1 (or all zero)
    s_per_byte: np.ndarray  # per row: seconds per byte alone
    keys: tuple[tuple[int, str, str, str], ...]  # (family, kind, algorithm, protocol)

    @property
    def n_classes(self) -> int:
        return self.loads.shape[1]

    def cost(self, type_id: int) -> tuple[float, list[tuple[np.ndarray, float]]]:
        """Latency, then per phase (loads over link classes, seconds per byte alone)."""
        phases = [(self.loads[row], float(self.s_per_byte[row])) for row in self.phase_rows[type_id]]
        return self.latency_s[type_id], phases

    @classmethod
    def build(cls, schedule: Schedule, sym: Symmetry, model: CollectiveModel, gpu_of: list[int]) -> "FlowTypes":
        type_ids: dict[tuple[int, str, str, str], int] = {}
        choices: dict[tuple[int, str, float], tuple[str, str]] = {}
        per_op: list[dict[int, tuple[int, int, int, float]]] = []

        def first_gpus(family: int) -> tuple[int, ...]:
            return tuple(gpu_of[r] for r in sym.families[family].instances[0])

        for c, prog_index in enumerate(sym.programs):
            counters: dict[str, int] = defaultdict(int)
            plan: dict[int, tuple[int, int, int, float]] = {}
            for op in schedule.programs[prog_index].ops:
                work = op.work
                if isinstance(work, P2P):
                    raise TwinError(f"op {op.id} '{op.name}': point-to-point ops are not simulated yet")
                if not isinstance(work, Collective):
                    continue
                family = sym.family_of[(c, work.group)]
                seq = counters[work.group]
                counters[work.group] += 1
                choice_key = (family, work.kind, work.nbytes)
                if choice_key not in choices:
                    lowering, protocol = model.choose(first_gpus(family), work.kind, work.nbytes)
                    choices[choice_key] = (lowering.algorithm, protocol)
                algorithm, protocol = choices[choice_key]
                key = (family, work.kind, algorithm, protocol)
                type_id = type_ids.setdefault(key, len(type_ids))
                plan[op.id] = (family, seq, type_id, work.nbytes)
            per_op.append(plan)

        keys = tuple(type_ids)
        fabric = model.fabric
        capacity = fabric.capacity_bytes_per_s
        rows: list[dict[int, float]] = []  # one per (type, phase)
        phase_rows: list[tuple[int, ...]] = []
        latencies = []
        for family, kind, algorithm, protocol in keys:
            fraction = model.tuning.protocol_bw_fraction[protocol]
            instances = sym.families[family].instances
            lowerings = [model.lowering(tuple(gpu_of[r] for r in members), kind, algorithm) for members in instances]
            indices = []
            for phase in range(len(lowerings[0].phases)):
                total: dict[int, float] = defaultdict(float)
                for lowering in lowerings:
                    for link, load in lowering.phases[phase].items():
                        total[link] += load / (fraction * capacity[link])
                indices.append(len(rows))
                rows.append(total)
            phase_rows.append(tuple(indices))
            latencies.append(model.latency_s(lowerings[0], protocol))
        loads, s_per_byte = _compress(rows, prune=len(rows) <= _DOMINANCE_PRUNE_MAX_TYPES)
        return cls(tuple(per_op), tuple(latencies), tuple(phase_rows), loads, s_per_byte, keys)


def _compress(rows: list[dict[int, float]], prune: bool) -> tuple[np.ndarray, np.ndarray]:
    """Types x link-class matrix of seconds per byte, normalised per row; equal and dominated links merged."""
    links = sorted({link for row in rows for link in row})
    if not rows:
        return np.zeros((0, 1)), np.zeros(0)
    if not links:
        return np.zeros((len(rows), 1)), np.zeros(len(rows))
    column = {link: j for j, link in enumerate(links)}
    matrix = np.zeros((len(rows), len(links)))
    for i, row in enumerate(rows):
        for link, value in row.items():
            matrix[i, column[link]] = value
    scale = matrix.max()
    keyed = np.round(matrix / scale, 12)
    _, first = np.unique(keyed.T, axis=0, return_index=True)
    matrix = matrix[:, np.sort(first)]
    if prune:
        matrix = _drop_dominated(matrix)
    s_per_byte = matrix.max(axis=1)
    safe = np.where(s_per_byte > 0, s_per_byte, 1.0)
    return matrix / safe[:, None], s_per_byte


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
