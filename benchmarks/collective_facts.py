"""Collective bandwidths the twin predicts beside published measurements.

    .venv/bin/python benchmarks/collective_facts.py          # the table
    .venv/bin/python benchmarks/collective_facts.py --fit    # the numbers the measurements imply (--json: JSON)

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
- vTrain's A100 nodes (dgx-a100-800g), all-reduces of 1 MB-1 GB over 2-8
  GPUs of one node, each alone (twin.collective_tables): they set that file's
  ring latency, NVLink hop latency and NVLink efficiency (`--fit`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.fabric import Fabric  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin.collective_facts import compare, fitted_nic_efficiency  # noqa: E402
from twin.collective_tables import (MeasuredInNode, RingFit, fit_ring_all_reduce, load_in_node,  # noqa: E402
                                    nvlink_efficiency, twin_in_node_s)
from twin.sim.collectives import CollectiveModel  # noqa: E402

MIB, GB = 1 << 20, 1e9
A100_NODE = "dgx-a100-800g"  # vTrain's A100 cluster, whose nodes measured the in-node table


def busbw_alone(machine_name: str, gpus: tuple[int, ...], nbytes: float) -> tuple[float, str]:
    machine = load_machine(machine_name)
    fabric = Fabric(machine, max(gpus) + 1)
    model = CollectiveModel(fabric)
    lowering, protocol = model.choose(gpus, "all_reduce", nbytes)
    t = model.time_alone_s(lowering, protocol, nbytes)
    n = len(gpus)
    return nbytes / t * 2 * (n - 1) / n / GB, f"{lowering.algorithm}/{protocol}"


def a100_entries() -> list[tuple[MeasuredInNode, float]]:
    """Every entry of vTrain's in-node table beside the twin's time for it (dgx-a100-800g, alone)."""
    machine = load_machine(A100_NODE)
    model = CollectiveModel(Fabric(machine, machine.node.gpus_per_node))
    return [(f, twin_in_node_s(machine, f.gpus, f.nbytes, model)) for f in load_in_node()]


def rows(a100: list[tuple[MeasuredInNode, float]]) -> list[tuple[str, float, float, str]]:
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
    for fact, twin_s in a100:
        if fact.gpus in (2, 4, 8) and fact.nbytes in (MIB, 16 * MIB, 256 * MIB):
            scale = fact.nbytes * 2 * (fact.gpus - 1) / fact.gpus / GB
            out.append((f"{A100_NODE}: {fact.nbytes // MIB} MiB, {fact.gpus} GPUs of a node, alone",
                        scale / twin_s, scale / fact.time_s, "vTrain's table"))
    return out


def fitted_numbers(ring: RingFit) -> list[tuple[str, str, float, float]]:
    """(machine, number, value in its file, value the measurements imply) for every number they set; `ring`: the
    fit to vTrain's in-node table."""
    out = [(name, "node.link_efficiency.nic", load_machine(name).node.link_efficiency["nic"],
            fitted_nic_efficiency(name)) for name in ("frontier", "perlmutter")]
    machine = load_machine(A100_NODE)
    t = machine.collectives
    out += [(A100_NODE, "collectives.base_latency_us.ring (each protocol)", t.base_latency_s[("ring", "simple")] * 1e6,
             ring.base_s * 1e6),
            (A100_NODE, "collectives.intra_hop_latency_us (each protocol)", t.intra_hop_latency_s["simple"] * 1e6,
             ring.hop_s * 1e6),
            (A100_NODE, "node.link_efficiency.nvlink", machine.node.link_efficiency["nvlink"],
             nvlink_efficiency(ring, machine))]
    return out


def fit_report() -> tuple[dict, list[str]]:
    """--fit: the numbers the measurements set, as JSON and as lines."""
    ring = fit_ring_all_reduce(load_in_node())
    numbers = fitted_numbers(ring)
    doc = {"numbers": [dict(zip(("machine", "number", "in_file", "fitted"), n)) for n in numbers],
           "ring_fit_mean_error": ring.mean_error, "ring_fit_max_error": ring.max_error}
    lines = [f"{'machine':<16}{'number':<50}{'in file':>10}{'fitted':>10}"]
    lines += [f"{machine:<16}{name:<50}{current:>10.3f}{fitted:>10.3f}" for machine, name, current, fitted in numbers]
    lines.append(f"(the ring model fitted to vTrain's table: mean |error| {ring.mean_error:.1%}, "
                 f"max {ring.max_error:.1%})")
    return doc, lines


def table_report() -> tuple[dict, list[str]]:
    """The table: the twin's bus bandwidth beside each measurement, and its time error over vTrain's whole table."""
    a100 = a100_entries()
    table = rows(a100)
    error = sum(abs(twin_s / f.time_s - 1) for f, twin_s in a100) / len(a100)
    doc = {"rows": [dict(zip(("case", "twin_gb_per_s", "measured_gb_per_s", "note"), r)) for r in table],
           "in_node_mean_time_error": error, "in_node_entries": len(a100)}
    lines = [f"{'case':<64}{'twin GB/s':>10}{'measured':>10}{'ratio':>7}  note"]
    lines += [f"{name:<64}{twin:>10.1f}{measured:>10.1f}{twin / measured:>7.2f}  {note}"
              for name, twin, measured, note in table]
    lines.append(f"{A100_NODE}: mean |twin / measured - 1| of the time over all {len(a100)} entries of vTrain's "
                 f"table: {error:.1%}")
    return doc, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fit", action="store_true",
                        help="print the numbers the measurements imply beside the machine files' values")
    parser.add_argument("--json", action="store_true", help="print the table (or, with --fit, the numbers) as JSON")
    args = parser.parse_args(argv)
    doc, lines = fit_report() if args.fit else table_report()
    print(json.dumps(doc, indent=2) if args.json else "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
