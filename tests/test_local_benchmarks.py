"""The benchmarks' own logic (fit_local.py, launch_noise.py, step_intercepts.py, rank_drift.py, rank_phases.py,
class_errors.py, lag_growth.py, error_floor.py, wake_ups.py, collective_split.py), without executing or simulating."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import fit_local  # noqa: E402
from class_errors import main as class_errors  # noqa: E402
from class_errors import summed_errors  # noqa: E402
import error_floor as error_floor_module  # noqa: E402
from error_floor import floors, launch_scatter, measured_numbers  # noqa: E402
from error_floor import main as error_floor  # noqa: E402
from fit_local import median_launches  # noqa: E402
from helpers import SMALL_SPEC  # noqa: E402
from launch_noise import main as launch_noise  # noqa: E402
from rank_drift import collective_spread_s, others_computing  # noqa: E402
from rank_drift import main as rank_drift  # noqa: E402
from rank_phases import main as rank_phases  # noqa: E402
from rank_phases import summary_of  # noqa: E402
from step_intercepts import _parameters_per_gpu, intercepts  # noqa: E402
from collective_split import PARTS, by_kind, lag_points, lags_by_compute, measured_split  # noqa: E402
from collective_split import main as collective_split  # noqa: E402
from wake_ups import main as wake_ups_main  # noqa: E402
from wake_ups import wake_ups  # noqa: E402
from test_sim import all_reduce, schedule  # noqa: E402

from twin.ir import Elementwise, Gemm, Op  # noqa: E402
from twin.model import parse_model_spec  # noqa: E402
from twin.plan import ParallelPlan  # noqa: E402
from twin.runs import MeasuredRun  # noqa: E402


def _launch(step_s: float, tag: str) -> dict:
    return {"step_time_s": step_s, "run": tag}


def test_the_median_launch_of_each_plan_is_compared():
    """Three rounds of two plans: each plan's middle launch, whichever round it came from; with two launches the
    lower one."""
    rounds = [[_launch(0.30, "a1"), _launch(0.90, "b1")],
              [_launch(0.20, "a2"), _launch(0.70, "b2")],
              [_launch(0.25, "a3"), _launch(0.80, "b3")]]
    assert [s["run"] for s in median_launches(rounds)] == ["a3", "b3"]
    assert [s["run"] for s in median_launches(rounds[:2])] == ["a2", "b2"]
    assert [s["run"] for s in median_launches(rounds[:1])] == ["a1", "b1"]


@pytest.mark.parametrize("argv, field", [(["--launches", "1"], "--launches"),
                                         (["--machine", "no/such.toml"], "--machine")])
def test_launch_noise_refuses_bad_arguments_before_measuring(argv, field, capsys):
    with pytest.raises(SystemExit) as stop:
        launch_noise(argv)
    assert stop.value.code == 2
    assert field in capsys.readouterr().err


def test_step_intercepts_recovers_each_groups_line():
    """benchmarks/step_intercepts.py: runs of one group differ only in their global batch; a step of a + b ga,
    a proportional to the GPU's parameters, comes back as a per billion parameters, b's ratio as given."""
    model = parse_model_spec(SMALL_SPEC)
    runs = [MeasuredRun("calibration.csv", line, "", model, ParallelPlan(gx=tp, gdata=dp, mbs=2, global_batch=gb),
                        tp * dp, 0.0, "test")
            for line, (tp, dp, gb) in enumerate([(2, 1, 4), (2, 1, 8), (2, 1, 16), (1, 2, 8), (1, 2, 16)], start=2)]
    ms_per_billion, slope = {(2, 1): 20.0, (1, 2): 30.0}, 0.05
    measured = [ms_per_billion[(r.plan.gx, r.plan.gdata)] * _parameters_per_gpu(r) / 1000
                + slope * r.plan.global_batch / (r.plan.mbs * r.plan.gdata) for r in runs]
    table = intercepts(runs, {"measured": np.array(measured), "model": 1.5 * np.array(measured)})
    for (tp, dp), want in ms_per_billion.items():
        row = table[(model.hidden, tp, dp)]
        assert row["measured"] == pytest.approx(want)
        assert row["model"] == pytest.approx(1.5 * want)
        assert row["model slope"] == pytest.approx(1.5)


def test_fit_local_leaves_out_what_is_refused_and_goes_on_when_nothing_fits(monkeypatch):
    """fit_local.fit_refusing_less: a refused parameter (named in twin fit's one-line error) is left out and the
    fit run again; when every one is refused the fit is None, not an exit, so the held-out plans are still
    predicted (from the microbenchmarks alone)."""
    calls = []

    def refuse_all_but(keep):
        def fake(*argv):
            params = argv[argv.index("--params") + 1].split(",")
            calls.append(params)
            refused = [p for p in params if p not in keep]
            if refused:
                raise fit_local.TwinFailed(f"twin: error: fit refused: {refused[0]} ends on its upper bound 1")
            return {"parameters": [{"path": p} for p in params]}
        return fake

    monkeypatch.setattr(fit_local, "twin_json", refuse_all_but({"device.attention_efficiency"}))
    fit, left_out = fit_local.fit_refusing_less("m.toml", "runs.json", ["device.hbm_efficiency",
                                                                      "device.attention_efficiency"], "o.toml")
    assert [p["path"] for p in fit["parameters"]] == ["device.attention_efficiency"]
    assert len(left_out) == 1 and left_out[0].startswith("device.hbm_efficiency (fit refused")
    monkeypatch.setattr(fit_local, "twin_json", refuse_all_but(set()))
    fit, left_out = fit_local.fit_refusing_less("m.toml", "runs.json", ["device.hbm_efficiency",
                                                                      "device.attention_efficiency"], "o.toml")
    assert fit is None and len(left_out) == 2


def test_oversubscribed_host_writes_each_variant_of_the_calibration(tmp_path):
    """benchmarks/oversubscribed_host.py's files (executor.calibrate_host.refit_saved, which fit_local.py --reuse
    uses too): the same samples with the lag, the stretch and the latency's pace each on or off (the lag off
    stays inside the collectives' latency); and it refuses a folder fit_local.py has not filled."""
    import json
    from dataclasses import asdict

    from oversubscribed_host import VARIANTS, main as oversubscribed_host
    from test_calibration_fit import known_parameters, synthetic_samples

    from executor.calibrate import LEAD_GEMM, fit
    from executor.calibrate_host import refit_saved
    from topologies.machine import load_machine

    samples = synthetic_samples(known_parameters(skew=0.25, sync_base=400e-6, stretch=3.5, latency_pace=0.125))
    lead_s = next(s.time_s for s in samples if s.kind == "skew_lead" and s.params == dict(zip("mnk", LEAD_GEMM)))
    calibration = tmp_path / "local-4.calibration.json"
    calibration.write_text(json.dumps({"samples": [asdict(s) for s in samples], "fit": asdict(fit(samples, True)),
                                       "host": {"cpu": "test CPU", "logical_cpus": 2, "memory_bytes": 16e9, "nproc": 4,
                                                "hostname": "h"}, "dtype": "float32", "date": "2026-01-01"}))
    for name, (lag, stretch, latency) in VARIANTS.items():
        fitted = refit_saved(str(calibration), str(tmp_path / "v.toml"), lag, stretch, latency=latency)
        machine = load_machine(str(tmp_path / "v.toml"))
        assert (fitted.timeslice_skew, fitted.comm_stretch_under_compute) == pytest.approx(
            (0.25 if lag else 0.0, 3.5 if stretch else 1.0))
        assert machine.node.timeslice_skew == pytest.approx(0.25 if lag else 0.0), name
        assert machine.node.comm_stretch_under_compute == pytest.approx(3.5 if stretch else 1.0), name
        assert machine.node.comm_latency_pace_under_compute == pytest.approx(0.125 if latency else None), name
        base = machine.sources["collectives.base_latency_us.ring.simple"].value
        assert base == pytest.approx(1e6 * (100e-6 + (0.0 if lag else 0.25 * lead_s)), rel=1e-3), name
    with pytest.raises(SystemExit) as exit_:
        oversubscribed_host(["--out", str(tmp_path / "empty")])
    assert exit_.value.code == 2


