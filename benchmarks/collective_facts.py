"""Collective bandwidths the twin predicts beside published measurements.

    .venv/bin/python benchmarks/collective_facts.py          # the table
    .venv/bin/python benchmarks/collective_facts.py --fit    # NIC efficiencies the measurements imply

Bus bandwidth (nccl-tests definition, busbw = S/t x 2(n-1)/n for all-reduce)
of all-reduces, as the twin's collective model times them (latency +
bandwidth on the real links, NCCL's algorithm and protocol choice):

- Alps (cscs-docs, docs/software/communication): NCCL all_reduce 128 MiB on
  2 nodes x 4 GPUs: 122.6 GB/s; 1 GPU per node on 2 nodes: 22.9 GB/s.
  Not fitted: Alps' link efficiencies come from OSU point-to-point.
- Frontier and Perlmutter, AxoNN's measured table (twin.collective_facts):
  1 GB all-reduces with every group of the job busy at once, simulated the
  same way. The node-spanning entries whose node hosts several such groups
  (stride > 1: injection-bound) set each machine's "nic" efficiency (`--fit`
  prints the value the machine file carries); the rest are predictions.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.fabric import Fabric  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin.collective_facts import compare, fitted_nic_efficiency  # noqa: E402
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


def rows() -> list[tuple[str, float, float, str]]:
    out = []
    bw, algo = busbw_alone("alps", tuple(range(8)), 128 * MIB)
    out.append(("alps: all_reduce 128 MiB, 2 nodes x 4 GPUs", bw, 122.6, algo))
    bw, algo = busbw_alone("alps", (0, 4), 128 * MIB)
    out.append(("alps: all_reduce 128 MiB, 2 nodes x 1 GPU", bw, 22.9, algo))
    for machine in ("frontier", "perlmutter"):
        for c in compare(machine):
            where = ("spans nodes, fits nic" if c.calibrates_nic
                     else "spans nodes" if c.spans_nodes else "in node")
            name = f"{machine}: 1 GB, {c.fact.own} ranks at stride {c.fact.inner}, all groups busy"
            out.append((name, c.twin_gb_per_s, c.fact.busbw_gb_per_s, where))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit", action="store_true",
                        help="print the NIC efficiency each machine's node-spanning measurements imply")
    args = parser.parse_args(argv)
    if args.fit:
        print(f"{'machine':<12}{'nic in file':>12}{'fitted':>9}")
        for machine in ("frontier", "perlmutter"):
            current = load_machine(machine).node.link_efficiency["nic"]
            print(f"{machine:<12}{current:>12.3f}{fitted_nic_efficiency(machine):>9.3f}")
        return 0
    print(f"{'case':<64}{'twin GB/s':>10}{'measured':>10}{'ratio':>7}  note")
    for name, twin, measured, note in rows():
        print(f"{name:<64}{twin:>10.1f}{measured:>10.1f}{twin / measured:>7.2f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
