"""The `twin` command line: error paths (exit 2, one line, no output file) and the good paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO, SMALL_SPEC
from twin.cli import main

STEP = ["--machine", "frontier", "--model-spec", SMALL_SPEC, "--gpus", "16",
        "--plan", "gx=2,gy=2,gz=2,gdata=2,mbs=2", "--global-batch", "16"]
SUMMARY_KEYS = {"step_time_s", "flops_executed", "pflops_total", "tflops_per_gpu", "pct_peak_advertised",
                "pct_peak_empirical", "flops_formula", "flops_by_formula", "formula_pflops_total",
                "formula_tflops_per_gpu", "formula_pct_peak_advertised", "formula_pct_peak_empirical",
                "exposed_comm_s", "memory_per_gpu_gb"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_user_error(rc: int, out: str, err: str, *mentions: str) -> None:
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("twin: error:")
    assert "Traceback" not in err
    for text in mentions:
        assert text in lines[0]


def simulate_args(trace, *overrides: str) -> list[str]:
    """STEP with some options replaced: overrides are (flag, value) pairs."""
    args = list(STEP)
    pairs = dict(zip(overrides[::2], overrides[1::2]))
    for flag, value in pairs.items():
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return ["simulate", *args, "--trace", str(trace)]


# ---- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, mentions",
    [
        (("--machine", "atlantis"), ("atlantis", "frontier")),
        (("--machine", "nowhere/machine.toml"), ("nowhere/machine.toml",)),
        (("--plan", "gx=8,gy"), ("gy",)),
        (("--plan", "gx=2,gy=2,gz=2,gdata=2,gw=1"), ("gw",)),
        (("--plan", "gx=2,gy=2,gz=2,gdata=2,oar=maybe"), ("oar",)),
        (("--plan", "gx=2,gy=2,gz=2,gdata=2,attention=sdpa"), ("attention", "flash, unfused")),
        (("--plan", "gx=2,gy=2,gz=2,gdata=1"), ("--gpus",)),  # product 8 != 16 GPUs
        (("--plan", "gx=16"), ("heads",)),
        (("--global-batch", "6"), ("--global-batch",)),
        (("--model-spec", "layers=2,hidden=500,heads=8"), ("heads",)),
        (("--gpus", "0"), ("--gpus",)),
        (("--gpus", "999999999", "--plan", "gdata=999999999"), ("999999999",)),
    ],
)
def test_simulate_user_errors(capsys, tmp_path, overrides, mentions):
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, *simulate_args(trace, *overrides))
    assert_user_error(rc, out, err, *mentions)
    assert not trace.exists()


def test_unknown_catalog_model(capsys, tmp_path):
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, "simulate", "--machine", "frontier", "--model", "GPT-7B", "--gpus", "8",
                       "--plan", "gx=8", "--trace", str(trace))
    assert_user_error(rc, out, err, "GPT-7B", "GPT-80B")
    assert not trace.exists()


def test_plan_that_does_not_fit_in_memory(capsys, tmp_path):
    trace = tmp_path / "t.json"
    figure = tmp_path / "f.png"
    rc, out, err = run(capsys, "simulate", "--machine", "frontier", "--model", "GPT-80B", "--gpus", "8",
                       "--plan", "gx=8", "--global-batch", "64", "--trace", str(trace), "--figure", str(figure))
    assert_user_error(rc, out, err, "over by")
    assert not trace.exists() and not figure.exists()


def test_simulate_needs_its_arguments(capsys):
    rc, out, err = run(capsys, "simulate", "--machine", "frontier")
    assert_user_error(rc, out, err, "--gpus", "--plan", "--model")


@pytest.mark.parametrize("kind", ["missing", "directory", "not-json", "not-ir"])
def test_unreadable_schedule_file(capsys, tmp_path, kind):
    path = tmp_path / "sched.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "not-json":
        path.write_text("{this is not json")
    elif kind == "not-ir":
        path.write_text(json.dumps({"format": "something-else", "version": 1}))
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, "simulate", "--schedule", str(path), "--machine", "frontier", "--trace", str(trace))
    assert_user_error(rc, out, err, str(path))
    assert not trace.exists()


def test_schedule_without_machine(capsys, tmp_path):
    rc, out, err = run(capsys, "simulate", "--schedule", str(tmp_path / "x.json"))
    assert_user_error(rc, out, err, "--machine")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A schedule written by `twin export`, and the JSON summary of simulating the same step directly."""
    folder = tmp_path_factory.mktemp("export")
    path = folder / "step.json"
    assert main(["export", *STEP, "-o", str(path)]) == 0
    return path