def test_fit_local_reuse_refuses_a_folder_without_measurements(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        fit_local.main(["--reuse", "--out", str(tmp_path / "none")])
    assert exit_.value.code == 2 and "--reuse" in capsys.readouterr().err
    assert not (tmp_path / "none").exists()  # nothing written where nothing was measured


def test_calibration_launches_refuses_a_folder_whose_calibrations_kept_one_launch(tmp_path, capsys):
    """benchmarks/calibration_launches.py compares launches fit_local.py kept: a folder of single launches (or
    none) is refused with the command that fills it, exit 2, nothing written."""
    import json

    from calibration_launches import main as calibration_launches

    with pytest.raises(SystemExit) as exit_:
        calibration_launches(["--out", str(tmp_path)])
    assert exit_.value.code == 2 and "fit_local.py" in capsys.readouterr().err
    for name in ("local-2.calibration.json", "local-4.calibration.json"):
        (tmp_path / name).write_text(json.dumps({"samples": []}))
    for name in ("calibration-runs.json", "held-out-runs.json"):
        (tmp_path / name).write_text("[]")
    with pytest.raises(SystemExit) as exit_:
        calibration_launches(["--out", str(tmp_path)])
    assert exit_.value.code == 2 and "--calibration-launches 3" in capsys.readouterr().err
    assert not (tmp_path / "launches").exists()


@pytest.mark.parametrize("flag", ["--launches", "--calibration-launches"])
def test_fit_local_refuses_fewer_than_one_launch(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        fit_local.main([flag, "0", "--out", str(tmp_path / "none")])
    assert exit_.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "none").exists()


def test_overlap_sizes_schedule_is_valid_and_its_summary_reads_the_timestamps(capsys):
    """benchmarks/overlap_sizes.py: its schedule passes the IR's checks, and from made-up timestamps where every
    all-reduce under GEMMs ends 3 ms after the last of them the summary says so, per size, and two all-reduces
    one after the other span from the first's start to the second's end; one rank, or an odd number, is
    refused."""
    from overlap_sizes import (PAIR_SIZES, SIZES, gemms_under, main as overlap_sizes, overlap_schedule, summarize,
                               summarize_pairs)

    from twin.ir_validate import validate_schedule

    schedule = overlap_schedule(4)
    validate_schedule(schedule)
    ops = schedule.programs[0].ops
    ids = {op.name: op.id for op in ops}
    start, end = np.arange(len(ops), dtype=float), np.arange(len(ops), dtype=float) + 0.5
    for nbytes in SIZES:
        last = ids[f"{nbytes}.gemm{gemms_under(nbytes)[0] - 1}.0"]
        for rep in range(3):
            end[ids[f"{nbytes}.during.{rep}"]] = end[ids[f"{nbytes}.gemm{gemms_under(nbytes)[0] - 1}.{rep}"]] + 0.003
        assert end[ids[f"{nbytes}.during.0"]] == end[last] + 0.003
    rows = summarize(schedule, [[(start, end)]] * 4)
    assert [r["nbytes"] for r in rows] == SIZES
    assert all(r["ends_after_last_gemm_s"] == pytest.approx(0.003) and r["alone_s"] == 0.5 for r in rows)
    pairs = summarize_pairs(schedule, [[(start, end)]] * 4)
    apart = [ids[f"{PAIR_SIZES[0]}.apart-{g}.0"] for g in ("x", "z")]
    assert pairs[0]["one_after_the_other_s"] == pytest.approx(apart[1] + 0.5 - apart[0])
    assert all(r["at_once_s"] == pytest.approx(1.5) for r in pairs)  # issued one op apart, each half an op long
    for nproc in ("1", "3"):
        with pytest.raises(SystemExit) as exit_:
            overlap_sizes(["--nproc", nproc])
        assert exit_.value.code == 2 and "--nproc" in capsys.readouterr().err


def test_pair_under_compute_lines_its_two_programs_up_and_reads_each_ranks_timestamps(capsys):
    """benchmarks/pair_under_compute.py: two programs (the pairs' all-reduces, the other half's GEMMs) that pass
    the IR's checks and issue the same synchronisations of every rank in the same order; from made-up timestamps
    where each all-reduce under compute takes 3 ms and alone 1 ms, and the GEMMs span 40 ms, the summary reads those
    back per size; a rank count that is not a multiple of 4 is refused."""
    from pair_under_compute import (GEMMS, PER_PHASE, REPEATS, SIZES, main as pair_under_compute, pair_schedule,
                                    summarize)

    from twin.ir import Collective
    from twin.ir_validate import validate_schedule

    schedule = pair_schedule(4)
    validate_schedule(schedule)
    pairs, computers = schedule.programs
    assert (pairs.ranks, computers.ranks) == ((0, 1), (2, 3))
    every_rank = [[op.name for op in p.ops if isinstance(op.work, Collective) and op.work.group == "g4"]
                  for p in (pairs, computers)]
    assert every_rank[0] == every_rank[1] and len(every_rank[0]) == len(SIZES) * (2 * REPEATS + 1)
    timestamps = []
    for program in schedule.programs:
        ids = {op.name: op.id for op in program.ops}
        start, end = np.arange(len(program.ops), dtype=float), np.arange(len(program.ops), dtype=float)
        for nbytes in SIZES:
            for rep in range(REPEATS):
                for phase, seconds in (("alone", 0.001), ("under", 0.003)):
                    for i in range(PER_PHASE):
                        if (op := ids.get(f"{nbytes}.{phase}.{rep}.{i}")) is not None:
                            end[op] = start[op] + seconds
                for g in range(GEMMS):  # from the first GEMM's start to the last one's end: 40 ms
                    if (op := ids.get(f"{nbytes}.gemm{g}.{rep}")) is not None:
                        start[op], end[op] = 100.0 + g * 0.04 / GEMMS, 100.0 + (g + 1) * 0.04 / GEMMS
        timestamps.append([(start, end)])
    rows = summarize(schedule, [timestamps[0], timestamps[0], timestamps[1], timestamps[1]])
    assert [r["nbytes"] for r in rows] == SIZES
    for r in rows:
        assert (r["alone_s"], r["under_compute_s"], r["ratio"]) == pytest.approx((0.001, 0.003, 3.0))
        assert (r["all_under_s"], r["gemm_span_s"]) == pytest.approx((PER_PHASE * 0.003, 0.04))
    for nproc in ("2", "6"):
        with pytest.raises(SystemExit) as exit_:
            pair_under_compute(["--nproc", nproc])
        assert exit_.value.code == 2 and "--nproc" in capsys.readouterr().err


def test_overlap_savings_pairs_each_plan_with_its_overlap_off_twin(tmp_path, capsys):
    """benchmarks/overlap_savings.py: from validate rows in PLANS order (each plan, then it without overlap) the
    saving 1 - on / off, measured and per machine file; a missing file or another rank count is refused."""
    from overlap_savings import PLANS, main as overlap_savings, savings

    rows = []
    for i, _ in enumerate(PLANS):
        rows += [{"measured_s": 0.9, "predicted_s": {"a": 0.8, "b": 1.0 + i}},
                 {"measured_s": 1.0, "predicted_s": {"a": 1.0, "b": 1.0 + i}}]
    out = savings(rows, ["a", "b"])
    assert [(r["model"], r["plan"]) for r in out] == [(m, p) for m, p, _ in PLANS]
    assert all(r["measured_saving"] == pytest.approx(0.1) for r in out)
    assert all(r["predicted_saving"] == pytest.approx({"a": 0.2, "b": 0.0}) for r in out)
    for argv, says in ((["--machine", str(tmp_path / "none.toml")], "no such file"),
                       (["--machine", "topologies/local.toml", "--nproc", "2"], "--nproc 2")):
        with pytest.raises(SystemExit) as exit_:
            overlap_savings(argv)
        assert exit_.value.code == 2 and says in capsys.readouterr().err


def _drift_schedule():
    """4 ranks, one program: a GEMM, an element-wise op, an all-reduce in each pair (axis x), one of all four (w)."""
    ops = [Op(0, "gemm", "compute", Gemm(64, 64, 64)), Op(1, "add", "compute", Elementwise(1e6), (0,)),
           all_reduce(2, 1e6, deps=(1,)), all_reduce(3, 1e6, group="w", stream="comm:w", deps=(2,))]
    return schedule(4, {"x": ((0, 1), (2, 3)), "w": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), ops)])


