"""What the `twin` commands share: their common arguments, reading them into a machine, model and plan, the
one-line usage-error parser, and the progress bar.

A helper module: it imports no command module (twin.cli.commands assembles those), and executor.cli takes its
helpers from here.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from twin import axes, limits
from twin.errors import TwinError
from twin.limits import count_flag

if TYPE_CHECKING:
    from topologies.machine import Machine
    from topologies.overrides import Override
    from twin.ir import Schedule
    from twin.model import ModelSpec
    from twin.plan import ParallelPlan

DEFAULT_BATCH_TOKENS = 16_777_216  # AxoNN SC'24 Table I: 16.8M tokens per batch


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (what is wrong and where to look), exit code 2, like a TwinError.

    argparse's default prints the whole usage block first, which buries the line that matters. Subcommand
    parsers are made of the same class (add_subparsers uses the parent's class)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"twin: error: {message} (see {self.prog} --help)\n")


# ---------------------------------------------------------------- arguments

def add_machine_and_model_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    """--machine, --model or --model-spec, and --seq: what every command that builds steps needs."""
    p.add_argument("--machine", required=required, help="machine name (see `twin machines`) or path to a machine .toml")
    model = p.add_mutually_exclusive_group(required=required)
    model.add_argument("--model", help="catalog model (see `twin models`), e.g. GPT-80B")
    model.add_argument("--model-spec", help="any decoder-only model: layers=..,hidden=..,heads=..[,seq=..,vocab=..,"
                       "ffn=..,kv_heads=..,arch=gpt|llama,dtype=bf16|fp16|fp32,dropout=1|0,tied=1|0] (kv_heads: "
                       "grouped-query attention; arch=llama: SwiGLU, RMSNorm, rotary, no biases, untied head, no "
                       "dropout; dropout=0: trained without dropout, as MPT; tied=0: the LM head its own weights, "
                       "Megatron's --untie-embeddings-and-output-weights)")
    p.add_argument("--seq", type=count_flag(limits.SEQ_LEN), help="sequence length (default: the model's)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                   help="replace one number of the machine file for this run (repeatable), e.g. "
                   "--set device.attention_efficiency=0.5; `twin machines NAME` lists the fields")


def add_plan_switches(p: argparse.ArgumentParser) -> None:
    """--no-overlap and --no-tune, which change any plan given."""
    p.add_argument("--no-overlap", action="store_true", help="switch off AxoNN's OAR, ORS and OAG overlap")
    p.add_argument("--no-tune", action="store_true", help="switch off GEMM-layout tuning (use the framework's layouts)")


def add_step_arguments(p: argparse.ArgumentParser, required: bool = True) -> None:
    """The arguments that describe a step; optional for simulate, which can read --schedule instead."""
    add_machine_and_model_arguments(p, required)
    p.add_argument("--gpus", type=count_flag(limits.GPUS), required=required, help="number of GPUs (GCDs on Frontier)")
    p.add_argument(
        "--plan", required=required,
        help="parallel plan: AxoNN's gx=..,gy=..,gz=..,gdata=.. and/or Megatron's tp=..,pp=..,dp=.. "
        "[,cp=..,cpcomm=p2p|allgather,vpp=..,pemb=0|1,ploss=0|1,zero=0-3,sp=0|1,tpo=0|1,odp=0|1,dpouter=0|1,"
        "fp8=0|1,fp8recipe=current|delayed,fp8pg=0|1,gradfp32=0|1,reshard=0|1,fsdp2=0|1,axonn=0|1,cache=..,mbs=..,ga=..,attention=flash|unfused,optimizer=megatron|flat,"
        "p2p=split|full,kernels=fused|eager,norm=fused|eager,recompute=full|selective|op|none,rcl=..,oar=0|1,ors=..,oag=..,tune=0|1] (cpcomm=allgather: context parallelism "
        "all-gathers K and V instead of passing them in a ring, Megatron-Core's --cp-comm-type all_gather, Llama 3's; "
        "pemb/ploss=1: the embedding / the loss counts as a layer in the pipeline's split, "
        "Megatron-Core's --account-for-*-in-pipeline-split; tpo=1: --tp-comm-overlap; odp=1: --overlap-grad-reduce "
        "and --overlap-param-gather; dpouter=1: ranks placed tp-cp-pp-dp, the data-parallel replicas outermost, "
        "--use-tp-pp-dp-mapping; fp8=1: the layers' linears in FP8 (Transformer Engine) on a machine "
        "whose file gives an FP8 GEMM rate, fp8recipe their scaling, current (default) or delayed; fp8pg=1: their weights "
        "kept and gathered in FP8, --fp8-param-gather (ZeRO-1/2); rcl=N: with recompute=full, only the first N layers of "
        "each model chunk recompute, --recompute-method block --recompute-num-layers N; recompute=op: torchtitan's per-operator selective checkpointing of a Llama block (flash attention, gx=gy=1); kernels=eager: a Llama layer's element-wise work op by op, as torchtitan runs without torch.compile; norm=eager: its RMSNorms too, torch's RMSNorm module (torchtitan's norm_type rmsnorm); gradfp32=1: gradients "
        "accumulated and reduced in fp32, Megatron-LM's default in bf16, FSDP's reduce_dtype=float32; "
        "reshard=1: sharded weights gathered again for the backward, as FSDP's "
        "FULL_SHARD; fsdp2=1: each gather's weights copied out of its buffer into the parameters, as PyTorch's FSDP2 "
        "does; axonn=1: AxoNN's code as its paper ran it: the forward's weight gathers blocking and copied, the embedding not sharded over Z; cache=N: with axonn=1, the first N layers keep the weights they gather over Z for the whole step, its --num-layers-for-caching-weights-in-depth-tensor-parallel-all-gather). Axes (their product is --gpus): " + axes.help_text(),
    )
    p.add_argument("--global-batch", type=count_flag(limits.SEQUENCES),
                   help="sequences per step (default: 16.8M tokens / seq, as AxoNN)")
    add_plan_switches(p)


def add_preset_argument(p: argparse.ArgumentParser, schedule: bool = False) -> None:
    """--preset, and with `schedule` also --schedule: the other ways than the step arguments to name a step."""
    p.add_argument("--preset", help="a named configuration from the papers (see `twin presets`)")
    if schedule:
        p.add_argument("--schedule", help="simulate a schedule IR file (from `twin export`) instead of building one")


# ---------------------------------------------------------------- reading them

def load_machine_from_args(args: argparse.Namespace) -> Machine:
    """--machine with its --set overrides."""
    from topologies.machine import load_machine

    return load_machine(args.machine, overrides_from_args(args))


def overrides_from_args(args: argparse.Namespace) -> tuple[Override, ...]:
    """--set FIELD=VALUE, each parsed."""
    from topologies.overrides import parse_override

    return tuple(parse_override(text) for text in getattr(args, "overrides", []))


def machine_and_model(args: argparse.Namespace) -> tuple[Machine, ModelSpec]:
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


def step_inputs(args: argparse.Namespace) -> tuple[ModelSpec, ParallelPlan, Machine]:
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


def comma_words(text: str) -> tuple[str, ...]:
    """The non-empty items of a comma-separated flag value, stripped."""
    return tuple(x.strip() for x in text.split(",") if x.strip())


def input_files(args: argparse.Namespace) -> dict[str, str | None]:
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


def apply_preset(args: argparse.Namespace) -> None:
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


def require_step_arguments(args: argparse.Namespace, command: str, alternative: str = "") -> None:
    """--machine, --model, --gpus and --plan, given or filled by --preset."""
    missing = [f"--{n}" for n in ("machine", "gpus", "plan") if getattr(args, n) is None]
    if not (args.model or args.model_spec):
        missing.append("--model")
    if missing:
        raise TwinError(f"{command} needs {', '.join(missing)}{alternative}; see `twin {command} --help`")


def schedule_and_machine(args: argparse.Namespace) -> tuple[Schedule, Machine]:
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


@dataclass(frozen=True)
class StepSource:
    """What a step command simulates: a built schedule (--schedule FILE) or a model and plan to build."""

    machine: Machine
    schedule: Schedule | None = None
    model: ModelSpec | None = None
    plan: ParallelPlan | None = None


def schedule_or_step(args: argparse.Namespace, command: str, alternative: str) -> StepSource:
    """--schedule FILE with its --machine, or the step arguments, a --preset filled in first."""
    if args.preset:
        apply_preset(args)
    if args.schedule:
        schedule, machine = schedule_and_machine(args)
        return StepSource(machine, schedule=schedule)
    require_step_arguments(args, command, alternative)
    model, plan, machine = step_inputs(args)
    return StepSource(machine, model=model, plan=plan)


# ---------------------------------------------------------------- progress on stderr

def shows_progress(args: argparse.Namespace) -> bool:
    """Whether to report progress on stderr: not with --json; with --progress, or when stderr is a terminal."""
    return not args.json and (args.progress or sys.stderr.isatty())


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


