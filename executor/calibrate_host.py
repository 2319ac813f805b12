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
    fitted = fit(samples, oversubscribed=_oversubscribed(host), cores=host["logical_cpus"])
    doc = write_machine(output, fitted, samples, host, measured.dtype,
                        launch_samples=per_launch if launches > 1 else None)
    return fitted, doc, measured


def refit_saved(calibration_json: str, output: str, lag: bool = True, stretch: bool = True,
                launches: list[int] | None = None, latency: bool = True) -> Fit:
    """Fit a saved calibration's samples (NAME.calibration.json) again with this code and write the machine
    file, nothing measured: what a change of the fit does to the same measurements. `lag`, `stretch` or
    `latency` False writes that number of an oversubscribed host as if not measured (the lag then stays in the
    collectives' latency; a latency unmeasured is stretched as the bytes are): benchmarks/oversubscribed_host.py
    compares them. Where the file kept each launch's samples,
    they are combined again (those whose 0-based indices `launches` lists; None: all), so one launch can be set
    beside the median of several on the same measurements (benchmarks/calibration_launches.py)."""
    from executor.machinefile import write_machine

    with open(calibration_json) as f:
        doc = json.load(f)
    kept = doc.get("launch_samples")
    if kept:
        chosen = range(len(kept)) if launches is None else launches
        per_launch = [[Sample(**s) for s in kept[i]] for i in chosen]
        samples = combine_launches(per_launch)
    else:
        per_launch, samples = None, [Sample(**s) for s in doc["samples"]]
    host = {**doc["host"], "launches": len(per_launch) if per_launch else doc["host"].get("launches", 1)}
    fitted = fit(samples, oversubscribed=lag and _oversubscribed(host), cores=host["logical_cpus"])
    fitted = replace(fitted, timeslice_skew=fitted.timeslice_skew if lag else 0.0,
                     timeslice_lag_s=fitted.timeslice_lag_s if lag else 0.0,
                     timeslice_lag_after_s=fitted.timeslice_lag_after_s if lag else 0.0,
                     comm_stretch_under_compute=fitted.comm_stretch_under_compute if stretch else 1.0,
                     comm_latency_pace_under_compute=fitted.comm_latency_pace_under_compute if latency else None)
    write_machine(output, fitted, samples, host, doc["dtype"], doc["date"],
                  launch_samples=per_launch if per_launch and len(per_launch) > 1 else None)
    return fitted


def launch_dirs(out_dir: str, launches: int) -> list[str]:
    """Where each launch of calibrate_host writes its ranks' files: OUT itself for one, OUT/launch-K for several."""
    return [out_dir] if launches == 1 else [os.path.join(out_dir, f"launch-{k + 1}") for k in range(launches)]


def _oversubscribed(host: dict) -> bool:
    """At least as many ranks as the host's logical CPUs: where the simulator applies the time-slicing lag
    (ranks computing on every core drift apart: twin.sim.compute_unit.NodeCores)."""
    return host["nproc"] >= host["logical_cpus"]
