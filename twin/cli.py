"""The `twin` command line.

Every user error (a TwinError) becomes one line on stderr and exit code 2;
argparse's own usage errors exit 2 as well. Output files (traces, figures,
schedules) are written atomically, after the work succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from twin import limits
from twin.errors import TwinError
from twin.limits import count_flag, real_flag
from twin.outputs import DEFAULT_DIR, FIGURE_FORMATS, check_outputs

DEFAULT_BATCH_TOKENS = 16_777_216  # AxoNN SC'24 Table I: 16.8M tokens per batch


def add_machine_and_model_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--machine, --model or --model-spec, and --seq: what every command that builds steps needs."""
    p.add_argument("--machine", required=required, help="machine name (see `twin machines`) or path to a machine .toml")
    model = p.add_mutually_exclusive_group(required=required)
    model.add_argument("--model", help="catalog model (see `twin models`), e.g. GPT-80B")
    model.add_argument("--model-spec", help="any GPT-style model: layers=..,hidden=..,heads=..[,seq=..,vocab=..,ffn=..]")
    p.add_argument("--seq", type=count_flag(limits.SEQ_LEN), help="sequence length (default: the model's)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                   help="replace one number of the machine file for this run (repeatable), e.g. "
                   "--set device.attention_efficiency=0.5; `twin machines NAME` lists the fields")


def load_machine_from_args(args: argparse.Namespace):
    """--machine with its --set overrides."""
    from topologies.machine import load_machine
    from topologies.overrides import parse_override

    overrides = tuple(parse_override(text) for text in getattr(args, "overrides", []))
    return load_machine(args.machine, overrides)


def add_plan_switches(p: argparse.ArgumentParser) -> None:
    """--no-overlap and --no-tune, which change any plan given."""
    p.add_argument("--no-overlap", action="store_true", help="switch off AxoNN's OAR, ORS and OAG overlap")
    p.add_argument("--no-tune", action="store_true", help="switch off GEMM-layout tuning (use the framework's layouts)")


