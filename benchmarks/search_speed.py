"""How fast `twin search` and `twin validate` are, cold (an empty result cache), on this machine.

    .venv/bin/python benchmarks/search_speed.py [--jobs N] [--skip-validate] [--json]

1. the issue's search: GPT-320B on 32,768 Frontier GCDs, AxoNN's axes
   (gx, gy, gz, gdata), a 16.8M-token batch of 2,048-token sequences, top 10;
   target under 60 s;
2. the same search again: from the cache;
3. `twin validate` (every row of published.md sections A and B), cold;
   target under 3 minutes.

It also prints how long bounding every plan took, and how tight the
search's lower bound was on the plans it had to simulate (bound / simulated
step).

Each runs with EXATWIN_CACHE_DIR pointing at a fresh temporary folder, so
nothing earlier is reused. Prints one table: wall time, target, ratio
(measured / target, < 1 meets it), and what the search did (plans, how many
simulated, the best plan).
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

from topologies.machine import load_machine  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.search.rank import search  # noqa: E402
from twin.search.space import AXONN_AXES, SearchSpace  # noqa: E402
from twin.validate import validate  # noqa: E402

SEARCH_TARGET_S, VALIDATE_TARGET_S = 60.0, 180.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, help="worker processes (default: every core)")
    parser.add_argument("--skip-validate", action="store_true", help="time only the search")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ["EXATWIN_CACHE_DIR"] = cache
        machine, model = load_machine("frontier"), get_model("GPT-320B")
        for label in ("cold", "cached"):
            start = time.perf_counter()
            bounded_at: list[float] = []  # when the last plan's bound came back

            def progress(phase: str, done: int, total: int) -> None:
                if phase == "bounding" and done == total:
                    bounded_at.append(time.perf_counter() - start)

            r = search(model, 32768, 8192, machine, SearchSpace(axes=AXONN_AXES), top=10, jobs=args.jobs,
                       progress=progress)
            wall = time.perf_counter() - start
            ratios = sorted(p.bound_s / p.step_time_s for p in r.landscape if p.step_time_s)
            rows.append({"case": f"search GPT-320B on 32768 Frontier GCDs ({label})", "wall_s": wall,
                         "target_s": SEARCH_TARGET_S, "plans": r.candidates, "simulated": r.simulated,
                         "best": r.ranked[0].plan, "best_step_s": r.ranked[0].step_time_s,
                         "bounding_s": bounded_at[0] if bounded_at else None,
                         "bound_over_step": {"min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1]}})
        if not args.skip_validate:
            start = time.perf_counter()
            v = validate(jobs=args.jobs)
            rows.append({"case": "twin validate (cold)", "wall_s": time.perf_counter() - start,
                         "target_s": VALIDATE_TARGET_S, "rows": len(v.rows), "mean_abs_error": v.mean_abs_error})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':<52}{'wall s':>9}{'target s':>10}{'ratio':>7}  notes")
    for r in rows:
        notes = (f"{r['plans']} plans, {r['simulated']} simulated; best {r['best'].split(',recompute')[0]} "
                 f"{r['best_step_s']:.2f} s") if "plans" in r else f"{r['rows']} rows"
        print(f"{r['case']:<52}{r['wall_s']:>9.1f}{r['target_s']:>10.0f}{r['wall_s'] / r['target_s']:>7.2f}  {notes}")
    print(f"cold search: every plan bounded after {rows[0]['bounding_s']:.1f} s, the rest simulating")
    q = rows[0]["bound_over_step"]
    print(f"lower bound / simulated step over the simulated plans: min {q['min']:.2f}, median {q['median']:.2f}, "
          f"max {q['max']:.2f} (plans whose bound was not below the 10th best step were never simulated)")
    print(f"(cores: {os.cpu_count()}, jobs: {args.jobs or os.cpu_count()}; ratio < 1 meets the target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
