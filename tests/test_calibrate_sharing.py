"""The calibration's numbers for ranks that share cores (executor.calibrate_sharing): a small all-reduce's
latency pace under its ranks' GEMMs, from hand-made samples, and through the fit to the machine file."""

from __future__ import annotations

import pytest

from executor.calibrate_sharing import latency_pace
from executor.calibration_samples import Sample
from test_calibration_fit import known_parameters, synthetic_samples
from topologies.machine import load_machine


def _latency_samples(alone_s: float, during_s: float, gemm_s: float, gemms: int = 4) -> list[Sample]:
    params = {"nbytes": 4096, "group_size": 4}
    return [Sample("latency_comm_alone", params, alone_s), Sample("latency_comm", {**params, "gemms": gemms}, during_s),
            Sample("latency_gemm", {"m": 256, "n": 512, "k": 512}, gemm_s)]


def _by_kind(samples: list[Sample]) -> dict[str, list[Sample]]:
    by: dict[str, list[Sample]] = {}
    for s in samples:
        by.setdefault(s.kind, []).append(s)
    return by


@pytest.mark.parametrize("alone, during, pace", [
    (4e-3, 8e-3 + 3e-3, 1e-3 / 8e-3),  # ended 3 ms after 8 ms of GEMMs: 1 ms of its 4 went by under them
    (4e-3, 8e-3 + 4.5e-3, 0.0),  # ended later than its time alone after them: nothing went by (not below 0)
    (4e-3, 5e-3, 0.8),  # ended inside the GEMMs: its time alone over its time
    (4e-3, 3e-3, 1.0),  # faster than alone (noise): never above its pace alone
])
def test_the_latency_pace_is_what_went_by_under_the_gemms(alone, during, pace):
    assert latency_pace(_by_kind(_latency_samples(alone, during, 2e-3))) == pytest.approx(pace)


def test_without_the_measurements_the_pace_is_unmeasured():
    assert latency_pace(_by_kind(_latency_samples(4e-3, 5e-3, 2e-3)[:2])) is None
    assert latency_pace({}) is None


def test_the_fit_writes_the_pace_into_the_machine_file_and_leaves_it_out_unmeasured(tmp_path):
    from executor import calibrate as cal
    from executor.machinefile import write_machine

    host = {"cpu": "test CPU", "logical_cpus": 2, "memory_bytes": 16e9, "nproc": 4, "hostname": "h"}
    for name, more, expected in (("measured", {"latency_pace": 0.125}, 0.125), ("unmeasured", {}, None)):
        samples = synthetic_samples(known_parameters(stretch=3.5, **more))
        f = cal.fit(samples, oversubscribed=True)
        assert f.comm_latency_pace_under_compute == pytest.approx(expected)
        path = tmp_path / f"{name}.toml"
        write_machine(str(path), f, samples, host, "float32", date="2026-01-01")
        node = load_machine(str(path)).node
        assert node.comm_latency_pace_under_compute == pytest.approx(expected)
        assert node.comm_stretch_under_compute == pytest.approx(3.5)
