"""Which GEMMs can AxoNN's slow GPT-320B layout have slowed? Each guess, timed on the twin's own tuned step.

    .venv/bin/python benchmarks/layout_slowdown.py [--machine frontier] [--json]     # about 10 s

The AxoNN paper (SC'24, sec. V-C) says two things about GPT-320B on
Frontier: one TN matmul ran at 6% of peak while the others reached 55%, and
the compute time of a batch fell from 30.1 s to 13.19 s (2.28x) once the
layouts were tuned. Which matmul it was is not published; the twin's rule
(`layout_penalty_min_dim` in the machine file) slows every forward product
whose dimensions all reach a threshold, an estimate docs/accuracy.md calls
too coarse.

This script takes the plan `twin validate` predicts the GPT-320B rows with,
simulates its tuned step, and sums the critical rank's GEMM time by linear
(qkv, attn_out, mlp_up, mlp_down, the LM head) and product (the forward
"gemm", the input gradient "dI", the weight gradient "dW"), over the forward
pass and the recompute. For each guess of which products ran slow it
prints the compute time they would give at 6/55 of their tuned rate, and
the ratio to the tuned compute time, beside the paper's 2.28. The ratio
depends on each product's share of the layer's work, which the model fixes
(a 4h x h linear holds a third of a layer's linear FLOPs), far more than on
the plan, whose shapes the paper does not give. Nothing here changes the
twin: it says which form of rule the paper's two numbers allow.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from topologies.machine import Machine, load_machine  # noqa: E402
from twin.build import build_step  # noqa: E402
from twin.errors import TwinError  # noqa: E402
from twin.ir import Gemm  # noqa: E402
from twin.model import get_model  # noqa: E402
from twin.plan import parse_plan  # noqa: E402
from twin.published import AXONN_BATCH_SEQUENCES  # noqa: E402
from twin.report import critical_timeline, summarize  # noqa: E402
from twin.sim.engine import simulate  # noqa: E402
from twin.validate import GPT320B_GPUS  # noqa: E402
from twin.validate_tasks import axonn_plan, tasks_see  # noqa: E402

PUBLISHED_TUNED_S, PUBLISHED_UNTUNED_S = 13.19, 30.1  # AxoNN SC'24 sec. V-C, GPT-320B compute time per batch
SLOW_RATE = 6 / 55  # "one TN matmul at 6% of peak while others reached 55%"
BLOCKS = ("qkv", "attn_out", "mlp_up", "mlp_down")
GUESSES = (
    *((f"{b} forward product (forward and recompute)", ((b, "gemm"),)) for b in BLOCKS),
    ("mlp_up forward product, first forward only", (("mlp_up", "gemm", "fwd"),)),
    ("every block linear's forward product", tuple((b, "gemm") for b in BLOCKS)),
    ("every block linear's input gradient (dI)", tuple((b, "dI") for b in BLOCKS)),
    ("every block linear's weight gradient (dW)", tuple((b, "dW") for b in BLOCKS)),
    ("the LM head's forward product", (("lm_head", "gemm"),)),
)


def gemm_seconds(machine: Machine, plan_text: str) -> tuple[dict[tuple[str, str, str], float], float]:
    """The critical rank's busy GEMM seconds by (block, role, pass) in the step of `plan_text`, and its compute
    seconds (GEMMs, attention, element-wise)."""
    model = get_model("GPT-320B")
    plan = parse_plan(f"{plan_text},global_batch={AXONN_BATCH_SEQUENCES}")
    run = simulate(build_step(model, plan, machine, GPT320B_GPUS).schedule, machine)
    timeline = critical_timeline(run)
    ops = run.schedule.programs[timeline.program].ops
    seconds: dict[tuple[str, str, str], float] = defaultdict(float)
    for op, start, end in zip(ops, timeline.start_s, timeline.end_s):
        if isinstance(op.work, Gemm) and op.tag is not None:
            seconds[(op.tag.block, op.tag.role, op.tag.phase)] += float(end - start)
    return dict(seconds), summarize(run).compute_s


def slowed_seconds(seconds: dict[tuple[str, str, str], float], guess: tuple[tuple[str, ...], ...]) -> float:
    """Tuned seconds of the products a guess names: (block, role) in every pass, or (block, role, pass)."""
    return sum(v for (block, role, phase), v in seconds.items()
               if any((block, role) == g[:2] and (len(g) == 2 or phase == g[2]) for g in guess))


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--machine", default="frontier",
                    help="machine name or file to time the step on (default frontier, first principles); the plan is "
                         "twin validate's first-principles one either way")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    try:
        machine = load_machine(args.machine)
    except TwinError as e:
        ap.exit(2, f"layout_slowdown.py: error: --machine: {e}\n")
    with tasks_see({}, {}, 1):
        plan = axonn_plan("frontier", "GPT-320B", GPT320B_GPUS, AXONN_BATCH_SEQUENCES)["plan"]
    seconds, compute = gemm_seconds(machine, plan)
    rows = []
    for name, guess in GUESSES:
        slow = slowed_seconds(seconds, guess)
        untuned = compute + slow * (1 / SLOW_RATE - 1)
        rows.append({"guess": name, "tuned_share": slow / compute, "untuned_s": untuned, "ratio": untuned / compute})
    if args.json:
        print(json.dumps({"plan": plan, "compute_s": compute, "published_ratio": PUBLISHED_UNTUNED_S / PUBLISHED_TUNED_S,
                          "rows": rows}, indent=1))
        return rows
    print(f"GPT-320B on {GPT320B_GPUS} GCDs, plan {plan} ({args.machine}): tuned compute {compute:.2f} s "
          f"(published {PUBLISHED_TUNED_S} s)")
    print(f"each guess at {SLOW_RATE:.3f} of its tuned rate; published untuned / tuned = "
          f"{PUBLISHED_UNTUNED_S} / {PUBLISHED_TUNED_S} = {PUBLISHED_UNTUNED_S / PUBLISHED_TUNED_S:.2f}")
    print(f"  {'slow products':<52} {'share':>6} {'untuned':>9} {'ratio':>6}")
    for r in rows:
        print(f"  {r['guess']:<52} {100 * r['tuned_share']:5.1f}% {r['untuned_s']:8.2f}s {r['ratio']:6.2f}")
    return rows


if __name__ == "__main__":
    main()
