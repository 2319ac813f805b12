"""`twin run`, `twin calibrate`, `twin compare`: the executor's commands, added to twin's parser.

Importing this module never imports torch (twin must run without it): each
command checks for torch first and, without it, fails with one line and exit
code 2. The ranks themselves are separate processes (executor.worker),
started by torchrun (executor.launch).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

from twin import limits
from twin.cli.args import machine_file
from twin.errors import TwinError
from twin.limits import count_flag, real_flag
from twin.outputs import DEFAULT_DIR, check_outputs

RANKS = limits.Range(1, 1024, "processes")  # processes on one host

NEEDS_TORCH = "twin {command} needs torch: pip install -e '.[torch]'"


def _require_torch(command: str) -> None:
    if importlib.util.find_spec("torch") is None:
        raise TwinError(NEEDS_TORCH.format(command=command))


def _worker_options(args: argparse.Namespace, **extra):
    from executor.launch import WorkerOptions

    return WorkerOptions(steps=args.steps, warmup=args.warmup, device=args.device, dtype=args.dtype,
                         timeout_s=args.timeout, threads=args.threads, tune=not args.no_tune,
                         compute_nice=args.compute_nice, **extra)


def _out_dir(args: argparse.Namespace, schedule_path: str, what: str) -> str:
    """--out, or out/<command>-<schedule>: a folder for the ranks' files (an existing file there is an error)."""
    if args.out:
        if os.path.lexists(args.out) and not os.path.isdir(args.out):
            raise TwinError(f"--out {args.out} is a file; give a folder (it is created if missing)")
        return args.out
    stem = os.path.basename(schedule_path).removesuffix(".json")
    return os.path.join(DEFAULT_DIR, f"{what}-{stem}")


BUSY_WARNING_CORES = 0.3


def _load_note(out: str) -> str:
    """A line on what else ran on the host during the measurement (executor.launch writes it)."""
    from executor.launch import other_load

    load = other_load(out)
    if load is None:
        return ""
    if load > BUSY_WARNING_CORES:
        return (f"  note: other processes kept {load:.1f} of this host's {os.cpu_count()} CPUs busy during the run: "
                "times are noisier and slower than on a quiet host")
    return f"  other load on the host during the run: {load:.2f} cores"


def _machine_for_peaks(name: str | None, device: str = "auto") -> str | None:
    """The machine whose peaks the summary's percentages use: --machine, else `local` if it loads and the run is
    on this host's CPUs (local describes them: a GPU run beat its peak by 5,938x); a GPU run without --machine
    reports no percentages."""
    from topologies.machine import load_machine

    if not name and _on_gpu(device):
        return None
    for candidate in ([name] if name else ["local"]):
        try:
            load_machine(candidate)
            return candidate
        except TwinError:
            if name:
                raise
    return None


def _on_gpu(device: str) -> bool:
    """Whether the ranks will run on GPUs (as executor.target.choose_target decides for --device)."""
    if device != "auto":
        return device == "cuda"
    import torch

    return torch.cuda.is_available()


def _refuse_fp8(schedule, command: str) -> None:
    """The executor runs every GEMM in one dtype, the model's: an fp8=1 schedule would time other work."""
    if schedule.info.plan is not None and schedule.info.plan.fp8:
        raise TwinError(f"twin {command}: the schedule's plan has fp8=1, and the executor has no FP8 GEMMs (they "
                        "would run in the model's dtype and time other work); export the same plan with fp8=0")


