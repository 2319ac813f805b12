"""Random steps through `twin simulate`: every outcome a sane result or a one-line error (issue 14).

    .venv/bin/python benchmarks/fuzz.py [--cases 10000] [--seed 0] [--timeout 60] [--json]

Each case draws a machine (sometimes with a --set of an odd or out-of-range
value), a small GPT-style model (any head count, odd vocabularies and ffn
sizes, sometimes a dtype, grouped-query attention, Llama's layer, an untied
head, no dropout), a plan over every axis and switch (degrees that do not
divide, GPU counts that do not match, context parallelism, interleaving,
uneven pipeline splits, ZeRO, recompute (of every layer or some), attention kinds, the overlaps, rank
order, micro-batches) and a batch, runs `twin simulate --json` in
this process and sorts the outcome:

- ok: exit 0, stdout is strict JSON (no NaN/Infinity), every number finite,
  and the achieved throughput at most the device's advertised peak;
- error: exit 2 and exactly one line on stderr, no traceback;
- crash: anything else (an exception, another exit code, several lines);
- hang: no answer within --timeout seconds (SIGALRM);
- above peak: exit 0 with more than the device's peak.

One case in four is a schedule IR file instead: a small exported step (a
tensor-parallel one and a pipeline with transfers) with a few values
replaced anywhere in its JSON (by negative, huge, non-numeric, null or
nested values), keys deleted, list entries repeated or the file truncated,
run through `twin simulate --schedule FILE --json`.

The table counts each; every case that is not ok or error is printed with
its seed and its command line, so it can be rerun alone. Models are small
(the point is the input space, not the machine's size), so 10,000 cases take
minutes. tests/test_fuzz.py runs the same cases: a short run in the default
suite (and a hypothesis search over the same choices), 10,000 marked slow.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import load_machine  # noqa: E402
from topologies.overrides import parse_override  # noqa: E402
from twin.cli import main as twin_main  # noqa: E402
from twin.errors import TwinError  # noqa: E402

Draw = Callable[[Sequence], object]  # picks one of the options given

MACHINES = ("frontier", "perlmutter", "alps", "dgx-a100", "dgx-a100-800g", "mpt-h100-80g", "gb200-nvl72")
# Machine-file numbers a case may replace, with odd but also impossible values.
SETS = {
    "device.hbm_efficiency": ("0.05", "0.5", "1", "1.5", "0", "-1", "nan", "inf"),
    "device.attention_efficiency": ("0.01", "0.3", "1", "2", "nan"),
    "device.kernel_overhead_us": ("0", "0.5", "50", "1e6", "-3", "inf"),
    "device.empirical_gemm_bf16_tflop_per_s": ("1", "100", "1e9", "0", "nan"),
    "device.empirical_gemm_fp8_tflop_per_s": ("1", "1000", "1e9", "0", "nan"),
    "device.comm_compute_slowdown": ("0", "0.5", "0.99", "1", "5"),
    "device.hbm_gb": ("0.001", "1", "80", "1e308", "inf"),
}
DEGREES = (1, 1, 1, 2, 2, 3, 4, 6, 8)
# Plan switches a case may add (each now and then, on top of the axes and the common keys above).
SWITCHES = (("pemb", (0, 1)), ("ploss", (0, 1)), ("dpouter", (0, 1)), ("tpo", (0, 1)), ("odp", (0, 1)),
            ("reshard", (0, 1)), ("optimizer", ("megatron", "flat")), ("p2p", ("split", "full")),
            ("cpcomm", ("p2p", "allgather")), ("fp8", (0, 1)), ("fp8recipe", ("current", "delayed")),
            ("rcl", (1, 2)), ("fp8pg", (0, 1)), ("gradfp32", (0, 1)), ("kernels", ("fused", "eager")),
            ("norm", ("fused", "eager")), ("fsdp2", (0, 1)), ("axonn", (0, 1)), ("cache", (1, 2)))
# Model-spec options a case may add: grouped-query attention, Llama's layer, the LM head, dropout.
MODEL_OPTIONS = (("kv_heads", (1, 2, 3)), ("arch", ("gpt", "llama")), ("tied", (0, 1)), ("dropout", (0, 1)))


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok, error, crash, hang, above_peak
    detail: str = ""


def draw_case(draw: Draw) -> list[str]:
    """One `twin simulate` command line, each choice made by `draw` (random.choice or a hypothesis draw).

    The plan comes first; two cases in three then shape the model to fit it (heads, widths, vocabulary and
    layers dividing as the plan needs), so that many cases get through validation to the simulator."""
    plan = {"gx": draw(DEGREES), "gy": draw(DEGREES), "gz": draw(DEGREES), "gdata": draw(DEGREES),
            "pp": draw((1, 1, 2, 3, 4))}
    if draw((False, False, False, True)):
        plan["cp"] = draw((1, 2, 3))
    gpus = math.prod(plan.values()) + draw((0, 0, 0, 0, 0, 1))  # now and then a count that does not match
    if plan["pp"] > 1 and draw((False, True)):
        plan["vpp"] = draw((2, 3))
    for key, options in (("zero", (0, 1, 2, 3)), ("mbs", (1, 2, 3, 4)), ("ga", (1, 2, 4)),
                         ("recompute", ("full", "selective", "op", "none")), ("attention", ("flash", "unfused")),
                         ("sp", (0, 1)), ("oar", (0, 1)), ("tune", (0, 1))):
        if draw((False, False, True)):
            plan[key] = draw(options)
    for key, options in SWITCHES:  # Megatron-Core's and Meta's options, each now and then
        if draw((False, False, False, True)):
            plan[key] = draw(options)
    fitted = draw((True, True, False))
    if fitted:
        _drop_inapplicable(plan)
    grid = plan["gx"] * plan["gy"] * plan["gz"]
    heads = plan["gx"] * draw((1, 2)) if fitted else draw((1, 2, 3, 4, 6, 8))
    hidden = heads * draw((8, 16, 32)) * (plan["gy"] * plan["gz"] if fitted else 1)
    extra_slots = plan.get("pemb", 0) + plan.get("ploss", 0)  # the embedding and the loss, counted as layers
    layers = max(plan["pp"] * plan.get("vpp", 1) * draw((1, 2)) - extra_slots, 1) if fitted \
        else draw((1, 2, 3, 4, 6))
    vocab = grid * draw((16, 32)) if fitted else draw((64, 100, 128, 256, 1000))
    spec = f"layers={layers},hidden={hidden},heads={heads},seq={draw((16, 32, 64, 128))},vocab={vocab}"
    ffn = draw((None, 3 * hidden) if fitted else (None, None, 3 * hidden, hidden + 1, 100))
    if ffn:
        spec += f",ffn={ffn}"
    if draw((False, False, True)):
        spec += f",dtype={draw(('fp16', 'fp32', 'bf16'))}"
    # per-operator checkpointing and eager kernels and norms count a Llama layer's ops (op: one without dropout)
    op_block = fitted and (plan.get("recompute") == "op" or "eager" in (plan.get("kernels"), plan.get("norm")))
    if op_block:
        spec += ",arch=llama,dropout=0"
    for key, options in MODEL_OPTIONS:
        if op_block and key in ("arch", "dropout"):
            continue
        if draw((False, False, False, True)):
            if fitted and key == "kv_heads":  # K/V heads that divide the heads and split over gx
                options = (plan["gx"], heads)
            spec += f",{key}={draw(options)}"
    batch = (plan["gdata"] * plan["gz"] * draw((1, 2, 3, 4, 8))) if draw((True, True, False)) \
        else draw((1, 2, 3, 5, 7, 16, 96))
    argv = ["simulate", "--machine", draw(MACHINES), "--model-spec", spec, "--gpus", str(gpus),
            "--plan", ",".join(f"{k}={v}" for k, v in plan.items()), "--global-batch", str(batch), "--json"]
    if draw((False, False, False, True)):
        field = draw(tuple(SETS))
        argv += ["--set", f"{field}={draw(SETS[field])}"]
    return argv


def _drop_inapplicable(plan: dict) -> None:
    """Leave out the switches validation would refuse on this plan (the shaped cases: reaching the simulator)."""
    sp = plan.get("sp") and plan["gy"] == 1
    plan["sp"] = int(bool(sp)) if "sp" in plan else 0
    rules = {"tpo": sp and plan["gx"] > 1, "pemb": plan["pp"] > 1, "ploss": plan["pp"] > 1,
             "dpouter": plan["pp"] > 1 and plan["gdata"] > 1,
             "reshard": plan["gz"] > 1 or (plan.get("zero") == 3 and plan["gdata"] > 1),
             "fsdp2": plan["gz"] > 1 or (plan.get("zero") == 3 and plan["gdata"] > 1),
             "axonn": plan["pp"] == 1 and not plan.get("fsdp2"),
             "odp": plan.get("zero", 0) != 3, "optimizer": plan.get("zero", 0) == 0 or plan.get("optimizer") != "flat",
             "cpcomm": plan.get("cp", 1) > 1, "fp8recipe": plan.get("fp8") == 1,
             "rcl": plan.get("recompute", "full") == "full",
             "fp8pg": plan.get("fp8") == 1 and plan.get("zero") in (1, 2) and plan["gdata"] > 1}
    for key, allowed in rules.items():
        if key in plan and not allowed:
            del plan[key]
    if "cache" in plan and not (plan.get("axonn") and plan["gz"] > 1):
        del plan["cache"]  # axonn's weights cache keeps what it gathers over Z
    if not plan["sp"]:
        del plan["sp"]
    if plan.get("recompute") == "op" and (plan["gx"] * plan["gy"] > 1 or plan.get("fp8")):
        plan["recompute"] = "full"  # per-operator checkpointing is modelled without tensor parallelism or FP8
    if plan.get("kernels") == "eager" and plan.get("cp", 1) > 1:
        del plan["kernels"]  # eager kernels are counted for whole sequences on a rank
    if plan.get("norm") == "eager" and plan["gy"] > 1:
        del plan["norm"]  # torch's RMSNorm is counted over a hidden whole on each rank
    if plan.get("cp", 1) > 1 or plan.get("recompute") == "op" or plan.get("kernels") == "eager":
        plan["attention"] = "flash"  # ring attention runs on the fused kernel; op keeps its output; eager is SDPA's


# Small steps to mutate, exported once: tensor parallelism, and a pipeline (point-to-point transfers).
IR_STEPS = (("layers=2,hidden=64,heads=4,seq=32,vocab=256", 2, "tp=2", 4),
            ("layers=4,hidden=64,heads=4,seq=32,vocab=256", 4, "tp=2,pp=2,mbs=1", 4))
ODD_VALUES = (-1, 0, 0.5, 1e308, 2**63, "x", "", None, True, [], {}, [[[[1]]]], {"a": 1}, 12345)


def _base_schedules() -> list[dict]:
    from twin.build import build_step
    from twin.ir_io import save_schedule
    from twin.model import parse_model_spec
    from twin.plan import parse_plan

    docs = []
    machine = load_machine("frontier")
    for spec, gpus, plan, batch in IR_STEPS:
        built = build_step(parse_model_spec(spec), parse_plan(f"{plan},global_batch={batch}"), machine, gpus)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "step.json"
            save_schedule(built.schedule, path)
            docs.append(json.loads(path.read_text()))
    return docs


_BASES: list[dict] = []


def draw_ir_case(draw: Draw) -> bytes:
    """A schedule IR file: one of IR_STEPS's with 1-3 mutations, each choice made by `draw`."""
    if not _BASES:
        _BASES.extend(_base_schedules())
    doc = json.loads(json.dumps(_BASES[draw(range(len(_BASES)))]))  # a deep copy
    for _ in range(draw((1, 1, 2, 3))):
        _mutate(doc, draw)
    text = json.dumps(doc)
    if draw((False,) * 9 + (True,)):
        text = text[:draw((1, 10, 100, len(text) // 2, len(text) - 1))]
    return text.encode()


def _mutate(doc, draw: Draw) -> None:
    """Walk down from the root, choosing a child at each level, and replace, delete or repeat where it stops."""
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            return
        key = draw(keys) if len(keys) < 50 else keys[draw(range(len(keys)))]
        child = node[key]
        if isinstance(child, (dict, list)) and child and draw((True, True, True, False)):
            node = child
            continue
        action = draw(("replace", "replace", "scale", "scale", "delete", "repeat"))
        if action == "scale" and isinstance(child, (int, float)) and not isinstance(child, bool):
            node[key] = type(child)(child * draw((0, 0.5, 2, 3, 1000)))  # a plausible but different number
        elif action in ("replace", "scale"):
            node[key] = draw(ODD_VALUES)
        elif action == "delete":
            del node[key]
        elif isinstance(node, list):
            node.append(child)
        else:
            node[key] = [child, child]
        return


def run_ir_case(data: bytes, timeout_s: float = 60.0) -> Outcome:
    """`twin simulate --schedule` on the file's bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step.json"
        path.write_bytes(data)
        return run_case(["simulate", "--machine", "frontier", "--schedule", str(path), "--json"], timeout_s)


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _peak_tflops(argv: list[str]) -> float:
    """The advertised peak (TF/s) of the case's machine, with its --set: its FP8 peak where the plan's linears run
    in FP8 (fp8=1), which only bounds the work from above."""
    machine = argv[argv.index("--machine") + 1]
    overrides = tuple(parse_override(argv[i + 1]) for i, a in enumerate(argv) if a == "--set")
    device = load_machine(machine, overrides).device
    fp8 = "--plan" in argv and "fp8=1" in argv[argv.index("--plan") + 1].split(",")
    return max(device.peak_flop_per_s, device.peak_fp8_flop_per_s if fp8 else 0.0) / 1e12


def _strict_json(text: str) -> dict:
    def refuse(name: str):
        raise ValueError(f"{name} in JSON output")
    return json.loads(text, parse_constant=refuse)


def _finite(doc) -> bool:
    if isinstance(doc, float):
        return math.isfinite(doc)
    if isinstance(doc, dict):
        return all(_finite(v) for v in doc.values())
    if isinstance(doc, list):
        return all(_finite(v) for v in doc)
    return True


def run_case(argv: list[str], timeout_s: float = 60.0) -> Outcome:
    """Run one command line in this process and sort its outcome (module docstring)."""
    out, err = io.StringIO(), io.StringIO()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = twin_main(argv)
            except SystemExit as e:  # argparse
                rc = e.code
    except _Timeout:
        return Outcome("hang", f"no answer in {timeout_s:g} s")
    except Exception as e:  # noqa: BLE001 - a crash is what we are looking for
        return Outcome("crash", f"{type(e).__name__}: {e}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    lines = err.getvalue().strip().splitlines()
    if rc == 2:
        if len(lines) == 1 and "error:" in lines[0] and "Traceback" not in err.getvalue():
            return Outcome("error", lines[0])
        return Outcome("crash", f"exit 2 with {len(lines)} lines on stderr: {err.getvalue()[-300:]!r}")
    if rc != 0:
        return Outcome("crash", f"exit {rc}: {err.getvalue()[-300:]!r}")
    try:
        doc = _strict_json(out.getvalue())
    except ValueError as e:
        return Outcome("crash", f"exit 0 but stdout is not strict JSON: {e}")
    if not _finite(doc):
        return Outcome("crash", "exit 0 with a non-finite number in the JSON")
    try:
        peak = _peak_tflops(argv)
    except TwinError as e:
        return Outcome("crash", f"exit 0 on a machine that does not load: {e}")
    achieved = float(doc.get("tflops_per_gpu", 0.0))
    if achieved > peak * (1 + 1e-9):
        return Outcome("above_peak", f"{achieved:.1f} TF/s per GPU on a {peak:.1f} TF/s device")
    return Outcome("ok")


def run_cases(cases: int, seed: int = 0, timeout_s: float = 60.0,
              progress: Callable[[int], None] | None = None) -> tuple[Counter, list[tuple[int, list[str], Outcome]]]:
    """Case i uses random.Random(seed + i): (count per outcome kind, the bad cases with their seeds)."""
    counts: Counter = Counter()
    bad = []
    for i in range(cases):
        rng = random.Random(seed + i)
        if (seed + i) % 4 == 3:
            data = draw_ir_case(rng.choice)
            argv = ["simulate", "--machine", "frontier", "--schedule", f"<IR case: python benchmarks/fuzz.py "
                    f"--show-ir {seed + i}>", "--json"]
            outcome = run_ir_case(data, timeout_s)
        else:
            argv = draw_case(rng.choice)
            outcome = run_case(argv, timeout_s)
        counts[outcome.kind] += 1
        if outcome.kind not in ("ok", "error"):
            bad.append((seed + i, argv, outcome))
        if progress:
            progress(i + 1)
    return counts, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="how many random cases (default 1000)")
    ap.add_argument("--seed", type=int, default=0, help="case i draws with seed + i (default 0)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a case counts as a hang (default 60)")
    ap.add_argument("--show-ir", type=int, metavar="SEED", help="print the IR file of that case's seed and stop")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.show_ir is not None:
        sys.stdout.write(draw_ir_case(random.Random(args.show_ir).choice).decode())
        return 0
    start = time.perf_counter()
    try:
        from tqdm import tqdm
        bar = tqdm(total=args.cases, file=sys.stderr, disable=not sys.stderr.isatty())
    except ImportError:  # pragma: no cover
        bar = None
    counts, bad = run_cases(args.cases, args.seed, args.timeout, bar.update if bar else None)
    if bar:
        bar.close()
    wall = time.perf_counter() - start
    if args.json:
        print(json.dumps({"cases": args.cases, "seed": args.seed, "wall_s": wall, "counts": dict(counts),
                          "bad": [{"seed": s, "argv": a, "kind": o.kind, "detail": o.detail} for s, a, o in bad]},
                         indent=2))
    else:
        print(f"{'outcome':<12}{'cases':>8}{'share':>9}")
        for kind in ("ok", "error", "crash", "hang", "above_peak"):
            print(f"{kind:<12}{counts[kind]:>8}{100 * counts[kind] / max(args.cases, 1):>8.1f}%")
        print(f"{args.cases} cases (seeds {args.seed}..{args.seed + args.cases - 1}) in {wall:.0f} s; "
              f"target: 0 crash, 0 hang, 0 above_peak")
        for s, a, o in bad:
            print(f"  seed {s}: {o.kind}: {o.detail}\n    twin {' '.join(a)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