def _timeline(*spans):
    return np.array([s for s, _ in spans], float), np.array([e for _, e in spans], float)


def test_rank_drift_counts_the_other_ranks_computing_while_rank_0_runs_its_gemms():
    """Rank 0's GEMM runs from 0 to 1 s. Rank 1's GEMM runs beside it all along (1), rank 2's element-wise op a
    quarter of it (0.25), rank 3 only communicates then (0): 1.25 other ranks on average; all in step, 3."""
    sched = _drift_schedule()
    per_rank = [_timeline((0, 1), (1, 1.5), (1.5, 2), (2, 2.5)),
                _timeline((0, 1), (1, 1.5), (1.5, 2), (2, 2.5)),
                _timeline((3, 4), (0.5, 0.75), (4, 5), (5, 6)),
                _timeline((5, 6), (6, 7), (0, 1), (7, 8))]
    assert others_computing(sched, per_rank) == pytest.approx(1.25)
    assert others_computing(sched, [per_rank[0]] * 4) == pytest.approx(3.0)


def test_rank_drift_spreads_each_collectives_end_over_its_own_members():
    """Step 1: the pairs' all-reduce ends 0.1 s apart in (0, 1), 0.4 s in (2, 3); the all-reduce of all four
    0.2 s. Step 2: together. The mean over the six (instance, step) ends: 0.7 / 6."""
    sched = _drift_schedule()

    def step(pair_ends, all_ends):
        return [(np.zeros(4), np.array([0.5, 1.0, pair_ends[r], all_ends[r]])) for r in range(4)]

    steps = [step([2.0, 2.1, 2.0, 2.4], [3.0, 3.0, 3.2, 3.1]), step([2.0] * 4, [3.0] * 4)]
    measured = SimpleNamespace(steps=tuple(tuple(s[r] for s in steps) for r in range(4)))
    assert collective_spread_s(sched, measured) == pytest.approx(0.7 / 6)
    assert collective_spread_s(sched, measured, edge=0) == 0.0  # every member reached each at 0