def cmd_run(args: argparse.Namespace) -> int:
    from twin.ir_io import load_schedule

    if args.profile_steps and args.check_numerics:
        raise TwinError("--profile-steps cannot go with --check-numerics; run them separately")
    schedule = load_schedule(args.schedule)
    _refuse_fp8(schedule, "run")
    if args.check_numerics and schedule.info.plan is not None and schedule.info.plan.tpo:
        raise TwinError("--check-numerics: tpo=1 splits each overlapped GEMM into chunks, which the numerics check "
                        "does not bind to tensors; check the same plan with tpo=0 (the same data, moved in one piece)")
    if args.check_numerics and schedule.info.plan is not None and schedule.info.plan.cpcomm != "p2p":
        raise TwinError(f"--check-numerics: cpcomm={schedule.info.plan.cpcomm} is not bound to tensors by the numerics "
                        "check, which checks ring attention; check the same plan with cpcomm=p2p (the same layers "
                        "and the same attention, its K and V passed in a ring)")
    if args.launcher == "srun":
        from executor.launch import srun_script

        if not args.machine:
            raise TwinError("--launcher srun needs --machine (frontier, perlmutter or alps)")
        opts = _worker_options(args, check_numerics=args.check_numerics, profile_steps=args.profile_steps)
        print(srun_script(args.machine, schedule, args.schedule, _out_dir(args, args.schedule, "run"), opts))
        print("# printed, not submitted: run these lines inside an allocation (salloc/sbatch)", file=sys.stderr)
        return 0
    _require_torch("run")
    from executor.launch import run_local

    nproc = args.nproc or schedule.world_size
    out = _out_dir(args, args.schedule, "numerics" if args.check_numerics else "run")
    check_outputs({"--trace": args.trace}, {"SCHEDULE": args.schedule, "--machine": machine_file(args.machine)})
    machine = None if args.check_numerics else _machine_for_peaks(args.machine, args.device)
    opts = _worker_options(args, check_numerics=args.check_numerics, machine=machine,
                           profile_steps=args.profile_steps)
    wall = run_local(schedule, args.schedule, nproc, out, opts, args.wall_timeout)
    with open(os.path.join(out, "rank0.json")) as f:
        rank0 = json.load(f)
    where = f"{nproc} ranks (torchrun, {rank0['backend']}, {rank0['device_name']}, {rank0['dtype']}: {rank0['dtype_note']})"
    if args.check_numerics:
        return _report_numerics(args, out, where, wall)
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out, "run.json")) as f:
        run = json.load(f)
    if args.trace:
        import shutil

        from twin.outputs import write_with

        write_with(args.trace, lambda tmp: shutil.copyfile(os.path.join(out, "trace.json"), tmp))
    if args.json:
        # the schedule it measured, so that `twin fit --runs` can take this output as a measured run
        print(json.dumps({**summary, "schedule": os.path.abspath(args.schedule)}, indent=2))
        return 0
    from twin.report import Summary, format_summary

    print(f"measured {args.schedule} on {where}")
    print(format_summary(Summary(**summary)).replace("simulated", "measured"))
    steps = ", ".join(f"{s:.4f}" for s in run["step_times_s"])
    print(f"  measured steps (s): {steps}; the median step is summarised, after {args.warmup} warm-up step(s)")
    print(f"  set-up before the first step: {run['compile_s']:.1f} s (the slowest rank; rank 0's buffers "
          f"{rank0['buffer_bytes'] / 1e9:.2f} GB)")
    if machine and summary["pct_peak_advertised"] > 100:
        print(f"  note: this run beat machine {machine}'s peak per GPU, so the percentages mean little: that file "
              f"was calibrated for another rank count, or this host runs faster today; `twin calibrate --nproc "
              f"{nproc}` measures it for this run")
    print(f"  trace written to {args.trace or os.path.join(out, 'trace.json')} (all files in {out}, {wall:.1f} s)")
    if args.profile_steps:
        print(f"  torch.profiler traces of {args.profile_steps} more step(s): {out}/profile-rank*.json "
              f"(twin compare-trace {out}/profile-rank0.json --schedule {args.schedule} --machine M)")
    if _load_note(out):
        print(_load_note(out))
    return 0


def _report_numerics(args: argparse.Namespace, out: str, where: str, wall: float) -> int:
    with open(os.path.join(out, "numerics.json")) as f:
        result = json.load(f)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"numerics check of {args.schedule} on {where}")
        status = "PASSED" if result["ok"] else "FAILED"
        print(f"  {status}: {result['checks']} comparisons of outputs, input gradients and weight-gradient shards "
              f"({max(result['linears_per_rank'])} linear layers per rank) with a float64 single-process reference; "
              f"max relative error {result['max_rel_err']:.2e} (bound {result['bound']:.0e}, float32)")
        for line in result["failures"]:
            print(f"  {line}")
        if result["n_failures"] > len(result["failures"]):
            print(f"  ... and {result['n_failures'] - len(result['failures'])} more")
        print(f"  details in {out}/numerics.json ({wall:.1f} s)")
    if not result["ok"]:
        print(f"twin: numerics check failed: {result['n_failures']} problem(s); see {out}/numerics.json", file=sys.stderr)
        return 1
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.refit is not None:
        return _refit(args)
    _require_torch("calibrate")
    import time

    if _on_gpu(args.device):  # its GEMMs (at most 1 GFLOP) and one-stream, no-waves fit describe a CPU host
        raise TwinError("twin calibrate measures a CPU host (GEMMs of at most 1 GFLOP, no SM waves), not a GPU: "
                        "time a GPU's GEMMs with benchmarks/gemm_shapes.py (--toml) into its machine file, or pass "
                        "--device cpu to calibrate this host's CPUs")

    from executor.calibrate import calibration_schedule
    from executor.calibrate_host import calibrate_host, launch_dirs
    from executor.calibration_report import fit_lines
    _check_calibration_output(args)
    out = args.out or os.path.join(DEFAULT_DIR, "calibrate")
    n_ops = len(calibration_schedule(args.nproc, args.repeats)[0].programs[0].ops)
    print(f"calibrating {args.nproc} ranks on this host: {n_ops} microbenchmark ops x {args.steps} step(s)"
          + (f" x {args.launches} launches, the median fitted" if args.launches > 1 else "") + "...", file=sys.stderr)

    def launched(k: int, seconds: float) -> None:
        print(f"  launch {k} of {args.launches} measured ({seconds:.0f} s)", file=sys.stderr)

    start = time.perf_counter()
    fitted, doc, measured = calibrate_host(args.nproc, args.output, out, _worker_options(args), args.repeats,
                                           args.wall_timeout, args.launches, launched if args.launches > 1 else None)
    wall = time.perf_counter() - start
    if args.json:
        print(json.dumps({"machine_file": args.output, "launches": args.launches, "fit": doc["fit"],
                          "simulator_vs_measured": doc["simulator_vs_measured"]}, indent=2))
        return 0
    print(f"wrote {args.output} ({measured.dtype}, {args.nproc} ranks, {wall:.0f} s) and the measurements beside it:")
    print("\n".join(fit_lines(fitted, doc)))
    for k, launch_dir in enumerate(launch_dirs(out, args.launches)):
        if _load_note(launch_dir):
            print(_load_note(launch_dir) + (f" (launch {k + 1})" if args.launches > 1 else ""))
    return 0


