"""Measured all-reduce times inside one node, and the latency-bandwidth model fitted to them.

vTrain (Bang et al., MICRO'24) times NCCL all-reduces on its A100 nodes (8
GPUs on NVSwitch) for 2-8 GPUs and 1 MB-1 GB and predicts a run's
tensor-parallel all-reduces from that table (VIA-Research/vTrain
trace/a100/AR_GPU*_LUT, src/predictor.py). The repository names no other
A100 machine than the one that measured the Megatron-DeepSpeed runs the A100
fit and its validation use, so the table is taken as the microbenchmark
behind their collectives; benchmarks/data holds its
power-of-two sizes (a100-nccl-all-reduce.csv).

One ring all-reduce of S bytes over n GPUs is modelled as the twin times it
on one protocol: t = base + 2 (n - 1) hop + 2 (n - 1) / n x S / B, a latency
per call, one per ring step, and the GPU's port at bus bandwidth B. The three
are fitted by least squares on the relative error (`fit_ring_all_reduce`),
and `benchmarks/collective_facts.py --fit` prints them as the machine file's
ring base latency, NVLink hop latency and NVLink efficiency (B over the
port's peak). The table shows one latency and one bandwidth from 1 MB up, so
the file gives every protocol the same latencies: NCCL's protocols are not
told apart by it, and Simple, at full bandwidth, is the one the twin then picks.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from topologies.fabric import Fabric
from topologies.machine import Machine
from twin.sim.collectives import CollectiveModel

# The table in a checkout of the repository (benchmarks/data); load_in_node takes any other path.
A100_TABLE = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "a100-nccl-all-reduce.csv"


@dataclass(frozen=True)
class MeasuredInNode:
    """One measured all-reduce: `gpus` GPUs of one node, `nbytes` bytes, the mean of out-of-place and in-place."""

    gpus: int
    nbytes: int
    time_s: float


@dataclass(frozen=True)
class RingFit:
    """t = base + 2 (n - 1) hop + 2 (n - 1) / n x S / busbw, and how well it matches the table."""

    base_s: float
    hop_s: float
    busbw_bytes_per_s: float
    mean_error: float  # mean |fitted / measured - 1|
    max_error: float

    def time_s(self, gpus: int, nbytes: float) -> float:
        steps = 2 * (gpus - 1)
        return self.base_s + steps * self.hop_s + steps / gpus * nbytes / self.busbw_bytes_per_s


def load_in_node(path: Path = A100_TABLE) -> list[MeasuredInNode]:
    """The table's rows (columns gpus, bytes, time_out_of_place_ns, time_in_place_ns)."""
    with open(path, newline="") as f:
        return [MeasuredInNode(int(r["gpus"]), int(r["bytes"]),
                               (int(r["time_out_of_place_ns"]) + int(r["time_in_place_ns"])) / 2e9)
                for r in csv.DictReader(f)]


def fit_ring_all_reduce(rows: list[MeasuredInNode]) -> RingFit:
    """The three numbers minimising the squared relative errors (each row's equation divided by its time)."""
    n = np.array([r.gpus for r in rows], float)
    t = np.array([r.time_s for r in rows])
    steps = 2 * (n - 1)
    columns = np.stack([np.ones_like(t), steps, steps / n * np.array([r.nbytes for r in rows], float)], axis=1)
    (base, hop, inverse_bw), *_ = np.linalg.lstsq(columns / t[:, None], np.ones_like(t), rcond=None)
    if min(base, hop, inverse_bw) <= 0:
        raise ValueError("the all-reduce table does not fit a positive latency, hop latency and bandwidth")
    errors = np.abs(columns @ np.array([base, hop, inverse_bw]) / t - 1)
    return RingFit(float(base), float(hop), float(1 / inverse_bw), float(errors.mean()), float(errors.max()))


def nvlink_efficiency(fit: RingFit, machine: Machine) -> float:
    """The fitted bus bandwidth as a fraction of a GPU's NVSwitch port (the ring's bottleneck in the twin)."""
    switch = machine.node.switch
    if switch is None:
        raise ValueError(f"{machine.name} has no node switch: the table is of GPUs on NVSwitch")
    return fit.busbw_bytes_per_s / switch.bw_bytes_per_s


def twin_in_node_s(machine: Machine, gpus: int, nbytes: float, model: CollectiveModel | None = None) -> float:
    """The twin's time for an all-reduce over the node's first `gpus` GPUs, alone, as its tuner chooses it."""
    model = model or CollectiveModel(Fabric(machine, machine.node.gpus_per_node))
    lowering, protocol = model.choose(tuple(range(gpus)), "all_reduce", nbytes)
    return model.time_alone_s(lowering, protocol, nbytes)
