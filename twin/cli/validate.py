"""`twin validate`: predict every published measurement (or, with --runs, every run of a CSV of measured runs)
and print the errors."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from twin import limits
from twin.cli.args import comma_words, shows_progress
from twin.cli.runs import (count_noun, describe_run, error_stats, finite, job_count, run_progress, spearman_by_label,
                           what_ran)
from twin.errors import TwinError
from twin.limits import count_flag


def cmd_validate(args: argparse.Namespace) -> int:
    from twin.validate import validate
    from twin.outputs import check_outputs
    from twin.validate_table import markdown_table, readme_parts, update_readme

    if args.runs:
        return validate_runs(args)
    if args.machine or args.assume or args.by:
        raise TwinError("--machine, --assume and --by go with --runs; the published rows use the package's machine "
                        "files (--machine-file NAME=PATH replaces one)")

    sections = tuple(comma_words(args.sections.upper()))
    for s in sections:
        if s not in ("A", "B"):
            raise TwinError(f"--sections: unknown section {s!r}; use A (AxoNN), B (the Frontier paper) or A,B")
    if args.readme:
        readme_parts(args.readme)  # markers present, before minutes of work
        check_outputs({"--readme": args.readme})
    files = _machine_files(args.machine_files)
    overrides = _validate_overrides(args.overrides, files)
    what_if = "--set" if overrides else "--machine-file" if files else None
    if what_if and args.readme:
        raise TwinError(f"--readme writes the package's machine files' own table; drop {what_if}, or drop --readme")
    if what_if and args.figures and args.figures_dir == FIGURES_DIR:
        raise TwinError(f"{what_if} with --figures needs --figures-dir: the figures in {FIGURES_DIR}/ are the "
                        "package's machine files' own")
    show = shows_progress(args)
    v = validate(jobs=args.jobs, progress=(lambda what: print(f"  {what} ...", file=sys.stderr)) if show else None,
                 sections=sections, overrides=overrides, files=files,
                 calibrated=not (what_if or args.first_principles_only))
    figures = []
    if args.figures:
        figures = _validation_figures(v, args.figures_dir)
    if args.readme:
        update_readme(args.readme, v)
    if args.json:
        doc = v.to_json_dict()
        doc["figures"] = figures
        print(json.dumps(doc, indent=2))
        return 0
    print(markdown_table(v))
    print(f"\n(wall time {v.wall_s:.0f} s; each search and simulation is cached: a repeat only prints)")
    for path in figures:
        print(f"figure: {path}")
    if args.readme:
        print(f"updated the Accuracy section of {args.readme}")
    return 0


FIGURES_DIR = "figures"


def _machine_files(texts: list[str]) -> dict[str, str]:
    """--machine-file NAME=PATH, by machine name (checked by twin.validate before any work)."""
    from twin.validate import check_machine_files

    files: dict[str, str] = {}
    for text in texts:
        name, sep, path = text.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise TwinError(f"--machine-file {text!r} must be NAME=PATH, e.g. frontier=my-frontier.toml")
        files[name.strip()] = path.strip()
    check_machine_files(files)
    return files


def _validate_overrides(texts: list[str], files: dict[str, str] | None = None) -> dict[str, tuple]:
    """--set [MACHINE:]FIELD=VALUE for twin validate: by machine; without MACHINE, for every machine the
    published rows run on (the field must then exist in each). `files`: --machine-file's, where given."""
    from topologies.machine import load_machine
    from topologies.overrides import parse_override
    from twin.validate import MACHINES

    files = files or {}
    out: dict[str, list] = {}
    for text in texts:
        name, sep, rest = text.partition(":")
        if sep and "=" not in name:
            if name not in MACHINES:
                raise TwinError(f"--set {text!r}: the published rows run on {' and '.join(MACHINES)}, not {name!r}")
            names, text = (name,), rest
        else:
            names = MACHINES
        override = parse_override(text)
        if not sep:
            has = [n for n in MACHINES if override[0] in load_machine(files.get(n, n)).sources]
            if has and len(has) < len(MACHINES):
                raise TwinError(f"--set {override[0]}: only {', '.join(has)} has this number; "
                                f"write {has[0]}:{override[0]}=VALUE")
        for n in names:
            out.setdefault(n, []).append(override)
    return {n: tuple(v) for n, v in out.items()}


def _runs_overrides(texts: list[str], machines: list[str]) -> tuple:
    """--set FIELD=VALUE with --runs: one what-if for every --machine column, each of which must have the field."""
    from topologies.machine import load_machine
    from topologies.overrides import parse_override

    for text in texts:
        name, sep, rest = text.partition(":")
        if sep and "=" not in name:
            raise TwinError(f"--set {text!r}: with --runs it takes FIELD=VALUE and changes every --machine; "
                            f"write --set {rest}")
    overrides = tuple(parse_override(text) for text in texts)
    for name in machines:
        load_machine(name, overrides)  # a field the file lacks, or a bad value: its one-line error, before any work
    return overrides