def _check_calibration_output(args: argparse.Namespace) -> None:
    """Default --output (out/local.toml: never into the repository), checked writable with its measurements'
    file beside it."""
    if args.output is None:
        os.makedirs(DEFAULT_DIR, exist_ok=True)
        args.output = os.path.join(DEFAULT_DIR, "local.toml")
    beside = os.path.join(os.path.dirname(os.path.abspath(args.output)),
                          os.path.basename(args.output).removesuffix(".toml") + ".calibration.json")
    check_outputs({"--output": args.output, "its measurements": beside}, formats={"--output": ("toml",)})


def _refit(args: argparse.Namespace) -> int:
    """--refit: a saved calibration's measurements fitted again by this version, nothing measured (no torch)."""
    from executor.calibrate_host import load_saved, refit_document
    from executor.calibration_report import fit_lines

    saved = load_saved(args.refit)  # a one-line error before anything is written
    _check_calibration_output(args)
    fitted, doc = refit_document(saved, args.output)
    if args.json:
        print(json.dumps({"machine_file": args.output, "refit": args.refit, "fit": doc["fit"],
                          "simulator_vs_measured": doc["simulator_vs_measured"]}, indent=2))
        return 0
    host = doc["host"]
    print(f"wrote {args.output}: the measurements of {args.refit} ({doc['dtype']}, {host['nproc']} ranks, "
          f"{doc['date']}) fitted again by this version, nothing measured:")
    print("\n".join(fit_lines(fitted, doc)))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    _require_torch("compare")
    from executor.compare import comparison_figures, format_comparison, simulate_and_execute
    from twin.ir_io import load_schedule

    schedule = load_schedule(args.schedule)
    _refuse_fp8(schedule, "compare")
    nproc = args.nproc or schedule.world_size
    out = _out_dir(args, args.schedule, "compare")
    c, sim_run, measured = simulate_and_execute(schedule, args.schedule, args.machine, nproc, out,
                                                _worker_options(args, machine=args.machine), args.wall_timeout)
    stem = os.path.basename(args.schedule).removesuffix(".json")
    prefix = args.figures or os.path.join(DEFAULT_DIR, f"compare-{stem}")
    sim_tl = next(t for t in sim_run.timelines if t.rank == c.rank)
    figures = comparison_figures(prefix, c, sim_tl, measured.timelines[c.rank])
    if args.json:
        print(json.dumps({**c.to_json_dict(), "figures": figures}, indent=2))
        return 0
    print(format_comparison(c))
    print(f"  machine {sim_run.machine.name} ({args.machine}); measured {measured.dtype} on {nproc} ranks; "
          f"figures {', '.join(figures)}; details in {out}/compare.json")
    if _load_note(out):
        print(_load_note(out))
    return 0


