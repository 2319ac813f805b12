"""`twin scale`: one plan at several GPU counts, weak or strong: an efficiency table and a figure."""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial

from twin import limits
from twin.cli.args import add_machine_and_model_arguments, add_plan_switches, input_files, step_inputs
from twin.cli.runs import job_count
from twin.errors import TwinError
from twin.limits import count_flag
from twin.outputs import DEFAULT_DIR, FIGURE_FORMATS, check_outputs


def cmd_scale(args: argparse.Namespace) -> int:
    from twin.figures import scaling_figure
    from twin.micro_batches import simulate_step
    from twin.plan import plan_keys
    from twin.scale import scaling

    try:
        counts = [limits.check_count(int(x), "--gpus", limits.GPUS) for x in args.gpus.split(",") if x.strip()]
    except ValueError:
        raise TwinError(f"--gpus {args.gpus!r} must be a comma-separated list of GPU counts, e.g. 128,256,512") from None
    if "gdata" in plan_keys(args.plan):
        raise TwinError("twin scale derives dp (gdata) at each GPU count from --gpus; drop it from --plan")
    figure = args.figure
    if figure is None:  # the default goes to out/, never into the repository's figures/
        os.makedirs(DEFAULT_DIR, exist_ok=True)
        machine_name = os.path.basename(args.machine).removesuffix(".toml")
        figure = os.path.join(DEFAULT_DIR, f"scale-{args.mode}-{(args.model or 'custom').lower()}-{machine_name}.png")
    check_outputs({"--figure": figure}, input_files(args), {"--figure": FIGURE_FORMATS})
    args.gpus = counts[0] if counts else 0
    model, plan, machine = step_inputs(args)

    def progress(point) -> None:
        print(f"  [{len(done) + 1}/{len(counts)}] {point.gpus} GPUs: step {point.step_time_s:.2f} s", file=sys.stderr)
        done.append(point)

    done: list = []
    points = scaling(model, plan, machine, counts, args.mode, progress=None if args.json else progress,
                     step=partial(simulate_step, jobs=job_count(args)))
    replica = plan.gx * plan.gy * plan.gz * plan.pp
    degrees = ",".join(part for part in plan.describe().split(",") if not part.startswith("gdata="))
    title = f"{model.name} on {machine.name}, {args.mode} scaling ({degrees}; dp = GPUs / {replica})"
    scaling_figure(figure, [p.gpus for p in points], [p.tflops_per_gpu for p in points],
                   [p.efficiency for p in points], args.mode, title)
    if args.json:
        from dataclasses import asdict

        print(json.dumps({"mode": args.mode, "figure": figure, "points": [asdict(p) for p in points],
                          "machine_overrides": dict(machine.overrides)}, indent=2))
        return 0
    label = "weak eff." if args.mode == "weak" else "strong eff."
    if machine.overrides:
        from topologies.overrides import describe_overrides

        print(describe_overrides(machine.overrides))
    print(f"{'GPUs':>7}{'batch':>8}{'step s':>10}{'TF/s/GPU':>10}{'PF/s':>9}{label:>12}  plan")
    for p in points:
        print(f"{p.gpus:>7}{p.global_batch:>8}{p.step_time_s:>10.2f}{p.tflops_per_gpu:>10.1f}{p.pflops_total:>9.2f}"
              f"{100 * p.efficiency:>11.1f}%  {p.plan}")
    print(f"figure written to {figure}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add scale to twin's subcommands."""
    p = sub.add_parser(
        "scale", help="weak or strong scaling over GPU counts: efficiency table and figure",
        description="Simulate one plan at several GPU counts, dp derived per count (gpus / (gx gy gz pp)). "
        "weak: the batch grows with dp, efficiency = TF/s per GPU relative to the first count; strong: the "
        "batch is fixed, efficiency = speedup over ideal. Example: twin scale --machine frontier --model 175B "
        "--plan tp=4,pp=16,zero=1,mbs=1 --global-batch 640 --gpus 128,256,512,1024 --mode weak",
    )
    add_machine_and_model_arguments(p)
    p.add_argument("--plan", required=True, help="the degrees other than dp, e.g. tp=4,pp=16,zero=1,mbs=1")
    p.add_argument("--gpus", required=True, help="comma-separated GPU counts, smallest first, e.g. 128,256,512,1024")
    p.add_argument("--mode", choices=("weak", "strong"), required=True, help="weak (batch grows with dp) or strong")
    p.add_argument("--global-batch", type=count_flag(limits.SEQUENCES),
                   help="sequences per step at the first GPU count (default 16.8M tokens / seq)")
    add_plan_switches(p)
    p.add_argument("--figure", help=f"figure path (default {DEFAULT_DIR}/scale-MODE-MODEL-MACHINE.png)")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes per point (default: every core; as twin simulate --jobs)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_scale)
