"""How fast `twin search` and `twin validate` are, cold (an empty result cache), on this machine.

    .venv/bin/python benchmarks/search_speed.py [--jobs N] [--skip-validate] [--all-axes] [--json]

1. the issue's search: GPT-320B on 32,768 Frontier GCDs, AxoNN's axes
   (gx, gy, gz, gdata), a 16.8M-token batch of 2,048-token sequences, top 10;
   target under 60 s;
2. the same search again: from the cache;
3. `twin validate` (every row of published.md sections A and B), cold, as
   the command runs it: the first-principles column and the calibrated one
   (the fitted machine files, a second validation); target under 60 s
   (issue 15; it was 3 minutes). Until 2026-12-03 this timed the
   first-principles column alone, half the command's work.

It also prints how long the screening bound took for every plan, how
many plans needed the full bound, and how tight the bound was on the plans
the search had to simulate (bound / simulated step). With --all-axes it also
times the search over every axis (pipelines too, the command's default) on
the same case: about 12,700 plans, target 30 s (issue 15), minutes today,
and over every axis the Frontier paper's 175B on 1,024 GCDs with the same
batch: target 15 s (issue 15).

Each runs with EXATWIN_CACHE_DIR pointing at a fresh temporary folder, so
nothing earlier is reused, and in a process of its own (peak_memory.py), so
that its peak memory, workers included, is its own. Prints one table: wall
time, target, ratio (measured / target, < 1 meets it), CPU time (the case's
processes together: wall about CPU / cores where it kept every core busy), peak memory,
and what the search did (plans, how many simulated, the best plan).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from peak_memory import baseline_mb, isolated  # noqa: E402

from topologies.machine import load_machine  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.search.rank import search  # noqa: E402
from twin.search.space import AXONN_AXES, DEFAULT_AXES, SearchSpace  # noqa: E402
from twin.validate import validate  # noqa: E402

# AxoNN's axes: the search issue's 60 s; every axis and validate: issue 15's 30 s and 60 s (validate was 180 s);
# 175B on 1,024 GCDs over every axis: issue 15's 15 s
SEARCH_TARGET_S, ALL_AXES_TARGET_S, VALIDATE_TARGET_S, SMALL_ALL_AXES_TARGET_S = 60.0, 30.0, 60.0, 15.0


def search_case(label: str, axes: tuple[str, ...], target_s: float, jobs: int | None, model_name: str = "GPT-320B",
                gpus: int = 32768) -> dict:
    """One search on Frontier GCDs (the issue's: GPT-320B on 32,768), batch 8,192 x 2,048 tokens, as a row (run by
    peak_memory.isolated)."""
    machine, model = load_machine("frontier"), get_model(model_name)
    start = time.perf_counter()
    screened_at: list[float] = []  # when the last grid's layer compute (W, twin.search.screen) came back

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "screening" and done == total and not screened_at:
            screened_at.append(time.perf_counter() - start)

    r = search(model, gpus, 8192, machine, SearchSpace(axes=axes), top=10, jobs=jobs, progress=progress)
    wall = time.perf_counter() - start
    ratios = sorted(p.bound_s / p.step_time_s for p in r.landscape if p.step_time_s)
    return {"case": f"search {model_name} on {gpus} GCDs, {label}", "wall_s": wall, "target_s": target_s,
            "plans": r.candidates,
            "bounded": r.bounded, "simulated": r.simulated,
            "best": r.ranked[0].plan, "best_step_s": r.ranked[0].step_time_s,
            "screening_s": screened_at[0] if screened_at else None,
            "bound_over_step": {"min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1]}}


def validate_case(jobs: int | None) -> dict:
    start = time.perf_counter()
    v = validate(jobs=jobs, calibrated=True)  # both columns, as `twin validate` prints them
    return {"case": "twin validate (cold, both columns)", "wall_s": time.perf_counter() - start,
            "target_s": VALIDATE_TARGET_S, "rows": len(v.rows), "mean_abs_error": v.mean_abs_error}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="worker processes (default: every core)")
    parser.add_argument("--skip-validate", action="store_true", help="time only the search")
    parser.add_argument("--all-axes", action="store_true", help="also time the search over every axis (minutes)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["EXATWIN_CACHE_DIR"] = cache
        cases = [("AxoNN axes, cold", AXONN_AXES, SEARCH_TARGET_S, "GPT-320B", 32768),
                 ("AxoNN axes, cached", AXONN_AXES, SEARCH_TARGET_S, "GPT-320B", 32768)]
        if args.all_axes:
            cases += [("every axis (the default: all but cp), cold", DEFAULT_AXES, ALL_AXES_TARGET_S, "GPT-320B", 32768),
                      ("every axis, cold", DEFAULT_AXES, SMALL_ALL_AXES_TARGET_S, "175B", 1024)]
        for label, axes, target_s, model, gpus in cases:  # each in a process of its own (peak memory); cache on disk
            rows.append(isolated(search_case, label, axes, target_s, args.jobs, model, gpus))
        if not args.skip_validate:
            rows.append(isolated(validate_case, args.jobs))
    baseline = baseline_mb()
    if args.json:
        print(json.dumps({"rows": rows, "baseline_peak_mb": baseline}, indent=2))
        return 0
    print(f"{'case':<48}{'wall s':>9}{'target s':>10}{'ratio':>7}{'CPU s':>8}{'peak MB':>9}  notes")
    for r in rows:
        target = f"{r['target_s']:>10.0f}{r['wall_s'] / r['target_s']:>7.2f}" if r["target_s"] else f"{'-':>10}{'-':>7}"
        notes = (f"{r['plans']} plans, {r['bounded']} fully bounded, {r['simulated']} simulated; "
                 f"best {r['best'].split(',recompute')[0]} {r['best_step_s']:.2f} s") if "plans" in r else f"{r['rows']} rows"
        print(f"{r['case']:<48}{r['wall_s']:>9.1f}{target}{r['cpu_s']:>8.1f}{r['peak_mb']:>9.0f}  {notes}")
    for r in rows:
        if r.get("screening_s") is not None and "cached" not in r["case"]:
            q = r["bound_over_step"]
            print(f"{r['case']}: every plan bounded by its layers' compute after {r['screening_s']:.1f} s; "
                  "bound / simulated step over the "
                  f"simulated plans: min {q['min']:.2f}, median {q['median']:.2f}, max {q['max']:.2f}")
    print("(plans whose bound was not below the 10th best step were never simulated; peak MB: the case's process "
          f"and its workers, a process that only starts: {baseline:.0f} MB)")
    print(f"(cores: {os.cpu_count()}, jobs: {args.jobs or os.cpu_count()}; ratio < 1 meets the target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
