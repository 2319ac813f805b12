"""`twin export`: build one training step and write its schedule IR as versioned JSON."""

from __future__ import annotations

import argparse

from twin.cli.args import add_step_arguments, input_files, step_inputs
from twin.outputs import check_outputs


def cmd_export(args: argparse.Namespace) -> int:
    from twin.build import build_step
    from twin.ir_io import save_schedule

    check_outputs({"--output": args.output}, input_files(args))
    model, plan, machine = step_inputs(args)
    built = build_step(model, plan, machine, args.gpus)
    save_schedule(built.schedule, args.output)
    ops = sum(len(p.ops) for p in built.schedule.programs)
    print(f"wrote {args.output}: {built.schedule.world_size} ranks, {ops} ops per program, plan {built.plan.describe()}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add export to twin's subcommands."""
    p = sub.add_parser("export", help="write the schedule IR of a step as versioned JSON")
    add_step_arguments(p)
    p.add_argument("-o", "--output", required=True, help="the IR file to write")
    p.set_defaults(func=cmd_export)