def _validation_figures(v, folder: str) -> list[str]:
    from twin.figures import weak_scaling_validation_figure
    from twin.published import AXONN_TABLE_III
    from twin.validate import table_iii_quantity

    out = []
    predicted = {r.quantity: r.predicted for r in v.rows}
    for machine in ("frontier", "perlmutter"):
        rows = [p for p in AXONN_TABLE_III if p.machine == machine]
        keys = [table_iii_quantity(p) for p in rows]
        if not all(k in predicted for k in keys):
            continue
        path = os.path.join(folder, f"validate-weak-scaling-{machine}.png")
        weak_scaling_validation_figure(path, machine.capitalize(), [p.gpus for p in rows], [p.pflops_total for p in rows],
                                       [predicted[k] for k in keys], [p.model for p in rows])
        out.append(path)
    return out


def validate_runs(args: argparse.Namespace) -> int:
    """Every run of --runs predicted on each --machine: per-row errors, their mean, and the order within each label."""
    from topologies.machine import load_machine
    from twin.fit.solve import simulate_runs
    from twin.run_groups import format_groups, group_errors, parse_group_fields
    from twin.runs import load_runs

    if not args.machine:
        raise TwinError("--runs needs --machine (repeatable: each machine becomes a column)")
    published_only = [flag for flag, given in (("--readme", args.readme), ("--figures", args.figures),
                                               ("--machine-file", args.machine_files),
                                               ("--sections", args.sections != "A,B"),
                                               ("--first-principles-only", args.first_principles_only)) if given]
    if published_only:
        raise TwinError(f"{', '.join(published_only)}: for the published rows only, not with --runs; with --runs "
                        "each --machine is a column (--set FIELD=VALUE changes a number in every one)")
    overrides = _runs_overrides(args.overrides, args.machine)
    fields = parse_group_fields(args.by) if args.by else ()
    runs = load_runs(args.runs, args.assume or "")
    measured = np.array([r.step_time_s for r in runs])
    columns = {}
    notes = []
    refused: dict[str, dict[int, str]] = {}
    for name in args.machine:
        machine = load_machine(name)
        fitted_on = {s.fitted for s in machine.sources.values() if s.fitted and Path(args.runs).name in s.fitted}
        if fitted_on:
            notes.append(f"note: {name} was fitted on {Path(args.runs).name}: its column is in-sample, "
                         "not a prediction")
        refused[name] = {}
        paths = simulate_runs(runs, name, [overrides] * len(runs), job_count(args), run_progress(args),
                              refused=refused[name])
        columns[name] = np.array([p.step_s if p is not None else np.nan for p in paths])
    # A run some column could not predict is left out of every column's statistics, so columns compare alike.
    kept = np.all([np.isfinite(c) for c in columns.values()], axis=0)
    if not kept.any():
        where, why = next((runs[i].where, why) for reasons in refused.values() for i, why in reasons.items())
        raise TwinError(f"--runs: no run could be predicted; {where}: {why}")
    kept_runs = [r for r, k in zip(runs, kept) if k]
    doc = {"runs_file": args.runs, "assume": args.assume or "", "machines": list(columns),
           "overrides": {field: value for field, value in overrides}, "notes": notes, "rows": [
        {"run": describe_run(r), "where": r.where, "what": what_ran(r), "label": r.label, "measured_s": r.step_time_s,
         "predicted_s": {n: finite(c[i]) for n, c in columns.items()},
         "error_pct": {n: finite(100 * (c[i] / r.step_time_s - 1)) for n, c in columns.items()},
         **({"not_predicted": {n: refused[n][i] for n in columns if i in refused[n]}} if not kept[i] else {})}
        for i, r in enumerate(runs)],
        "summary": {n: {**error_stats(c[kept] / measured[kept] - 1), "runs": int(kept.sum()), "spearman_by_label": {
            label: finite(rho) for label, rho in spearman_by_label(kept_runs, measured[kept], c[kept]).items()}}
            for n, c in columns.items()}}
    if fields:
        doc["by"] = {"fields": list(fields), "groups": group_errors(runs, columns, fields)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    names = list(columns)
    shown = [f"{r.position}: {what_ran(r)}" for r in runs]
    width = max(len(text) for text in shown) + 2
    heads = [n if len(n) <= 22 else Path(n).name[-22:] for n in names]  # a path's file name heads its column...
    heads = [n[-22:] if heads.count(h) > 1 else h for h, n in zip(heads, names)]  # ...unless two share it
    print(f"runs: {args.runs}" + "".join(f"\n  column {h}: {n}" for h, n in zip(heads, names) if h != n))
    print(f"{'run':<{width}}{'measured':>10}" + "".join(f"{h:>24}" for h in heads))
    for text, row in zip(shown, doc["rows"]):
        cells = "".join(f"{'not predicted':>24}" if row['predicted_s'][n] is None else
                        f"{1e3 * row['predicted_s'][n]:>14.1f} ({row['error_pct'][n]:+5.1f}%)" for n in names)
        print(f"{text:<{width}}{1e3 * row['measured_s']:>8.1f}ms{cells}")
    for n in names:
        s = doc["summary"][n]
        order = ", ".join(f"{k or 'all'} {'n/a' if v is None else f'{v:.2f}'}"
                          for k, v in s["spearman_by_label"].items())  # empty where no label has 3 runs to order
        print(f"\n{n}: mean |error| {s['mean_abs_pct']:.1f}%, mean {s['mean_pct']:+.1f}%, max {s['max_abs_pct']:.1f}%"
              f" over {count_noun(s['runs'], 'run')}"
              + (f"; Spearman (measured vs predicted order) by label: {order}" if order else ""))
    for row in doc["rows"]:
        reasons = row.get("not_predicted", {})
        for why in dict.fromkeys(reasons.values()):  # once per reason, naming the columns only where they differ
            on = "" if len(set(reasons.values())) == 1 and len(reasons) == len(names) else \
                f" on {', '.join(n for n, w in reasons.items() if w == why)}"
            print(f"not predicted{on}, {row['where']}: {why}")
    if overrides:
        from topologies.overrides import describe_overrides

        print(f"(every column: {describe_overrides(overrides)})")
    if fields:
        print("\n" + "\n".join(format_groups(doc["by"]["groups"], fields, names)))
    for note in notes:
        print(note)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add validate to twin's subcommands."""
    p = sub.add_parser(
        "validate", help="predict every published measurement (reference/published.md) and print the errors",
        description="Every row of reference/published.md sections A (AxoNN SC'24) and B (the Frontier paper), "
        "predicted from the machine files (first principles) and from the fitted ones in topologies/fitted/ "
        "(calibrated; rows fitted on are marked 'fit'): AxoNN's unpublished plans are chosen as AxoNN chose them "
        "(the fastest of its communication model's top 20, as its launcher ran them), the Frontier paper's are its launch scripts'. Prints "
        "published, predicted and error per row, then the mean and max error. With --runs: measured runs of a "
        "CSV instead, predicted on each --machine. "
        "Searches and simulations are cached (~/.cache/exatwin), so only the first run is slow.",
    )
    p.add_argument("--sections", default="A,B", help="A (AxoNN), B (the Frontier paper) or A,B (default)")
    p.add_argument("--figures", action="store_true", help="write predicted vs published weak-scaling figures")
    p.add_argument("--figures-dir", default=FIGURES_DIR, help="where --figures writes (default figures/)")
    p.add_argument("--set", action="append", default=[], metavar="[MACHINE:]FIELD=VALUE", dest="overrides",
                   help="what-if: replace a number of a machine file for this validation (repeatable), e.g. "
                   "--set frontier:device.comm_compute_slowdown=0.3; without MACHINE, in frontier and perlmutter; with "
                   "--runs, FIELD=VALUE in every --machine")
    p.add_argument("--machine-file", action="append", default=[], metavar="NAME=PATH", dest="machine_files",
                   help="what-if: validate with this file in place of the package's machine NAME (repeatable), e.g. "
                   "frontier=frontier-measured.toml with measured GEMMs ([[device.gemm_measured]])")
    p.add_argument("--readme", help="rewrite this README's Accuracy section (between the accuracy markers)")
    p.add_argument("--first-principles-only", action="store_true",
                   help="leave out the calibrated column (the fitted files in topologies/fitted/; what-ifs always do)")
    p.add_argument("--runs", help="instead of the published rows: predict every run of this CSV of measured runs "
                   "(twin/runs.py) on each --machine, e.g. benchmarks/data/a100-megatron-multi-node.csv")
    p.add_argument("--machine", action="append", default=[], help="with --runs: a machine (name or .toml, e.g. a "
                   "`twin fit` output); repeat it to compare machines side by side")
    p.add_argument("--assume", help="with --runs: plan and model fields the CSV does not say, e.g. attention=unfused")
    p.add_argument("--by", metavar="FIELDS", help="with --runs: also the mean and mean |error| of each group of runs "
                   "sharing these fields' values, e.g. --by tp,mbs (fields: label, gpus, tp, pp, dp, mbs, vpp, hidden, "
                   "layers, heads, seq): where a machine file's error sits")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes for the searches (default and most: every core)")
    p.add_argument("--progress", action="store_true", help="report each task on stderr even when not a terminal")
    p.add_argument("--json", action="store_true", help="print the rows and the error summary as JSON")
    p.set_defaults(func=cmd_validate)
