"""Measured all-gathers and reduce-scatters over 8-1,024 GPUs of Perlmutter and Frontier, beside the twin's times.

The PCCL reproducer of the AxoNN group (axonn-ai/sc2025-pccl-reproducer,
data/ at commit 7b783c0) timed NCCL (Perlmutter, 4 A100 a node) and RCCL
(Frontier, 8 GCDs a node) all-gathers and reduce-scatters of one group
spanning the whole job, 1 MB-1 GB, with torch.distributed: rank 0's CUDA
events around each call, the mean of the last 10 of 20 calls (the timed
region also allocates the output and fills it with an empty torch.cat, a
copy of the buffer). benchmarks/data/pccl-collectives.csv holds every
timing of the library's own collective ("nccl" in its logs); the data
README says more.

These are the collectives AxoNN's depth-wise (gz) and FSDP plans issue at
the sizes and group widths they use, each measured alone: what the twin's
collective model (twin.sim.collectives: latency per ring step, the
bottleneck link at the protocol's share of it) predicts for one group on an
idle fabric. `fit_latency_bandwidth` fits the three numbers a ring collective
alone is made of to a machine's table, t = base + crossings x latency +
(n - 1)/n x S / B with `crossings` the nodes the group spans (a ring enters
and leaves each once) and B the bandwidth of a node's way in, by least
squares on the relative error; a timing more than FIT_OUTLIER times what the
fit of the others gives is left out and the fit repeated (RCCL's runs on
Frontier stall now and then: the same 1 MB reduce-scatter over 16 GCDs took
0.3 ms in one run and 31 ms in another).
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topologies.fabric import Fabric
from topologies.machine import load_machine
from twin.errors import TwinError
from twin.sim.collectives import CollectiveModel

TABLE = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "pccl-collectives.csv"
FIT_OUTLIER = 3.0  # a median this many times the fit of the others is a stall, left out of the fit
_COLUMNS = ("machine", "collective", "gpus", "nodes", "bytes", "time_ms")  # gpus_per_node, if given, must agree


@dataclass(frozen=True)
class MeasuredCollective:
    """One collective's timings: `collective` over `gpus` GPUs of `nodes` nodes, a `nbytes` buffer (an all-gather's
    output, a reduce-scatter's input), every run's time in seconds."""

    machine: str
    collective: str
    gpus: int
    nodes: int
    nbytes: int
    times_s: tuple[float, ...]

    @property
    def time_s(self) -> float:
        """The median over runs."""
        return statistics.median(self.times_s)

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


def load_table(path: Path = TABLE) -> list[MeasuredCollective]:
    """The table's timings grouped by (machine, collective, gpus, nodes, bytes), in that order."""
    runs: dict[tuple, list[float]] = defaultdict(list)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in _COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TwinError(f"{path}: no column {missing[0]!r}; the table needs {', '.join(_COLUMNS)}")
        for line, row in enumerate(reader, start=2):
            key, seconds = _parsed_row(row, f"{path} line {line}")
            runs[key].append(seconds)
    return [MeasuredCollective(*key, tuple(times)) for key, times in sorted(runs.items())]