def test_rank_drift_refuses_a_folder_without_held_out_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        rank_drift(["--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "held-out-runs.json is missing" in capsys.readouterr().err


def test_rank_drift_names_the_folder_when_a_schedule_cannot_be_read(tmp_path, capsys):
    """A held-out run whose schedule is gone (or of an older twin): one line naming the folder, exit 2."""
    machine = Path(__file__).resolve().parents[1] / "topologies" / "local.toml"
    (tmp_path / "local-4.toml").write_text(machine.read_text())
    (tmp_path / "held-out-runs.json").write_text(json.dumps([{"schedule": str(tmp_path / "gone.json")}]))
    with pytest.raises(SystemExit) as stop:
        rank_drift(["--out", str(tmp_path)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"--out {tmp_path}:" in err and "gone.json" in err


def test_class_errors_sums_each_class_over_the_plans_before_dividing():
    """A folder's error per op class is its time summed over the plans, simulated over measured: a long class
    weighs more than a short one, a class one plan lacks is summed over the plans that have it."""
    rows = [{"plan": "a", "step": (0.9, 1.0), "classes": {"gemm": (0.6, 0.5), "all_gather": (0.1, 0.4)}},
            {"plan": "b", "step": (2.0, 2.0), "classes": {"gemm": (1.0, 1.5)}}]
    assert summed_errors(rows) == pytest.approx({"step": 2.9 / 3.0 - 1, "gemm": 1.6 / 2.0 - 1, "all_gather": -0.75})


def test_class_errors_refuses_a_folder_without_held_out_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        class_errors(["--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "held-out-runs.json is missing" in capsys.readouterr().err


def test_fit_local_names_the_cpu_its_measurements_were_taken_on(tmp_path):
    """The loop's error moves with the VM's CPU (Intel Xeon some days, AMD EPYC others): each run says which, from
    the saved calibration record, so that --reuse of old measurements names their host, not this one."""
    machine = tmp_path / "local-4.toml"
    record = tmp_path / "local-4.calibration.json"
    record.write_text(json.dumps({"host": {"cpu": "Intel(R) Xeon(R) Processor", "logical_cpus": 2}}))
    assert fit_local.measured_on(str(machine)) == "Intel(R) Xeon(R) Processor (2 logical CPUs)"
    record.write_text(json.dumps({"date": "2026-12-06"}))
    assert fit_local.measured_on(str(machine)) == "an unrecorded CPU (? logical CPUs)"


def test_rank_phases_refuses_a_folder_without_a_4_rank_file(tmp_path, capsys):
    """The fitted 4-rank file, or the microbenchmarks' own where nothing was fitted: without either, one line."""
    (tmp_path / "held-out-runs.json").write_text("[]")
    with pytest.raises(SystemExit) as stop:
        rank_phases(["--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "local-4-fitted.toml or " in capsys.readouterr().err
    machine = Path(__file__).resolve().parents[1] / "topologies" / "local.toml"
    (tmp_path / "local-4.toml").write_text(machine.read_text())
    assert rank_phases(["--out", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)[str(tmp_path)]
    assert doc["rows"] == [] and doc["summary"]["in_step_mean_abs_pct"] is None


def test_rank_phases_counts_the_plans_the_two_bounds_hold():
    rows = [{"in_step_error_pct": 10.0, "scattered_error_pct": -5.0, "between": True},
            {"in_step_error_pct": -4.0, "scattered_error_pct": -20.0, "between": False}]
    assert summary_of(rows) == {"in_step_mean_abs_pct": 7.0, "scattered_mean_abs_pct": 12.5, "between": 1, "plans": 2}


def test_compute_beside_comm_times_the_gemms_inside_the_all_reduces_span():
    """benchmarks/compute_beside_comm.py: two programs that pass the IR's checks and the same synchronisations;
    from made-up timestamps (GEMMs 20 ms idle, 30 ms beside the pairs' all-reduces, which span 300 ms: the ten
    GEMMs inside it count, the two after do not) the ratio 1.5 and, 2 ranks computing on 2 cores, a communicating
    rank's share of a core 0.5."""
    from compute_beside_comm import GEMMS, REPEATS, SIZES, beside_schedule, core_share, summarize

    from twin.ir import Collective
    from twin.ir_validate import validate_schedule

    schedule = beside_schedule(4)
    validate_schedule(schedule)
    pairs, computers = schedule.programs
    every_rank = [[op.name for op in p.ops if isinstance(op.work, Collective) and op.work.group == "g4"]
                  for p in (pairs, computers)]
    assert every_rank[0] == every_rank[1]
    timestamps = []
    for program in schedule.programs:
        ids = {op.name: op.id for op in program.ops}
        start, end = np.zeros(len(program.ops)), np.zeros(len(program.ops))
        for nbytes, count in SIZES.items():
            for rep in range(REPEATS):
                if program is pairs:
                    start[ids[f"{nbytes}.beside.{rep}.ar0"]] = 100
                    end[ids[f"{nbytes}.beside.{rep}.ar{count - 1}"]] = 100.3
                    continue
                for g in range(GEMMS):
                    op = ids[f"{nbytes}.idle.{rep}.gemm{g}"]
                    start[op], end[op] = 50 + g * 0.02, 50 + (g + 1) * 0.02
                    op = ids[f"{nbytes}.beside.{rep}.gemm{g}"]
                    start[op], end[op] = 100 + g * 0.03, 100 + (g + 1) * 0.03
        timestamps.append([(start, end)])
    rows = summarize(schedule, [timestamps[0], timestamps[0], timestamps[1], timestamps[1]], cores=2)
    assert [r["nbytes"] for r in rows] == list(SIZES)
    for r in rows:
        assert (r["gemm_idle_s"], r["gemm_beside_s"], r["ratio"]) == pytest.approx((0.02, 0.03, 1.5))
        assert r["gemms_beside"] == 10 * 2 * REPEATS and r["core_share"] == pytest.approx(0.5)
    assert core_share(1.0, 2, 2) == 0.0 and core_share(2.0, 2, 4) == pytest.approx(3.0)


def test_collective_after_times_each_collective_in_its_condition(capsys):
    """benchmarks/collective_after.py: one program that passes the IR's checks, each timed collective right after
    what its condition says (a synchronisation of every rank, itself, a copy, a GEMM); from made-up timestamps
    where a collective takes 1 ms after a GEMM and 0.5 ms otherwise, the summary reads those back per
    collective and condition, in CONDITIONS order; an odd rank count is refused."""
    from collective_after import CHAIN, CONDITIONS, KINDS, REPEATS, SIZES, after_schedule, main as collective_after
    from collective_after import summarize

    from twin.ir import Collective, Elementwise, Gemm
    from twin.ir_validate import validate_schedule

    schedule, timed = after_schedule(4)
    validate_schedule(schedule)
    (program,) = schedule.programs
    ops = program.ops
    before = {"sync": Collective, "itself": Collective, "copy": Elementwise, "gemm-synced": Gemm, "gemm-chain": Gemm}
    for op_id, (condition, group, kind, nbytes) in timed.items():
        previous = ops[op_id - 1].work if condition not in ("sync", "itself") else ops[op_id - 2].work
        assert isinstance(previous, before[condition]), (condition, ops[op_id - 1].name)
        if condition == "sync":
            assert previous.group == "g4" and previous.nbytes == 4
        if condition == "itself":
            assert (previous.kind, previous.nbytes) == (kind, nbytes)
    counts = [list(timed.values()).count(c) for c in {*timed.values()}]
    assert set(counts) == {REPEATS, REPEATS * CHAIN}
    start, end = np.zeros(len(ops)), np.zeros(len(ops))
    for op_id, (condition, *_) in timed.items():
        end[op_id] = 0.001 if condition.startswith("gemm") else 0.0005
    rows = summarize(timed, [[(start, end)]] * 4)
    assert len(rows) == 2 * len(KINDS) * len(SIZES) * len(CONDITIONS)
    assert [r["condition"] for r in rows[:len(CONDITIONS)]] == list(CONDITIONS)
    for r in rows:
        assert r["mean_s"] == pytest.approx(0.001 if r["condition"].startswith("gemm") else 0.0005)
    with pytest.raises(SystemExit) as exit_:
        collective_after(["--nproc", "3"])
    assert exit_.value.code == 2 and "--nproc" in capsys.readouterr().err


def test_calibration_drift_sets_each_launchs_file_beside_the_median_one():
    from calibration_drift import launch_range

    doc = {"rounds": 2, "errors": [[4.0, 10.0], [12.0, 6.0], [14.0, 16.0], [8.0, 9.0]]}
    assert launch_range(doc) == (7.0, 15.0, 8.5)  # launches' means over the rounds; the median file's apart


def test_calibration_drift_refuses_a_folder_without_rounds_in_one_line(tmp_path, capsys):
    from calibration_drift import main as calibration_drift

    (tmp_path / "launch-1" / "4-tiny-gdata4").mkdir(parents=True)
    (tmp_path / "launch-1" / "4-tiny-gdata4" / "summary.json").write_text("{}")
    with pytest.raises(SystemExit) as e:
        calibration_drift(["--out", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "1 round(s)" in err[-1] and "--launches 3" in err[-1]


def test_lag_growth_times_each_phase_and_sets_the_line_through_calibrates_range_beside_it(capsys):
    """benchmarks/lag_growth.py: one program that passes the IR's checks, each phase of PHASES GEMMs of the
    largest calibrated shape after a synchronisation and followed by a timed 4-byte all-reduce; from made-up
    timestamps where each GEMM takes 10 ms and the all-reduce 1 ms plus a tenth of the phase up to 20 ms of it
    and nothing more after, the summary reads each phase's compute back, puts the line through the first two
    phases (1 ms + 0.1 x the compute) beside it, and the longer phases fall under that line; an odd rank count is
    refused."""
    from lag_growth import CALIBRATED, PHASES, REPEATS, growth_schedule, main as lag_growth, summarize

    from executor.calibrate_sharing import SKEW_LEADS
    from twin.ir_validate import validate_schedule

    schedule, timed = growth_schedule(4)
    validate_schedule(schedule)
    ops = schedule.programs[0].ops
    gemms = [i for i, (kind, _) in timed.items() if kind == "gemm"]
    assert len(gemms) == REPEATS * sum(PHASES)
    assert {(ops[i].work.m, ops[i].work.n, ops[i].work.k) for i in gemms} == {SKEW_LEADS[-1]}
    for i, (kind, phase) in timed.items():
        if kind == "sync":
            assert (ops[i].work.kind, ops[i].work.nbytes) == ("all_reduce", 4)
            assert sum(1 for j in ops[i].deps if timed.get(j, ("", 0))[0] == "gemm") == 1  # after its phase's last
    start, end = np.zeros(len(ops)), np.zeros(len(ops))
    for i, (kind, phase) in timed.items():
        end[i] = 0.010 if kind == "gemm" else 0.001 + 0.1 * min(phase * 0.010, 0.020)
    rows = summarize(timed, [[(start, end)]] * 4)
    assert [r["gemms"] for r in rows] == list(PHASES)
    assert [r["compute_s"] for r in rows] == pytest.approx([0.010 * g for g in PHASES])
    assert [r["line_s"] for r in rows] == pytest.approx([0.001 + 0.1 * 0.010 * g for g in PHASES])
    assert all(r["sync_mean_s"] == pytest.approx(r["line_s"]) for r in rows[:CALIBRATED])
    assert all(r["sync_mean_s"] < r["line_s"] for r in rows[CALIBRATED:])
    with pytest.raises(SystemExit) as exit_:
        lag_growth(["--nproc", "3"])
    assert exit_.value.code == 2 and "--nproc" in capsys.readouterr().err


def _fit_local_folder(folder: Path, rows: dict[str, tuple[float, float]], launches: dict[str, list[float]] = {}) -> str:
    """A fit_local folder as error_floor reads it: results.json's held-out rows ({plan: (measured s, error %)} on
    the fitted file) and each plan's launches' summaries."""
    folder.mkdir()
    table = [{"what": f"{plan}.json on 4 ranks", "measured_s": measured,
              "error_pct": {f"{folder}/local-4.toml": 99.0, f"{folder}/local-4-fitted.toml": error}}
             for plan, (measured, error) in rows.items()]
    (folder / "results.json").write_text(json.dumps({"held_out": {"rows": table}}))
    for plan, steps in launches.items():
        for r, step in enumerate(steps, 1):
            (folder / f"launch-{r}" / plan).mkdir(parents=True)
            (folder / f"launch-{r}" / plan / "summary.json").write_text(json.dumps({"step_time_s": step}))
    return str(folder)


def test_error_floor_takes_out_each_plans_bias_learned_from_the_other_folders():
    """A plan 10% slow in every folder has no error left once its bias is taken out; a plan whose error moves
    keeps the part the other folders do not predict. The no-model column predicts each plan by its geometric
    mean over the other folders: a plan measured alike everywhere scores 0."""
    tables = {"a": {"p": (1.0, 10.0), "q": (2.0, 0.0)},
              "b": {"p": (1.0, 10.0), "q": (4.0, 6.0)},
              "c": {"p": (1.0, 10.0), "q": (1.0, -6.0), "only_here": (5.0, 50.0)}}
    doc = floors(tables)
    assert doc["plans"] == ["p", "q"]
    assert doc["plan_bias_pct"] == pytest.approx({"p": 10.0, "q": 0.0})
    a = doc["folders"]["a"]
    assert a["twin"] == pytest.approx((0.10 + 0.0) / 2)
    assert a["twin_without_plan_bias"] == pytest.approx((0.0 + 0.0) / 2)  # q's other folders: +6 and -6
    assert doc["folders"]["b"]["twin_without_plan_bias"] == pytest.approx((0.0 + 0.09) / 2)  # 6 - (0 - 6) / 2
    assert a["no_model"] == pytest.approx((0.0 + (2.0 - 2.0) / 2.0) / 2)  # sqrt(4 x 1) = 2: q repeats
    assert doc["folders"]["b"]["no_model"] == pytest.approx((0.0 + abs(2 ** 0.5 / 4.0 - 1)) / 2)


def test_error_floor_reads_the_launches_scatter_about_their_median(tmp_path):
    folder = Path(_fit_local_folder(tmp_path / "f", {"p": (1.0, 0.0)}, {"p": [0.9, 1.0, 1.2]}))
    assert launch_scatter(folder, ["p"]) == pytest.approx((0.1 + 0.0 + 0.2) / 3)
    assert launch_scatter(folder, ["p", "missing"]) is None


def test_error_floor_prints_a_row_per_folder_and_the_plans_biases(tmp_path, capsys):
    outs = [_fit_local_folder(tmp_path / name, {"p": (1.0, e), "q": (2.0, -e)}, {"p": [1.0, 1.1]})
            for name, e in (("a", 4.0), ("b", 6.0), ("c", 8.0))]
    assert error_floor([arg for out in outs for arg in ("--out", out)]) == 0
    text = capsys.readouterr().out
    assert all(out in text for out in outs)
    bias_lines = {tuple(line.split()) for line in text.splitlines()}
    assert ("p", "+6.0%") in bias_lines and ("q", "-6.0%") in bias_lines
    assert error_floor([arg for out in outs for arg in ("--out", out)] + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["folders"][outs[0]]["twin"] == pytest.approx(0.04)
    assert doc["folders"][outs[0]]["launch_scatter"] is None  # q has no launches there


@pytest.mark.parametrize("count, field", [(2, "three or more"), (3, "no results.json")])
def test_error_floor_refuses_too_few_or_unmeasured_folders_in_one_line(count, field, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        error_floor([arg for i in range(count) for arg in ("--out", str(tmp_path / f"f{i}"))])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert field in err[-1] and "Traceback" not in "".join(err)


def test_error_floor_refuses_folders_without_a_plan_in_common(tmp_path, capsys):
    outs = [_fit_local_folder(tmp_path / name, {name: (1.0, 0.0)}) for name in "abc"]
    with pytest.raises(SystemExit) as stop:
        error_floor([arg for out in outs for arg in ("--out", out)])
    assert stop.value.code == 2
    assert "no plan is held out in every folder" in capsys.readouterr().err


def test_error_floor_pools_what_calibrate_measured_and_keeps_estimates_and_discrete_choices(tmp_path, monkeypatch):
    """--pooled sets each measured number of a folder's microbenchmark file to its mean over the other folders'
    files (the placeholder peak with the GEMM rate); estimates, tiles and the node's shape keep its own."""
    text = """[device]
peak_bf16_tflop_per_s = {{ value = {rate}, estimate = "placeholder" }}
empirical_gemm_bf16_tflop_per_s = {{ value = {rate}, source = "measured" }}
gemm_tile_m = {{ value = {tile}, source = "measured" }}
hbm_efficiency = {{ value = 1.0, estimate = "the copy bandwidth already" }}
[node]
shared_cores = {{ value = 2, source = "measured" }}
timeslice_skew = {{ value = {skew}, source = "measured" }}
[collectives.base_latency_us.ring]
simple = {{ value = {base}, source = "measured" }}
"""
    values = {"a": (0.05, 1, 0.2, 400), "b": (0.06, 8, 0.3, 500), "c": (0.07, 16, 0.4, 600)}
    for name, (rate, tile, skew, base) in values.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "local-4.toml").write_text(text.format(rate=rate, tile=tile, skew=skew, base=base))
    a = measured_numbers(tomllib.loads((tmp_path / "a" / "local-4.toml").read_text()))
    assert a == {"device.empirical_gemm_bf16_tflop_per_s": 0.05, "node.timeslice_skew": 0.2,
                 "collectives.base_latency_us.ring.simple": 400.0}
    calls = []

    def fake_twin_json(*argv):
        calls.append(argv)
        return {"rows": [{"error_pct": {"m": 10.0 if "--set" in argv else -4.0}}]}

    monkeypatch.setattr(error_floor_module, "twin_json", fake_twin_json)
    result = error_floor_module.pooled_errors([str(tmp_path / n) for n in "abc"])
    assert result[str(tmp_path / "a")] == pytest.approx((0.04, 0.10))
    pooled_a = [arg for arg in calls[1] if "=" in arg]
    assert sorted(pooled_a) == sorted(["device.empirical_gemm_bf16_tflop_per_s=0.065",
                                       "device.peak_bf16_tflop_per_s=0.065", "node.timeslice_skew=0.35",
                                       "collectives.base_latency_us.ring.simple=550"])


def _rank_file(rank: int, steps: list[dict]) -> dict:
    return {"rank": rank, "program": 0, "host": "h", "steps": steps}


def test_wake_ups_averages_each_ranks_blocking_waits_per_step():
    """Two ranks, two steps: waits per step and the sum per step are means over (rank, step); mean and p90 over
    every wake-up; the step is the median of the steps' last ends."""
    def step(woke: dict, last: float) -> dict:
        return {"t0": 0.0, "start": [0.0, 0.0], "end": [0.5 * last, last], "woke": woke}

    ranks = [_rank_file(0, [step({"1": 0.001, "3": 0.003}, 0.10), step({"1": 0.002}, 0.12)]),
             _rank_file(1, [step({}, 0.11), step({"1": 0.004}, 0.13)])]
    row = wake_ups(ranks, "run")
    assert row["waits_per_step"] == pytest.approx((2 + 1 + 0 + 1) / 4)
    assert row["mean_s"] == pytest.approx((0.001 + 0.003 + 0.002 + 0.004) / 4)
    assert row["summed_per_step_s"] == pytest.approx((0.004 + 0.002 + 0.0 + 0.004) / 4)
    assert row["p90_s"] == pytest.approx(0.003)  # the 90th percentile, nearest below, of four
    assert row["step_s"] == pytest.approx(0.115)


def test_wake_ups_refuses_runs_of_an_older_executor_and_folders_without_rank_files(tmp_path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    (old / "rank0.json").write_text(json.dumps(_rank_file(0, [{"t0": 0.0, "start": [0.0], "end": [0.1]}])))
    for run, words in ((old, "no 'woke' times"), (tmp_path / "empty", "no rank*.json")):
        with pytest.raises(SystemExit) as stop:
            wake_ups_main([str(run)])
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert words in err[-1] and "run" in err[-1]


def test_collective_split_measures_the_wait_for_the_last_member_and_the_transfer_after_it():
    """Step 1: in pair (0, 1) rank 1 issues the pairs' all-reduce 0.2 s after rank 0 (the last 0.1 s behind the
    mean), in (2, 3) together; of the all-four all-reduce rank 3 issues 0.4 s after the others (0.3 behind the
    mean). Step 2: all together. Per op, the mean over the (instance, step) pairs: waits 0.1 / 4 and 0.3 / 2.
    Each transfer ends 1 s after its last member's issue, but the all-four one, on a stream of its own, never
    waits for the pairs': 1 s each."""
    sched = _drift_schedule()

    def step(pair_issues, all_issues):
        last_pair = {r: max(pair_issues[q] for q in ((0, 1) if r < 2 else (2, 3))) for r in range(4)}
        return [(np.array([0.0, 0.5, pair_issues[r], all_issues[r]]),
                 np.array([0.4, 0.6, last_pair[r] + 1.0, max(all_issues) + 1.0])) for r in range(4)]

    steps = [step([2.0, 2.2, 2.0, 2.0], [3.0, 3.0, 3.0, 3.4]), step([2.0] * 4, [3.0] * 4)]
    measured = SimpleNamespace(steps=tuple(tuple(s[r] for s in steps) for r in range(4)))
    split = measured_split(sched, measured)
    assert split == {(0, 2): pytest.approx((0.1 / 4, 1.0)), (0, 3): pytest.approx((0.3 / 2, 1.0))}


def test_collective_split_counts_a_transfer_from_the_end_of_the_one_before_it_on_its_stream():
    """Two all-reduces of all four on one stream, issued together at 0 and 0.1 s: the first ends at 1 s, so the
    second's transfer runs from 1 s to its end at 1.5 s (0.5 s), not from its issue. Where the first's recorded
    end (the host's resume from a wait) comes after the second's, the second counts from its own first end."""
    ops = [all_reduce(0, 1e6, group="w", stream="comm:w"), all_reduce(1, 1e6, group="w", stream="comm:w")]
    sched = schedule(4, {"w": ((0, 1, 2, 3),)}, [((0, 1, 2, 3), ops)])
    for first_end, transfer in ((1.0, 0.5), (2.0, 0.0)):
        measured = SimpleNamespace(steps=tuple(((np.array([0.0, 0.1]), np.array([first_end, 1.5])),)
                                               for _ in range(4)))
        assert measured_split(sched, measured)[(0, 1)] == pytest.approx((0.0, transfer))


def test_collective_split_sums_the_parts_by_axis_kind_and_pass():
    """An all-reduce on x and one on w, untagged (no pass): a row each, the larger measured total first; no
    collectives, no rows."""
    sched = _drift_schedule()
    rows = by_kind(sched, {(0, 2): (0.01, 0.02), (0, 3): (0.05, 0.0)}, {(0, 2): (0.02, 0.03), (0, 3): (0.0, 0.1)})
    assert [(r["axis"], r["kind"], r["pass"], r["ops"]) for r in rows] == [("w", "all_reduce", "", 1),
                                                                        ("x", "all_reduce", "", 1)]
    assert [rows[1][part] for part in PARTS] == [0.01, 0.02, 0.02, 0.03]
    assert by_kind(sched, {}, {}) == []


def test_collective_split_sets_each_wait_beside_the_compute_before_it():
    """The drift schedule, one step: every rank runs its GEMM (op 0, 1 ms; rank 3 from 1 to 4 ms) and its add
    (op 1, 0.5 ms) before the pairs' all-reduce, which ends at 6 ms; the all-four one follows with no compute.
    Pair (0, 1) computed 1.5 ms each and issued together (lag 0); pair (2, 3) 1.5 and 3.5 ms, issued at 2.5 and
    4.5 ms (lag 1 ms behind the mean); the all-four one after its members' pair transfer: no compute since, and
    its issues at 7, 7, 7 and 9 ms, lag 1.5 ms. Binned: the pairs' points by their mean compute."""
    sched = _drift_schedule()
    ms = 1e-3

    def rank(gemm, add, issue, issue_all):
        return np.array([gemm[0], add[0], issue, issue_all]) * ms, np.array([gemm[1], add[1], 6.0, 10.0]) * ms

    step = [rank((0, 1), (1, 1.5), 2.5, 7.0), rank((0, 1), (1, 1.5), 2.5, 7.0),
            rank((0, 1), (1, 1.5), 2.5, 7.0), rank((1, 4), (4, 4.5), 4.5, 9.0)]
    measured = SimpleNamespace(steps=tuple((s,) for s in step))
    points = sorted(lag_points(sched, measured))
    expected = [(2, 1.5 * ms, 0.0), (2, 2.5 * ms, 1.0 * ms), (4, 0.0, 1.5 * ms)]
    assert [p[0] for p in points] == [e[0] for e in expected]
    assert [v for p in points for v in p[1:]] == pytest.approx([v for e in expected for v in e[1:]], abs=1e-12)
    rows = lags_by_compute([p + (0.0,) for p in points])
    assert [(r["members"], r["points"]) for r in rows] == [(2, 1), (2, 1), (4, 1)]  # 0.5-2 ms, 2-5 ms; 0-0.5 ms
    assert rows[2]["lag_mean_s"] == pytest.approx(1.5 * ms)


def test_collective_split_refuses_a_folder_without_held_out_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        collective_split(["--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "held-out-runs.json is missing" in capsys.readouterr().err
