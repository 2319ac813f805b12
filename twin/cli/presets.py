"""`twin presets`: list the named configurations from the papers."""

from __future__ import annotations

import argparse
import json


def cmd_presets(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from twin.presets import PRESETS

    if args.json:
        print(json.dumps([asdict(p) for p in PRESETS.values()], indent=2))
        return 0
    for p in PRESETS.values():
        print(f"{p.name:<20} {p.model:<8} {p.gpus:>6} x {p.machine:<11} --plan {p.plan} --global-batch {p.global_batch}")
        print(f"{'':<20} source: {p.source}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add presets to twin's subcommands."""
    p = sub.add_parser("presets", help="list the named configurations from the papers")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_presets)
