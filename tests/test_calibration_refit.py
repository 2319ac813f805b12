"""`twin calibrate --refit`: a saved calibration's measurements fitted again, nothing measured; and the committed
topologies/local.toml is what this version fits from the measurements saved beside it."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from test_calibration_fit import known_parameters, synthetic_samples
from twin.cli import main

ROOT = Path(__file__).resolve().parent.parent


def _values(node, prefix: str = "") -> dict[str, float]:
    """Every number of a machine file, by dotted path (the `value` of each inline table, and plain numbers)."""
    out: dict[str, float] = {}
    if isinstance(node, dict):
        if "value" in node and isinstance(node["value"], (int, float)):
            out[prefix] = float(node["value"])
        for key, child in node.items():
            out.update(_values(child, f"{prefix}.{key}" if prefix else key))
    elif isinstance(node, list):
        for i, child in enumerate(node):
            out.update(_values(child, f"{prefix}[{i}]"))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        out[prefix] = float(node)
    return out


def test_the_committed_local_machine_is_what_this_version_fits_from_its_saved_measurements(tmp_path):
    """A change to `twin calibrate`'s fit must refit topologies/local.toml (`twin calibrate --refit
    topologies/local.calibration.json -o topologies/local.toml`): no number of the built-in `local` machine is
    one that no command of this version gives."""
    from executor.calibrate_host import refit_saved

    refit_saved(str(ROOT / "topologies" / "local.calibration.json"), str(tmp_path / "local.toml"))
    committed = _values(tomllib.loads((ROOT / "topologies" / "local.toml").read_text()))
    refitted = _values(tomllib.loads((tmp_path / "local.toml").read_text()))
    assert committed.keys() == refitted.keys()
    differ = {k: (committed[k], refitted[k]) for k in committed if committed[k] != pytest.approx(refitted[k], rel=1e-5)}
    assert not differ, f"topologies/local.toml is not this version's fit of its measurements: {differ}"


def _saved(tmp_path: Path) -> Path:
    """A calibration's saved measurements (synthetic, from known parameters), as twin calibrate writes them."""
    from executor import calibrate as cal
    from executor.machinefile import write_machine

    samples = synthetic_samples(known_parameters())
    host = {"cpu": "test CPU", "logical_cpus": 2, "memory_bytes": 16e9, "nproc": 4, "hostname": "h"}
    write_machine(str(tmp_path / "saved.toml"), cal.fit(samples), samples, host, "float32", "2026-01-01")
    return tmp_path / "saved.calibration.json"


def test_refit_writes_the_machine_file_and_keeps_the_measurements(tmp_path, capsys):
    saved = _saved(tmp_path)
    out = tmp_path / "again.toml"
    assert main(["calibrate", "--refit", str(saved), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "fitted again by this version, nothing measured" in printed and "GEMM 100.0 GF/s per rank" in printed
    before, after = json.loads(saved.read_text()), json.loads((tmp_path / "again.calibration.json").read_text())
    assert after["samples"] == before["samples"] and after["date"] == before["date"] == "2026-01-01"
    assert _values(tomllib.loads(out.read_text())) == _values(tomllib.loads((tmp_path / "saved.toml").read_text()))
    # in place: the measurements file is both read and rewritten, and keeps its measurements
    assert main(["calibrate", "--refit", str(saved), "-o", str(tmp_path / "saved.toml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["refit"] == str(saved)
    assert json.loads(saved.read_text())["samples"] == before["samples"]


@pytest.mark.parametrize("content, expected", [
    (None, "not found"),
    ("{not json", "cannot read"),
    ('{"host": {}, "date": "2026-01-01"}', "has no dtype, samples"),
    ('{"host": {"nproc": 4}, "date": "d", "dtype": "float32", "samples": []}', "not this version's"),
    ('{"host": {}, "date": "d", "dtype": "float32", "samples": [{"colour": 1}]}', "not this version's"),
])
def test_refit_refuses_what_is_not_a_calibrations_measurements_in_one_line(tmp_path, capsys, content, expected):
    saved = tmp_path / "x.calibration.json"
    if content is not None:
        saved.write_text(content)
    out = tmp_path / "out.toml"
    assert main(["calibrate", "--refit", str(saved), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--refit" in err[0] and expected in err[0]
    assert not out.exists() and not (tmp_path / "out.calibration.json").exists()


def test_a_calibration_of_several_launches_says_how_far_each_launch_alone_puts_its_numbers(tmp_path, capsys):
    """executor.calibrate_host.launch_spread: each launch fitted alone, the lowest and highest of each number, in
    the calibration document and in what `twin calibrate` prints; the file still fits their median."""
    from dataclasses import replace

    from executor import calibrate as cal
    from executor import calibration_samples as samples
    from executor.calibrate_host import launch_spread
    from executor.machinefile import write_machine

    truth = known_parameters()
    launches = [synthetic_samples(truth), [replace(s, time_s=2 * s.time_s) for s in synthetic_samples(truth)],
                synthetic_samples(truth)]
    host = {"cpu": "test CPU", "logical_cpus": 2, "memory_bytes": 16e9, "nproc": 4, "hostname": "h"}
    spread = launch_spread(launches, host)
    assert spread["GEMM"] == pytest.approx([truth["rate"] / 2e9, truth["rate"] / 1e9], rel=1e-3)
    assert spread["copy"] == pytest.approx([truth["bw"] / 2e9, truth["bw"] / 1e9], rel=1e-3)
    combined = samples.combine_launches(launches)
    write_machine(str(tmp_path / "saved.toml"), cal.fit(combined), combined, host, "float32", "2026-01-01", launches)
    assert main(["calibrate", "--refit", str(tmp_path / "saved.calibration.json"), "-o", str(tmp_path / "a.toml")]) == 0
    printed = capsys.readouterr().out
    assert "each launch fitted alone (the file fits their median): GEMM 50-100 GF/s, copy 5-10 GB/s" in printed
    assert "GEMM 100.0 GF/s per rank" in printed  # the median outvotes the doubled launch
    assert json.loads((tmp_path / "a.calibration.json").read_text())["launch_spread"]["GEMM"] == spread["GEMM"]


def test_collectives_are_measured_after_a_synchronisation_and_keep_their_time_in_the_fit():
    """A collective microbenchmark follows a synchronisation of every rank, not a GEMM, so that its time holds
    no time-slicing lag and the fit takes none out (the lag and the ring's latency traded off launch by launch
    when it did); a calibration saved before, whose collectives followed a LEAD_GEMM (no "after" in their
    params), still has that lag taken out where ranks >= cores."""
    from dataclasses import replace

    from executor import calibrate as cal
    from twin.ir import Collective

    schedule, what = cal.calibration_schedule(4, repeats=1)
    ops = schedule.programs[0].ops
    index = {op.id: i for i, op in enumerate(ops)}
    measured = [op_id for op_id, (kind, _) in what.items() if kind == "collective"]
    assert measured and all(what[i][1]["after"] == cal.COLLECTIVES_AFTER == "sync" for i in measured)
    for op_id in measured:
        before = [op for op in ops[:index[op_id]] if isinstance(op.work, Collective)][-1]
        assert before.work.group == "g4" and before.work.nbytes == 4 and before.name.endswith(".before")
    truth = known_parameters(skew=0.25, sync_base=400e-6, stretch=3.5)
    older = synthetic_samples(truth)  # each collective's time holds the lag behind the lead GEMM
    lead_s = next(s.time_s for s in older if s.kind == "skew_lead" and s.params == dict(zip("mnk", cal.LEAD_GEMM)))
    together = [replace(s, params={**s.params, "after": "sync"}, time_s=s.time_s - 0.25 * lead_s)
                if s.kind == "collective" else s for s in older]
    for samples, lead_skew in ((older, 0.25 * lead_s), (together, 0.0)):
        f = cal.fit(samples, oversubscribed=True)
        assert f.lead_skew_s == pytest.approx(lead_skew, rel=1e-6)
        assert (f.base_latency_s, f.hop_latency_s, f.port_bw_bytes_per_s) == pytest.approx((100e-6, 50e-6, 1e9),
                                                                                            rel=1e-3)
