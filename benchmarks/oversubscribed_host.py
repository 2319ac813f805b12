"""What the oversubscribed host's numbers change on fit_local's held-out plans: the same measurements, each way.

    .venv/bin/python benchmarks/oversubscribed_host.py [--out out/fit_local]

After `benchmarks/fit_local.py` (whose OUT folder this reads; nothing is
measured here). A 2-core host running 4 ranks has two effects its
calibration measures (docs/fit.md, "The oversubscribed host"): the last
rank lags at a synchronisation (`node.timeslice_skew`), a collective
runs longer while every rank computes (`node.comm_stretch_under_compute`),
and a small one's latency barely moves while its own ranks compute
(`node.comm_latency_pace_under_compute`; without it the latency is
stretched as the bytes are). The 4-rank calibration's own samples are
fitted again with each effect on or off (off: `executor.calibrate.fit
(oversubscribed=False)` leaves the lag inside the collectives' latency, and
the number is written as 0, 1 or not at all),
fit_local's 1-2 rank fit is carried to each file, and `twin validate --runs
OUT/held-out-runs.json` predicts the held-out plans on all of them: a
comparison of models on identical measurements, so the host's
launch-to-launch noise does not enter it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from executor.calibrate_host import refit_saved  # noqa: E402
from fit_local import carry_fit, twin_json  # noqa: E402

# (the lag, the stretch, the latency's pace)
VARIANTS = {"neither": (False, False, False), "the lag": (True, False, False), "the stretch": (False, True, False),
            "both": (True, True, False), "all three": (True, True, True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="out/fit_local", help="benchmarks/fit_local.py's folder (default out/fit_local)")
    args = ap.parse_args(argv)
    o = args.out
    results = Path(o, "results.json")
    if not results.exists():
        ap.error(f"--out {o}: no results.json; run benchmarks/fit_local.py (--out {o}) first")
    carried = json.loads(results.read_text())["fit"]
    files: dict[str, list[str]] = {}
    fits = {}
    for name, (lag, stretch, latency) in VARIANTS.items():
        path = os.path.join(o, f"local-4-{name.replace(' ', '-')}.toml")
        fits[name] = refit_saved(os.path.join(o, "local-4.calibration.json"), path, lag, stretch, latency=latency)
        files[name] = [path]
        if carried is not None:
            carry_fit(carried, path, os.path.join(o, "local-2-fitted.toml"), path.replace(".toml", "-fitted.toml"))
            files[name].append(path.replace(".toml", "-fitted.toml"))
    every = [path for paths in files.values() for path in paths]
    table = twin_json("validate", "--runs", os.path.join(o, "held-out-runs.json"),
                      *[a for path in every for a in ("--machine", path)], "--json")
    measured = fits["all three"]  # every number as the calibration measured it
    pace = measured.comm_latency_pace_under_compute
    print(f"held-out 4-rank plans of {o}; the 4-rank calibration measured a lag of {measured.timeslice_skew:.3f}, "
          f"a stretch of {measured.comm_stretch_under_compute:.2f} and a latency pace of "
          + (f"{pace:.2f}" if pace is not None else "- (not in this calibration: 'all three' is 'both')"))
    columns = ("microbenchmarks", "fitted on 1-2 ranks")[:len(files["both"])]
    print(f"{'modelled':<14}" + "".join(f"{c:>22}" for c in columns))
    for name, paths in files.items():
        print(f"{name:<14}" + "".join(f"{table['summary'][p]['mean_abs_pct']:>21.1f}%" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
