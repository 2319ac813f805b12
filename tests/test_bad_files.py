"""Every file a user hands the twin is checked before any work: a bad one is one line, exit code 2.

Four kinds of file reach the twin from outside: machine files (and `--set`
values written into them), schedule IR files (tests/test_bad_schedule_files.py,
with the helpers here), profiler traces, and the search cache's entries. Each
case writes one bad file into tmp_path,
runs the CLI in-process and checks what a user sees: exit code 2, exactly one
line on stderr starting "twin: error:" that names the problem, no traceback,
nothing on stdout, and the bad file left byte for byte as it was (the twin
never "repairs" a user's input). A cache entry is the exception: it is the
twin's own file, so a bad one is deleted and recomputed, with a one-line
warning, and the command succeeds.

A control case per kind runs the unmutated file, so each error is known to
come from the one thing a case breaks.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from pathlib import Path
from typing import Callable

import pytest

from twin.cli import main

REPO = Path(__file__).resolve().parents[1]
FRONTIER = (REPO / "topologies" / "frontier.toml").read_text()
STEP = ["--model-spec", "layers=2,hidden=512,heads=8,seq=128,vocab=1024", "--gpus", "8", "--plan", "gx=2,gz=4",
        "--global-batch", "8"]
SEARCH = ["search", "--machine", "frontier", "--model-spec", "layers=2,hidden=256,heads=4,seq=128,vocab=1024",
          "--gpus", "2", "--global-batch", "4", "--jobs", "1", "--top", "2"]
INF = "__INF__"  # JSON cannot say infinity; 1e999 reads as it (json.dumps writes the marker, then it is replaced)

Writer = Callable[[Path], Path]  # writes the case's file into tmp_path, returns its path
Argv = Callable[[Path, Path], list[str]]  # (the bad file, tmp_path) -> the command line


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, out: str, err: str, mention: str) -> None:
    assert rc == 2, (rc, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), err
    assert lines[0].startswith("twin: error:"), err
    assert mention in lines[0], (mention, lines[0])


def check_case(capsys, tmp_path: Path, write: Writer, argv: Argv, mention: str) -> None:
    path = write(tmp_path)
    before = path.read_bytes()
    rc, out, err = run(capsys, argv(path, tmp_path))
    assert_one_line_error(rc, out, err, mention)
    assert path.read_bytes() == before, "the twin changed the user's file"


def text_file(name: str, text: str | bytes) -> Writer:
    def write(tmp_path: Path) -> Path:
        path = tmp_path / name
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return path
    return write


# ---- machine files -------------------------------------------------------------------------------------------


def machine_with(key: str, literal: str, occurrence: int = 1) -> Writer:
    """frontier.toml with the value of the occurrence-th `key = { value = ... }` replaced by `literal`."""
    pattern = re.compile(rf"^({re.escape(key)} = {{ value = )[^,]+", re.M)
    matches = list(pattern.finditer(FRONTIER))
    m = matches[occurrence - 1]
    return text_file("machine.toml", FRONTIER[:m.start()] + m.group(1) + literal + FRONTIER[m.end():])


def machine_adding(after: str, lines: str) -> Writer:
    """frontier.toml with `lines` inserted after the line `after`."""
    assert after in FRONTIER
    return text_file("machine.toml", FRONTIER.replace(after + "\n", after + "\n" + lines + "\n", 1))


GOOD_MACHINE = text_file("machine.toml", FRONTIER)


def machines(path: Path, _tmp: Path) -> list[str]:
    return ["machines", str(path)]


def machines_set(*overrides: str) -> Argv:
    return lambda path, _tmp: ["machines", str(path), *[a for o in overrides for a in ("--set", o)]]


def simulate_on(path: Path, _tmp: Path) -> list[str]:
    return ["simulate", "--machine", str(path), *STEP]


_GEMM_ENTRY = '[[device.gemm_measured]]\nm = 8192\nn = 8192\nk = 8192\nlayout = "nn"\n' \
             'tflop_per_s = { value = 100.0, estimate = "t" }\nestimate = "t"'

MACHINE_CASES = [
    pytest.param(text_file("machine.toml", random.Random(1).randbytes(3000)),
                 machines, "not a text file", id="machine-binary"),
    pytest.param(text_file("machine.toml", FRONTIER.encode("utf-16")), machines, "not a text file",
                 id="machine-utf16"),
    pytest.param(text_file("machine.toml", FRONTIER[:FRONTIER.index("hbm_gb = {") + 14]), machines, "invalid TOML",
                 id="machine-truncated"),
    pytest.param(text_file("machine.toml", ""), machines, "'machine' is missing", id="machine-empty"),
    pytest.param(text_file("machine.toml", FRONTIER.replace("[device]\n", "[device]\x00\n", 1)), machines,
                 "invalid TOML", id="machine-nul-byte"),
    pytest.param(machine_with("hbm_gb", "1e308"), machines, "'device.hbm_gb' is 1e+308, above", id="hbm-1e308"),
    pytest.param(machine_with("peak_bf16_tflop_per_s", "inf"), machines, "'device.peak_bf16_tflop_per_s' must be a finite",
                 id="peak-inf"),
    pytest.param(machine_with("peak_bf16_tflop_per_s", "nan"), machines, "'device.peak_bf16_tflop_per_s' must be a finite",
                 id="peak-nan"),
    pytest.param(machine_with("hbm_gb", "-inf"), machines, "'device.hbm_gb' must be a finite", id="hbm-minus-inf"),
    pytest.param(machine_with("link_bw_per_direction_gb_per_s", "1e400"), machines,
                 "'network.link_bw_per_direction_gb_per_s' must be a finite", id="network-bw-overflows-to-inf"),
    pytest.param(machine_with("hbm_bw_gb_per_s", "1e9"), machines, "'device.hbm_bw_gb_per_s' is 1e+09, above",
                 id="hbm-bw-above-limit"),
    pytest.param(machine_with("kernel_overhead_us", "2e6"), machines, "'device.kernel_overhead_us' is 2e+06, above",
                 id="overhead-above-1s"),
    pytest.param(machine_with("ll", "inf"), machines, "'collectives.base_latency_us.ring.ll' must be a finite",
                 id="latency-table-inf"),
    pytest.param(machine_with("ll", "5e7", occurrence=3), machines, "'collectives.intra_hop_latency_us.ll' is 5e+07",
                 id="latency-table-above-limit"),
    pytest.param(machine_with("n_groups", "1000000000000"), machines, "'network.n_groups' is 1e+12, above",
                 id="count-above-limit"),
    pytest.param(machine_with("compute_units", "1" + "0" * 30), machines, "'device.compute_units' is 1.000e+30",
                 id="huge-integer"),
    pytest.param(machine_with("gpus_per_node", "100000"), machines, "'node.gpus_per_node' is 100000, above",
                 id="gpus-per-node-above-limit"),
    pytest.param(machine_with("attention_efficiency", "nan"), machines, "'device.attention_efficiency' must be a finite",
                 id="fraction-nan"),
    pytest.param(machine_adding('kind = "dragonfly"', 'switch_latency_us = { value = 0.35, estimate = "x" }'),
                 machines, "'network.switch_latency_us' is not a known field", id="removed-switch-latency"),
    pytest.param(machine_adding('kind = "dragonfly"', 'nic_latency_us = { value = 2.6, source = "x" }'),
                 machines, "'network.nic_latency_us' is not a known field", id="removed-nic-latency"),
    pytest.param(text_file("machine.toml", FRONTIER + '\n[collectives.p2p_latency_us]\nsimple = { value = 30, '
                                           'source = "x" }\n'), machines,
                 "'collectives.p2p_latency_us.ll' is missing for an allowed protocol", id="p2p-latency-protocol"),
    pytest.param(text_file("machine.toml", FRONTIER + '\n[extras]\nnote = "x"\n'), machines,
                 "'extras' is not a known field", id="unknown-table"),
    pytest.param(text_file("machine.toml", FRONTIER.replace("[[node.nics]]", _GEMM_ENTRY.replace(
        "m = 8192", "m = 1000000000000") + "\n\n[[node.nics]]", 1)), machines,
        "'device.gemm_measured[0].m' is 1e+12, above", id="structure-integer-above-limit"),
    pytest.param(machine_with("peak_bf16_tflop_per_s", "inf"), simulate_on, "'device.peak_bf16_tflop_per_s'",
                 id="simulate-machine-inf"),
    pytest.param(GOOD_MACHINE, machines_set("device.hbm_gb=1e308"),
                 "(with --set): field 'device.hbm_gb' is 1e+308, above", id="set-hbm-1e308"),
    pytest.param(GOOD_MACHINE, machines_set("device.peak_bf16_tflop_per_s=inf"),
                 "--set device.peak_bf16_tflop_per_s: value 'inf' must be finite", id="set-inf"),
    pytest.param(GOOD_MACHINE, machines_set("device.compute_units=1e300"),
                 "'device.compute_units' is 1.000e+300", id="set-count-huge"),
    pytest.param(GOOD_MACHINE, machines_set("device.kernel_overhead_us=5e6"),
                 "'device.kernel_overhead_us' is 5e+06, above", id="set-latency-above-limit"),
    pytest.param(GOOD_MACHINE, machines_set("network.switch_latency_us=1"),
                 "--set network.switch_latency_us: machine.toml has no such number", id="set-removed-field"),
]


@pytest.mark.parametrize("write, argv, mention", MACHINE_CASES)
def test_bad_machine_file(capsys, tmp_path, write, argv, mention):
    check_case(capsys, tmp_path, write, argv, mention)


def test_the_unedited_machine_file_loads(capsys, tmp_path):
    path = GOOD_MACHINE(tmp_path)
    rc, out, err = run(capsys, ["machines", str(path)])
    assert rc == 0 and err == "" and "device.hbm_gb = 68.7" in out


# ---- profiler traces -----------------------------------------------------------------------------------------


def base_trace() -> dict:
    """Two 10 ms steps of one GPU (times in us, as Kineto writes them): a GEMM and an all-gather each."""
    events = []
    for i, t0 in enumerate((1000.0, 11000.0)):
        events += [{"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{i + 1}", "ts": t0,
                    "dur": 10000.0, "pid": 0, "tid": 7},
                   {"ph": "X", "cat": "kernel", "name": "Cijk_Ailk_Bljk_BBS_BH_MT128x128x32", "ts": t0 + 100,
                    "dur": 2000.0, "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}},
                   {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": t0 + 100,
                    "dur": 2000.0, "pid": 0, "tid": 20, "args": {"device": 0, "stream": 20}}]
    return {"traceEvents": events}


def trace_gz(data: Callable[[bytes], bytes], name: str = "trace.json.gz") -> Writer:
    """The base trace gzipped, then passed through `data` (cut, corrupted)."""
    return text_file(name, data(gzip.compress(json.dumps(base_trace()).encode(), mtime=0)))


def flip_bytes(raw: bytes) -> bytes:
    """Deterministic corruption in the middle of the deflate stream."""
    out = bytearray(raw)
    for i in range(20, len(out) - 10, 7):
        out[i] ^= 0xFF
    return bytes(out)


def trace_with(edit: Callable[[dict], object]) -> Writer:
    def write(tmp_path: Path) -> Path:
        d = base_trace()
        edit(d)
        return text_file("trace.json", json.dumps(d).replace(f'"{INF}"', "1e999"))(tmp_path)
    return write


def compare_trace(path: Path, _tmp: Path) -> list[str]:
    return ["compare-trace", str(path), "--machine", "frontier", *STEP]


TRACE_CASES = [
    pytest.param(trace_gz(lambda raw: raw[:100]), compare_trace, "a truncated or corrupt gzip file",
                 id="gzip-first-100-bytes"),
    pytest.param(trace_gz(lambda raw: raw[:-8]), compare_trace, "a truncated or corrupt gzip file",
                 id="gzip-missing-trailer"),
    pytest.param(trace_gz(flip_bytes), compare_trace, "a truncated or corrupt gzip file", id="gzip-corrupt-data"),
    pytest.param(text_file("trace.json.gz", random.Random(2).randbytes(300)),
                 compare_trace, "not gzip-compressed", id="random-bytes-named-gz"),
    pytest.param(text_file("trace.json.gz", json.dumps(base_trace())), compare_trace, "not gzip-compressed",
                 id="plain-json-named-gz"),
    pytest.param(text_file("trace.json.gz", gzip.compress(b"not json at all", mtime=0)), compare_trace,
                 "not a JSON trace", id="gzip-of-non-json"),
    pytest.param(text_file("trace.json", "{\"traceEvents\": [{"), compare_trace, "not a JSON trace",
                 id="truncated-json"),
    pytest.param(text_file("trace.json", ""), compare_trace, "not a JSON trace", id="empty-file"),
    pytest.param(text_file("trace.json", bytes(range(256))), compare_trace, "is not UTF-8", id="binary"),
    pytest.param(text_file("trace.json", "[" * 100_000), compare_trace, "nested too deeply", id="nested-too-deep"),
    pytest.param(text_file("trace.json", json.dumps("hello")), compare_trace, "no traceEvents list (the file is a "
                 "JSON string)", id="json-string"),
    pytest.param(trace_with(lambda d: d.update(traceEvents={"a": 1})), compare_trace, "no traceEvents list",
                 id="events-an-object"),
    pytest.param(text_file("trace.json", json.dumps([1, 2, "x"])), compare_trace, "no GPU kernels",
                 id="events-not-objects"),
    pytest.param(trace_with(lambda d: d["traceEvents"][1].update(dur=INF)), compare_trace,
                 "has dur = inf, not a finite time", id="infinite-duration"),
    pytest.param(trace_with(lambda d: d["traceEvents"][2].update(ts=float("nan"))), compare_trace,
                 "has ts = nan, not a finite time", id="nan-start"),
]


@pytest.mark.parametrize("write, argv, mention", TRACE_CASES)
def test_bad_profiler_trace(capsys, tmp_path, write, argv, mention):
    check_case(capsys, tmp_path, write, argv, mention)


def test_the_unedited_trace_compares(capsys, tmp_path):
    path = trace_gz(lambda raw: raw)(tmp_path)
    rc, out, err = run(capsys, compare_trace(path, tmp_path))
    assert rc == 0 and "all_gather" in out, err


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip-bomb", "too-large"])
def test_a_trace_beyond_the_cap_is_one_line_before_it_fills_memory(capsys, tmp_path, monkeypatch, compressed):
    """A gzip file that expands past MAX_TRACE_BYTES (here lowered to 1 MB; the real cap is 4 GiB) is refused
    after reading no more than the cap, and so is a plain file that large."""
    from twin import profiler_trace

    monkeypatch.setattr(profiler_trace, "MAX_TRACE_BYTES", 1 << 20)
    padding = b" " * (4 << 20)  # JSON whitespace: 4 MB of it compresses to a few KB
    data = json.dumps(base_trace()).encode() + padding
    write = text_file("trace.json.gz" if compressed else "trace.json", gzip.compress(data) if compressed else data)
    check_case(capsys, tmp_path, write, compare_trace, "more than")


# ---- search cache entries ------------------------------------------------------------------------------------


def _ranked_step_not_a_number(doc: dict) -> None:
    doc["ranked"][0]["step_time_s"] = "fast"


CACHE_CASES = [
    pytest.param(b"{}", id="empty-object"),
    pytest.param(b"[1]", id="a-list"),
    pytest.param(b"null", id="null"),
    pytest.param(b'{"ranked": 5}', id="missing-fields"),
    pytest.param(b"garbage{", id="not-json"),
    pytest.param(bytes(range(256)), id="binary"),
    pytest.param(_ranked_step_not_a_number, id="wrong-type-inside"),
    pytest.param(lambda doc: doc.update(colour="red"), id="unknown-key"),
    pytest.param(lambda doc: doc.update(ranked=[{"plan": "x"}]), id="ranked-entry-incomplete"),
]


@pytest.mark.parametrize("corrupt", CACHE_CASES)
def test_bad_cache_entry_is_discarded_and_recomputed(capsys, tmp_path, monkeypatch, corrupt):
    monkeypatch.delenv("EXATWIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rc, good_out, _ = run(capsys, SEARCH)
    assert rc == 0
    [entry] = (tmp_path / "cache" / "exatwin" / "search").glob("*.json")
    good = json.loads(entry.read_bytes())
    if callable(corrupt):
        doc = json.loads(entry.read_bytes())
        corrupt(doc)
        entry.write_text(json.dumps(doc))
    else:
        entry.write_bytes(corrupt)
    rc, out, err = run(capsys, SEARCH)
    assert rc == 0, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("twin: warning: discarded the cache entry"), err
    assert str(entry) in lines[0]
    ranking = [line for line in out.splitlines() if line.lstrip().startswith("1 ")]
    assert ranking and ranking == [line for line in good_out.splitlines() if line.lstrip().startswith("1 ")]
    # Recomputed and stored again: the next identical search is served from the cache, silently.
    assert json.loads(entry.read_bytes())["ranked"] == good["ranked"]
    rc, out, err = run(capsys, SEARCH)
    assert rc == 0 and err == "" and "from the cache" in out