def test_wrong_ir_version(capsys, tmp_path, exported):
    capsys.readouterr()
    data = json.loads(exported.read_text())
    assert data["version"] == 3
    data["version"] = 99
    bad = tmp_path / "v99.json"
    bad.write_text(json.dumps(data))
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, "simulate", "--schedule", str(bad), "--machine", "frontier", "--trace", str(trace))
    assert_user_error(rc, out, err, "99")
    assert not trace.exists()


def test_export_error_writes_nothing(capsys, tmp_path):
    target = tmp_path / "out.json"
    rc, out, err = run(capsys, "export", *simulate_args(tmp_path / "unused", "--plan", "gx=3")[1:-2], "-o", str(target))
    assert_user_error(rc, out, err)
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind either


def test_trace_into_a_missing_folder_is_a_user_error(capsys, tmp_path):
    rc, out, err = run(capsys, *simulate_args(tmp_path / "no" / "such" / "t.json"))
    assert_user_error(rc, out, err, "--trace")


def test_export_into_a_missing_folder_is_a_user_error(capsys, tmp_path):
    target = tmp_path / "no" / "such" / "f.json"
    rc, out, err = run(capsys, "export", *STEP, "-o", str(target))
    assert_user_error(rc, out, err, str(target))
    assert list(tmp_path.iterdir()) == []


def test_bad_figure_format_is_a_user_error_and_writes_nothing(capsys, tmp_path):
    trace = tmp_path / "t.json"
    rc, out, err = run(capsys, *simulate_args(trace), "--figure", str(tmp_path / "f.nosuchformat"))
    assert_user_error(rc, out, err, "--figure")
    assert list(tmp_path.iterdir()) == []