def _add_step_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The arguments that describe a step; optional for simulate, which can read --schedule instead."""
    add_machine_and_model_arguments(p, required)
    p.add_argument("--gpus", type=count_flag(limits.GPUS), required=required, help="number of GPUs (GCDs on Frontier)")
    p.add_argument(
        "--plan", required=required,
        help="parallel plan: AxoNN's gx=..,gy=..,gz=..,gdata=.. and/or Megatron's tp=..,pp=..,dp=.. "
        "[,vpp=..,zero=0-3,sp=0|1,mbs=..,ga=..,attention=flash|unfused,recompute=full|selective|none,oar=0|1,ors=..,"
        "oag=..,tune=0|1]",
    )
    p.add_argument("--global-batch", type=count_flag(limits.SEQUENCES),
                   help="sequences per step (default: 16.8M tokens / seq, as AxoNN)")
    add_plan_switches(p)


def machine_and_model(args: argparse.Namespace):
    """(machine, model) from --machine, --model/--model-spec and --seq; --gpus checked positive."""
    from dataclasses import replace

    from twin.model import get_model, parse_model_spec

    machine = load_machine_from_args(args)
    model = get_model(args.model) if args.model else parse_model_spec(args.model_spec)
    if args.seq is not None:
        if args.seq <= 0:
            raise TwinError("--seq must be a positive number of tokens")
        model = replace(model, seq=args.seq)
    if args.gpus <= 0:
        raise TwinError("--gpus must be a positive number")
    return machine, model


def _step_inputs(args: argparse.Namespace):
    """(model, plan, machine) from the common step arguments."""
    from dataclasses import replace

    from twin.plan import parse_plan, plan_keys

    machine, model = machine_and_model(args)
    if args.global_batch is not None and "global_batch" in plan_keys(args.plan):
        raise TwinError("the batch is given twice: global_batch= in --plan and --global-batch; give one")
    batch = args.global_batch if args.global_batch is not None else max(1, DEFAULT_BATCH_TOKENS // model.seq)
    plan = parse_plan(args.plan, replace(parse_plan(""), global_batch=batch))
    if args.no_overlap:
        plan = plan.without_overlap()
    if args.no_tune:
        plan = replace(plan, tune_gemm=False)
    return model, plan, machine


def _inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """The files a step command reads, which none of its outputs may replace (twin.outputs): --machine by its
    file, also when named (`--machine frontier` reads topologies/frontier.toml)."""
    files = {flag: getattr(args, attr, None) for flag, attr in (("--schedule", "schedule"), ("TRACE", "trace_in"))}
    return {"--machine": machine_file(getattr(args, "machine", None)), **files}


def machine_file(name_or_path: str | None) -> str | None:
    """The file a --machine value names, if it names one (a bad name is reported when the machine is loaded)."""
    from topologies.machine import machine_file as resolve

    try:
        return str(resolve(name_or_path)) if name_or_path else None
    except TwinError:
        return None


def cmd_simulate(args: argparse.Namespace) -> int:
    from twin.build import build_step
    from twin.figures import timeline_figure
    from twin.report import format_summary, summarize
    from twin.sim.engine import simulate
    from twin.trace import write_trace

    check_outputs({"--trace": args.trace, "--figure": args.figure}, _inputs(args), {"--figure": FIGURE_FORMATS})
    if args.preset:
        _apply_preset(args)
    if args.schedule:
        schedule, machine = _schedule_and_machine(args)
    else:
        _require_step_arguments(args, "simulate", " (or --schedule FILE)")
        model, plan, machine = _step_inputs(args)
        schedule = build_step(model, plan, machine, args.gpus).schedule
    run = simulate(schedule, machine, full=args.full)
    summary = summarize(run, args.flops_formula)
    if args.trace:
        write_trace(args.trace, schedule.programs, run.timelines, summary.to_json_dict())
    if args.figure:
        title = f"{summary.model} on {summary.gpus} {machine.name} GPUs ({summary.plan}): step {summary.step_time_s:.2f} s"
        timeline_figure(args.figure, timeline_rows(schedule, run), title)
    if args.json:
        print(summary.to_json())
    else:
        print(format_summary(summary))
        for what, path in (("trace", args.trace), ("figure", args.figure)):
            if path:
                print(f"  {what} written to {path}")
    return 0


def _schedule_and_machine(args: argparse.Namespace):
    """--schedule FILE and the --machine (with --set) to simulate it on, which it needs."""
    from twin.ir_io import load_schedule

    if args.machine is None:
        raise TwinError("--machine is required with --schedule")
    step_flags = ("--preset", "--model", "--model-spec", "--plan", "--gpus", "--global-batch", "--seq", "--no-overlap",
                  "--no-tune")
    given = [flag for flag in step_flags if getattr(args, flag.lstrip("-").replace("-", "_"), None)]
    if given:
        raise TwinError(f"--schedule FILE is a built step already; drop {given[0]} (or drop --schedule)")
    return load_schedule(args.schedule), load_machine_from_args(args)


def _require_step_arguments(args: argparse.Namespace, command: str, alternative: str = "") -> None:
    """--machine, --model, --gpus and --plan, given or filled by --preset."""
    missing = [f"--{n}" for n in ("machine", "gpus", "plan") if getattr(args, n) is None]
    if not (args.model or args.model_spec):
        missing.append("--model")
    if missing:
        raise TwinError(f"{command} needs {', '.join(missing)}{alternative}; see `twin {command} --help`")


def cmd_sensitivity(args: argparse.Namespace) -> int:
    from twin.search.cli import ProgressBar
    from twin.sensitivity import format_sensitivity, sensitivity

    if args.preset:
        _apply_preset(args)
    _require_step_arguments(args, "sensitivity", " (or --preset NAME)")
    check_outputs({"--figure": args.figure}, _inputs(args), {"--figure": FIGURE_FORMATS})
    model, plan, machine = _step_inputs(args)
    if args.fields is not None and args.all:
        raise TwinError("give one of --fields and --all")
    if args.fields is not None:
        fields = [f.strip() for f in args.fields.split(",") if f.strip()]
        if not fields:
            raise TwinError(f"--fields {args.fields!r} names no number; e.g. --fields device.attention_efficiency")
    else:
        fields = list(machine.sources) if args.all else None
    bar = ProgressBar(not args.json and (args.progress or sys.stderr.isatty()))
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
    if args.json:
        doc = result.to_json_dict()
        doc["figure"] = args.figure
        print(json.dumps(doc, indent=2))
    else:
        print(format_sensitivity(result))
        if args.figure:
            print(f"  figure written to {args.figure}")
    return 0


def cmd_compare_trace(args: argparse.Namespace) -> int:
    from topologies.overrides import describe_overrides
    from twin.build import resolve_step
    from twin.micro_batches import rank_busy_by_class
    from twin.profiler_trace import compare_trace, format_trace_comparison, load_profiled_run
    from twin.report import rank_time_by_class
    from twin.sim.engine import simulate

    check_outputs({"--figure": args.figure}, _inputs(args), {"--figure": FIGURE_FORMATS})
    if args.preset:
        _apply_preset(args)
    if args.schedule:
        schedule, machine = _schedule_and_machine(args)
    else:
        _require_step_arguments(args, "compare-trace", " (or --preset NAME, or --schedule FILE)")
        model, plan, machine = _step_inputs(args)
    run = load_profiled_run(args.trace_in, args.steps, args.device)
    rank = args.rank if args.rank is not None else run.rank  # None: the critical rank
    if args.schedule:
        sim = simulate(schedule, machine)
        step_s, by_class = sim.step_time_s, rank_time_by_class(sim, rank)
        model_name, plan_text, gpus = schedule.info.model, schedule.info.plan, schedule.world_size
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
    if args.json:
        doc = c.to_json_dict()
        doc["figure"] = args.figure
        print(json.dumps(doc, indent=2))
    else:
        print(format_trace_comparison(c, title))
        if args.figure:
            print(f"  figure written to {args.figure}")
    return 0


def timeline_rows(schedule, run) -> list:
    """One rank: all its streams. Several simulated ranks (pipeline stages): each one's compute stream."""
    from twin.figures import MAX_TIMELINE_RANKS
    from twin.report import critical_timeline

    if len(run.timelines) == 1:
        timeline = critical_timeline(run)
        return [("", schedule.programs[timeline.program], timeline, None)]
    shown = run.timelines[:MAX_TIMELINE_RANKS]
    return [(f"rank {t.rank} compute", schedule.programs[t.program], t, "compute") for t in shown]


