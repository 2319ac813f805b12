"""What allowing the depth continuation on stages that differ only in link shares would cost and save.

    .venv/bin/python benchmarks/depth_share_kinds.py [--json]

twin.pipeline_depth refuses pipelines whose interior stages differ only in
the shares of the links they load (stages of three Frontier nodes straddle
switches in several ways): the step is then not linear in the stages of each
kind, so the continuation is not exact, and issue 15 asks every shortcut to
equal the full simulation to 1e-6. The preset frontier-1t-3072 is such a
pipeline, and its step (15-20 s, against a 2 s target) is what that rule
costs. This prints, for it and for the 40-stage case the rule was measured
on, the step as the twin simulates it today (exact: the full simulation, or
the micro-batch continuation the tests hold to it) beside the depth
continuation with those kinds allowed (`share_kinds=True`, never the
default), their relative difference and each one's wall time, one after the
other in this process. The numbers a decision on the rule needs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from depth_shortcut_sweep import case  # noqa: E402

from topologies.machine import load_machine  # noqa: E402
from twin import pipeline_depth  # noqa: E402
from twin.build import build_step, resolve_step  # noqa: E402
from twin.micro_batches import simulate_step  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.pipeline_depth import simulate_deep  # noqa: E402
from twin.plan import ParallelPlan, parse_plan  # noqa: E402
from twin.presets import PRESETS  # noqa: E402
from twin.report import summarize  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _row(label: str, exact: float, exact_s: float, shared, shared_s: float, how: str) -> dict:
    step = shared.step_time_s if shared is not None else None
    return {"case": label, "exact_step_s": exact, "exact_wall_s": exact_s, "how": how,
            "share_kinds_step_s": step, "share_kinds_wall_s": shared_s,
            "relative_difference": None if step is None else step / exact - 1}


def shallow_case() -> dict:
    """The 40-stage pipeline of stages of three Frontier nodes (tests/test_pipeline_depth.py's machinery), against
    its full simulation; the short pipelines may cost more than this shallow step (as in the tests)."""
    model, resolved, machine, gpus = case("frontier", "tp=4,dp=6", 40, 41)
    full, full_s = _timed(lambda: summarize(simulate(build_step(model, resolved, machine, gpus).schedule, machine)))
    saving, pipeline_depth.SAVING = pipeline_depth.SAVING, 0.01
    try:
        shared, shared_s = _timed(lambda: simulate_deep(model, resolved, machine, gpus, share_kinds=True))
    finally:
        pipeline_depth.SAVING = saving
    return _row(f"test model, tp=4 dp=6 pp=40 (3 nodes a stage), {gpus} GCDs", full.step_time_s, full_s, shared,
                shared_s, "full simulation")


def preset_case(name: str = "frontier-1t-3072") -> dict:
    """A preset as `twin simulate --preset` runs it, against the same with share kinds allowed."""
    preset = PRESETS[name]
    machine, model = load_machine(preset.machine), get_model(preset.model)
    plan = parse_plan(preset.plan, ParallelPlan(global_batch=preset.global_batch))
    exact, exact_s = _timed(lambda: simulate_step(model, plan, machine, preset.gpus))
    resolved, _ = resolve_step(model, plan, machine, preset.gpus)
    shared, shared_s = _timed(lambda: simulate_deep(model, resolved, machine, preset.gpus, share_kinds=True))
    return _row(f"preset {name}, {preset.gpus} GCDs", exact.step_time_s, exact_s, shared, shared_s,
                "as twin simulate (micro-batch continuation, one process)")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [shallow_case(), preset_case()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return rows
    print(f"{'case':<58}{'exact s':>14}{'wall':>8}{'share kinds s':>16}{'wall':>8}{'difference':>12}")
    for r in rows:
        step = "refused" if r["share_kinds_step_s"] is None else f"{r['share_kinds_step_s']:.6f}"
        diff = "" if r["relative_difference"] is None else f"{r['relative_difference']:+.2e}"
        print(f"{r['case']:<58}{r['exact_step_s']:>14.6f}{r['exact_wall_s']:>7.1f}s{step:>16}"
              f"{r['share_kinds_wall_s']:>7.1f}s{diff:>12}")
    print("(exact: the full simulation, or the micro-batch continuation, which the tests hold to it to 1e-6; "
          "share kinds: twin.pipeline_depth with share_kinds=True, not exact and never the default)")
    return rows


if __name__ == "__main__":
    main()
