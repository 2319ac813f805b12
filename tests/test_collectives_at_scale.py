"""twin.collectives_at_scale and benchmarks/collectives_at_scale.py: PCCL's measured all-gathers and reduce-scatters
on Perlmutter and Frontier, the twin's time for each, and the latency-bandwidth fit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import collectives_at_scale  # noqa: E402
from twin.collectives_at_scale import (FIT_OUTLIER, MeasuredCollective, collective_models,  # noqa: E402
                                       fit_latency_bandwidth, load_table, twin_alone_s)
from twin.errors import TwinError  # noqa: E402

MB = 1 << 20


def test_the_table_holds_both_machines_and_every_width():
    entries = load_table()
    widths: dict[tuple[str, str], set[int]] = {}
    for e in entries:
        widths.setdefault((e.machine, e.collective), set()).add(e.gpus)
    widths = {key: sorted(gpus) for key, gpus in widths.items()}
    assert widths == {("perlmutter", "all_gather"): [16, 32, 64, 128, 256, 512, 1024],
                      ("frontier", "all_gather"): [8, 16, 32, 64, 128, 256, 512, 1024],
                      ("frontier", "reduce_scatter"): [8, 16, 32, 64, 128, 256, 512, 1024]}
    assert {e.gpus_per_node for e in entries if e.machine == "perlmutter"} == {4}
    assert {e.gpus_per_node for e in entries if e.machine == "frontier"} == {8}
    assert {e.nbytes for e in entries} == {s * MB for s in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)}


def synthetic(base: float, crossing: float, node_bw: float, stalls: int = 0,
              stall: float = 50.0) -> list[MeasuredCollective]:
    """Timings made by the fit's own formula over 4-GPU nodes, the first `stalls` of them made `stall` times
    longer."""
    out = []
    for gpus in (16, 64, 256, 1024):
        for size in (1, 16, 256, 1024):
            t = base + gpus / 4 * crossing + (gpus - 1) / gpus * size * MB / node_bw
            out.append(MeasuredCollective("perlmutter", "all_gather", gpus, gpus // 4, size * MB,
                                          (t * (stall if len(out) < stalls else 1),)))
    return out


def test_the_fit_recovers_the_numbers_that_made_the_timings_and_leaves_stalls_out():
    fit, used = fit_latency_bandwidth(synthetic(100e-6, 30e-6, 60e9))
    assert (fit.base_s, fit.crossing_s, fit.node_bytes_per_s) == pytest.approx((100e-6, 30e-6, 60e9), rel=1e-6)
    assert all(used) and fit.mean_error == pytest.approx(0, abs=1e-9)
    fit, used = fit_latency_bandwidth(synthetic(100e-6, 30e-6, 60e9, stalls=2))
    assert used[:2] == [False, False] and all(used[2:]) and fit.used == 14
    assert fit.crossing_s == pytest.approx(30e-6, rel=1e-6)


def test_a_timing_slower_than_the_fit_by_less_than_the_outlier_factor_stays_in():
    """Only a stall of more than FIT_OUTLIER times the fit of the rest is left out: one of 0.8 times that factor
    (against a fit it pulls up itself) is fitted on, and moves the fit."""
    fit, used = fit_latency_bandwidth(synthetic(100e-6, 30e-6, 60e9, stalls=1, stall=0.8 * FIT_OUTLIER))
    assert all(used) and fit.used == 16 and fit.mean_error > 0.01


def test_a_latency_the_timings_would_make_negative_is_zero():
    fit, _ = fit_latency_bandwidth(synthetic(0.0, 30e-6, 60e9))
    assert fit.base_s >= 0 and fit.crossing_s == pytest.approx(30e-6, rel=1e-3)


def test_too_few_timings_and_a_table_without_a_column_are_one_line_errors(tmp_path):
    with pytest.raises(TwinError, match="needs at least 4 timings"):
        fit_latency_bandwidth(synthetic(1e-4, 3e-5, 6e10)[:3])
    bad = tmp_path / "t.csv"
    bad.write_text("machine,collective,gpus,nodes,time_ms\nperlmutter,all_gather,16,4,0.2\n")
    with pytest.raises(TwinError, match="no column 'bytes'"):
        load_table(bad)


@pytest.mark.parametrize("row, message", [
    ("perlmutter,all_gather,16,4,,1048576,0.2", None),  # gpus_per_node left out: derived
    ("perlmutter,all_gather,16,4,4,1048576,0.2", None),
    ("perlmutter,all_gather,16,4,8,1048576,0.2", r"line 2: 16 GPUs on 4 nodes with gpus_per_node=8 is not whole"),
    ("perlmutter,all_gather,10,4,,1048576,0.2", r"line 2: 10 GPUs on 4 nodes is not whole nodes"),
    ("perlmutter,all_gather,16,0,,1048576,0.2", r"line 2: nodes='0' must be a positive integer"),
    ("perlmutter,all_gather,16,4,,1MB,0.2", r"line 2: bytes='1MB' must be a positive integer"),
    ("perlmutter,all_gather,16,4,,1048576,-1", r"line 2: time_ms='-1' must be a positive number"),
    ("perlmutter,all_gather,16,4,,1048576,nan", r"line 2: time_ms='nan' must be a positive number"),
])
def test_a_bad_row_is_a_one_line_error_naming_its_line_and_field(tmp_path, row, message):
    table = tmp_path / "t.csv"
    table.write_text("machine,collective,gpus,nodes,gpus_per_node,bytes,time_ms\n" + row + "\n")
    if message is None:
        [entry] = load_table(table)
        assert (entry.gpus, entry.nodes, entry.gpus_per_node) == (16, 4, 4)
    else:
        with pytest.raises(TwinError, match=message):
            load_table(table)


def test_the_twin_times_each_collective_alone_longer_for_a_larger_buffer():
    entries = [e for e in load_table() if e.machine == "perlmutter" and e.gpus == 64]
    model = collective_models(entries)["perlmutter"]
    times = [twin_alone_s(model, e)[0] for e in sorted(entries, key=lambda e: e.nbytes)]
    assert all(0 < a < b for a, b in zip(times, times[1:]))


def test_the_benchmark_prints_every_set_with_its_fit_and_the_machine_files_numbers(capsys):
    result = collectives_at_scale.main(["--json"])
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result))
    assert {(s["machine"], s["collective"]) for s in result["sets"]} == \
        {("perlmutter", "all_gather"), ("frontier", "all_gather"), ("frontier", "reduce_scatter")}
    for s in result["sets"]:
        assert s["fit"]["node_gb_per_s"] > 0 and s["fit"]["used"] <= s["fit"]["of"] == len(s["rows"])
        assert 0 < s["machine_file"]["nic_efficiency"] <= 1
        assert all(r["twin_s"] > 0 and r["measured_s"] > 0 for r in s["rows"])
    collectives_at_scale.main([])
    out = capsys.readouterr().out
    assert "perlmutter all_gather" in out and "geometric mean" in out and "a node spanned" in out


def test_the_figure_is_written(tmp_path, capsys):
    path = tmp_path / "collectives.png"
    collectives_at_scale.main(["--figure", str(path)])
    assert path.stat().st_size > 10_000 and f"figure written to {path}" in capsys.readouterr().out
