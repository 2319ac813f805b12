"""What the time-slicing lag changes on fit_local's held-out plans: the same measurements, with and without it.

    .venv/bin/python benchmarks/timeslice_lag.py [--out out/fit_local]

After `benchmarks/fit_local.py` (whose OUT folder this reads, nothing is
measured here): the 4-rank calibration's own samples are fitted again as if
the host had a core per rank (`executor.calibrate.fit(oversubscribed=False)`:
the lag stays inside the collectives' latency) and written with
`node.timeslice_skew` 0, fit_local's 1-2 rank fit is carried to that file as
to the other, and `twin validate --runs OUT/held-out-runs.json` predicts the
held-out plans on all four files. A comparison of models on identical
measurements, so the host's launch-to-launch noise does not enter it
(docs/fit.md, "The last rank of an oversubscribed host").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor.calibrate import Sample, fit  # noqa: E402
from executor.machinefile import write_machine  # noqa: E402
from fit_local import twin_json  # noqa: E402


def without_lag(calibration_json: str, output: str) -> float:
    """Write the calibration's machine file as if nothing lagged; return the lag it measured."""
    doc = json.loads(Path(calibration_json).read_text())
    samples = [Sample(**s) for s in doc["samples"]]
    one_per_core = dataclasses.replace(fit(samples, oversubscribed=False), timeslice_skew=0.0)
    write_machine(output, one_per_core, samples, doc["host"], doc["dtype"], doc["date"])
    return doc["fit"]["timeslice_skew"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/fit_local", help="benchmarks/fit_local.py's folder (default out/fit_local)")
    args = ap.parse_args(argv)
    o = args.out
    results = Path(o, "results.json")
    if not results.exists():
        ap.error(f"--out {o}: no results.json; run benchmarks/fit_local.py (--out {o}) first")
    fitted = json.loads(results.read_text())["fit"]
    lag = without_lag(os.path.join(o, "local-4.calibration.json"), os.path.join(o, "local-4-nolag.toml"))
    files = {"with the lag": [os.path.join(o, "local-4.toml")], "without": [os.path.join(o, "local-4-nolag.toml")]}
    if fitted is not None:
        params = ",".join(p["path"] for p in fitted["parameters"])
        twin_json("fit", "--machine", files["without"][0], "--from", os.path.join(o, "local-2-fitted.toml"),
                  "--params", params, "-o", os.path.join(o, "local-4-nolag-fitted.toml"), "--json")
        files["with the lag"].append(os.path.join(o, "local-4-fitted.toml"))
        files["without"].append(os.path.join(o, "local-4-nolag-fitted.toml"))
    every = [path for paths in files.values() for path in paths]
    table = twin_json("validate", "--runs", os.path.join(o, "held-out-runs.json"),
                      *[a for path in every for a in ("--machine", path)], "--json")
    print(f"held-out 4-rank plans of {o}, the 4-rank calibration's lag {lag:.3f} (node.timeslice_skew)")
    print(f"{'mean absolute step-time error':<34}{'without the lag':>18}{'with it':>10}")
    for k, what in enumerate(("microbenchmarks", "fitted on 1-2 ranks")[:len(files["without"])]):
        errors = [table["summary"][files[column][k]]["mean_abs_pct"] for column in ("without", "with the lag")]
        print(f"{what:<34}{errors[0]:>17.1f}%{errors[1]:>9.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
