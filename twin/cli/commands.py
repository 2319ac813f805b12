"""The `twin` command: the explicit list of command modules, the parser they assemble, and `main`, which runs one
command.

Each module in COMMANDS adds its subcommands with `add_parsers(sub)`, in the order `twin --help` lists them. This
is the one module of twin that imports executor: its commands (run, calibrate, compare) register without torch
and say at run time that they need it (executor.cli).

Every user error (a TwinError) becomes one line on stderr and exit code 2; argparse's own usage errors exit 2 as
well. Output files (traces, figures, schedules) are written atomically, after the work succeeded.
"""

from __future__ import annotations

import argparse
import sys

from executor import cli as executor_cli
from twin.cli import catalog, explain, export, fit, presets, scale, search, simulate, validate
from twin.cli.args import OneLineErrorParser
from twin.collector import infrequent
from twin.errors import TwinError

COMMANDS = (catalog, simulate, explain, presets, scale, export, search, validate, fit, executor_cli)


def build_parser() -> argparse.ArgumentParser:
    """twin's parser: every command of COMMANDS, each with its `func`."""
    parser = OneLineErrorParser(
        prog="twin",
        description="exatwin: a digital twin of large-scale LLM training (AxoNN 4D parallelism on Frontier, "
        "Perlmutter and Alps).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parsers(sub)
    return parser


@infrequent()
def main(argv: list[str] | None = None) -> int:
    """Run one `twin` command; its exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a usage error (2, its line printed): a code, as from any command
        return int(done.code or 0)
    try:
        return args.func(args)
    except TwinError as err:
        print(f"twin: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `twin models | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("twin: interrupted", file=sys.stderr)
        return 130