def _apply_preset(args: argparse.Namespace) -> None:
    """Fill the step arguments from a named configuration; explicit flags may not contradict it."""
    from twin.presets import get_preset

    preset = get_preset(args.preset)
    for field, value in (("machine", preset.machine), ("gpus", preset.gpus), ("plan", preset.plan),
                         ("global_batch", preset.global_batch)):
        given = getattr(args, field)
        if given is not None and given != value:
            raise TwinError(f"--{field.replace('_', '-')} {given} contradicts --preset {preset.name} ({value}); drop one")
        setattr(args, field, value)
    if args.model_spec or (args.model and args.model != preset.model):
        raise TwinError(f"--model contradicts --preset {preset.name} ({preset.model}); drop one")
    args.model = preset.model


def cmd_presets(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from twin.presets import PRESETS

    if args.json:
        print(json.dumps([asdict(p) for p in PRESETS.values()], indent=2))
        return 0
    for p in PRESETS.values():
        print(f"{p.name:<20} {p.model:<8} {p.gpus:>6} x {p.machine:<11} --plan {p.plan} --global-batch {p.global_batch}")
        print(f"{'':<20} source: {p.source}")
    return 0


def cmd_scale(args: argparse.Namespace) -> int:
    from twin.figures import scaling_figure
    from twin.scale import scaling

    from twin.plan import plan_keys

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
    check_outputs({"--figure": figure}, _inputs(args), {"--figure": FIGURE_FORMATS})
    args.gpus = counts[0] if counts else 0
    model, plan, machine = _step_inputs(args)

    def progress(point) -> None:
        print(f"  [{len(done) + 1}/{len(counts)}] {point.gpus} GPUs: step {point.step_time_s:.2f} s", file=sys.stderr)
        done.append(point)

    done: list = []
    points = scaling(model, plan, machine, counts, args.mode, progress=None if args.json else progress)
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


def cmd_export(args: argparse.Namespace) -> int:
    from twin.build import build_step
    from twin.ir_io import save_schedule

    check_outputs({"--output": args.output}, _inputs(args))
    model, plan, machine = _step_inputs(args)
    built = build_step(model, plan, machine, args.gpus)
    save_schedule(built.schedule, args.output)
    ops = sum(len(p.ops) for p in built.schedule.programs)
    print(f"wrote {args.output}: {built.schedule.world_size} ranks, {ops} ops per program, plan {built.plan.describe()}")
    return 0


def cmd_machines(args: argparse.Namespace) -> int:
    from topologies.machine import list_machines, load_machine
    from topologies.overrides import parse_override

    if args.overrides and not args.name:
        raise TwinError("--set needs a machine NAME: twin machines NAME --set FIELD=VALUE")
    names = [args.name] if args.name else list_machines()
    machines = [load_machine(n, tuple(parse_override(t) for t in args.overrides)) for n in names]
    rows = []
    for m in machines:
        d, n, net = m.device, m.node, m.network
        rows.append({
            "name": m.name,
            "device": d.name,
            "gpus_per_node": n.gpus_per_node,
            "peak_tflops": d.peak_flop_per_s / 1e12,
            "empirical_gemm_tflops": d.empirical_gemm_flop_per_s / 1e12,
            "hbm_gb": d.hbm_bytes / 1e9,
            "hbm_bw_gb_per_s": d.hbm_bw_bytes_per_s / 1e9,
            "nics_per_node": len(n.nics),
            "measured_gemms": [{"m": g.m, "n": g.n, "k": g.k, "layout": g.layout, "tflops": g.flop_per_s / 1e12}
                               for g in d.gemm_measured],
            "network": net.describe(),
            "max_gpus": m.max_gpus,
            "description": m.description,
        })
        if args.name:
            rows[-1]["sources"] = {
                key: {"value": s.value, "source": s.source, "estimate": s.estimate, "fitted": s.fitted,
                      "provenance": s.provenance} for key, s in m.sources.items()
            }
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'machine':<15}{'device':<27}{'GPUs/node':>10}{'peak TF/s':>11}{'GEMM TF/s':>11}{'HBM GB':>8}{'NICs':>6}  network")
    for r in rows:
        print(
            f"{r['name']:<15}{r['device']:<27}{r['gpus_per_node']:>10}{r['peak_tflops']:>11.1f}"
            f"{r['empirical_gemm_tflops']:>11.1f}{r['hbm_gb']:>8.0f}{r['nics_per_node']:>6}  {r['network']}"
        )
    if args.name:
        print()
        for key, s in rows[0]["sources"].items():
            print(f"  {key} = {s['value']:g}  ({s['provenance']})")
        if rows[0]["measured_gemms"]:
            print("\n  measured GEMMs (they replace the shape model at their shapes; m x n x k layout: TF/s):")
            for g in rows[0]["measured_gemms"]:
                print(f"    {g['m']} x {g['n']} x {g['k']} {g['layout']}: {g['tflops']:g}")
    else:
        print("\n`twin machines NAME` lists every number of one machine with its source.")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from twin.model import CATALOG, SOURCES

    rows = [
        {
            "name": m.name, "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "ffn": m.ffn,
            "seq": m.seq, "vocab": m.vocab, "params_billion": m.params / 1e9, "source": SOURCES[m.name],
        }
        for m in CATALOG.values()
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'model':<10}{'layers':>7}{'hidden':>8}{'heads':>6}{'ffn':>7}{'seq':>6}{'vocab':>7}{'params':>10}  source")
    for r in rows:
        print(
            f"{r['name']:<10}{r['layers']:>7}{r['hidden']:>8}{r['heads']:>6}{r['ffn']:>7}{r['seq']:>6}"
            f"{r['vocab']:>7}{r['params_billion']:>9.2f}B  {r['source']}"
        )
    return 0


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong and where to look), exit code 2, like a TwinError.

    argparse's default prints the whole usage block first, which buries the line that matters. Subcommand
    parsers are made of the same class (add_subparsers uses the parent's class)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"twin: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="twin",
        description="exatwin: a digital twin of large-scale LLM training (AxoNN 4D parallelism on Frontier, "
        "Perlmutter and Alps).",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("machines", help="list the machine models, or one machine's numbers with their sources")
    p.add_argument("name", nargs="?", help="a machine name or .toml path")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                   help="with NAME: show the machine with this number replaced (repeatable), as --set does elsewhere")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_machines)

    p = sub.add_parser("models", help="list the catalog models")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser(
        "simulate", help="simulate one training step: summary, trace, timeline figure",
        description="Simulate one training step (AxoNN 4D, Megatron pipeline/ZeRO) on a machine model. Example: "
        "twin simulate --machine frontier --model GPT-80B --gpus 8192 --plan gx=8,gy=1,gz=16,gdata=64 "
        "--global-batch 8192 --trace step.json --figure figures/timeline.png",
    )
    _add_step_arguments(p, required=False)
    p.add_argument("--preset", help="a named configuration from the papers (see `twin presets`)")
    p.add_argument("--schedule", help="simulate a schedule IR file (from `twin export`) instead of building one")
    p.add_argument("--full", action="store_true", help="simulate every rank, not one per symmetry class (slow; exact)")
    p.add_argument("--flops-formula", choices=("hardware", "model"), default="hardware",
                   help="the papers' FLOP count beside the achieved throughput (which counts the FLOPs the step "
                   "executes): Narayanan's with full recompute (hardware, the papers' choice) or without (model, MFU)")
    p.add_argument("--trace", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--figure", help="write a timeline figure (PNG) of the critical rank")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "sensitivity", help="which machine-file numbers a predicted step depends on, and how much",
        description="Move each estimated number of the machine file (or --fields, or --all) by --factor each way, "
        "re-simulate the step, and print the elasticity d ln(step) / d ln(value), largest first. With "
        "--target-step-s (a measured step), also the value each number alone would need to reach it, to first "
        "order. Example: twin sensitivity --preset frontier-175b --target-step-s 120",
    )
    _add_step_arguments(p, required=False)
    p.add_argument("--preset", help="a named configuration from the papers (see `twin presets`)")
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
    _add_step_arguments(p, required=False)
    p.add_argument("--preset", help="a named configuration from the papers (see `twin presets`)")
    p.add_argument("--schedule", help="simulate a schedule IR file (from `twin export`) instead of building one")
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

    p = sub.add_parser("presets", help="list the named configurations from the papers")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_presets)

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
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_scale)

    p = sub.add_parser("export", help="write the schedule IR of a step as versioned JSON")
    _add_step_arguments(p)
    p.add_argument("-o", "--output", required=True, help="the IR file to write")
    p.set_defaults(func=cmd_export)

    from twin.search import cli as search_cli

    search_cli.add_parsers(sub)
    search_cli.add_validate_parser(sub)

    from twin.fit import cli as fit_cli

    fit_cli.add_fit_parser(sub)

    try:  # the executor's commands (run, calibrate, compare); they import torch only when run
        from executor import cli as executor_cli
    except ImportError:  # pragma: no cover - twin without the executor package
        executor_cli = None
    if executor_cli is not None:
        executor_cli.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help (0) or a usage error (2, its line printed): a code, as from any command
        return int(done.code or 0)
    try:
        return args.func(args)
    except TwinError as err:
        print(f"twin: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `twin models | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("twin: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
