"""Fit on one and two ranks of this host, predict four: the executor closes `twin fit`'s loop (issue 13).

    .venv/bin/python benchmarks/fit_local.py [--steps 7] [--launches 1] [--calibration-launches 3]
                                             [--out out/fit_local] [--reuse] [--set FIELD=VALUE] [--json]

1. `twin calibrate` (microbenchmarks only) at 2 and at 4 ranks, each the
   median of --calibration-launches launches (`twin calibrate --launches`):
   OUT/local-2.toml, OUT/local-4.toml;
2. calibration runs: ONE_RANK's plans at 1 rank and compare_local's 2-rank
   plans, each exported for local-2.toml and executed (`twin run --json`),
   their summaries in OUT/calibration-runs.json;
3. `twin fit --machine OUT/local-2.toml --runs OUT/calibration-runs.json
   --params PARAMS`, then `twin fit --machine OUT/local-4.toml --from` that
   fit: the per-op and efficiency numbers the microbenchmarks miss, carried
   to the 4-rank file, whose rates come from its own microbenchmarks;
4. the held-out runs: compare_local's 4-rank plans, exported for local-4.toml
   and executed (--launches times each, the median launch compared), predicted
   by `twin validate --runs` on the microbenchmark file and on the fitted one:
   one table, the mean absolute step-time error of each (target <= 5% on plans
   not used in the fit; how far single launches of one plan scatter on this
   host: benchmarks/launch_noise.py).

With --reuse nothing is measured: steps 1, 2 and 4 take OUT's saved
calibrations (refitted by this code: executor.calibrate_host.refit_saved)
and runs, and only the fit and the predictions run again. --set FIELD=VALUE
(repeatable) replaces a number of both machine files for the fit and the
predictions, a what-if (e.g. a number an older calibration did not measure):
OUT/local-N.toml keep the measured numbers, the fitted files carry the what-if.

Nothing measured at 4 ranks enters the fit. On a 2-core host, 4 ranks share
the cores two by two, which no per-device number can express exactly (see
compare_local.py), so the 4-rank error says how far numbers learned from
1-2 ranks carry. Every measurement waits for the host to be quiet first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compare_local import BUSY_CORES, DEEP, PLANS, SMALL, model_of  # noqa: E402
from executor.calibrate_host import calibrate_host, refit_saved  # noqa: E402
from executor.launch import WorkerOptions, other_load, wait_for_quiet  # noqa: E402
from topologies.machine import load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.cli import main as twin  # noqa: E402
from twin.ir_io import save_schedule  # noqa: E402
from twin.plan import parse_plan  # noqa: E402

ONE_RANK = [("tiny", "gdata=1", 8), ("tiny", "gdata=1,recompute=none", 8), ("small", "gdata=1", 8),
            ("deep", "gdata=1", 8)]
# What microbenchmarks cannot see but whole steps can: the per-op cost of the framework (dispatch, Python) and
# how element-wise and attention work run inside a step rather than alone.
PARAMS = ["device.kernel_overhead_us", "device.hbm_efficiency", "device.attention_efficiency"]


def _named(model: str) -> str:
    """compare_local's model names: "small" and "deep" stand for its specs."""
    return {"small": SMALL, "deep": DEEP}.get(model, model)


class TwinFailed(Exception):
    """A twin command's one-line error."""


