"""Bad input on every command: exit code 2, one line on stderr, no traceback, no file changed (issue 14).

A table of flags, plan fields, model specs and output paths a careless or
hostile user types (tests/test_bad_files.py does the same for bad files).
Each case runs the command in-process and checks, besides the exit code and
the one line, that no file of the case's folder or of the repository's
machine files, figures and README changed: bytes and mode, hashed before
and after.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from helpers import REPO
from twin.cli import main

SPEC = "layers=2,hidden=64,heads=4,seq=32,vocab=256"
STEP = ["--machine", "frontier", "--model-spec", SPEC, "--gpus", "2", "--plan", "tp=2", "--global-batch", "4"]
SEARCH = ["search", "--machine", "frontier", "--model-spec", SPEC, "--gpus", "2", "--global-batch", "4", "--no-cache"]
WATCHED = [REPO / "topologies", REPO / "figures", REPO / "README.md"]


def _with(base: list[str], **flags: str) -> list[str]:
    """`base` with some flags' values replaced (flag names with _ for -)."""
    args = list(base)
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    return args


def sim(**flags: str) -> list[str]:
    return ["simulate", *_with(STEP, **flags)]


CASES: list[tuple[str, list[str]]] = [
    # counts: zero, negative, not a number, not an integer, absurdly large
    ("gpus 0", sim(gpus="0")),
    ("gpus negative", sim(gpus="-3")),
    ("gpus text", sim(gpus="two")),
    ("gpus float", sim(gpus="1e3")),
    ("gpus huge", sim(gpus="9" * 40)),
    ("batch 0", sim(global_batch="0")),
    ("batch huge", sim(global_batch="9" * 300)),
    ("batch nan", sim(global_batch="nan")),
    ("seq 0", sim(seq="0")),
    ("seq nan", sim(seq="nan")),
    ("seq huge", sim(seq="10000000000")),
    # plan fields
    ("plan tp=0", sim(plan="tp=0")),
    ("plan tp text", sim(plan="tp=x")),
    ("plan unknown key", sim(plan="tp=2,foo=1")),
    ("plan no value", sim(plan="tp")),
    ("plan mbs=0", sim(plan="tp=2,mbs=0")),
    ("plan ga=0", sim(plan="tp=2,ga=0")),
    ("plan zero=4", sim(plan="tp=2,zero=4")),
    ("plan recompute word", sim(plan="tp=2,recompute=maybe")),
    ("plan attention word", sim(plan="tp=2,attention=fast")),
    ("plan key twice", sim(plan="tp=2,tp=2")),
    ("plan alias twice", sim(plan="tp=2,gx=2")),
    ("plan GPUs mismatch", sim(plan="tp=4")),
    ("plan degree huge", sim(plan="tp=" + "9" * 30)),
    ("plan oar=2", sim(plan="tp=2,oar=2")),
    ("plan batch twice", sim(plan="tp=2,global_batch=4")),
    ("plan interleaved rounds", sim(model_spec="layers=4,hidden=64,heads=4,seq=32", plan="pp=2,vpp=2",
                                    global_batch="3")),
    ("plan mbs not dividing", sim(plan="tp=2,mbs=3")),
    # model specs
    ("spec layers=0", sim(model_spec="layers=0,hidden=64,heads=4")),
    ("spec missing heads", sim(model_spec="layers=2,hidden=64")),
    ("spec heads not dividing", sim(model_spec="layers=2,hidden=64,heads=5")),
    ("spec ffn=0", sim(model_spec="layers=2,hidden=64,heads=4,ffn=0")),
    ("spec hidden huge", sim(model_spec="layers=2,hidden=" + "9" * 30 + ",heads=4")),
    ("spec dtype", sim(model_spec="layers=2,hidden=64,heads=4,dtype=fp8")),
    ("spec unknown key", sim(model_spec="layers=2,hidden=64,heads=4,experts=8")),
    ("spec not an int", sim(model_spec="layers=2.5,hidden=64,heads=4")),
    ("spec kv_heads not dividing heads", sim(model_spec="layers=2,hidden=64,heads=4,kv_heads=3")),
    ("spec kv_heads not split by tp", sim(model_spec="layers=2,hidden=64,heads=4,kv_heads=1")),
    ("spec arch", sim(model_spec="layers=2,hidden=64,heads=4,arch=mamba")),
    ("plan tpo without sp", sim(plan="tp=2,tpo=1")),
    ("plan odp with zero 3", ["simulate", "--machine", "frontier", "--model-spec", SPEC, "--gpus", "4", "--plan",
                              "tp=2,dp=2,zero=3,odp=1", "--global-batch", "4"]),
    ("plan pemb without a pipeline", sim(plan="tp=2,pemb=1")),
    ("plan dpouter without a pipeline", sim(plan="tp=2,dpouter=1")),
    ("plan ploss not 0 or 1", sim(plan="tp=2,ploss=2")),
    ("plan pemb slots not dividing", ["simulate", "--machine", "frontier", "--model-spec", SPEC, "--gpus", "2",
                                      "--plan", "pp=2,pemb=1", "--global-batch", "4"]),
    ("unknown model", ["simulate", *[a if a != "--model-spec" else "--model"
                                     for a in _with(STEP, model_spec="GPT-7Q")]]),
    # machines and --set
    ("unknown machine", sim(machine="atlantis")),
    ("machine file missing", sim(machine="{tmp}/nowhere.toml")),
    ("set unknown field", sim(set="device.nosuch=1")),
    ("set nan", sim(set="device.hbm_efficiency=nan")),
    ("set text", sim(set="device.hbm_efficiency=fast")),
    ("set no value", sim(set="device.hbm_efficiency")),
    # outputs: never an input, never shared, never half-written, never read-only
    ("trace is the schedule", ["simulate", "--machine", "frontier", "--schedule", "{sched}", "--trace", "{sched}"]),
    ("trace is the machine file", sim(machine="{machine}", trace="{machine}")),
    ("trace is a named machine", sim(trace=str(REPO / "topologies" / "frontier.toml"))),
    ("trace and figure one path", sim(trace="{tmp}/x.png", figure="{tmp}/x.png")),
    ("figure format", sim(figure="{tmp}/x.json")),
    ("figure folder missing", sim(figure="{tmp}/nowhere/x.png")),
    ("trace is a folder", sim(trace="{tmp}")),
    ("trace read-only", sim(trace="{readonly}")),
    ("trace empty name", sim(trace="")),
    # conflicting flags
    ("schedule with model", ["simulate", "--machine", "frontier", "--schedule", "{sched}", "--model", "GPT-5B"]),
    ("schedule with plan", ["simulate", "--machine", "frontier", "--schedule", "{sched}", "--plan", "tp=2"]),
    ("schedule without machine", ["simulate", "--schedule", "{sched}"]),
    ("simulate nothing", ["simulate", "--machine", "frontier"]),
    ("preset unknown", ["simulate", "--preset", "atlantis-1t"]),
    ("preset contradicted", ["simulate", "--preset", "frontier-22b", "--gpus", "7"]),
    ("flops formula", sim(flops_formula="magic")),
    ("simulate jobs 0", sim(jobs="0")),
    ("simulate jobs not a number", sim(jobs="two")),
    ("scale jobs 0", ["scale", "--machine", "frontier", "--model", "GPT-5B", "--plan", "tp=2", "--gpus", "2,4",
                      "--mode", "weak", "--jobs", "0"]),
    ("unknown flag", sim(turbo="1")),
    # sensitivity
    ("factor 0", ["sensitivity", *_with(STEP, factor="0")]),
    ("factor nan", ["sensitivity", *_with(STEP, factor="nan")]),
    ("factor 5", ["sensitivity", *_with(STEP, factor="5")]),
    ("target negative", ["sensitivity", *_with(STEP, target_step_s="-1")]),
    ("target inf", ["sensitivity", *_with(STEP, target_step_s="inf")]),
    ("jobs 0", ["sensitivity", *_with(STEP, jobs="0")]),
    ("jobs huge", ["sensitivity", *_with(STEP, jobs="100000")]),
    ("fields empty", ["sensitivity", *_with(STEP, fields=",")]),
    ("fields and all", ["sensitivity", *STEP, "--fields", "device.hbm_efficiency", "--all"]),
    # compare-trace
    ("trace file missing", ["compare-trace", "{tmp}/none.json", *STEP]),
    ("trace rank negative", ["compare-trace", "{tmp}/none.json", *_with(STEP, rank="-1")]),
    ("trace steps 0", ["compare-trace", "{tmp}/none.json", *_with(STEP, steps="0")]),
    # scale
    ("scale gpus text", ["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2", "--gpus", "2,x",
                         "--mode", "weak", "--figure", "{tmp}/s.png"]),
    ("scale gpus 0", ["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2", "--gpus", "0,2",
                      "--mode", "weak", "--figure", "{tmp}/s.png"]),
    ("scale with dp", ["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2,dp=2", "--gpus",
                       "4,8", "--mode", "weak", "--figure", "{tmp}/s.png"]),
    ("scale mode", ["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2", "--gpus", "2,4",
                    "--mode", "sideways"]),
    ("scale figure format", ["scale", "--machine", "frontier", "--model-spec", SPEC, "--plan", "tp=2", "--gpus",
                             "2,4", "--mode", "weak", "--figure", "{tmp}/s.toml"]),
    # export
    ("export empty output", ["export", *STEP, "-o", ""]),
    ("export over its machine", ["export", *_with(STEP, machine="{machine}"), "-o", "{machine}"]),
    ("export over a named machine", ["export", *STEP, "-o", str(REPO / "topologies" / "frontier.toml")]),
    ("export to a folder", ["export", *STEP, "-o", "{tmp}"]),
    ("export folder missing", ["export", *STEP, "-o", "{tmp}/nowhere/s.json"]),
    ("export read-only", ["export", *STEP, "-o", "{readonly}"]),
    # search
    ("search top 0", [*SEARCH, "--top", "0"]),
    ("search top negative", [*SEARCH, "--top", "-1"]),
    ("search min-tp 0", [*SEARCH, "--min-tp", "0"]),
    ("search max-tp 0", [*SEARCH, "--max-tp", "0"]),
    ("search max below min", [*SEARCH, "--max-tp", "1", "--min-tp", "2"]),
    ("search robustness 1", [*SEARCH, "--robustness", "1"]),
    ("search tokens huge", [*SEARCH[:-3], "--no-cache", "--batch-tokens", "9" * 40]),
    ("search tokens overflow", [*SEARCH[:-3], "--no-cache", "--batch-tokens", "1" + "0" * 400 + "M"]),
    ("search tokens text", [*SEARCH[:-3], "--no-cache", "--batch-tokens", "lots"]),
    ("search batch twice", [*SEARCH, "--batch-tokens", "16M"]),
    ("search axes", [*SEARCH, "--axes", "gx,foo"]),
    ("search zero", [*SEARCH, "--zero", "5"]),
    ("search recompute", [*SEARCH, "--recompute", "sometimes"]),
    ("search reshard", [*SEARCH, "--reshard", "yes"]),
    ("search vpp zero", [*SEARCH, "--vpp", "0,2"]),
    ("search vpp text", [*SEARCH, "--vpp", "two"]),
    ("search sp 2", [*SEARCH, "--sp", "2"]),
    ("search odp empty", [*SEARCH, "--odp", ","]),
    ("search mbs text", [*SEARCH, "--mbs", "x"]),
    ("search jobs 0", [*SEARCH, "--jobs", "0"]),
    ("search figure format", [*SEARCH, "--figure", "{tmp}/l.txt"]),
    # validate
    ("validate section", ["validate", "--sections", "C"]),
    ("validate readme without markers", ["validate", "--readme", "{plain}"]),
    ("validate readme missing", ["validate", "--readme", "{tmp}/none.md"]),
    ("validate machine without runs", ["validate", "--machine", "frontier"]),
    ("validate runs missing", ["validate", "--runs", "{tmp}/none.csv", "--machine", "frontier"]),
    ("validate jobs negative", ["validate", "--jobs", "-1"]),
    # fit
    ("fit over its machine", ["fit", "--machine", "{machine}", "--runs", "{runs}", "-o", "{machine}"]),
    ("fit over its runs", ["fit", "--machine", "frontier", "--runs", "{runs}", "-o", "{runs}"]),
    ("fit runs and from", ["fit", "--machine", "frontier", "--runs", "{runs}", "--from", "{machine}",
                           "-o", "{tmp}/f.toml"]),
    ("fit neither", ["fit", "--machine", "frontier", "-o", "{tmp}/f.toml"]),
    ("fit unknown param", ["fit", "--machine", "frontier", "--runs", "{runs}", "--params", "device.magic",
                           "-o", "{tmp}/f.toml"]),
    ("fit folds 1", ["fit", "--machine", "frontier", "--runs", "{runs}", "--folds", "1", "--params",
                     "device.hbm_efficiency", "-o", "{tmp}/f.toml"]),
    ("fit output format", ["fit", "--machine", "frontier", "--runs", "{runs}", "-o", "{tmp}/f.txt"]),
    ("runs step time nan", ["validate", "--runs", "{runs_nan}", "--machine", "frontier"]),
    ("runs set unknown", ["validate", "--runs", "{runs}", "--machine", "frontier", "--set", "device.magic=1"]),
    ("runs set with machine", ["validate", "--runs", "{runs}", "--machine", "frontier", "--set",
                               "frontier:device.hbm_gb=40"]),
    ("runs with readme", ["validate", "--runs", "{runs}", "--machine", "frontier", "--readme", "{plain}"]),
    ("runs batch huge", ["validate", "--runs", "{runs_huge}", "--machine", "frontier"]),
    ("runs binary", ["validate", "--runs", "{runs_binary}", "--machine", "frontier"]),
    ("fit jobs 0", ["fit", "--machine", "frontier", "--runs", "{runs}", "--jobs", "0", "-o", "{tmp}/f.toml"]),
    # machines, models, presets
    ("machines unknown", ["machines", "atlantis"]),
    ("machines set without name", ["machines", "--set", "device.hbm_gb=1"]),
    ("models extra", ["models", "extra"]),
    ("presets flag", ["presets", "--all"]),
    ("no command", []),
    ("unknown command", ["teleport"]),
    # the executor's commands: checked before torch starts anything
    ("run timeout nan", ["run", "{sched}", "--timeout", "nan"]),
    ("run timeout negative", ["run", "{sched}", "--timeout", "-1"]),
    ("run wall-timeout negative", ["run", "{sched}", "--wall-timeout", "-5"]),
    ("run steps 0", ["run", "{sched}", "--steps", "0"]),
    ("run warmup negative", ["run", "{sched}", "--warmup", "-1"]),
    ("run nproc 0", ["run", "{sched}", "--nproc", "0"]),
    ("run nproc huge", ["run", "{sched}", "--nproc", "5000"]),
    ("run out is a file", ["run", "{sched}", "--out", "{sched}"]),
    ("run threads 0", ["run", "{sched}", "--threads", "0"]),
    ("run nice 40", ["run", "{sched}", "--compute-nice", "40"]),
    ("run profile negative", ["run", "{sched}", "--profile-steps", "-1"]),
    ("run trace is the schedule", ["run", "{sched}", "--trace", "{sched}"]),
    ("run schedule missing", ["run", "{tmp}/none.json"]),
    ("calibrate repeats 0", ["calibrate", "--repeats", "0", "-o", "{tmp}/l.toml"]),
    ("calibrate output format", ["calibrate", "-o", "{tmp}/l.txt"]),
    ("calibrate nproc 0", ["calibrate", "--nproc", "0", "-o", "{tmp}/l.toml"]),
    ("calibrate launches 0", ["calibrate", "--launches", "0", "-o", "{tmp}/l.toml"]),
    ("calibrate a gpu", ["calibrate", "--device", "cuda", "-o", "{tmp}/l.toml"]),
    ("compare without machine", ["compare", "{sched}"]),
    ("compare nproc 0", ["compare", "{sched}", "--machine", "frontier", "--nproc", "0"]),
]


