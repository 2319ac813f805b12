"""`twin search` and `twin validate`: their argument parsers and output."""

from __future__ import annotations

import argparse
import json
import os
import sys

from twin import limits
from twin.errors import TwinError
from twin.limits import count_flag


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TwinError(f"{flag} {text!r} must be comma-separated integers, e.g. 0,1") from None


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


class ProgressBar:
    """tqdm bars on stderr, one per phase (screening, bounding, simulating); silent when stderr is not a terminal
    unless forced, so --json output and CI logs stay clean. A phase's total may change as it runs (the plans a
    search still has to bound shrink as better steps are found)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bars: dict = {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self._bars.get(phase)
        if bar is None:
            bar = self._bars[phase] = tqdm(total=total, desc=f"{phase:<10}", unit="plan", file=sys.stderr,
                                           leave=False, dynamic_ncols=True)
        elif total != bar.total:
            bar.total = total
            bar.refresh()
        bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self._bars.values():
            bar.close()


def cmd_search(args: argparse.Namespace) -> int:
    from topologies.overrides import describe_overrides
    from twin.cli import machine_and_model
    from twin.figures import landscape_figure
    from twin.search.batch import sequences_for_tokens
    from twin.search.rank import search
    from twin.search.space import AXES, SearchSpace

    machine, model = machine_and_model(args)
    if args.global_batch is not None and args.batch_tokens is not None:
        raise TwinError("give one of --global-batch (sequences) and --batch-tokens (tokens)")
    if args.global_batch is not None:
        batch = args.global_batch
    else:
        batch = sequences_for_tokens(args.batch_tokens or "16.8M", model.seq)
    limits.check_count(batch, "the batch in sequences (--batch-tokens / seq)", limits.SEQUENCES)
    if args.figure:
        from twin.outputs import FIGURE_FORMATS, check_outputs

        check_outputs({"--figure": args.figure}, {"--machine": machine.path}, {"--figure": FIGURE_FORMATS})
    axes = _words(args.axes) if args.axes else AXES
    space = SearchSpace(axes=axes, min_tp=args.min_tp, max_tp=args.max_tp or 0, zero=_ints(args.zero, "--zero"),
                        recompute=_words(args.recompute), mbs=_ints(args.mbs, "--mbs") if args.mbs != "auto" else ())
    bar = ProgressBar(not args.json and (args.progress or sys.stderr.isatty()))
    moves = None
    try:
        result = search(model, args.gpus, batch, machine, space, top=args.top, exhaustive=args.exhaustive,
                        progress=bar, use_cache=not args.no_cache, jobs=args.jobs)
        if args.robustness and len(result.ranked) > 1:
            from twin.plan import parse_plan
            from twin.sensitivity import ranking_robustness

            ranked = result.ranked[:args.robustness]
            plans = [parse_plan(f"{r.plan},global_batch={batch}") for r in ranked]
            moves = ranking_robustness(model, plans, machine, args.gpus,
                                       progress=lambda done, total: bar("robustness", done, total), jobs=args.jobs)
    finally:
        bar.close()
    if args.figure:
        title = (f"{result.model} on {result.gpus} {machine.name} GPUs, {batch} x {model.seq} tokens: "
                 f"{result.candidates} valid plans")
        landscape_figure(args.figure, result.landscape, title)
    if args.json:
        doc = result.to_json_dict(landscape=args.landscape)
        if args.figure:
            doc["figure"] = args.figure
        doc["machine_overrides"] = dict(machine.overrides)
        if moves is not None:
            doc["robustness"] = [m.to_json_dict() for m in moves]
        print(json.dumps(doc, indent=2))
        return 0
    how = "from the cache" if result.cached else f"in {result.wall_s:.1f} s"
    ruled_out = result.candidates - result.simulated
    print(f"{result.model} on {result.gpus} {machine.name} GPUs, global batch {batch} x {model.seq} tokens "
          f"({batch * model.seq / 1e6:.1f}M); {result.space}")
    if machine.overrides:
        print(describe_overrides(machine.overrides))
    print(f"{result.candidates} valid plans fit in memory; {result.bounded} given the full lower bound, "
          f"{result.simulated} simulated, {ruled_out} ruled out by a bound (none of them can enter the top {args.top}) "
          f"{how}")
    print(f"{'#':>3} {'step s':>8} {'PF/s':>8} {'TF/s/GPU':>9} {'mem GB':>7} {'exposed s':>9}  plan")
    for i, r in enumerate(result.ranked, 1):
        print(f"{i:>3} {r.step_time_s:>8.3f} {r.pflops_total:>8.1f} {r.tflops_per_gpu:>9.1f} {r.memory_per_gpu_gb:>7.1f} "
              f"{r.exposed_comm_s:>9.3f}  {r.plan}")
    if moves is not None:
        from twin.sensitivity import DEFAULT_FACTOR, format_robustness

        print(format_robustness(moves, [r.plan for r in result.ranked[:args.robustness]], DEFAULT_FACTOR))
    if args.figure:
        print(f"landscape: {args.figure}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "search", help="rank every valid plan by simulated step time",
        description="Every valid plan for the model, GPU count and batch (factorisations over --axes, ZeRO stages, "
        "recompute modes, micro-batch sizes; overlap and GEMM tuning on), pruned by memory, then simulated in order "
        "of lower bounds on their step time (a cheap one for every plan, a tighter one where the cheap one cannot "
        "decide) until no plan left can enter the top. The ranking equals simulating "
        "every plan (--exhaustive does). Results are cached in ~/.cache/exatwin (--no-cache). Example: twin search "
        "--machine frontier --model GPT-320B --gpus 32768 --batch-tokens 16.8M --seq 2048 --top 10",
    )
    from twin.cli import add_machine_and_model_arguments

    add_machine_and_model_arguments(p)
    p.add_argument("--gpus", type=count_flag(limits.GPUS), required=True, help="number of GPUs (GCDs on Frontier)")
    p.add_argument("--batch-tokens", help="tokens per step, e.g. 16.8M (default; AxoNN's batch): rounded to a sequence "
                   "count with the most factors of two within the digits given")
    p.add_argument("--global-batch", type=count_flag(limits.SEQUENCES),
                   help="sequences per step (instead of --batch-tokens)")
    p.add_argument("--top", type=count_flag(limits.Range(1, 100_000, "plans")), default=10,
                   help="how many plans to rank (default 10)")
    p.add_argument("--axes", help="axes to search, from gx,gy,gz,gdata,pp (default all; gx,gy,gz,gdata = AxoNN "
                                  "only: at tens of thousands of GPUs far fewer plans, a search in about half a minute "
                                  "instead of a few minutes)")
    p.add_argument("--min-tp", type=count_flag(limits.DEGREE), default=1, help="smallest gx*gy*gz (default 1)")
    p.add_argument("--max-tp", type=count_flag(limits.DEGREE), help="largest gx*gy*gz (default: no limit)")
    p.add_argument("--zero", default="0", help="ZeRO stages to try over gdata, e.g. 0,1 (default 0)")
    p.add_argument("--recompute", default="full",
                   help="recompute modes to try, from full,selective,none (default full)")
    p.add_argument("--mbs", default="auto",
                   help="micro-batch sizes to try, e.g. 1,2,4; auto (default): the largest that "
                   "fits without a pipeline, every power of two that fits with one")
    p.add_argument("--exhaustive", action="store_true",
                   help="simulate every valid plan (slow; the ranking is the same)")
    p.add_argument("--robustness", type=count_flag(limits.Range(2, 1000, "plans")), metavar="N",
                   help="after ranking, move each estimate of the machine file by 20%% each way and re-simulate the "
                   "top N plans under it: does the winner stay first? (2 x estimates x N simulations)")
    p.add_argument("--jobs", type=count_flag(limits.JOBS), help="processes (default and most: every core)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the result cache")
    p.add_argument("--figure", help="write the search landscape (every plan's step time by memory use) to this PNG")
    p.add_argument("--landscape", action="store_true", help="with --json: include every valid plan's bound and step")
    p.add_argument("--progress", action="store_true", help="show progress bars even when stderr is not a terminal")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_search)


def cmd_validate(args: argparse.Namespace) -> int:
    from twin.validate import validate
    from twin.outputs import check_outputs
    from twin.validate_table import markdown_table, readme_parts, update_readme

    if args.runs:
        from twin.fit.cli import validate_runs

        return validate_runs(args)
    if args.machine or args.assume:
        raise TwinError("--machine and --assume go with --runs; the published rows use the package's machine files "
                        "(--machine-file NAME=PATH replaces one)")

    sections = tuple(_words(args.sections.upper()))
    for s in sections:
        if s not in ("A", "B"):
            raise TwinError(f"--sections: unknown section {s!r}; use A (AxoNN), B (the Frontier paper) or A,B")
    if args.readme:
        readme_parts(args.readme)  # markers present, before minutes of work
        check_outputs({"--readme": args.readme})
    files = _machine_files(args.machine_files)
    overrides = _validate_overrides(args.overrides, files)
    what_if = "--set" if overrides else "--machine-file" if files else None
    if what_if and args.readme:
        raise TwinError(f"--readme writes the package's machine files' own table; drop {what_if}, or drop --readme")
    if what_if and args.figures and args.figures_dir == FIGURES_DIR:
        raise TwinError(f"{what_if} with --figures needs --figures-dir: the figures in {FIGURES_DIR}/ are the "
                        "package's machine files' own")
    show = not args.json and (args.progress or sys.stderr.isatty())
    v = validate(jobs=args.jobs, progress=(lambda what: print(f"  {what} ...", file=sys.stderr)) if show else None,
                 sections=sections, overrides=overrides, files=files,
                 calibrated=not (what_if or args.first_principles_only))
    figures = []
    if args.figures:
        figures = _validation_figures(v, args.figures_dir)
    if args.readme:
        update_readme(args.readme, v)
    if args.json:
        doc = v.to_json_dict()
        doc["figures"] = figures
        print(json.dumps(doc, indent=2))
        return 0
    print(markdown_table(v))
    print(f"\n(wall time {v.wall_s:.0f} s; each search and simulation is cached: a repeat only prints)")
    for path in figures:
        print(f"figure: {path}")
    if args.readme:
        print(f"updated the Accuracy section of {args.readme}")
    return 0


FIGURES_DIR = "figures"


def _machine_files(texts: list[str]) -> dict[str, str]:
    """--machine-file NAME=PATH, by machine name (checked by twin.validate before any work)."""
    from twin.validate import check_machine_files

    files: dict[str, str] = {}
    for text in texts:
        name, sep, path = text.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise TwinError(f"--machine-file {text!r} must be NAME=PATH, e.g. frontier=my-frontier.toml")
        files[name.strip()] = path.strip()
    check_machine_files(files)
    return files


def _validate_overrides(texts: list[str], files: dict[str, str] | None = None) -> dict[str, tuple]:
    """--set [MACHINE:]FIELD=VALUE for twin validate: by machine; without MACHINE, for every machine the
    published rows run on (the field must then exist in each). `files`: --machine-file's, where given."""
    from topologies.machine import load_machine
    from topologies.overrides import parse_override
    from twin.validate import MACHINES

    files = files or {}
    out: dict[str, list] = {}
    for text in texts:
        name, sep, rest = text.partition(":")
        if sep and "=" not in name:
            if name not in MACHINES:
                raise TwinError(f"--set {text!r}: the published rows run on {' and '.join(MACHINES)}, not {name!r}")
            names, text = (name,), rest
        else:
            names = MACHINES
        override = parse_override(text)
        if not sep:
            has = [n for n in MACHINES if override[0] in load_machine(files.get(n, n)).sources]
            if has and len(has) < len(MACHINES):
                raise TwinError(f"--set {override[0]}: only {', '.join(has)} has this number; "
                                f"write {has[0]}:{override[0]}=VALUE")
        for n in names:
            out.setdefault(n, []).append(override)
    return {n: tuple(v) for n, v in out.items()}


