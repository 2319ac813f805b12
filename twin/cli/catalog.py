"""`twin machines` and `twin models`: list the machine models and the catalog models, or one machine's numbers
with their sources."""

from __future__ import annotations

import argparse
import json

from twin.cli.args import overrides_from_args
from twin.errors import TwinError


def cmd_machines(args: argparse.Namespace) -> int:
    from topologies.machine import list_machines, load_machine

    if args.overrides and not args.name:
        raise TwinError("--set needs a machine NAME: twin machines NAME --set FIELD=VALUE")
    names = [args.name] if args.name else list_machines()
    machines = [load_machine(n, overrides_from_args(args)) for n in names]
    rows = []
    for m in machines:
        d, n, net = m.device, m.node, m.network
        rows.append({
            "name": m.name,
            "device": d.name,
            "gpus_per_node": n.gpus_per_node,
            "peak_tflops": d.peak_flop_per_s / 1e12,
            "empirical_gemm_tflops": d.empirical_gemm_flop_per_s / 1e12,
            "peak_fp8_tflops": d.peak_fp8_flop_per_s / 1e12,  # 0: the file gives no FP8 rates (no fp8=1 plans)
            "empirical_gemm_fp8_tflops": d.empirical_gemm_fp8_flop_per_s / 1e12,
            "hbm_gb": d.hbm_bytes / 1e9,
            "hbm_bw_gb_per_s": d.hbm_bw_bytes_per_s / 1e9,
            "nics_per_node": len(n.nics),
            "measured_gemms": [{"m": g.m, "n": g.n, "k": g.k, "layout": g.layout, "tflops": g.flop_per_s / 1e12}
                               for g in d.gemm_measured],
            "network": net.describe(),
            "max_gpus": m.max_gpus,
            "description": m.description,
        })
        if args.name:
            rows[-1]["sources"] = {
                key: {"value": s.value, "source": s.source, "estimate": s.estimate, "fitted": s.fitted,
                      "provenance": s.provenance} for key, s in m.sources.items()
            }
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'machine':<15}{'device':<27}{'GPUs/node':>10}{'peak TF/s':>11}{'GEMM TF/s':>11}{'FP8 GEMM':>10}"
          f"{'HBM GB':>8}{'NICs':>6}  network")
    for r in rows:
        fp8 = f"{r['empirical_gemm_fp8_tflops']:>10.1f}" if r["empirical_gemm_fp8_tflops"] else f"{'-':>10}"
        print(
            f"{r['name']:<15}{r['device']:<27}{r['gpus_per_node']:>10}{r['peak_tflops']:>11.1f}"
            f"{r['empirical_gemm_tflops']:>11.1f}{fp8}{r['hbm_gb']:>8.0f}{r['nics_per_node']:>6}  {r['network']}"
        )
    if args.name:
        print()
        for key, s in rows[0]["sources"].items():
            print(f"  {key} = {s['value']:g}  ({s['provenance']})")
        if rows[0]["measured_gemms"]:
            print("\n  measured GEMMs (they replace the shape model at their shapes; m x n x k layout: TF/s):")
            for g in rows[0]["measured_gemms"]:
                print(f"    {g['m']} x {g['n']} x {g['k']} {g['layout']}: {g['tflops']:g}")
    else:
        print("\n`twin machines NAME` lists every number of one machine with its source.")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from twin.model import CATALOG, SOURCES

    rows = [
        {
            "name": m.name, "arch": m.arch, "layers": m.layers, "hidden": m.hidden, "heads": m.heads,
            "kv_heads": m.kv_heads, "ffn": m.ffn, "seq": m.seq, "vocab": m.vocab, "tied": m.tied_head,
            "params_billion": m.params / 1e9,
            "source": SOURCES[m.name],
        }
        for m in CATALOG.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':<15}{'arch':>6}{'layers':>7}{'hidden':>7}{'heads':>6}{'kv':>4}{'ffn':>7}{'seq':>6}{'vocab':>8}"
          f"{'params':>9}  source")
    for r in rows:
        print(
            f"{r['name']:<15}{r['arch']:>6}{r['layers']:>7}{r['hidden']:>7}{r['heads']:>6}{r['kv_heads']:>4}"
            f"{r['ffn']:>7}{r['seq']:>6}{r['vocab']:>8}{r['params_billion']:>8.2f}B  {r['source']}"
        )
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add machines and models to twin's subcommands."""
    p = sub.add_parser("machines", help="list the machine models, or one machine's numbers with their sources")
    p.add_argument("name", nargs="?", help="a machine name or .toml path")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                   help="with NAME: show the machine with this number replaced (repeatable), as --set does elsewhere")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_machines)

    p = sub.add_parser("models", help="list the catalog models")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_models)