def _add_exec_options(p: argparse.ArgumentParser, steps: int = 5, warmup: int = 2) -> None:
    p.add_argument("--steps", type=count_flag(limits.STEPS), default=steps, help=f"measured steps (default {steps})")
    p.add_argument("--warmup", type=count_flag(limits.STEPS, zero_ok=True), default=warmup,
                   help=f"warm-up steps, not measured (default {warmup})")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where ranks run (default: GPU if any)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="element type (default: the schedule's on GPU, float32 on CPU)")
    p.add_argument("--timeout", type=real_flag(limits.SECONDS), default=30.0,
                   help="seconds before a collective counts as dead (default 30)")
    p.add_argument("--wall-timeout", type=real_flag(limits.SECONDS), default=900.0,
                   help="seconds before the whole launch is stopped")
    p.add_argument("--threads", type=count_flag(limits.Range(1, 1024, "threads")), default=1,
                   help="torch threads per rank on CPU (default 1)")
    p.add_argument("--no-tune", action="store_true", help="run GEMMs in the IR's layout, not the fastest one")
    p.add_argument("--compute-nice", type=count_flag(limits.Range(0, 19, "(a niceness)")), default=10,
                   help="CPU: niceness of each rank's compute thread, so communication threads preempt it (default 10; "
                   "0: off; use the same value to calibrate and to run)")
    p.add_argument("--out",
                   help=f"folder for the ranks' files, trace and summary (default {DEFAULT_DIR}/<command>-<schedule>)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add run, calibrate and compare to twin's subcommands."""
    p = sub.add_parser(
        "run", help="execute a schedule with torch.distributed (torchrun): measured trace and summary",
        description="Execute a schedule IR (from `twin export`) for real: torchrun on this host (gloo on CPU, NCCL on "
        "GPUs), warm-up steps, then measured steps; writes a Chrome trace and the summary keys of `twin simulate "
        "--json`. --check-numerics runs one step with real data through the 4D linear layers and checks it against "
        "a single-process reference. --launcher srun prints the Slurm lines for Frontier, Perlmutter or Alps. "
        "Example: twin run step.json --nproc 4",
    )
    p.add_argument("schedule", help="a schedule IR file (twin export)")
    p.add_argument("--nproc", type=count_flag(RANKS), help="processes on this host (default: the schedule's ranks)")
    p.add_argument("--check-numerics", action="store_true", help="check the linear layers' numbers against one process")
    p.add_argument("--launcher", choices=("torchrun", "srun"), default="torchrun",
                   help="torchrun here, or print srun lines")
    p.add_argument("--machine", help="machine for the %% of peak (default: local if present, on CPU runs; none on "
                   "GPUs: local describes this host's CPUs); with srun: the cluster")
    p.add_argument("--trace", help="also copy the measured Chrome trace here")
    p.add_argument("--profile-steps", type=count_flag(limits.STEPS, zero_ok=True), default=0,
                   help="after the measured steps, run this many more under torch.profiler and write each rank's "
                   "trace to OUT/profile-rankR.json (for twin compare-trace; default 0: none)")
    p.add_argument("--json", action="store_true", help="print the summary (or numerics result) as JSON")
    _add_exec_options(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "calibrate", help="GEMM, element-wise, attention and collective microbenchmarks -> a machine file",
        description="Run microbenchmarks with the executor on this host (GEMM shapes x NN/NT/TN, copies, attention, "
        "all-reduce/all-gather/reduce-scatter over sizes and group sizes), fit the simulator's device and link "
        "parameters and write a machine file (default out/local.toml) plus NAME.calibration.json beside it. "
        "Example: twin calibrate --nproc 4 -o out/local.toml",
    )
    p.add_argument("--nproc", type=count_flag(RANKS), default=4, help="ranks on this host (default 4)")
    p.add_argument("-o", "--output", help=f"machine file to write (default {DEFAULT_DIR}/local.toml)")
    p.add_argument("--repeats", type=count_flag(limits.Range(1, 1000, "repeats")), default=4,
                   help="repeats of each microbenchmark per step (default 4)")
    p.add_argument("--launches", type=count_flag(limits.Range(1, 100, "launches")), default=1,
                   help="launch the microbenchmarks this many times and fit the median of the launches' times, so one "
                   "launch in an odd moment of a shared host does not decide the file (default 1)")
    p.add_argument("--json", action="store_true", help="print the fit as JSON")
    p.add_argument("--refit", metavar="NAME.calibration.json",
                   help="measure nothing: fit the measurements a calibration saved (the JSON beside its machine "
                   "file) again with this version's fit and write --output; after an upgrade, or to audit a file "
                   "(--nproc and the measuring options are then the saved run's)")
    _add_exec_options(p, steps=3, warmup=1)
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser(
        "compare", help="simulate and execute one schedule, side by side: per op class, per step, figures",
        description="Simulate the schedule on --machine and execute it here, then compare per op class and per "
        "step, and draw out/compare-NAME-scatter.png and -timeline.png (--figures). "
        "Example: twin compare step.json --machine out/local.toml --nproc 4",
    )
    p.add_argument("schedule", help="a schedule IR file (twin export)")
    p.add_argument("--machine", required=True, help="machine name or .toml (e.g. topologies/local.toml)")
    p.add_argument("--nproc", type=count_flag(RANKS), help="processes on this host (default: the schedule's ranks)")
    p.add_argument("--figures", help=f"figure path prefix (default {DEFAULT_DIR}/compare-<schedule>)")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    _add_exec_options(p)
    p.set_defaults(func=cmd_compare)