def twin_json(*argv: str) -> dict | list:
    """A `twin ... --json` command run in this process: its parsed stdout (TwinFailed with its error line)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = twin(list(argv))
    if rc != 0:
        raise TwinFailed(err.getvalue().strip())
    return json.loads(out.getvalue())


def fit_refusing_less(machine: str, runs: str, params: list[str], output: str,
                      what_if: tuple[str, ...] = ()) -> tuple[dict | None, list[str]]:
    """`twin fit` with `params`; where it refuses one (on a bound, no effect, not told apart from another), that
    one is left out and the fit run again, so the table says what the runs could pin down. (fit, left out); the
    fit None where every parameter was refused (the held-out plans are then predicted from the microbenchmarks
    alone, which is still worth the measuring)."""
    left_out = []
    while params:
        try:
            return twin_json("fit", "--machine", machine, "--runs", runs, "--params", ",".join(params), "-o", output,
                             *what_if, "--json"), left_out
        except TwinFailed as e:
            named = [p for p in params if p in str(e)]
            if not named:
                raise
            print(f"  {e}: fitting without {named[0]}", file=sys.stderr)
            left_out.append(f"{named[0]} ({str(e).removeprefix('twin: error: ')})")
            params = [p for p in params if p != named[0]]
    return None, left_out


def measure(plans: list[tuple[str, str, int]], ranks: int, machine_path: str, out: str, steps: int,
            quiet_wait: float) -> list[dict]:
    """Export each plan for the machine, execute it on `ranks` ranks (again while the host was busy), and
    return the `twin run --json` summaries."""
    machine = load_machine(machine_path)
    os.makedirs(out, exist_ok=True)
    summaries = []
    for model_name, plan_text, batch in plans:
        model = model_of(_named(model_name))
        built = build_step(model, parse_plan(plan_text, parse_plan(f"global_batch={batch}")), machine, ranks)
        tag = f"{ranks}-{model.name}-{plan_text.replace(',', '_').replace('=', '')}"
        schedule = os.path.join(out, f"{tag}.json")
        save_schedule(built.schedule, schedule)
        run_dir = os.path.join(out, tag)
        for attempt in range(3):
            if quiet_wait > 0:
                wait_for_quiet(max_wait_s=quiet_wait)
            summary = twin_json("run", schedule, "--nproc", str(ranks), "--machine", machine_path, "--steps",
                                str(steps), "--out", run_dir, "--json")
            load = other_load(run_dir)
            if load is None or load <= BUSY_CORES:
                break
            print(f"  the host was busy ({load:.2f} cores): measuring {tag} again", file=sys.stderr)
        summaries.append(summary)
        print(f"  {tag}: {summary['step_time_s']:.4f} s", file=sys.stderr)
    return summaries


def fit_and_carry(files: dict[int, str], runs: str,
                  what_if: tuple[str, ...] = ()) -> tuple[dict | None, list[str], dict[int, str]]:
    """`twin fit` on the calibration runs with the 2-rank file (fit_refusing_less), then what it fitted carried
    to the 4-rank file: (fit, left out, {2: fitted 2-rank file, 4: fitted 4-rank file}); where nothing could be
    fitted the 4-rank "fitted" file is the microbenchmarks' own. `what_if`: --set arguments for both fits."""
    fitted = {n: path.replace(".toml", "-fitted.toml") for n, path in files.items()}
    fit, left_out = fit_refusing_less(files[2], runs, PARAMS, fitted[2], what_if)
    if fit is not None:
        carry_fit(fit, files[4], fitted[2], fitted[4], what_if)
    else:
        fitted[4] = files[4]  # nothing to carry: the second column is the microbenchmarks' again
    return fit, left_out, fitted


def carry_fit(fit: dict, machine: str, fitted_from: str, output: str, what_if: tuple[str, ...] = ()) -> None:
    """What the fit on the 1-2 rank runs learned (`fit`: `twin fit --json`'s, written to `fitted_from`) carried
    to `machine`, a file of other ranks whose rates come from its own microbenchmarks: `output`."""
    carried = ",".join(p["path"] for p in fit["parameters"])
    twin_json("fit", "--machine", machine, "--from", fitted_from, "--params", carried, "-o", output, *what_if,
              "--json")


def print_fit(fit: dict | None, left_out: list[str]) -> None:
    """What the fit on 1-2 ranks learned, or that it learned nothing (every parameter on a bound)."""
    if fit is None:
        print("fit on the runs of 1 and 2 ranks: nothing could be fitted (the held-out plans below are predicted "
              "from the microbenchmarks alone in both columns)")
    else:
        print(f"fit on {fit['runs']} runs of 1 and 2 ranks ({fit['passes']} passes):")
        for p in fit["parameters"]:
            print(f"  {p['path']:<34} file {p['file_value']:>9.4g}  fitted {p['fitted']:>9.4g}")
    for why in left_out:
        print(f"  left out: {why}")
    if fit is not None:
        e = fit["errors"]
        cv = e["cross_validated"]
        print(f"  step error: microbenchmarks {e['machine_file']['mean_abs_pct']:.1f}%, fitted "
              f"{e['fitted']['mean_abs_pct']:.1f}%" + (f", {fit['folds']}-fold cross-validated {cv['mean_abs_pct']:.1f}%"
                                                      if cv else ""))


def median_launches(rounds: list[list[dict]]) -> list[dict]:
    """Per plan, the summary of its median launch (the lower of the middle two for an even count): the held-out
    runs measured several times, so that one launch's noise (benchmarks/launch_noise.py) weighs less."""
    chosen = []
    for launches in zip(*rounds):
        middle = statistics.median_low([s["step_time_s"] for s in launches])
        chosen.append(next(s for s in launches if s["step_time_s"] == middle))
    return chosen


