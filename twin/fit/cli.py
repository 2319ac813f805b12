"""`twin fit` and `twin validate --runs`: learn a machine from measured runs, and predict measured runs in bulk."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

from twin import limits
from twin.errors import TwinError
from twin.limits import count_flag
from twin.outputs import check_outputs

WORST_SHOWN = 5


def _progress(args: argparse.Namespace):
    """A tqdm wrapper on stderr when it is a terminal (or --progress), else None."""
    if args.json or not (args.progress or sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return lambda it, total=None: tqdm(it, total=total, file=sys.stderr, leave=False, unit="run")


def _jobs(args: argparse.Namespace) -> int:
    """--jobs as twin search reads it (at most every core)."""
    from twin.search.rank import worker_count

    return worker_count(args.jobs)


def _overrides(args: argparse.Namespace):
    from topologies.overrides import parse_override

    return tuple(parse_override(t) for t in args.overrides)


def describe_run(run) -> str:
    """One line naming a run: where it is, its size and its plan."""
    if run.schedule:
        return f"{run.where}: {Path(run.schedule).name} on {run.gpus} ranks"
    p = run.plan
    plan = f"tp={p.gx},pp={p.pp},dp={p.gdata},mbs={p.mbs}"
    return (f"{run.where}: {run.label + ' ' if run.label else ''}h={run.model.hidden} L={run.model.layers} "
            f"on {run.gpus} GPUs {plan} gb={p.global_batch}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _finite(x: float) -> float | None:
    """x, or None where it is not a number (a spread from as many runs as parameters; a rank correlation of a
    constant): JSON has no NaN."""
    return float(x) if np.isfinite(x) else None


def _error_stats(e: np.ndarray) -> dict[str, float]:
    return {"mean_abs_pct": 100 * float(np.abs(e).mean()), "mean_pct": 100 * float(e.mean()),
            "max_abs_pct": 100 * float(np.abs(e).max())}


def cmd_fit(args: argparse.Namespace) -> int:
    from topologies.machine import load_machine
    from twin.fit.machinefile import write_fitted
    from twin.fit.params import DEFAULT_PARAMETERS, fit_parameters
    from twin.fit.protocol import check_calibration_file
    from twin.fit.solve import fit
    from twin.runs import load_runs

    if bool(args.runs) == bool(args.carry_from):
        raise TwinError("give --runs (fit on measured runs) or --from FITTED.toml (carry a fit to this machine), "
                        "not both or neither")
    base = _overrides(args)
    machine = load_machine(args.machine, base)
    check_outputs({"-o": args.output}, {"--machine": machine.path, "--runs": args.runs, "--from": args.carry_from},
                  {"-o": ("toml",)})
    names = tuple(n.strip() for n in args.params.split(",") if n.strip()) if args.params else DEFAULT_PARAMETERS
    params = fit_parameters(machine, names)
    if args.carry_from:
        return _carry(args, machine, params)
    check_calibration_file(args.runs)
    runs = load_runs(args.runs, args.assume or "")
    say = (lambda line: None) if args.json else (lambda line: print(f"  {line}", file=sys.stderr))
    result = fit(runs, args.machine, base, params, folds=args.folds, jobs=_jobs(args), explicit=bool(args.params),
                 progress=_progress(args), say=say)
    cv = f", {args.folds}-fold cross-validated error {100 * np.abs(result.cv_errors).mean():.1f}%" \
        if result.cv_errors is not None else ""
    assumed = f", assuming {args.assume}" if args.assume else ""
    today = datetime.date.today().isoformat()
    values = {}
    for p, start, value in zip(result.params, result.start, result.values):
        here = machine.sources.get(p.path)
        was = (f"was {here.value:.4g} ({here.provenance})" if here is not None
               else f"absent from the file, started at {start:.4g}")
        note = (f"twin fit on {Path(args.runs).name} ({_count(len(runs), 'run')}{assumed}), {today}: mean step error "
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


def _carry(args: argparse.Namespace, machine, params) -> int:
    """Write --machine with the --params numbers taken from another machine's fitted file, saying so."""
    from topologies.machine import load_machine
    from twin.fit.machinefile import write_fitted

    donor = load_machine(args.carry_from)
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
    write_fitted(machine.path, values, args.output)
    doc = {"machine": machine.name, "from": args.carry_from, "output": args.output,
           "carried": {path: value for path, (value, _) in values.items()}}
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"twin fit: carried {len(values)} fitted number(s) from {args.carry_from} to {machine.name}: "
              + ", ".join(f"{path}={value:.4g}" for path, (value, _) in values.items()) + f"; wrote {args.output}")
    return 0


