"""Calibrate this host: run the microbenchmarks with the executor, fit them, write the machine file.

The orchestration apart from executor.calibrate (the microbenchmark schedule and the fit, pure functions),
executor.calibration_samples (timestamps and launches into samples)
and executor.machinefile (the file it writes, which needs the fit's types): so neither imports the other's
caller, and the import graph has no cycle (tests/test_import_graph.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import replace

from executor.calibrate import REPEATS, Fit, calibration_schedule, fit
from executor.calibration_report import SPREAD_FIELDS, oversubscribed
from executor.calibration_samples import Sample, collect, combine_launches


def calibrate_host(nproc: int, output: str, out_dir: str, opts, repeats: int = REPEATS,
                   wall_limit_s: float = 900.0, launches: int = 1,
                   on_launch: Callable[[int, float], None] | None = None) -> tuple[Fit, dict, object]:
    """Run the microbenchmarks on `nproc` local ranks (`opts`: executor.launch.WorkerOptions) `launches` times,
    fit the median of the launches (calibration_samples.combine_launches), write `output` and its calibration
    JSON (with each launch's samples where there are several). `on_launch(k, seconds)` is told when launch k
    (from 1) has been measured. Returns (fit, the JSON document, the last launch's executor.measured.Measured run)."""
    from executor.launch import run_local
    from executor.machinefile import host_description, write_machine
    from executor.measured import load_measured
    from twin.ir_io import save_schedule

    os.makedirs(out_dir, exist_ok=True)
    schedule, what = calibration_schedule(nproc, repeats)
    path = os.path.join(out_dir, "calibration-schedule.json")
    save_schedule(schedule, path)
    per_launch = []
    for k, launch_dir in enumerate(launch_dirs(out_dir, launches), start=1):
        start = time.perf_counter()
        run_local(schedule, path, nproc, launch_dir, opts, wall_limit_s)
        measured = load_measured(launch_dir, schedule)
        per_launch.append(collect(list(measured.steps), what, schedule.program_of()))
        if on_launch is not None:
            on_launch(k, time.perf_counter() - start)
    samples = combine_launches(per_launch)
    host = {**host_description(nproc), "compute_nice": getattr(opts, "compute_nice", 0), "launches": launches}
    fitted = fit(samples, oversubscribed=oversubscribed(host), cores=host["logical_cpus"])
    doc = write_machine(output, fitted, samples, host, measured.dtype,
                        launch_samples=per_launch if launches > 1 else None,
                        spread=launch_spread(per_launch, host) if launches > 1 else None)
    return fitted, doc, measured


def launch_spread(per_launch: list[list[Sample]], host: dict) -> dict[str, list[float]]:
    """Each launch fitted alone: the lowest and highest value of each of SPREAD_FIELDS (in its unit) over the
    launches, so a calibration says how far its numbers are from reproducible (on this project's 2-core host,
    one 4-rank calibration's launches put the ring's hop latency at 407-822 us and the lag's floor at
    1.9-4.0 ms, in opposite order, while the fit took that lag out of collectives measured after a GEMM;
    434-647 us once they followed a synchronisation: docs/fit.md). The file itself fits the launches' median
    (calibration_samples.combine_launches), which this leaves as it is."""
    fits = [fit(launch, oversubscribed=oversubscribed(host), cores=host["logical_cpus"]) for launch in per_launch]
    spread = {}
    for label, name, scale, _ in SPREAD_FIELDS:
        values = [getattr(f, name) for f in fits if getattr(f, name) is not None]
        if values:
            spread[label] = [min(values) * scale, max(values) * scale]
    return spread


SAVED_KEYS = ("host", "date", "dtype", "samples")  # what a calibration JSON must hold to be fitted again


def load_saved(calibration_json: str) -> dict:
    """A calibration's saved JSON (NAME.calibration.json, written beside its machine file), checked: a TwinError
    of one line naming what is wrong where it cannot be fitted again."""
    from twin.errors import TwinError

    try:
        with open(calibration_json) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise TwinError(f"--refit: {calibration_json} not found; give the NAME.calibration.json that twin calibrate "
                        "wrote beside its machine file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TwinError(f"--refit: cannot read {calibration_json} as JSON ({e}); give the NAME.calibration.json "
                        "that twin calibrate wrote") from None
    missing = [k for k in SAVED_KEYS if not isinstance(doc, dict) or k not in doc]
    if missing:
        raise TwinError(f"--refit: {calibration_json} has no {', '.join(missing)}: not a calibration's measurements "
                        "(twin calibrate writes them as NAME.calibration.json beside the machine file)")
    try:
        [Sample(**s) for s in doc["samples"]]
        if not {"nproc", "logical_cpus"} <= set(doc["host"]):
            raise TypeError("host lacks nproc or logical_cpus")
    except TypeError as e:
        raise TwinError(f"--refit: {calibration_json}'s samples or host are not this version's ({e}); "
                        "calibrate again (twin calibrate)") from None
    return doc


def refit_saved(calibration_json: str, output: str, lag: bool = True, stretch: bool = True,
                launches: list[int] | None = None, latency: bool = True) -> Fit:
    """Fit a saved calibration's samples (NAME.calibration.json) again with this code and write the machine
    file, nothing measured: what a change of the fit does to the same measurements. `lag`, `stretch` or
    `latency` False writes that number of an oversubscribed host as if not measured (the lag then stays in the
    collectives' latency; a latency unmeasured is stretched as the bytes are): benchmarks/oversubscribed_host.py
    compares them. Where the file kept each launch's samples,
    they are combined again (those whose 0-based indices `launches` lists; None: all), so one launch can be set
    beside the median of several on the same measurements (benchmarks/calibration_launches.py)."""
    return refit_document(load_saved(calibration_json), output, lag, stretch, launches, latency)[0]


def refit_document(doc: dict, output: str, lag: bool = True, stretch: bool = True,
                   launches: list[int] | None = None, latency: bool = True) -> tuple[Fit, dict]:
    """refit_saved on a loaded document (load_saved); returns the fit and the JSON document written beside
    `output` (`twin calibrate --refit`)."""
    from executor.machinefile import write_machine

    kept = doc.get("launch_samples")
    if kept:
        chosen = range(len(kept)) if launches is None else launches
        per_launch = [[Sample(**s) for s in kept[i]] for i in chosen]
        samples = combine_launches(per_launch)
    else:
        per_launch, samples = None, [Sample(**s) for s in doc["samples"]]
    host = {**doc["host"], "launches": len(per_launch) if per_launch else doc["host"].get("launches", 1)}
    fitted = fit(samples, oversubscribed=lag and oversubscribed(host), cores=host["logical_cpus"])
    fitted = replace(fitted, timeslice_skew=fitted.timeslice_skew if lag else 0.0,
                     timeslice_lag_s=fitted.timeslice_lag_s if lag else 0.0,
                     timeslice_lag_after_s=fitted.timeslice_lag_after_s if lag else 0.0,
                     timeslice_lag_span_s=fitted.timeslice_lag_span_s if lag else 0.0,
                     timeslice_skew_beyond_span=fitted.timeslice_skew_beyond_span if lag else None,
                     comm_stretch_under_compute=fitted.comm_stretch_under_compute if stretch else 1.0,
                     comm_latency_pace_under_compute=fitted.comm_latency_pace_under_compute if latency else None)
    several = per_launch is not None and len(per_launch) > 1
    written = write_machine(output, fitted, samples, host, doc["dtype"], doc["date"],
                            launch_samples=per_launch if several else None,
                            spread=launch_spread(per_launch, host) if several else None)
    return fitted, written


def launch_dirs(out_dir: str, launches: int) -> list[str]:
    """Where each launch of calibrate_host writes its ranks' files: OUT itself for one, OUT/launch-K for several."""
    return [out_dir] if launches == 1 else [os.path.join(out_dir, f"launch-{k + 1}") for k in range(launches)]