def measured_on(machine_file: str) -> str:
    """The CPU the 4-rank calibration was measured on, from its saved record (so `--reuse` names the host of the
    measurements, not this one): the project's VM has been an Intel Xeon on some days and an AMD EPYC on others,
    and the loop's error moves with it (docs/fit.md)."""
    record = json.loads(Path(machine_file.replace(".toml", ".calibration.json")).read_text())
    host = record.get("host", {})
    return f"{host.get('cpu', 'an unrecorded CPU')} ({host.get('logical_cpus', '?')} logical CPUs)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=7, help="measured steps per run (default 7)")
    ap.add_argument("--out", default="out/fit_local", help="working folder (default out/fit_local)")
    ap.add_argument("--quiet-wait", type=float, default=120.0, help="seconds to wait for a quiet host (0: never)")
    ap.add_argument("--launches", type=int, default=1,
                    help="launches of each held-out plan, the median one compared (default 1; the host's launch-to-"
                         "launch noise: benchmarks/launch_noise.py)")
    ap.add_argument("--calibration-launches", type=int, default=3,
                    help="launches of each calibration, the median of their microbenchmarks fitted (default 3; "
                         "benchmarks/calibration_launches.py sets one beside the median on the same measurements)")
    ap.add_argument("--reuse", action="store_true",
                    help="measure nothing: fit OUT's saved calibrations and runs again with this code and predict the "
                         "same held-out runs (seconds; what a change of the model does to the same measurements)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="what-if: replace a number of both machine files for the fit and the predictions "
                         "(repeatable), e.g. node.comm_core_share=0.63; the microbenchmark files keep the measured ones")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    what_if = tuple(arg for value in args.set for arg in ("--set", value))
    try:
        return _run(ap, args, what_if)
    except TwinFailed as e:  # a bad --set, a saved file this twin cannot read: its one line, exit 2
        ap.error(str(e).removeprefix("twin: error: "))


def _run(ap: argparse.ArgumentParser, args: argparse.Namespace, what_if: tuple[str, ...]) -> int:
    for flag, value in (("--launches", args.launches), ("--calibration-launches", args.calibration_launches)):
        if value < 1:
            ap.error(f"{flag} {value}: at least 1")
    start = time.perf_counter()
    files = {n: os.path.join(args.out, f"local-{n}.toml") for n in (2, 4)}
    runs = os.path.join(args.out, "calibration-runs.json")
    held_path = os.path.join(args.out, "held-out-runs.json")
    if args.reuse:
        saved = [p.replace(".toml", ".calibration.json") for p in files.values()] + [runs, held_path]
        missing = next((p for p in saved if not os.path.exists(p)), None)
        if missing:
            ap.error(f"--reuse: {missing} is missing; run fit_local.py --out {args.out} without --reuse first")
        for path in files.values():
            refit_saved(path.replace(".toml", ".calibration.json"), path)
    else:
        os.makedirs(args.out, exist_ok=True)
        for n, path in files.items():
            print(f"calibrating {n} ranks -> {path}", file=sys.stderr)
            if args.quiet_wait > 0:
                wait_for_quiet(max_wait_s=args.quiet_wait)
            calibrate_host(n, path, os.path.join(args.out, f"calibrate-{n}"), WorkerOptions(steps=3, warmup=1),
                           launches=args.calibration_launches,
                           on_launch=lambda k, s: print(f"  launch {k} of {args.calibration_launches} ({s:.0f} s)",
                                                        file=sys.stderr))
        calibration = (measure(ONE_RANK, 1, files[2], args.out, args.steps, args.quiet_wait)
                       + measure([(m, p, b) for m, p, b in PLANS[2]], 2, files[2], args.out, args.steps,
                                 args.quiet_wait))
        Path(runs).write_text(json.dumps(calibration, indent=1))
    fit, left_out, fitted = fit_and_carry(files, runs, what_if)

    if not args.reuse:
        held = median_launches([measure([(m, p, b) for m, p, b in PLANS[4]], 4, files[4],
                                        os.path.join(args.out, f"launch-{k + 1}"), args.steps, args.quiet_wait)
                                for k in range(args.launches)])
        Path(held_path).write_text(json.dumps(held, indent=1))
    machines = ("--machine", files[4]) + (("--machine", fitted[4]) if fit is not None else ())
    table = twin_json("validate", "--runs", held_path, *machines, *what_if, "--json")
    doc = {"fit": fit, "left_out": left_out, "held_out": table, "host": measured_on(files[4]),
           "wall_s": time.perf_counter() - start}
    Path(os.path.join(args.out, "results.json")).write_text(json.dumps(doc, indent=1))
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print_fit(fit, left_out)
    micro, carried = (table["machines"] * 2)[:2]  # one machine twice where nothing was fitted
    names = [row["what"] for row in table["rows"]]  # the schedule, without the file's entry
    width = max(len("held out: 4 ranks"), *map(len, names)) + 2
    print(f"\n{'held out: 4 ranks':<{width}}{'measured':>10}{'microbenchmarks':>22}{'fitted on 1-2 ranks':>24}")
    for name, row in zip(names, table["rows"]):
        print(f"{name:<{width}}{1e3 * row['measured_s']:>8.1f}ms"
              + "".join(f"{1e3 * row['predicted_s'][n]:>13.1f} ({row['error_pct'][n]:+6.1f}%)" for n in (micro, carried)))
    s = table["summary"]
    print(f"\nmean absolute step-time error over {len(table['rows'])} held-out plans: microbenchmarks "
          f"{s[micro]['mean_abs_pct']:.1f}%, fitted on 1-2 ranks {s[carried]['mean_abs_pct']:.1f}% (target <= 5%); "
          f"measured on {doc['host']}; wall {doc['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
