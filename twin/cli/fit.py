"""`twin fit`: learn a machine's remaining costs from measured runs, and write them into a fitted machine file."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

from twin import limits
from twin.cli.args import overrides_from_args
from twin.cli.runs import count_noun, describe_run, error_stats, finite, job_count, run_progress
from twin.errors import TwinError
from twin.limits import count_flag
from twin.outputs import check_outputs

WORST_SHOWN = 5


def cmd_fit(args: argparse.Namespace) -> int:
    from topologies.machine import load_machine
    from twin.fit.machinefile import write_fitted
    from twin.fit.params import DEFAULT_PARAMETERS, default_parameters, fit_parameters
    from twin.fit.protocol import check_calibration_file
    from twin.fit.solve import fit
    from twin.runs import load_runs

    if bool(args.runs) == bool(args.carry_from):
        raise TwinError("give --runs (fit on measured runs) or --from FITTED.toml (carry a fit to this machine), "
                        "not both or neither")
    base = overrides_from_args(args)
    machine = load_machine(args.machine, base)
    check_outputs({"-o": args.output}, {"--machine": machine.path, "--runs": args.runs, "--from": args.carry_from},
                  {"-o": ("toml",)})
    names = tuple(n.strip() for n in args.params.split(",") if n.strip()) if args.params else ()
    named = fit_parameters(machine, names) if names else None  # checked before any run is read
    if args.carry_from:
        return _carry(args, machine, named or fit_parameters(machine, DEFAULT_PARAMETERS), base)
    check_calibration_file(args.runs)
    runs = load_runs(args.runs, args.assume or "")
    params = named or fit_parameters(machine, default_parameters(machine, [r.gpus for r in runs]))
    say = (lambda line: None) if args.json else (lambda line: print(f"  {line}", file=sys.stderr))
    result = fit(runs, args.machine, base, params, folds=args.folds, jobs=job_count(args), explicit=bool(args.params),
                 progress=run_progress(args), say=say)
    cv = f", {args.folds}-fold cross-validated error {100 * np.abs(result.cv_errors).mean():.1f}%" \
        if result.cv_errors is not None else ""
    assumed = f", assuming {args.assume}" if args.assume else ""
    today = datetime.date.today().isoformat()
    values = {}
    for p, start, value in zip(result.params, result.start, result.values):
        here = machine.sources.get(p.path)
        was = (f"was {here.value:.4g} ({here.provenance})" if here is not None
               else f"absent from the file, started at {start:.4g}")
        note = (f"twin fit on {Path(args.runs).name} ({count_noun(len(runs), 'run')}{assumed}), {today}: mean step error "
                f"{100 * np.abs(result.errors_after).mean():.1f}%{cv}; {was}")
        values[p.path] = (value, note)
    for path, value in base:  # what-ifs of the base file become part of the fitted one, marked as such
        values.setdefault(path, (value, f"set with --set for twin fit on {Path(args.runs).name}, {today}"))
    write_fitted(machine.path, values, args.output)
    doc = _fit_json(result, args)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    _print_fit(result, doc, args)
    return 0


def _carry(args: argparse.Namespace, machine, params, base) -> int:
    """Write --machine with the --params numbers taken from another machine's fitted file, saying so, and the --set
    numbers (`base`) marked as set."""
    from topologies.machine import load_machine
    from twin.fit.machinefile import write_fitted

    donor = load_machine(args.carry_from)
    both = sorted({p.path for p in params} & {path for path, _ in base})
    if both:
        raise TwinError(f"--set {both[0]} and --params carries it from {args.carry_from}: give it in one of them")
    values = {}
    for p in params:
        s = donor.sources.get(p.path)
        if s is None or not s.fitted:
            raise TwinError(f"--from {args.carry_from}: {p.path} was not fitted there; carry only fitted numbers "
                            "(--params)")
        here = machine.sources.get(p.path)
        was = f"{here.value:.4g}" if here is not None else "absent"
        values[p.path] = (s.value, f"carried from {Path(args.carry_from).name} ({donor.name}), where it was fitted: "
                                   f"{s.fitted}; was {was} here")
    carried = {path: value for path, (value, _) in values.items()}
    today = datetime.date.today().isoformat()
    for path, value in base:  # what-ifs of the base file become part of the written one, marked as such
        values[path] = (value, f"set with --set for twin fit --from {Path(args.carry_from).name}, {today}")
    write_fitted(machine.path, values, args.output)
    doc = {"machine": machine.name, "from": args.carry_from, "output": args.output, "carried": carried,
           "set": dict(base)}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        also = "; set " + ", ".join(f"{path}={value:.4g}" for path, value in base) if base else ""
        print(f"twin fit: carried {len(carried)} fitted number(s) from {args.carry_from} to {machine.name}: "
              + ", ".join(f"{path}={value:.4g}" for path, value in carried.items()) + f"{also}; wrote {args.output}")
    return 0


def _fit_json(result, args: argparse.Namespace) -> dict:
    from twin.fit.solve import repeat_key

    order = np.argsort(-np.abs(result.errors_after))[:WORST_SHOWN]
    return {
        "machine": result.machine, "runs_file": args.runs, "runs": len(result.runs), "assume": args.assume or "",
        "plans": len({repeat_key(r) for r in result.runs}),  # what a fold holds out whole (twin.fit.solve)
        "output": args.output, "passes": result.passes, "wall_s": result.wall_s, "folds": result.folds,
        "parameters": [{"path": p.path, "meaning": p.meaning, "file_value": s, "fitted": v,
                        "std": finite(e), "lower": p.lower, "upper": p.upper}
                       for p, s, v, e in zip(result.params, result.start, result.values, result.std)],
        "left_out": list(result.dropped),
        "errors": {"machine_file": error_stats(result.errors_before), "fitted": error_stats(result.errors_after),
                   "cross_validated": error_stats(result.cv_errors) if result.cv_errors is not None else None},
        "worst": [{"run": describe_run(result.runs[i]), "measured_s": result.runs[i].step_time_s,
                   "predicted_s": result.runs[i].step_time_s * (1 + result.errors_after[i]),
                   "error_pct": 100 * result.errors_after[i]} for i in order],
    }


def _print_fit(result, doc: dict, args: argparse.Namespace) -> None:
    print(f"twin fit: {result.machine} on {args.runs} ({count_noun(len(result.runs), 'run')}"
          + (f"; assumed {args.assume}" if args.assume else "") + ")")
    print(f"  {'parameter':<42}{'file':>10}{'fitted':>11}{'± std':>10}  meaning")
    for p in doc["parameters"]:
        std = "n/a" if p["std"] is None else f"{p['std']:.2g}"
        print(f"  {p['path']:<42}{p['file_value']:>10.4g}{p['fitted']:>11.4g}{std:>10}  {p['meaning']}")
    if result.dropped:
        print(f"  left out (no run depends on them): {', '.join(result.dropped)}")
    print(f"\n  {'simulated step error':<28}{'mean |e|':>10}{'mean e':>10}{'max |e|':>10}")
    labels = {"machine_file": "machine file", "fitted": "fitted (in sample)",
              "cross_validated": f"{result.folds}-fold cross-validated"}
    for key, label in labels.items():
        e = doc["errors"][key]
        if e:
            print(f"  {label:<28}{e['mean_abs_pct']:>9.1f}%{e['mean_pct']:>+9.1f}%{e['max_abs_pct']:>9.1f}%")
    if doc["errors"]["cross_validated"]:
        print(f"  (folds hold out whole plans, {doc['plans']} in all: a plan's runs at other dp and batches go "
              "with it)")
    print("\n  worst runs, fitted:")
    for w in doc["worst"]:
        print(f"    {w['run']}: measured {1e3 * w['measured_s']:.1f} ms, predicted {1e3 * w['predicted_s']:.1f} ms "
              f"({w['error_pct']:+.1f}%)")
    print(f"\n  wrote {args.output} ({result.passes} simulation passes, {result.wall_s:.0f} s); every command takes "
          f"it as --machine {args.output}")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add fit to twin's subcommands."""
    p = sub.add_parser(
        "fit", help="learn a machine's remaining costs from measured runs -> a fitted machine file",
        description="Fit a few physically named numbers of a machine file (the host's time per op, the device's "
        "fixed cost per kernel, the GEMM rate and its k-loop constant, the HBM efficiency of element-wise work, the "
        "fused attention rate, the achieved fraction of each level's link bandwidth: node.link_efficiency.<kind>, "
        "e.g. nvlink or nic, which only runs whose critical path crosses that level can pin down) to measured runs, "
        "by simulation and bounded least squares, and write the machine "
        "file with those numbers marked `fitted` (which runs, when, the cross-validated error). A fit that ends on a "
        "bound, whose parameters the runs cannot tell apart, or whose standard error is over half a value, is "
        "refused. Fit only on calibration runs (e.g. one "
        "node); validation files are refused. --from carries fitted numbers to another machine file. Example: "
        "twin fit --machine dgx-a100-800g --runs benchmarks/data/a100-megatron-single-node.csv --assume "
        "attention=unfused,recompute=full,dtype=fp16,optimizer=flat --params device.launch_interval_us -o a100-fitted.toml",
    )
    p.add_argument("--machine", required=True, help="the machine file to start from (a name or a .toml path)")
    p.add_argument("--runs", help="a CSV of measured runs, one per row (columns: twin/runs.py)")
    p.add_argument("--from", dest="carry_from", metavar="FITTED.toml",
                   help="instead of --runs: carry the --params numbers fitted in another machine file to --machine "
                   "(e.g. an A100 cluster's fit to another A100 machine), each marked as carried from where")
    p.add_argument("-o", "--output", required=True, help="the fitted machine file to write (.toml)")
    p.add_argument("--assume", help="plan and model fields every run shares that the CSV does not say, e.g. "
                   "attention=unfused,recompute=full,vocab=50304,dtype=fp16 (model fields: vocab, ffn, kv_heads, "
                   "arch=gpt|llama, dtype, dropout=0|1)")
    p.add_argument("--params", help="comma-separated machine-file numbers to fit (default: "
                   "device.launch_interval_us, kernel_overhead_us, empirical_gemm_bf16_tflop_per_s, gemm_k_half, "
                   "hbm_efficiency, attention_efficiency, and where a run spans nodes node.link_efficiency.<kind> "
                   "for each link kind of the machine (`twin machines NAME`); those no run depends on are left out)")
    p.add_argument("--folds", type=int, default=5,
                   help="k of the k-fold cross-validation (default 5; 0: none). A fold holds whole groups of runs "
                   "that differ only in data parallelism and global batch (they repeat one micro-batch), so each "
                   "held-out run is a plan the fit has not seen")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                   help="replace a number of the machine file before fitting (repeatable); written into the output")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes for the simulations (default and most: every core)")
    p.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a terminal")
    p.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    p.set_defaults(func=cmd_fit)
