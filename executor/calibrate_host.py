"""Calibrate this host: run the microbenchmarks with the executor, fit them, write the machine file.

The orchestration apart from executor.calibrate (the microbenchmark schedule and the fit, pure functions)
and executor.machinefile (the file it writes, which needs the fit's types): so neither imports the other's
caller, and the import graph has no cycle (tests/test_import_graph.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

from executor.calibrate import REPEATS, Fit, Sample, calibration_schedule, collect, fit


def calibrate_host(nproc: int, output: str, out_dir: str, opts, repeats: int = REPEATS,
                   wall_limit_s: float = 900.0) -> tuple[Fit, dict, object]:
    """Run the microbenchmarks on `nproc` local ranks (`opts`: executor.launch.WorkerOptions), fit, write
    `output` and its calibration JSON. Returns (fit, the JSON document, the executor.measured.Measured run)."""
    from executor.launch import run_local
    from executor.machinefile import host_description, write_machine
    from executor.measured import load_measured
    from twin.ir_io import save_schedule

    os.makedirs(out_dir, exist_ok=True)
    schedule, what = calibration_schedule(nproc, repeats)
    path = os.path.join(out_dir, "calibration-schedule.json")
    save_schedule(schedule, path)
    run_local(schedule, path, nproc, out_dir, opts, wall_limit_s)
    measured = load_measured(out_dir, schedule)
    samples = collect(list(measured.steps), what)
    host = {**host_description(nproc), "compute_nice": getattr(opts, "compute_nice", 0)}
    fitted = fit(samples, oversubscribed=_oversubscribed(host))
    doc = write_machine(output, fitted, samples, host, measured.dtype)
    return fitted, doc, measured


def refit_saved(calibration_json: str, output: str, lag: bool = True, stretch: bool = True) -> Fit:
    """Fit a saved calibration's samples (NAME.calibration.json) again with this code and write the machine
    file, nothing measured: what a change of the fit does to the same measurements. `lag` or `stretch` False
    writes that number of an oversubscribed host as if not measured (the lag then stays in the collectives'
    latency): benchmarks/oversubscribed_host.py compares the four."""
    from executor.machinefile import write_machine

    with open(calibration_json) as f:
        doc = json.load(f)
    samples = [Sample(**s) for s in doc["samples"]]
    host = doc["host"]
    fitted = fit(samples, oversubscribed=lag and _oversubscribed(host))
    fitted = replace(fitted, timeslice_skew=fitted.timeslice_skew if lag else 0.0,
                     comm_stretch_under_compute=fitted.comm_stretch_under_compute if stretch else 1.0)
    write_machine(output, fitted, samples, host, doc["dtype"], doc["date"])
    return fitted


def _oversubscribed(host: dict) -> bool:
    """More ranks than the host's logical CPUs: where the simulator applies the time-slicing lag."""
    return host["nproc"] > host["logical_cpus"]
