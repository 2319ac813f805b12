"""`twin search`: rank every valid plan for a model, GPU count and batch by simulated step time."""

from __future__ import annotations

import argparse
import json

from twin import axes as axis_registry, limits
from twin.cli.args import ProgressBar, add_machine_and_model_arguments, comma_words, machine_and_model, shows_progress
from twin.errors import TwinError
from twin.limits import count_flag


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TwinError(f"{flag} {text!r} must be comma-separated integers, e.g. 0,1") from None


def _switches(text: str, flag: str) -> tuple[bool, ...]:
    """A comma-separated list of 0 and 1 as booleans."""
    values = _ints(text, flag)
    if any(v not in (0, 1) for v in values):
        raise TwinError(f"{flag} {text!r} must be 0, 1 or 0,1")
    return tuple(bool(v) for v in values)


# The plan keys a search varies itself (its flags), which --with may not fix; pemb and ploss follow the split.
_SEARCHED = {*axis_registry.KEYS, *axis_registry.ALIASES, "mbs", "ga", "global_batch", "zero", "recompute", "rcl",
             "reshard", "vpp", "sp", "tpo", "odp", "dpouter", "cpcomm", "fp8", "pemb", "ploss"}
_ON_FP8 = {"fp8pg", "fp8recipe"}  # valid only with fp8=1, which a candidate takes after its base plan is checked


def _fixed_words(text: str | None) -> tuple[tuple[str, object], ...]:
    """--with's plan words as (field, value) pairs for every candidate; a key the search varies is a one-line
    error naming its flag."""
    from dataclasses import fields

    from twin.plan import ParallelPlan, parse_plan, plan_keys

    if not text:
        return ()
    dependent = sorted(plan_keys(text) & _ON_FP8)
    if dependent:
        raise TwinError(f"--with: {dependent[0]} applies to FP8 linears, which the search varies (--fp8) and tries "
                        f"in its default form only; leave {dependent[0]} out")
    searched = sorted(plan_keys(text) & _SEARCHED)
    if searched:
        key = searched[0]
        flag = "--axes" if key in axis_registry.KEYS else "--mbs" if key in ("mbs", "ga") else \
            "--global-batch" if key == "global_batch" else "the pipeline split" if key in ("pemb", "ploss") \
            else f"--{key}"
        raise TwinError(f"--with: {key} is what the search varies ({flag}); give it there, not in --with")
    try:
        plan, default = parse_plan(text), ParallelPlan()
    except TwinError as e:
        raise TwinError(str(e).replace("--plan", "--with", 1)) from None
    return tuple((f.name, getattr(plan, f.name)) for f in fields(ParallelPlan)
                 if getattr(plan, f.name) != getattr(default, f.name))


