"""The `twin` command line: `main` (the `twin` entry point, also `python -m twin.cli`) and `build_parser`.

The package: `args` holds what the commands share (arguments, reading them, the one-line usage errors, progress);
one module per command group adds its subcommands (catalog, simulate, explain, presets, scale, export, search,
validate, fit; executor.cli adds run, calibrate and compare); `commands` lists those modules and assembles them.
This file imports `commands` only when called, so that importing a helper (`twin.cli.args`, as executor.cli does)
imports no command module.
"""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    """twin's parser, every command in it (twin.cli.commands)."""
    from twin.cli.commands import build_parser as build

    return build()


def main(argv: list[str] | None = None) -> int:
    """Run one `twin` command (argv, default sys.argv[1:]); its exit code."""
    from twin.cli.commands import main as run

    return run(argv)
