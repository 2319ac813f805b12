"""The per-rank entry point: `python -m executor.worker SCHEDULE --out DIR ...`, started by torchrun or srun.

Each rank loads the schedule, builds its program (executor.runtime), runs the
warm-up steps and the measured steps, each after a barrier, and writes
OUT/rank{R}.json: its host, device, element type and, per measured step, the
host-clock t0 and the start and end of every op. Rank 0 then merges the
files into OUT/trace.json and OUT/summary.json (executor.measured).

With --profile-steps N, one warm-up and N more steps run under
torch.profiler after the measured ones (so the profiler's overhead never
enters the measured steps), each marked ProfilerStep#N, and each rank writes
OUT/profile-rank{R}.json, the Chrome trace `twin compare-trace` reads.

With --check-numerics a single step runs with real data bound to the linear
layers (executor.numerics) and each rank writes its errors to
OUT/numerics-rank{R}.json; rank 0 writes OUT/numerics.json.

Priorities (CPU): once the process groups exist, the thread that runs the
compute ops lowers its own priority (nice +10, --compute-nice; allowed
without privileges), while gloo's threads keep theirs. Communication then
preempts compute when both want the core, as a GPU's NCCL kernels and copy
engines progress while other kernels run: an async collective overlapped
with compute progresses (the compute pays, which calibration measures as
comm_compute_slowdown) instead of waiting for a time slice. Without it,
overlapped collectives on a CPU-bound host only move when the compute thread
is descheduled, which no stream model describes.

Failure: a rank that cannot run an op writes OUT/error-rank{R}.json (rank,
step, op, message), prints one line to stderr and exits 1 at once (no
destructors, which could block on dead peers). OUT/progress-rank{R}.bin holds
the (step, op) the rank is at, updated before every op, so the launcher can
name the op of a rank that died without a word (killed, out of memory).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import mmap
import os
import socket
import sys
import threading


def _rank_env() -> tuple[int, int, int]:
    """(the process's slot, world size, local rank) from torchrun's or Slurm's environment. The slot is the GPU the
    launcher placed the process on (rank slot of the job, in node-major order); the rank it runs is the plan's
    (_load)."""
    env = os.environ
    if "RANK" not in env and "SLURM_PROCID" in env:
        env["RANK"], env["WORLD_SIZE"] = env["SLURM_PROCID"], env["SLURM_NTASKS"]
        env["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0"))


def _progress_view(path: str):
    """An int64 [step, op] array in a small shared file the launcher can read after a crash."""
    with open(path, "wb") as f:
        f.write(b"\xff" * 16)
    f = open(path, "r+b")
    mm = mmap.mmap(f.fileno(), 16)
    return memoryview(mm).cast("q"), (f, mm)


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m executor.worker")
    p.add_argument("schedule")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--check-numerics", action="store_true")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--timeout", type=float, default=30.0, help="seconds before a collective is declared dead")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (CPU)")
    p.add_argument("--no-tune", action="store_true", help="run GEMMs in the IR's layout even where tunable")
    p.add_argument("--compute-nice", type=int, default=10, help="CPU: niceness of the compute thread (0: unchanged)")
    p.add_argument("--machine", help="machine file for the summary's % of peak")
    p.add_argument("--profile-steps", type=int, default=0, help="extra steps under torch.profiler (0: none)")
    return p.parse_args(argv)


def _load(schedule_path: str, slot: int):
    """(the schedule, or None where it does not load, and the rank the process on GPU slot `slot` runs): the slot
    itself, but where the schedule's plan places its ranks in another order (dpouter: twin.mesh.rank_on_gpu). Every
    rank number below, torch.distributed's included, is that rank, so groups and transfers name ranks as the
    schedule does wherever the processes sit. A schedule that does not load keeps the slot; _run loads it again
    and reports why."""
    from twin.errors import TwinError
    from twin.ir_io import load_schedule
    from twin.mesh import rank_on_gpu

    try:
        schedule = load_schedule(schedule_path)
    except TwinError:
        return None, slot
    return schedule, rank_on_gpu(schedule.info.plan, slot)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    slot, world, local_rank = _rank_env()
    schedule, rank = _load(args.schedule, slot)
    os.makedirs(args.out, exist_ok=True)
    progress, _keep = _progress_view(os.path.join(args.out, f"progress-rank{rank}.bin"))
    try:
        return _run(args, schedule, rank, world, local_rank, progress)
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the process ends at once
        from executor.runtime import OpFailure

        info = {"rank": rank, "step": int(progress[0]), "op": int(progress[1]), "message": f"rank {rank}: {type(e).__name__}: {e}"}
        if isinstance(e, OpFailure):
            info.update(step=e.step, op=e.op_id, op_name=e.op_name, message=str(e))
        try:
            _write_json(os.path.join(args.out, f"error-rank{rank}.json"), info)
        finally:
            print(f"exatwin worker: {info['message']}", file=sys.stderr, flush=True)
            os._exit(1)


def _profile(ex, barrier, steps: int, cuda: bool, path: str) -> None:
    """One warm-up and `steps` more steps under torch.profiler, each marked ProfilerStep#N (the profiler marks
    steps only with a schedule); the active steps' Chrome trace to `path`."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(1 + steps):
            barrier()
            ex.step()
            prof.step()