def _fit_json(result, args: argparse.Namespace) -> dict:
    order = np.argsort(-np.abs(result.errors_after))[:WORST_SHOWN]
    return {
        "machine": result.machine, "runs_file": args.runs, "runs": len(result.runs), "assume": args.assume or "",
        "output": args.output, "passes": result.passes, "wall_s": result.wall_s, "folds": result.folds,
        "parameters": [{"path": p.path, "meaning": p.meaning, "file_value": s, "fitted": v,
                        "std": _finite(e), "lower": p.lower, "upper": p.upper}
                       for p, s, v, e in zip(result.params, result.start, result.values, result.std)],
        "left_out": list(result.dropped),
        "errors": {"machine_file": _error_stats(result.errors_before), "fitted": _error_stats(result.errors_after),
                   "cross_validated": _error_stats(result.cv_errors) if result.cv_errors is not None else None},
        "worst": [{"run": describe_run(result.runs[i]), "measured_s": result.runs[i].step_time_s,
                   "predicted_s": result.runs[i].step_time_s * (1 + result.errors_after[i]),
                   "error_pct": 100 * result.errors_after[i]} for i in order],
    }


def _print_fit(result, doc: dict, args: argparse.Namespace) -> None:
    print(f"twin fit: {result.machine} on {args.runs} ({_count(len(result.runs), 'run')}"
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
    print("\n  worst runs, fitted:")
    for w in doc["worst"]:
        print(f"    {w['run']}: measured {1e3 * w['measured_s']:.1f} ms, predicted {1e3 * w['predicted_s']:.1f} ms "
              f"({w['error_pct']:+.1f}%)")
    print(f"\n  wrote {args.output} ({result.passes} simulation passes, {result.wall_s:.0f} s); every command takes "
          f"it as --machine {args.output}")


def add_fit_parser(sub) -> None:
    p = sub.add_parser(
        "fit", help="learn a machine's remaining costs from measured runs -> a fitted machine file",
        description="Fit a few physically named numbers of a machine file (the host's time per op, the device's "
        "fixed cost per kernel, the GEMM rate and its k-loop constant, the HBM efficiency of element-wise work, the "
        "fused attention rate) to measured runs, by simulation and bounded least squares, and write the machine "
        "file with those numbers marked `fitted` (which runs, when, the cross-validated error). A fit that ends on a "
        "bound, or whose parameters the runs cannot tell apart, is refused. Fit only on calibration runs (e.g. one "
        "node); validation files are refused. --from carries fitted numbers to another machine file. Example: "
        "twin fit --machine dgx-a100-800g --runs benchmarks/data/a100-megatron-single-node.csv --assume "
        "attention=unfused,dtype=fp16 --params device.launch_interval_us,device.hbm_efficiency -o a100-fitted.toml",
    )
    p.add_argument("--machine", required=True, help="the machine file to start from (a name or a .toml path)")
    p.add_argument("--runs", help="a CSV of measured runs, one per row (columns: twin/runs.py)")
    p.add_argument("--from", dest="carry_from", metavar="FITTED.toml",
                   help="instead of --runs: carry the --params numbers fitted in another machine file to --machine "
                   "(e.g. an A100 cluster's fit to another A100 machine), each marked as carried from where")
    p.add_argument("-o", "--output", required=True, help="the fitted machine file to write (.toml)")
    p.add_argument("--assume", help="plan and model fields every run shares that the CSV does not say, e.g. "
                   "attention=unfused,recompute=full,vocab=50304,dtype=fp16")
    p.add_argument("--params", help="comma-separated machine-file numbers to fit (default: "
                   "device.launch_interval_us, kernel_overhead_us, empirical_gemm_bf16_tflop_per_s, gemm_k_half, "
                   "hbm_efficiency, attention_efficiency; those no run depends on are left out)")
    p.add_argument("--folds", type=int, default=5, help="k of the k-fold cross-validation (default 5; 0: none)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                   help="replace a number of the machine file before fitting (repeatable); written into the output")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes for the simulations (default and most: every core)")
    p.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a terminal")
    p.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    p.set_defaults(func=cmd_fit)


# ---------------------------------------------------------------- twin validate --runs

def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    def ranks(x: np.ndarray) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for value in np.unique(x):
            tied = x == value
            r[tied] = r[tied].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def validate_runs(args: argparse.Namespace) -> int:
    """Every run of --runs predicted on each --machine: per-row errors, their mean, and the order within each label."""
    from topologies.machine import load_machine
    from twin.fit.solve import simulate_runs
    from twin.runs import load_runs

    if not args.machine:
        raise TwinError("--runs needs --machine (repeatable: each machine becomes a column)")
    runs = load_runs(args.runs, args.assume or "")
    measured = np.array([r.step_time_s for r in runs])
    columns = {}
    notes = []
    for name in args.machine:
        machine = load_machine(name)
        fitted_on = {s.fitted for s in machine.sources.values() if s.fitted and Path(args.runs).name in s.fitted}
        if fitted_on:
            notes.append(f"note: {name} was fitted on {Path(args.runs).name}: its column is in-sample, "
                         "not a prediction")
        paths = simulate_runs(runs, name, [()] * len(runs), _jobs(args), _progress(args))
        columns[name] = np.array([p.step_s for p in paths])
    labels = sorted({r.label for r in runs})
    doc = {"runs_file": args.runs, "assume": args.assume or "", "machines": list(columns), "notes": notes, "rows": [
        {"run": describe_run(r), "label": r.label, "measured_s": r.step_time_s,
         "predicted_s": {n: float(c[i]) for n, c in columns.items()},
         "error_pct": {n: 100 * float(c[i] / r.step_time_s - 1) for n, c in columns.items()}}
        for i, r in enumerate(runs)],
        "summary": {n: {**_error_stats(c / measured - 1), "spearman_by_label": {
            label: _finite(_spearman(measured[sel], c[sel])) for label in labels
            if (sel := np.array([r.label == label for r in runs])).sum() > 2}} for n, c in columns.items()}}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    names = list(columns)
    print(f"{'run':<70}{'measured':>10}" + "".join(f"{n[-22:]:>24}" for n in names))
    for row in doc["rows"]:
        cells = "".join(f"{1e3 * row['predicted_s'][n]:>14.1f} ({row['error_pct'][n]:+5.1f}%)" for n in names)
        print(f"{row['run'][-70:]:<70}{1e3 * row['measured_s']:>8.1f}ms{cells}")
    for n in names:
        s = doc["summary"][n]
        order = ", ".join(f"{k or 'all'} {'n/a' if v is None else f'{v:.2f}'}"
                          for k, v in s["spearman_by_label"].items())
        print(f"\n{n}: mean |error| {s['mean_abs_pct']:.1f}%, mean {s['mean_pct']:+.1f}%, max {s['max_abs_pct']:.1f}%"
              f" over {_count(len(runs), 'run')}; Spearman (measured vs predicted order) by label: {order}")
    for note in notes:
        print(note)
    return 0
