"""Which calibration launch: each 4-rank calibration launch alone beside each round of fit_local's held-out runs.

    .venv/bin/python benchmarks/calibration_drift.py [--out out/fit_local] [--out ...] [--json]

After `benchmarks/fit_local.py --launches K --out OUT` (K of at least 2); measures nothing. fit_local
calibrates 4 ranks with --calibration-launches launches, then measures every held-out plan in K rounds
(OUT/launch-R/). Here each calibration launch alone is fitted again (executor.calibrate_host.refit_saved,
launches=[L]), what the fit on 1-2 ranks learned is carried to it as fit_local carries it (the parameters in
OUT/results.json, `twin fit --from OUT/local-2-fitted.toml`), and each round's runs are predicted on each
such file (`twin validate --runs`): a matrix of mean absolute step errors, calibration launch by round, and
beside it the same for the file fit_local compared (fitted to the launches' median).

How to read it: where the rows differ, one launch of the microbenchmarks says something another does not (the
host's time-slicing moved between them, or their scatter decides a number the fit cannot pin down); where the
columns differ, the runs moved. The error of one launch's file is not the protocol's result; fit_local's
median file is. The forty-eighth session's reading (docs/fit.md): on out/fit_local_s47c the launches alone give
4.7-7.1%, 12.4-16.5% and 12.7-16.5% over the three rounds, their median 10.4-14.1%.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor.calibrate_host import refit_saved  # noqa: E402
from fit_local import carry_fit, twin_json  # noqa: E402
from rank_drift import folders_parser  # noqa: E402


def round_runs(folder: Path) -> list[list[dict]]:
    """Each round's `twin run --json` summaries (launch-R order), each naming the schedule exported beside it."""
    rounds = []
    for launch in sorted(folder.glob("launch-*"), key=lambda p: int(p.name.split("-")[1])):
        summaries = [{**json.loads(s.read_text()), "schedule": str(s.parent.with_suffix(".json"))}
                     for s in sorted(launch.glob("*/summary.json"))]
        if summaries:
            rounds.append(summaries)
    return rounds


def launch_files(folder: Path, fit: dict | None, work: str) -> list[str]:
    """One 4-rank machine file per calibration launch, in `work`, carrying what fit_local's fit learned (`fit`:
    OUT/results.json's; None where it learned nothing)."""
    saved = folder / "local-4.calibration.json"
    count = len(json.loads(saved.read_text()).get("launch_samples") or [])
    files = []
    for launch in range(count):
        path = os.path.join(work, f"local-4-L{launch + 1}.toml")
        refit_saved(str(saved), path, launches=[launch])
        if fit is not None:
            fitted = path.replace(".toml", "-fitted.toml")
            carry_fit(fit, path, str(folder / "local-2-fitted.toml"), fitted)
            path = fitted
        files.append(path)
    return files


def drift(folder: Path) -> dict:
    """The matrix of one folder: {"rows": calibration launches then "median", "rounds": K, "errors": mean |error|
    per row and round}; ValueError where the folder lacks rounds."""
    rounds = round_runs(folder)
    has_results = (folder / "results.json").exists()
    if len(rounds) < 2 or not has_results:
        raise ValueError(f"{folder} has {len(rounds)} round(s) of held-out runs and {'a' if has_results else 'no'} "
                         f"results.json; run benchmarks/fit_local.py --launches 3 --out {folder} first")
    fit = json.loads((folder / "results.json").read_text()).get("fit")
    median = folder / ("local-4-fitted.toml" if fit else "local-4.toml")
    with tempfile.TemporaryDirectory() as work:
        files = launch_files(folder, fit, work) + [str(median)]
        errors = []
        for k, summaries in enumerate(rounds):
            runs = os.path.join(work, f"round-{k + 1}.json")
            Path(runs).write_text(json.dumps(summaries))
            table = twin_json("validate", "--runs", runs, *(a for f in files for a in ("--machine", f)), "--json")
            errors.append([table["summary"][name]["mean_abs_pct"] for name in table["machines"]])
    names = [f"launch {i + 1}" for i in range(len(files) - 1)] + ["median"]
    return {"rows": names, "rounds": len(rounds),
            "errors": [[errors[k][i] for k in range(len(rounds))] for i in range(len(names))]}


def launch_range(doc: dict) -> tuple[float, float, float]:
    """(lowest, highest) mean over the rounds of one launch's file, and the median file's mean."""
    means = [sum(row) / len(row) for row in doc["errors"]]
    return min(means[:-1]), max(means[:-1]), means[-1]


def main(argv: list[str] | None = None) -> int:
    ap = folders_parser(__doc__)
    args = ap.parse_args(argv)
    try:
        doc = {folder: drift(Path(folder)) for folder in args.out or ["out/fit_local"]}
    except ValueError as e:
        ap.error(str(e))
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    for folder, d in doc.items():
        print(f"{folder}: mean |step error| of the 4-rank plans, by calibration launch (rows) and round of runs")
        print(f"  {'file':<10}" + "".join(f"{'round ' + str(k + 1):>10}" for k in range(d["rounds"])))
        for name, row in zip(d["rows"], d["errors"]):
            print(f"  {name:<10}" + "".join(f"{e:>9.1f}%" for e in row))
        low, high, median = launch_range(d)
        print(f"  over the rounds: one launch's file {low:.1f}-{high:.1f}%, the median file {median:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
