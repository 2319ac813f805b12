"""NCCL and RCCL all-gathers and reduce-scatters over 8-1,024 GPUs, measured, beside the twin's time for each.

    .venv/bin/python benchmarks/collectives_at_scale.py [--json] [--figure figures/collectives-at-scale.png]

The table (benchmarks/data/pccl-collectives.csv, twin.collectives_at_scale)
times one group spanning the whole job on Perlmutter (NCCL) and Frontier
(RCCL), 1 MB-1 GB, each collective alone. For each machine and collective
this prints the twin's time over the measured one (the median of the runs)
for every group width and buffer size, and then the three numbers the
measurements imply for a ring alone (a latency per call, one per node the
group spans, and a node's bandwidth in), fitted to them
(`fit_latency_bandwidth`), beside what the machine file gives.

A microbenchmark of the collective library, not a training run: nothing here
writes a machine file.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from twin.collectives_at_scale import (TABLE, collective_models, fit_latency_bandwidth, load_table,  # noqa: E402
                                       twin_alone_s)
from twin.figures import collectives_figure  # noqa: E402

MIB = 1 << 20


def machine_numbers(name: str, collective: str) -> dict:
    """What the machine file says about a ring of this kind crossing nodes: the NICs' rate a node, their achieved
    share (the kind's own, `[collectives.nic_efficiency]`, where the file gives one), and the ring's latencies by
    protocol."""
    m = load_machine(name)
    tuning = m.collectives
    return {"nic_gb_per_s_per_node": sum(nic.bw_bytes_per_s for nic in m.node.nics) / 1e9,
            "nic_efficiency": tuning.nic_efficiency.get(collective, m.node.link_efficiency["nic"]),
            "base_latency_us": {p: tuning.base_latency_s[("ring", p)] * 1e6 for p in tuning.protocols},
            "inter_hop_latency_us": {p: tuning.inter_hop_latency_s[p] * 1e6 for p in tuning.protocols}}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print the comparison and the fits as JSON")
    ap.add_argument("--figure", help="also draw measured and predicted times against the buffer, for the narrowest, "
                    "a middle and the widest group of each set, to this PNG")
    args = ap.parse_args(argv)
    entries = load_table()
    models = collective_models(entries)
    groups = defaultdict(list)
    for e in entries:
        groups[(e.machine, e.collective)].append(e)
    result = {"table": str(TABLE.relative_to(TABLE.parents[2])), "sets": []}
    for (machine, collective), members in groups.items():
        rows = []
        for e in members:
            twin_s, choice = twin_alone_s(models[machine], e)
            rows.append({"gpus": e.gpus, "nodes": e.nodes, "bytes": e.nbytes, "measured_s": e.time_s,
                         "runs_s": list(e.times_s), "twin_s": twin_s, "twin_choice": choice})
        fit, used = fit_latency_bandwidth(members)
        for row, kept in zip(rows, used):
            row["fitted"] = kept
        result["sets"].append({
            "machine": machine, "collective": collective, "rows": rows,
            "fit": {"base_us": fit.base_s * 1e6, "per_node_us": fit.crossing_s * 1e6,
                    "node_gb_per_s": fit.node_bytes_per_s / 1e9, "used": fit.used, "of": len(members),
                    "mean_error": fit.mean_error},
            "machine_file": machine_numbers(machine, collective),
            "twin_over_measured": _summary(rows)})
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print(result)
    if args.figure:
        _figure(args.figure, result)
    return result


def _figure(path: str, result: dict) -> None:
    """The figure --figure asks for: three group widths a set (the narrowest, the middle one, the widest)."""
    panels = []
    for s in result["sets"]:
        widths = sorted({r["gpus"] for r in s["rows"]})
        shown = sorted({widths[0], widths[len(widths) // 2], widths[-1]})
        lines = {g: [(r["bytes"], r["measured_s"], r["twin_s"], r["fitted"]) for r in s["rows"] if r["gpus"] == g]
                 for g in shown}
        panels.append((f"{s['machine']} {s['collective']}", lines))
    collectives_figure(path, panels, "collectives alone: measured (solid; hollow: a stall the fit left out) "
                                     "and the twin (dashed)")
    print(f"figure written to {path}")


def _summary(rows: list[dict]) -> dict:
    """Geometric means of twin / measured: buffers of 128 MB and more (bandwidth-bound), of 16 MB and less, on the
    timings the fit kept (the others are stalls)."""
    def geomean(selected):
        ratios = [r["twin_s"] / r["measured_s"] for r in selected]
        return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    kept = [r for r in rows if r["fitted"]]
    return {"large": geomean([r for r in kept if r["bytes"] >= 128 * MIB]),
            "small": geomean([r for r in kept if r["bytes"] <= 16 * MIB])}


def _print(result: dict) -> None:
    print(f"{result['table']}: twin (alone, its tuner's choice) / measured (median of the runs); "
          "* a timing the fit left out (a stall)")
    for s in result["sets"]:
        rows = s["rows"]
        sizes = sorted({r["bytes"] for r in rows})
        widths = sorted({r["gpus"] for r in rows})
        cell = {(r["gpus"], r["bytes"]): r for r in rows}
        print(f"\n{s['machine']} {s['collective']} (gpus down, buffer MB across)")
        print("  gpus " + "".join(f"{b // MIB:>7}" for b in sizes))
        for g in widths:
            line = ""
            for b in sizes:
                r = cell.get((g, b))
                line += "      -" if r is None else f"{r['twin_s'] / r['measured_s']:>6.2f}{' ' if r['fitted'] else '*'}"
            print(f"  {g:>4} {line}")
        f, m, summary = s["fit"], s["machine_file"], s["twin_over_measured"]
        print(f"  twin / measured, geometric mean: {summary['large']:.2f} at 128 MB and more, "
              f"{summary['small']:.2f} at 16 MB and less")
        print(f"  fitted to the {f['used']} of {f['of']} timings kept: {f['base_us']:.0f} us a call + "
              f"{f['per_node_us']:.1f} us a node spanned + (n-1)/n S / {f['node_gb_per_s']:.1f} GB/s "
              f"(mean error {100 * f['mean_error']:.1f}%)")
        print(f"  machine file: NICs {m['nic_gb_per_s_per_node']:.0f} GB/s a node at efficiency {m['nic_efficiency']} "
              f"({m['nic_gb_per_s_per_node'] * m['nic_efficiency']:.0f} GB/s); ring latency a call "
              + ", ".join(f"{k} {v:g}" for k, v in m["base_latency_us"].items()) + " us; a network hop "
              + ", ".join(f"{k} {v:g}" for k, v in m["inter_hop_latency_us"].items()) + " us")


if __name__ == "__main__":
    main()