def test_exit_code_and_stderr_in_a_subprocess(tmp_path):
    trace = tmp_path / "t.json"
    proc = subprocess.run(
        [sys.executable, "-m", "twin.cli", *simulate_args(trace, "--plan", "gx=8,gy")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("twin: error:")
    assert len(proc.stderr.splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert not trace.exists()


def test_argparse_usage_error_exits_2(capsys):
    rc, out, err = run(capsys, "simulate", "--gpus", "many")
    assert_user_error(rc, out, err, "--gpus", "many", "see twin simulate --help")


# ---- good paths --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """One `twin simulate --json --trace --figure` run: (summary, trace path, figure path)."""
    folder = tmp_path_factory.mktemp("simulate")
    trace, figure = folder / "step.trace.json", folder / "timeline.png"
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["simulate", *STEP, "--json", "--trace", str(trace), "--figure", str(figure)])
    assert rc == 0
    return json.loads(out.getvalue()), trace, figure


def test_simulate_json_summary(simulated):
    summary, _, _ = simulated
    assert SUMMARY_KEYS <= summary.keys()
    assert summary["flops_formula"] == "hardware"
    assert summary["step_time_s"] > 0
    assert summary["gpus"] == 16
    # the formula figures agree with each other and with Narayanan's formula for 16 sequences
    h, s, l, V, B = 512, 128, 2, 1024, 16
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert summary["flops_by_formula"] == pytest.approx(flops, rel=1e-12)
    assert summary["formula_pflops_total"] * 1e15 == pytest.approx(flops / summary["step_time_s"], rel=1e-9)
    assert summary["formula_tflops_per_gpu"] * 16 * 1e12 == pytest.approx(flops / summary["step_time_s"], rel=1e-9)
    assert summary["formula_pct_peak_advertised"] == pytest.approx(100 * summary["formula_tflops_per_gpu"] / 191.5,
                                                                   rel=1e-9)
    # the achieved figures, of the FLOPs the schedule executes, agree with each other
    executed = summary["flops_executed"]
    assert summary["pflops_total"] * 1e15 == pytest.approx(executed / summary["step_time_s"], rel=1e-9)
    assert summary["tflops_per_gpu"] * 16 * 1e12 == pytest.approx(executed / summary["step_time_s"], rel=1e-9)
    assert summary["pct_peak_advertised"] == pytest.approx(100 * summary["tflops_per_gpu"] / 191.5, rel=1e-9)
    assert summary["pct_peak_empirical"] == pytest.approx(100 * summary["tflops_per_gpu"] / 125.0, rel=1e-9)


def test_unfused_attention_simulates_slower_and_needs_more_memory(capsys):
    """Megatron's unfused core attention, against flash under the same recompute: the s x s scores are computed in
    full, moved through HBM as GEMMs and element-wise kernels (no attention kernel left) and stored."""
    plan = STEP[STEP.index("--plan") + 1]

    def simulate(extra: str) -> dict:
        args = list(STEP)
        args[args.index("--plan") + 1] = f"{plan},{extra}"
        # 512 tokens: at 128 the s x s scores are smaller than the q/k/v copies Megatron's flash path adds
        # (twin.builders.schedule), and both are dominated by kernel launches
        args[args.index("--model-spec") + 1] = SMALL_SPEC.replace("seq=128", "seq=512")
        rc, out, _ = run(capsys, "simulate", *args, "--json")
        assert rc == 0
        return json.loads(out)

    for recompute in ("full", "selective"):
        flash, unfused = simulate(f"recompute={recompute}"), simulate(f"attention=unfused,recompute={recompute}")
        assert unfused["step_time_s"] > flash["step_time_s"]
        assert unfused["memory_per_gpu_gb"] > flash["memory_per_gpu_gb"]
        assert "attention" in flash["time_by_class_s"] and "attention" not in unfused["time_by_class_s"]
        for kind in ("gemm", "elementwise"):
            assert unfused["time_by_class_s"][kind] > flash["time_by_class_s"][kind]


def test_model_flops_formula_option(capsys, simulated):
    summary, _, _ = simulated
    rc, out, _ = run(capsys, "simulate", *STEP, "--json", "--flops-formula", "model")
    assert rc == 0
    other = json.loads(out)
    assert other["flops_formula"] == "model"
    assert other["step_time_s"] == pytest.approx(summary["step_time_s"], rel=1e-12)
    h, s, l, V = 512, 128, 2, 1024
    ratio = (72 * (1 + s / (6 * h) + V / (12 * l * h))) / (96 * (1 + s / (6 * h) + V / (16 * l * h)))
    assert other["formula_tflops_per_gpu"] == pytest.approx(summary["formula_tflops_per_gpu"] * ratio, rel=1e-9)
    assert other["tflops_per_gpu"] == pytest.approx(summary["tflops_per_gpu"], rel=1e-12)  # the same ops ran


def test_trace_is_valid_chrome_json(simulated):
    summary, trace, _ = simulated
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete
    for e in complete:
        assert {"pid", "tid", "ts", "dur", "name"} <= e.keys()
        assert e["dur"] >= 0 and e["ts"] >= 0
    threads: dict[tuple[int, int], str] = {}
    for e in events:
        if e["ph"] == "M" and e["name"] == "thread_name":
            key = (e["pid"], e["tid"])
            assert key not in threads
            threads[key] = e["args"]["name"]
    # one thread per stream: names unique per process, every op on a named thread
    for pid in {e["pid"] for e in complete}:
        names = [name for (p, _), name in threads.items() if p == pid]
        assert len(names) == len(set(names))
        assert "compute" in names and "comm:x" in names and "comm:z" in names and "comm:data" in names
    by_thread: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in complete:
        assert (e["pid"], e["tid"]) in threads
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    # a stream runs one op at a time (ts and dur are each rounded to 1 ns)
    for spans in by_thread.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 2.5e-3
    last = max(e["ts"] + e["dur"] for e in complete)
    assert last == pytest.approx(summary["step_time_s"] * 1e6, rel=1e-6)


def test_trace_events_carry_their_ops_work(simulated):
    """Each op's event names its work type and carries the work's numbers (a GEMM's m, n, k; a collective's
    kind, group and bytes), read from the work's fields."""
    _, trace, _ = simulated
    complete = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    gemm = next(e["args"] for e in complete if e["args"]["type"] == "gemm")
    assert {"m", "n", "k", "layout", "batch"} <= gemm.keys() and gemm["m"] > 0
    collective = next(e["args"] for e in complete if e["args"]["type"] == "collective")
    assert {"kind", "group", "nbytes"} <= collective.keys() and collective["nbytes"] > 0


def test_trace_file_mode_follows_the_umask(simulated):
    _, trace, _ = simulated
    umask = os.umask(0)
    os.umask(umask)
    assert trace.stat().st_mode & 0o777 == 0o666 & ~umask


def test_figure_is_a_png(simulated):
    _, _, figure = simulated
    assert figure.read_bytes()[:8] == PNG_MAGIC
    assert figure.stat().st_size > 1000


def test_text_summary(capsys):
    rc, out, err = run(capsys, "simulate", *STEP)
    assert rc == 0 and err == ""
    assert "step time" in out and "hardware" in out


def test_export_then_simulate_gives_the_same_step_time(capsys, exported, simulated):
    summary, _, _ = simulated
    rc, out, _ = run(capsys, "simulate", "--schedule", str(exported), "--machine", "frontier", "--json")
    assert rc == 0
    assert json.loads(out)["step_time_s"] == pytest.approx(summary["step_time_s"], rel=1e-12)


def test_export_reports_what_it_wrote(capsys, tmp_path):
    path = tmp_path / "s.json"
    rc, out, _ = run(capsys, "export", *STEP, "-o", str(path))
    assert rc == 0
    assert str(path) in out
    assert json.loads(path.read_text())["world_size"] == 16
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]


def test_machines_table(capsys):
    rc, out, _ = run(capsys, "machines")
    assert rc == 0
    for name in ("frontier", "perlmutter", "alps"):
        assert name in out


def test_one_machine_as_json(capsys):
    rc, out, _ = run(capsys, "machines", "frontier", "--json")
    assert rc == 0
    (row,) = json.loads(out)
    assert row["name"] == "frontier"
    assert row["gpus_per_node"] == 8
    assert row["peak_tflops"] == pytest.approx(191.5)
    assert row["empirical_gemm_tflops"] == pytest.approx(125.0)
    assert row["sources"]  # every number with where it came from
    for entry in row["sources"].values():
        assert entry["source"] or entry["estimate"]


def test_one_machine_with_a_number_set(capsys):
    rc, out, _ = run(capsys, "machines", "frontier", "--set", "device.empirical_gemm_bf16_tflop_per_s=100", "--json")
    (row,) = json.loads(out)
    assert rc == 0 and row["empirical_gemm_tflops"] == pytest.approx(100.0)
    entry = row["sources"]["device.empirical_gemm_bf16_tflop_per_s"]
    assert entry["source"] is None and "set on the command line" in entry["estimate"]
    assert_user_error(*run(capsys, "machines", "--set", "device.hbm_gb=1"), "--set needs a machine NAME")
    assert_user_error(*run(capsys, "machines", "frontier", "--set", "device.hbm_gbb=1"), "did you mean device.hbm_gb")


def test_unknown_machine_listing(capsys):
    rc, out, err = run(capsys, "machines", "atlantis")
    assert_user_error(rc, out, err, "atlantis")


def test_models_json(capsys):
    rc, out, _ = run(capsys, "models", "--json")
    assert rc == 0
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["GPT-80B"]["layers"] == 42 and rows["GPT-80B"]["hidden"] == 12288
    assert rows["GPT-80B"]["params_billion"] == pytest.approx(80, rel=0.05)
    assert {"GPT-5B", "GPT-640B", "22B", "175B", "1T"} <= rows.keys()


def test_console_script_is_installed():
    script = REPO / ".venv" / "bin" / "twin"
    if not script.exists():
        pytest.skip("no .venv/bin/twin in this checkout")
    proc = subprocess.run([str(script), "models"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0
    assert "GPT-80B" in proc.stdout


def test_a_full_pipeline_trace_has_every_rank_with_its_own_programs_ops(capsys, tmp_path):
    """--full simulates every rank, so there are more timelines than programs (two ranks per pipeline stage
    here): each rank's events are its own stage's ops (it crashed pairing timeline i with program i)."""
    trace = tmp_path / "pipe.json"
    rc, _, err = run(capsys, "simulate", "--machine", "frontier", "--model-spec",
                     "layers=4,hidden=256,heads=4,seq=128,vocab=1024", "--gpus", "4", "--plan",
                     "tp=2,pp=2,vpp=2,mbs=1", "--global-batch", "8", "--full", "--trace", str(trace))
    assert rc == 0, err
    complete = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in complete} == {0, 1, 2, 3}
    names = {pid: {e["name"] for e in complete if e["pid"] == pid} for pid in range(4)}
    assert names[0] == names[1] and names[2] == names[3] and names[0] != names[2]
    # the embedding is on stage 0 (virtual stage 0), the loss on stage 1 (virtual stage 3)
    assert any(".embed.word" in name for name in names[0]) and not any(".embed.word" in name for name in names[2])
    assert any(".loss." in name for name in names[2]) and not any(".loss." in name for name in names[0])


@pytest.mark.parametrize("recompute, noted", [("full", False), ("none", True), ("selective", True)])
def test_the_hardware_formula_line_says_when_it_counts_a_recompute_the_plan_does_not_run(capsys, recompute, noted):
    """The hardware formula counts a full recompute whatever the plan reruns, so its % of peak can pass the GPU's
    on a plan that recomputes less: the text line says so there (the executed line is the GPU's)."""
    rc, out, _ = run(capsys, "simulate", "--machine", "frontier", "--model-spec",
                     "layers=2,hidden=512,heads=8,seq=128,vocab=1024", "--gpus", "2",
                     "--plan", f"gx=2,recompute={recompute}", "--global-batch", "2")
    assert rc == 0
    [line] = [line for line in out.splitlines() if "by hardware formula" in line]
    assert ("counts a full recompute this plan does not run" in line) == noted
