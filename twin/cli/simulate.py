"""`twin simulate`: build one training step (or read its schedule IR) and simulate it: summary, trace, figure.

A summary alone takes the path every other command takes (twin.micro_batches.simulate_step: long steps
continued from short ones, exactly); a trace or a figure needs every op's time, so the whole step is simulated.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from twin import limits
from twin.cli.args import add_preset_argument, add_step_arguments, input_files, schedule_or_step
from twin.cli.runs import job_count
from twin.limits import count_flag
from twin.outputs import FIGURE_FORMATS, check_outputs

if TYPE_CHECKING:
    from twin.ir import Schedule
    from twin.report import Summary
    from twin.sim.engine import SimRun


def cmd_simulate(args: argparse.Namespace) -> int:
    from twin.build import build_step
    from twin.figures import timeline_figure
    from twin.micro_batches import simulate_step
    from twin.report import summarize
    from twin.sim.engine import simulate
    from twin.trace import write_trace

    check_outputs({"--trace": args.trace, "--figure": args.figure}, input_files(args), {"--figure": FIGURE_FORMATS})
    source = schedule_or_step(args, "simulate", " (or --schedule FILE)")
    schedule, machine = source.schedule, source.machine
    if schedule is None:
        if not (args.trace or args.figure or args.full):
            return _print(simulate_step(source.model, source.plan, machine, args.gpus,
                                        flops_formula=args.flops_formula, jobs=job_count(args)), args)
        schedule = build_step(source.model, source.plan, machine, args.gpus).schedule
    run = simulate(schedule, machine, full=args.full)
    summary = summarize(run, args.flops_formula)
    if args.trace:
        programs = [schedule.programs[t.program] for t in run.timelines]  # with --full, one timeline per rank
        write_trace(args.trace, programs, run.timelines, summary.to_json_dict())
    if args.figure:
        title = f"{summary.model} on {summary.gpus} {machine.name} GPUs ({summary.plan}): step {summary.step_time_s:.2f} s"
        timeline_figure(args.figure, timeline_rows(schedule, run), title)
    return _print(summary, args)


def _print(summary: Summary, args: argparse.Namespace) -> int:
    from twin.report import format_summary

    if args.json:
        print(summary.to_json())
    else:
        print(format_summary(summary))
        for what, path in (("trace", args.trace), ("figure", args.figure)):
            if path:
                print(f"  {what} written to {path}")
    return 0


def timeline_rows(schedule: Schedule, run: SimRun) -> list:
    """One rank: all its streams. Several simulated ranks (pipeline stages): each one's compute stream."""
    from twin.figures import MAX_TIMELINE_RANKS
    from twin.report import critical_timeline

    if len(run.timelines) == 1:
        timeline = critical_timeline(run)
        return [("", schedule.programs[timeline.program], timeline, None)]
    shown = run.timelines[:MAX_TIMELINE_RANKS]
    return [(f"rank {t.rank} compute", schedule.programs[t.program], t, "compute") for t in shown]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add simulate to twin's subcommands."""
    p = sub.add_parser(
        "simulate", help="simulate one training step: summary, trace, timeline figure",
        description="Simulate one training step (AxoNN 4D, Megatron pipeline/ZeRO, context parallelism) on a machine model. Example: "
        "twin simulate --machine frontier --model GPT-80B --gpus 8192 --plan gx=8,gy=1,gz=16,gdata=64 "
        "--global-batch 8192 --trace step.json --figure figures/timeline.png. Without --trace, --figure or --full, a "
        "step of many micro-batches is continued from two short ones, and a deep pipeline of uniform stages from "
        "short pipelines (exact step time; the summary says where other numbers are approximate)",
    )
    add_step_arguments(p, required=False)
    add_preset_argument(p, schedule=True)
    p.add_argument("--full", action="store_true", help="simulate every rank, not one per symmetry class (slow; exact)")
    p.add_argument("--flops-formula", choices=("hardware", "model"), default="hardware",
                   help="the papers' FLOP count beside the achieved throughput (which counts the FLOPs the step "
                   "executes): Narayanan's with full recompute (hardware, the papers' choice) or without (model, MFU)")
    p.add_argument("--trace", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--figure", help="write a timeline figure (PNG) of the critical rank")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes (default: every core; a step continued from two short ones simulates both at once "
                   "on two, the same summary in about half the time)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_simulate)