def _validation_figures(v, folder: str) -> list[str]:
    from twin.figures import weak_scaling_validation_figure
    from twin.published import AXONN_TABLE_III
    from twin.validate import table_iii_quantity

    out = []
    predicted = {r.quantity: r.predicted for r in v.rows}
    for machine in ("frontier", "perlmutter"):
        rows = [p for p in AXONN_TABLE_III if p.machine == machine]
        keys = [table_iii_quantity(p) for p in rows]
        if not all(k in predicted for k in keys):
            continue
        path = os.path.join(folder, f"validate-weak-scaling-{machine}.png")
        weak_scaling_validation_figure(path, machine.capitalize(), [p.gpus for p in rows], [p.pflops_total for p in rows],
                                       [predicted[k] for k in keys], [p.model for p in rows])
        out.append(path)
    return out


def add_validate_parser(sub) -> None:
    p = sub.add_parser(
        "validate", help="predict every published measurement (reference/published.md) and print the errors",
        description="Every row of reference/published.md sections A (AxoNN SC'24) and B (the Frontier paper), "
        "predicted from the machine files (first principles) and from the fitted ones in topologies/fitted/ "
        "(calibrated; rows fitted on are marked 'fit'): AxoNN's unpublished plans are chosen as AxoNN chose them "
        "(the fastest of its communication model's top 10), the Frontier paper's are its launch scripts'. Prints "
        "published, predicted and error per row, then the mean and max error. With --runs: measured runs of a "
        "CSV instead, predicted on each --machine. "
        "Searches and simulations are cached (~/.cache/exatwin), so only the first run is slow.",
    )
    p.add_argument("--sections", default="A,B", help="A (AxoNN), B (the Frontier paper) or A,B (default)")
    p.add_argument("--figures", action="store_true", help="write predicted vs published weak-scaling figures")
    p.add_argument("--figures-dir", default=FIGURES_DIR, help="where --figures writes (default figures/)")
    p.add_argument("--set", action="append", default=[], metavar="[MACHINE:]FIELD=VALUE", dest="overrides",
                   help="what-if: replace a number of a machine file for this validation (repeatable), e.g. "
                   "--set frontier:device.comm_compute_slowdown=0.3; without MACHINE, in frontier and perlmutter")
    p.add_argument("--machine-file", action="append", default=[], metavar="NAME=PATH", dest="machine_files",
                   help="what-if: validate with this file in place of the package's machine NAME (repeatable), e.g. "
                   "frontier=frontier-measured.toml with measured GEMMs ([[device.gemm_measured]])")
    p.add_argument("--readme", help="rewrite this README's Accuracy section (between the accuracy markers)")
    p.add_argument("--first-principles-only", action="store_true",
                   help="leave out the calibrated column (the fitted files in topologies/fitted/; what-ifs always do)")
    p.add_argument("--runs", help="instead of the published rows: predict every run of this CSV of measured runs "
                   "(twin/runs.py) on each --machine, e.g. benchmarks/data/a100-megatron-multi-node.csv")
    p.add_argument("--machine", action="append", default=[], help="with --runs: a machine (name or .toml, e.g. a "
                   "`twin fit` output); repeat it to compare machines side by side")
    p.add_argument("--assume", help="with --runs: plan and model fields the CSV does not say, e.g. attention=unfused")
    p.add_argument("--jobs", type=count_flag(limits.JOBS),
                   help="processes for the searches (default and most: every core)")
    p.add_argument("--progress", action="store_true", help="report each task on stderr even when not a terminal")
    p.add_argument("--json", action="store_true", help="print the rows and the error summary as JSON")
    p.set_defaults(func=cmd_validate)