def _parsed_row(row: dict, where: str) -> tuple[tuple, float]:
    """One row's (machine, collective, gpus, nodes, bytes) and time in seconds, or a one-line TwinError naming the
    row and the field: counts positive integers, the nodes dividing the GPUs (as gpus_per_node, where the table
    gives it), the time positive."""
    counts = {}
    for field in ("gpus", "nodes", "bytes"):
        try:
            counts[field] = int(row[field])
        except (TypeError, ValueError):
            counts[field] = 0
        if counts[field] <= 0:
            raise TwinError(f"{where}: {field}={row[field]!r} must be a positive integer")
    gpus, nodes = counts["gpus"], counts["nodes"]
    per_node = row.get("gpus_per_node")
    if gpus % nodes or (per_node not in (None, "") and per_node != str(gpus // nodes)):
        given = f" with gpus_per_node={per_node}" if per_node else ""
        raise TwinError(f"{where}: {gpus} GPUs on {nodes} nodes{given} is not whole nodes; give gpus = nodes x GPUs a "
                        "node")
    try:
        seconds = float(row["time_ms"]) / 1e3
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise TwinError(f"{where}: time_ms={row['time_ms']!r} must be a positive number of milliseconds")
    return (row["machine"], row["collective"], gpus, nodes, counts["bytes"]), seconds


def collective_models(entries: list[MeasuredCollective]) -> dict[str, CollectiveModel]:
    """One collective model per machine of `entries`, its fabric as wide as the widest of their groups."""
    widest: dict[str, int] = {}
    for e in entries:
        widest[e.machine] = max(widest.get(e.machine, 0), e.gpus)
    return {name: CollectiveModel(Fabric(load_machine(name), gpus)) for name, gpus in widest.items()}


def twin_alone_s(model: CollectiveModel, entry: MeasuredCollective) -> tuple[float, str]:
    """The twin's time for `entry`'s collective over GPUs 0..gpus-1 (whole nodes, as the jobs ran), alone, as its
    tuner chooses it, and the choice (algorithm/protocol)."""
    lowering, protocol = model.choose(tuple(range(entry.gpus)), entry.collective, entry.nbytes)
    return model.time_alone_s(lowering, protocol, entry.nbytes), f"{lowering.algorithm}/{protocol}"


@dataclass(frozen=True)
class RingFit:
    """t = base + nodes x latency + (n - 1)/n x S / node_bw, fitted to one machine's table of one collective."""

    base_s: float
    crossing_s: float  # per node the group spans: a ring's entry into and exit from it
    node_bytes_per_s: float
    used: int  # timings fitted on (the others: stalls, module docstring)
    mean_error: float  # mean |fit / measured - 1| over those

    def time_s(self, entry: MeasuredCollective) -> float:
        n = entry.gpus
        return self.base_s + entry.nodes * self.crossing_s + (n - 1) / n * entry.nbytes / self.node_bytes_per_s


def fit_latency_bandwidth(entries: list[MeasuredCollective]) -> tuple[RingFit, list[bool]]:
    """RingFit by least squares on relative error over the entries' medians, leaving out, one round after another,
    those more than FIT_OUTLIER times slower than the fit of the rest; returns the fit and which entries it used."""
    if len(entries) < 4:
        raise TwinError(f"a latency-bandwidth fit needs at least 4 timings (got {len(entries)})")
    t = np.array([e.time_s for e in entries])
    n = np.array([e.gpus for e in entries], float)
    columns = np.stack([np.ones_like(t), np.array([e.nodes for e in entries], float),
                        (n - 1) / n * np.array([e.nbytes for e in entries], float)], axis=1)
    used = np.ones(len(t), bool)
    for _ in range(len(t)):
        coefficients = _nonnegative_fit(columns[used] / t[used, None])
        fitted = columns @ coefficients
        now = t <= FIT_OUTLIER * fitted
        if (now == used).all():
            break
        used = now
    base, crossing, inverse_bw = (float(c) for c in coefficients)
    if inverse_bw <= 0:
        raise TwinError("the timings do not fit a positive bandwidth")
    errors = np.abs(fitted[used] / t[used] - 1)
    return RingFit(base, crossing, 1 / inverse_bw, int(used.sum()), float(errors.mean())), [bool(u) for u in used]


def _nonnegative_fit(scaled: np.ndarray) -> np.ndarray:
    """Least squares of scaled @ x = 1 with no coefficient below zero: a latency the timings would make negative
    is taken as zero and the others refitted (three columns: no general solver needed)."""
    free = list(range(scaled.shape[1]))
    while True:
        x = np.zeros(scaled.shape[1])
        x[free], *_ = np.linalg.lstsq(scaled[:, free], np.ones(len(scaled)), rcond=None)
        if (x >= 0).all() or len(free) == 1:
            return x
        free.remove(int(np.argmin(x)))
