"""Collective bandwidths the twin predicts beside published measurements (not fitted).

    .venv/bin/python benchmarks/collective_facts.py

Bus bandwidth (nccl-tests definition, busbw = S/t x 2(n-1)/n for all-reduce)
of a lone all-reduce, as the twin's collective model times it (latency +
bandwidth on the real links, NCCL's algorithm and protocol choice):

- Alps (cscs-docs, docs/software/communication): NCCL all_reduce 128 MiB on
  2 nodes x 4 GPUs: 122.6 GB/s; 1 GPU per node on 2 nodes: 22.9 GB/s.
- Frontier, AxoNN's measured intra-node table (Megatron-AxoNN
  examples/comm_model.py, inner = 1): own 2: 129, own 4: 52, own 8: 135 GB/s
  (1 GB collectives with the other groups of the node busy at once: here the
  concurrent copies are simulated too).

The twin's link efficiencies come from point-to-point measurements (OSU on
Alps, Pearson's GPU-write bandwidths on Frontier), not from these numbers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.fabric import Fabric  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin.sim.collectives import CollectiveModel  # noqa: E402

MIB, GB = 1 << 20, 1e9


def busbw_alone(machine_name: str, gpus: tuple[int, ...], nbytes: float) -> tuple[float, str]:
    machine = load_machine(machine_name)
    fabric = Fabric(machine, max(gpus) + 1)
    model = CollectiveModel(fabric)
    lowering, protocol = model.choose(gpus, "all_reduce", nbytes)
    t = model.time_alone_s(lowering, protocol, nbytes)
    n = len(gpus)
    return nbytes / t * 2 * (n - 1) / n / GB, f"{lowering.algorithm}/{protocol}"


def busbw_with_copies(machine_name: str, size: int, nbytes: float) -> float:
    """All the node's groups of `size` consecutive GCDs all-reducing at once, simulated."""
    from twin.ir import Collective, GroupAxis, Op, Program, Schedule, StepInfo
    from twin.sim.engine import simulate

    machine = load_machine(machine_name)
    gpn = machine.node.gpus_per_node
    groups = tuple(tuple(range(i, i + size)) for i in range(0, gpn, size))
    op = Op(0, "ar", "comm:x", Collective("all_reduce", "x", nbytes))
    schedule = Schedule(gpn, (GroupAxis("x", groups),), (Program(tuple(range(gpn)), (op,)),),
                        StepInfo("bench", "", 1, 1, 1.0, 1.0, 0.0))
    t = simulate(schedule, machine, full=True).step_time_s
    return nbytes / t * 2 * (size - 1) / size / GB


def rows() -> list[tuple[str, float, float, str]]:
    out = []
    bw, algo = busbw_alone("alps", tuple(range(8)), 128 * MIB)
    out.append(("alps: all_reduce 128 MiB, 2 nodes x 4 GPUs", bw, 122.6, algo))
    bw, algo = busbw_alone("alps", (0, 4), 128 * MIB)
    out.append(("alps: all_reduce 128 MiB, 2 nodes x 1 GPU", bw, 22.9, algo))
    for size, measured in ((2, 129.0), (4, 52.0), (8, 135.0)):
        out.append((f"frontier: all_reduce 1 GB over {size} GCDs, all groups of the node at once",
                    busbw_with_copies("frontier", size, 1e9), measured, "ring"))
    return out


def main() -> int:
    print(f"{'case':<72}{'twin GB/s':>10}{'measured':>10}{'ratio':>7}  algorithm")
    for name, twin, measured, algo in rows():
        print(f"{name:<72}{twin:>10.1f}{measured:>10.1f}{twin / measured:>7.2f}  {algo}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