def _fingerprint(paths: list[Path]) -> dict[str, tuple[str, int]]:
    """Every file under `paths`: its bytes' hash and its mode."""
    out = {}
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            out[str(f)] = (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mode)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """The valid inputs the cases point at: a schedule, a machine file, measured runs, a README without markers,
    a read-only file."""
    tmp = tmp_path_factory.mktemp("inputs")
    sched = tmp / "step.json"
    assert main(["export", *STEP, "-o", str(sched)]) == 0
    machine = tmp / "frontier-copy.toml"
    machine.write_bytes((REPO / "topologies" / "frontier.toml").read_bytes())
    runs = tmp / "runs.csv"
    runs.write_text("layers,hidden,heads,seq,gpus,plan,global_batch,step_time_s\n"
                    "2,64,4,32,2,tp=2,4,0.01\n2,64,4,32,2,tp=2,8,0.02\n")
    header = "layers,hidden,heads,seq,gpus,plan,global_batch,step_time_s\n"
    (tmp / "runs-nan.csv").write_text(header + "2,64,4,32,2,tp=2,4,nan\n")
    (tmp / "runs-huge.csv").write_text(header + f"2,64,4,32,2,tp=2,{10**23},1\n")  # hung on its divisors
    (tmp / "runs-binary.csv").write_bytes(b"\xff\xfe\x00garbage")
    plain = tmp / "plain.md"
    plain.write_text("# a README without the accuracy markers\n")
    readonly = tmp / "readonly.json"
    readonly.write_text("{}")
    readonly.chmod(stat.S_IRUSR | stat.S_IRGRP)
    return {"tmp": str(tmp), "cache": str(tmp_path_factory.mktemp("cache")), "sched": str(sched),
            "machine": str(machine), "runs": str(runs), "plain": str(plain), "readonly": str(readonly),
            **{f"runs_{kind}": str(tmp / f"runs-{kind}.csv") for kind in ("nan", "huge", "binary")}}


def test_the_table_is_large_and_distinct():
    assert len(CASES) >= 100
    assert len({name for name, _ in CASES}) == len(CASES)
    assert len({tuple(argv) for _, argv in CASES}) == len(CASES)


@pytest.mark.parametrize("argv", [argv for _, argv in CASES], ids=[name for name, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_changes_no_file(argv, files, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # anything written to a default path lands here, and is seen
    monkeypatch.setenv("XDG_CACHE_HOME", files["cache"])  # not watched: matplotlib keeps its font list there
    watched = [Path(files["tmp"]), tmp_path, *WATCHED]
    before = _fingerprint(watched)
    args = [a.format(**files) for a in argv]
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's usage errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("twin") and "error:" in lines[0], err
    assert "Traceback" not in err
    assert _fingerprint(watched) == before
    assert not os.path.exists(tmp_path / "out") or not any((tmp_path / "out").iterdir())
