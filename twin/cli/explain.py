"""`twin sensitivity` and `twin compare-trace`: explain a predicted step, by the machine-file numbers that move
it and beside a real run's profiler trace."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from twin import limits
from twin.cli.args import (
    ProgressBar,
    add_preset_argument,
    add_step_arguments,
    apply_preset,
    comma_words,
    input_files,
    require_step_arguments,
    schedule_or_step,
    shows_progress,
    step_inputs,
)
from twin.errors import TwinError
from twin.limits import count_flag, real_flag
from twin.outputs import FIGURE_FORMATS, check_outputs


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from twin.sensitivity import format_sensitivity, sensitivity

    if args.preset:
        apply_preset(args)
    require_step_arguments(args, "sensitivity", " (or --preset NAME)")
    check_outputs({"--figure": args.figure}, input_files(args), {"--figure": FIGURE_FORMATS})
    model, plan, machine = step_inputs(args)
    if args.fields is not None and args.all:
        raise TwinError("give one of --fields and --all")
    if args.fields is not None:
        fields = list(comma_words(args.fields))
        if not fields:
            raise TwinError(f"--fields {args.fields!r} names no number; e.g. --fields device.attention_efficiency")
    else:
        fields = list(machine.sources) if args.all else None
    bar = ProgressBar(shows_progress(args))
    try:
        result = sensitivity(model, plan, machine, args.gpus, fields, args.factor, args.target_step_s,
                             progress=lambda done, total: bar("simulating", done, total), jobs=args.jobs)
    finally:
        bar.close()
    if args.figure:
        from twin.figures import sensitivity_figure

        title = (f"{model.name} on {args.gpus} {machine.name} GPUs, {plan.describe().split(',recompute')[0]}\n"
                 "step time when one machine-file number moves")
        sensitivity_figure(args.figure, result, title)
    _print_with_figure(args, result.to_json_dict, lambda: format_sensitivity(result))
    return 0


def cmd_compare_trace(args: argparse.Namespace) -> int:
    from topologies.overrides import describe_overrides
    from twin.build import resolve_step
    from twin.micro_batches import rank_busy_by_class
    from twin.profiler_trace import load_profiled_run
    from twin.trace_comparison import compare_trace, format_trace_comparison
    from twin.report import rank_time_by_class
    from twin.sim.engine import simulate

    check_outputs({"--figure": args.figure}, input_files(args), {"--figure": FIGURE_FORMATS})
    source = schedule_or_step(args, "compare-trace", " (or --preset NAME, or --schedule FILE)")
    schedule, model, plan, machine = source.schedule, source.model, source.plan, source.machine
    run = load_profiled_run(args.trace_in, args.steps, args.device)
    rank = args.rank if args.rank is not None else run.rank  # None: the critical rank
    if schedule is not None:
        sim = simulate(schedule, machine)
        step_s, by_class = sim.step_time_s, rank_time_by_class(sim, rank)
        model_name, plan_text, gpus = schedule.info.model, schedule.info.plan_text, schedule.world_size
    else:
        step_s, by_class = rank_busy_by_class(model, plan, machine, args.gpus, rank)
        model_name, plan_text, gpus = model.name, resolve_step(model, plan, machine, args.gpus)[0].describe(), args.gpus
    who = f"rank {rank}" if rank is not None else "the critical rank"
    side = f"{who} of {plan_text} on {gpus} {machine.name} GPUs"
    c = compare_trace(by_class, step_s, run, "; ".join(filter(None, (side, describe_overrides(machine.overrides)))))
    title = f"{model_name} on {gpus} x {machine.name}: the twin beside a profiler trace, per op class and step"
    if args.figure:
        from twin.figures import trace_comparison_figure

        trace_comparison_figure(args.figure, c, f"{title}\n{side}")
    _print_with_figure(args, c.to_json_dict, lambda: format_trace_comparison(c, title))
    return 0


def _print_with_figure(args: argparse.Namespace, doc: Callable[[], dict], text: Callable[[], str]) -> None:
    """The result as JSON (`doc()`) with its --figure path, or as text (`text()`) and where the figure went."""
    if args.json:
        out = doc()
        out["figure"] = args.figure
        print(json.dumps(out, indent=2))
    else:
        print(text())
        if args.figure:
            print(f"  figure written to {args.figure}")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add sensitivity and compare-trace to twin's subcommands."""
    p = sub.add_parser(
        "sensitivity", help="which machine-file numbers a predicted step depends on, and how much",
        description="Move each estimated number of the machine file (or --fields, or --all) by --factor each way, "
        "re-simulate the step, and print the elasticity d ln(step) / d ln(value), largest first. With "
        "--target-step-s (a measured step), also the value each number alone would need to reach it, to first "
        "order. Example: twin sensitivity --preset frontier-175b --target-step-s 120",
    )
    add_step_arguments(p, required=False)
    add_preset_argument(p)
    p.add_argument("--fields", help="comma-separated numbers to move (default: every estimate), "
                   "e.g. device.empirical_gemm_bf16_tflop_per_s,device.attention_efficiency")
    p.add_argument("--all", action="store_true", help="move every number of the machine file, sourced ones too")
    p.add_argument("--factor", type=real_flag(limits.Range(0.001, 0.9, "")), default=0.2,
                   help="relative move each way (default 0.2 = 20%%)")
    p.add_argument("--target-step-s", type=real_flag(limits.SECONDS), help="a measured step time to explain (seconds)")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes for the simulations (default and most: every core)")
    p.add_argument("--figure", help="write a tornado chart of the numbers that move the step (PNG, PDF or SVG)")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is not a terminal")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_sensitivity)

    p = sub.add_parser(
        "compare-trace", help="a real run's profiler trace beside the twin's step, per op class",
        description="Read one rank's torch.profiler trace (export_chrome_trace; .json or .json.gz) of a real "
        "training run, sum its GPU kernels per op class (GEMM, attention, element-wise, each collective kind, "
        "memcpy) and per step, and print them beside the twin's prediction of the same step (busy time per class "
        "of the same rank: --rank, the rank the trace names, or the critical one). Steps come from the trace's "
        "ProfilerStep annotations, or --steps. Example: twin "
        "compare-trace rank0.json --preset frontier-22b",
    )
    p.add_argument("trace_in", metavar="TRACE",
                   help="the profiler trace of one rank (Chrome trace JSON, optionally gzipped)")
    add_step_arguments(p, required=False)
    add_preset_argument(p, schedule=True)
    p.add_argument("--steps", type=count_flag(limits.STEPS),
                   help="how many training steps the trace covers (when it has no "
                   "ProfilerStep annotations)")
    p.add_argument("--figure", help="also draw the classes, twin beside measured, as a bar chart (PNG, PDF or SVG)")
    p.add_argument("--rank", type=count_flag(limits.RANK),
                   help="the job rank the trace is of (default: the rank the trace names, "
                   "else the twin's critical rank)")
    p.add_argument("--device", help="the GPU whose kernels to count, when the trace has several (default: the first)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_compare_trace)