def _run(args: argparse.Namespace, schedule, rank: int, world: int, local_rank: int, progress) -> int:
    import torch
    import torch.distributed as dist

    from executor.runtime import Executor
    from executor.target import choose_target
    from twin.ir_io import load_schedule

    torch.set_num_threads(args.threads)
    sys.setswitchinterval(0.0005)  # callbacks on gloo threads get the GIL quickly
    if schedule is None:
        schedule = load_schedule(args.schedule)  # raises the reason _load kept
    if schedule.world_size != world:
        raise RuntimeError(f"the schedule has {schedule.world_size} ranks but {world} processes were started")
    ir_dtype = next((op.work.dtype for p in schedule.programs for op in p.ops if hasattr(op.work, "dtype")), "bf16")
    target = choose_target(ir_dtype, args.device, "float32" if args.check_numerics else args.dtype, local_rank)
    if args.check_numerics:
        target = dataclasses.replace(target, note="the numerics check runs in float32")
    backend = "cpu:gloo,cuda:nccl" if target.is_cuda else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout), rank=rank, world_size=world)
    flag = torch.zeros(1)

    def barrier() -> None:
        dist.all_reduce(flag)  # a CPU tensor: the gloo side of the default group, on CPU and GPU hosts

    fault = os.environ.get("EXATWIN_FAULT")
    bind, checker = None, None
    if args.check_numerics:
        from executor.numerics import NumericsChecker

        if target.is_cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        checker = NumericsChecker(schedule, rank, target.device)
        bind = checker.bind
    ex = Executor(schedule, rank, target, args.timeout, tune=not args.no_tune and not args.check_numerics,
                  bind=bind, progress=progress, fault=fault)
    if not target.is_cuda and args.compute_nice:
        # gloo's threads exist now and keep their priority; the compute thread yields to them (module docstring)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), args.compute_nice)
    barrier()
    records = []
    if checker is not None:
        ex.step()
        result = checker.check(ex)
        _write_json(os.path.join(args.out, f"numerics-rank{rank}.json"), result)
    else:
        for s in range(args.warmup + args.steps):
            barrier()
            rec = ex.step()
            if s >= args.warmup:
                records.append({"t0": rec.t0, "start": rec.start, "end": rec.end,
                                "woke": {str(op): seconds for op, seconds in rec.woke.items()}})
        if args.profile_steps:
            _profile(ex, barrier, args.profile_steps, target.is_cuda, os.path.join(args.out, f"profile-rank{rank}.json"))
    data = {
        "rank": rank, "slot": int(os.environ["RANK"]), "program": ex.rp.program, "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(target.device), "device_name": torch.cuda.get_device_name(target.device) if target.is_cuda else "cpu",
        "backend": target.backend, "dtype": target.dtype_name, "dtype_note": target.note,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "compile_s": ex.compile_s,
        "buffer_bytes": ex.bufs.nbytes, "tuned_layouts": {f"{m}x{n}x{k}x{b}": lay for (m, n, k, b), lay in ex.tuned_layouts.items()},
        "steps": records,
    }
    _write_json(os.path.join(args.out, f"rank{rank}.json"), data)
    barrier()
    if rank == 0:
        if checker is not None:
            from executor.numerics import merge_numerics

            merge_numerics(args.out, world)
        else:
            from executor.measured import finish_run

            finish_run(args.out, schedule, args.schedule, args.machine)
    barrier()
    progress[1] = -2  # done
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