def cmd_search(args: argparse.Namespace) -> int:
    from topologies.overrides import describe_overrides
    from twin.build import check_fp8_rate
    from twin.figures import landscape_figure
    from twin.search.batch import sequences_for_tokens
    from twin.search.rank import search
    from twin.search.space import DEFAULT_AXES, SearchSpace

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
    axes = comma_words(args.axes) if args.axes else DEFAULT_AXES
    space = SearchSpace(axes=axes, min_tp=args.min_tp, max_tp=args.max_tp or 0, zero=_ints(args.zero, "--zero"),
                        recompute=comma_words(args.recompute), reshard=_switches(args.reshard, "--reshard"),
                        mbs=_ints(args.mbs, "--mbs") if args.mbs != "auto" else (), vpp=_ints(args.vpp, "--vpp"),
                        sp=_switches(args.sp, "--sp"), tpo=_switches(args.tpo, "--tpo"),
                        odp=_switches(args.odp, "--odp"), dpouter=_switches(args.dpouter, "--dpouter"),
                        cpcomm=comma_words(args.cpcomm), fp8=_switches(args.fp8, "--fp8"),
                        rcl=_ints(args.rcl, "--rcl"), fixed=_fixed_words(args.with_words))
    if True in space.fp8:
        check_fp8_rate(machine, "--fp8 1", "use --fp8 0")
    bar = ProgressBar(shows_progress(args))
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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add search to twin's subcommands."""
    p = sub.add_parser(
        "search", help="rank every valid plan by simulated step time",
        description="Every valid plan for the model, GPU count and batch (factorisations over --axes, ZeRO stages, "
        "recompute modes, micro-batch sizes; overlap and GEMM tuning on), pruned by memory, then simulated in order "
        "of lower bounds on their step time (a cheap one for every plan, a tighter one where the cheap one cannot "
        "decide) until no plan left can enter the top. The ranking equals simulating "
        "every plan (--exhaustive does). Results are cached in ~/.cache/exatwin (--no-cache). Example: twin search "
        "--machine frontier --model GPT-320B --gpus 32768 --batch-tokens 16.8M --seq 2048 --top 10",
    )
    add_machine_and_model_arguments(p)
    p.add_argument("--gpus", type=count_flag(limits.GPUS), required=True, help="number of GPUs (GCDs on Frontier)")
    p.add_argument("--batch-tokens", help="tokens per step, e.g. 16.8M (default; AxoNN's batch): rounded to a sequence "
                   "count with the most factors of two within the digits given")
    p.add_argument("--global-batch", type=count_flag(limits.SEQUENCES),
                   help="sequences per step (instead of --batch-tokens)")
    p.add_argument("--top", type=count_flag(limits.Range(1, 100_000, "plans")), default=10,
                   help="how many plans to rank (default 10)")
    p.add_argument("--axes", help=f"axes to search, from {','.join(axis_registry.KEYS)} (default "
                                  f"{','.join(axis_registry.DEFAULT_SEARCH)}; gx,gy,gz,gdata = AxoNN only: at tens of "
                                  "thousands of GPUs far fewer plans, a search in about half a minute instead of a few "
                                  "minutes). " + axis_registry.help_text())
    p.add_argument("--min-tp", type=count_flag(limits.DEGREE), default=1, help="smallest gx*gy*gz (default 1)")
    p.add_argument("--max-tp", type=count_flag(limits.DEGREE), help="largest gx*gy*gz (default: no limit)")
    p.add_argument("--zero", default="0", help="ZeRO stages to try over gdata, e.g. 0,1 (default 0)")
    p.add_argument("--recompute", default="full",
                   help="recompute modes to try, from full,selective,op,none (default full; op: torchtitan's per-operator "
                   "checkpointing, tried on Llama models where the block has no tensor parallelism)")
    p.add_argument("--rcl", default="0",
                   help="with full recompute, how many layers of each model chunk recompute, to try: e.g. 0,1,2 "
                   "(Megatron-Core's --recompute-method block --recompute-num-layers; 0, the default: every layer; "
                   "a count applies where a chunk holds more layers)")
    p.add_argument("--reshard", default="0",
                   help="FSDP's resharding to try: 0 keeps sharded weights gathered for the backward (AxoNN, "
                   "SHARD_GRAD_OP), 1 gathers them again (FULL_SHARD: less memory, one more all-gather per linear), "
                   "0,1 both; only plans with sharded weights (gz > 1 or ZeRO-3) and a layer that does not recompute "
                   "(recompute none or selective, or an --rcl count) differ (default 0)")
    p.add_argument("--mbs", default="auto",
                   help="micro-batch sizes to try, e.g. 1,2,4; auto (default): the largest that "
                   "fits without a pipeline, every power of two that fits with one")
    p.add_argument("--vpp", default="1",
                   help="interleaved model chunks per pipeline rank to try, e.g. 1,2,4 (default 1); a count applies "
                   "where the stages' layers split into it and the micro-batches are a multiple of pp")
    p.add_argument("--sp", default="0", help="Megatron's sequence parallelism to try: 0, 1 or 0,1 (default 0; "
                   "applies where gx > 1 and gy = 1)")
    p.add_argument("--tpo", default="0", help="its gathers and scatters under their GEMMs (--tp-comm-overlap) to try: "
                   "0, 1 or 0,1 (default 0; applies with sp=1)")
    p.add_argument("--odp", default="0", help="the data-parallel synchronisation overlapped (--overlap-grad-reduce, "
                   "--overlap-param-gather) to try: 0, 1 or 0,1 (default 0; applies where ZeRO 0-2 has more than "
                   "one replica)")
    p.add_argument("--dpouter", default="0", help="the ranks' order to try: 0 places them tp-cp-dp-pp (each stage's "
                   "replicas on consecutive GPUs), 1 tp-cp-pp-dp (each pipeline on consecutive GPUs, the replicas "
                   "outermost: Megatron's --use-tp-pp-dp-mapping, Llama 3's), 0,1 both (default 0; applies where "
                   "pp > 1 and dp > 1)")
    p.add_argument("--cpcomm", default="p2p", help="context parallelism's K/V exchange to try: p2p (a ring, the "
                   "default), allgather (all-gathered, Llama 3's), or p2p,allgather; applies where cp > 1 (--axes "
                   "with cp)")
    p.add_argument("--fp8", default="0", help="the layers' linears in FP8 (Transformer Engine's current scaling) to "
                   "try: 0, 1 or 0,1 (default 0; 1 needs a machine file with an FP8 GEMM rate)")
    p.add_argument("--with", dest="with_words", metavar="WORDS",
                   help="plan words every candidate holds, not searched, e.g. gradfp32=1,kernels=eager,norm=eager,"
                   "fsdp2=1 (torchtitan's FSDP2 in eager PyTorch) or attention=unfused,optimizer=flat (Megatron-"
                   "DeepSpeed before flash attention); what the search varies (axes, mbs, zero, recompute, ...) "
                   "goes to its own flag")
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
