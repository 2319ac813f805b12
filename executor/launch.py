"""Start the ranks: torchrun on this host, or the srun line for a cluster. Torch-free.

Local runs go through torch.distributed.run (torchrun) in standalone mode with
no restarts: when one worker dies the agent stops the others (SIGTERM, then
SIGKILL), and a rank stuck in a collective fails by the run's collective
timeout. The whole launch also has a wall-clock limit, after which the
launcher kills the process group it started. Either way the launcher reads
the ranks' error and progress files (executor.worker) and turns them into one
line that names the rank, the step and the op: ranks that died without a
word first (with the signal torchrun reports), then the first rank that
reported an error.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from twin.errors import TwinError
from twin.ir import Schedule

REPO = Path(__file__).resolve().parents[1]
_STALE = ("launch.json", "rank*.json", "error-rank*.json", "progress-rank*.bin", "numerics*.json", "summary.json", "trace.json", "run.json")


@dataclass(frozen=True)
class WorkerOptions:
    steps: int = 5
    warmup: int = 2
    check_numerics: bool = False
    device: str = "auto"
    dtype: str = "auto"
    timeout_s: float = 30.0
    threads: int = 1
    tune: bool = True
    machine: str | None = None
    compute_nice: int = 10
    profile_steps: int = 0  # extra steps under torch.profiler after the measured ones (OUT/profile-rankR.json)

    def argv(self, schedule_path: str, out_dir: str) -> list[str]:
        args = [os.path.abspath(schedule_path), "--out", os.path.abspath(out_dir), "--steps", str(self.steps),
                "--warmup", str(self.warmup), "--device", self.device, "--dtype", self.dtype,
                "--timeout", f"{self.timeout_s:g}", "--threads", str(self.threads), "--compute-nice", str(self.compute_nice)]
        if self.check_numerics:
            args.append("--check-numerics")
        if not self.tune:
            args.append("--no-tune")
        if self.machine:
            args += ["--machine", self.machine]
        if self.profile_steps:
            args += ["--profile-steps", str(self.profile_steps)]
        return args


def torchrun_argv(nproc: int, worker: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--max-restarts=0", "--monitor-interval=0.2", "-m", "executor.worker", *worker]


def _cpu_busy_s() -> float | None:
    """Busy CPU seconds of the whole host so far (/proc/stat), None where unavailable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        ticks = [int(x) for x in fields]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def buffer_bytes(schedule: Schedule, dtype_name: str = "float32") -> float:
    """What the executor allocates per rank for `schedule`, at most over programs: each role's arena at its
    largest request (executor.kernels), plus, per backward attention shape, the recorded forward (q, k, v and the
    output: 4 tensors of the shape)."""
    import torch

    from executor.kernels import op_requests
    from twin.ir import Attention, Collective

    dtype = getattr(torch, dtype_name)
    itemsize = torch.empty((), dtype=dtype).element_size()
    worst = 0.0
    for program in schedule.programs:
        arenas: dict[tuple, int] = {}
        recorded: set[tuple] = set()
        for op in program.ops:
            members = len(schedule.group(op.work.group).instances[0]) if isinstance(op.work, Collective) else 1
            for r in op_requests(op, dtype, members):
                arenas[r.role] = max(arenas.get(r.role, 0), r.numel)
            if isinstance(op.work, Attention) and op.work.backward:
                w = op.work
                recorded.add((w.batch, w.heads, w.seq, w.head_dim, w.causal))
        total = sum(arenas.values()) + sum(4 * b * h * s * d for b, h, s, d, _ in recorded)
        worst = max(worst, itemsize * total)
    return worst


def memory_available_bytes() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            return next(float(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable"))
    except (OSError, StopIteration, ValueError):
        return None


def check_fits_host(schedule: Schedule, nproc: int, device: str = "auto") -> None:
    """Fail before launching when the ranks' buffers cannot fit in this host's memory (CPU runs)."""
    if device == "cuda":
        return
    available = memory_available_bytes()
    need = buffer_bytes(schedule) * nproc
    if available is not None and need > 0.8 * available:
        raise TwinError(f"the schedule needs about {need / 1e9:.1f} GB of buffers on {nproc} ranks but this host has "
                        f"{available / 1e9:.1f} GB available; export it with a smaller --global-batch (e.g. 8) or mbs")


def run_local(schedule: Schedule, schedule_path: str, nproc: int, out_dir: str, opts: WorkerOptions,
              wall_limit_s: float = 600.0) -> float:
    """Run the schedule on this host with torchrun; return the wall time. Raises TwinError (one line) on failure.

    Also writes OUT/launch.json: the wall time, the CPU time of the run's own
    processes, and the host's other load in cores during the run (busy CPU
    time not ours / wall time): measurements on a host others are using are
    noisier, and the output should say so.
    """
    if nproc != schedule.world_size:
        raise TwinError(f"--nproc {nproc} but the schedule has {schedule.world_size} ranks; "
                        f"use --nproc {schedule.world_size} or re-export for {nproc} GPUs")
    if not (opts.device == "auto" and _has_gpu_hint()):
        check_fits_host(schedule, nproc, opts.device)
    os.makedirs(out_dir, exist_ok=True)
    for pattern in _STALE:
        for stale in glob.glob(os.path.join(out_dir, pattern)):
            os.unlink(stale)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = str(opts.threads)
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    log_path = os.path.join(out_dir, "torchrun.log")
    busy0, ours0 = _cpu_busy_s(), _children_cpu_s()
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(torchrun_argv(nproc, opts.argv(schedule_path, out_dir)), stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=str(REPO), start_new_session=True)
        try:
            rc = proc.wait(timeout=wall_limit_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc = None
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
    wall = time.perf_counter() - start
    busy1, ours = _cpu_busy_s(), _children_cpu_s() - ours0
    other = max(0.0, (busy1 - busy0 - ours) / wall) if busy0 is not None and busy1 is not None and wall > 0 else None
    with open(os.path.join(out_dir, "launch.json"), "w") as f:
        json.dump({"wall_s": wall, "cpu_s_ours": ours, "other_load_cores": other, "host_cpus": os.cpu_count(),
                   "nproc": nproc, "returncode": rc}, f, indent=2)
    if rc != 0:
        raise TwinError(explain_failure(schedule, out_dir, rc, log_path, wall_limit_s))
    return wall


def busy_cores(interval_s: float = 1.0) -> float | None:
    """Cores the host keeps busy over `interval_s` (/proc/stat), None where unavailable."""
    a = _cpu_busy_s()
    time.sleep(interval_s)
    b = _cpu_busy_s()
    return None if a is None or b is None else (b - a) / interval_s


def wait_for_quiet(threshold_cores: float = 0.25, max_wait_s: float = 300.0, settle_s: float = 3.0) -> float | None:
    """Wait (at most max_wait_s) until the host has been nearly idle for settle_s; return the last busy reading.

    A measurement on a host that other processes load is noisier and
    slower; benchmarks call this first, and report what they got.
    """
    deadline = time.monotonic() + max_wait_s
    quiet_since = None
    load = None
    while time.monotonic() < deadline:
        load = busy_cores(0.5)
        if load is None:
            return None
        if load <= threshold_cores:
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= settle_s:
                return load
        else:
            quiet_since = None
    return load


def other_load(out_dir: str) -> float | None:
    """The host's other load (cores) during the last run in out_dir, from OUT/launch.json."""
    try:
        with open(os.path.join(out_dir, "launch.json")) as f:
            return json.load(f).get("other_load_cores")
    except (OSError, ValueError):
        return None


def _has_gpu_hint() -> bool:
    """Whether this host looks like it has NVIDIA/AMD GPUs (without importing torch)."""
    return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/kfd")


def _kill_group(proc: subprocess.Popen) -> None:
    """End the torchrun process group this launcher started: SIGTERM, then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


def read_progress(out_dir: str, rank: int) -> tuple[int, int] | None:
    """(step, op) a rank was at, -1 before its first op; None if it never started. op -2 = finished."""
    try:
        with open(os.path.join(out_dir, f"progress-rank{rank}.bin"), "rb") as f:
            data = f.read(16)
    except OSError:
        return None
    if len(data) < 16:
        return None
    return struct.unpack("qq", data)


def _torchrun_exits(log_path: str) -> dict[int, str]:
    """rank -> "exit code N" / "signal NAME" from torchrun's failure report."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return {}
    out = {}
    for m in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", text):
        rank, code = int(m.group(1)), int(m.group(2))
        if code < 0:
            try:
                out[rank] = f"signal {signal.Signals(-code).name}"
            except ValueError:
                out[rank] = f"signal {-code}"
        else:
            out[rank] = f"exit code {code}"
    return out


def _op_text(schedule: Schedule, rank: int, op: int) -> str:
    if op < 0:
        return "before its first op"
    program = schedule.programs[schedule.program_of()[rank]]
    if op >= len(program.ops):
        return f"at op {op}"
    return f"at op {op} '{program.ops[op].name}'"


def explain_failure(schedule: Schedule, out_dir: str, rc, log_path: str, wall_limit_s: float) -> str:
    """One line: which ranks died where, and the first error a rank reported."""
    errors = {}
    for path in glob.glob(os.path.join(out_dir, "error-rank*.json")):
        try:
            with open(path) as f:
                e = json.load(f)
            errors[int(e["rank"])] = e
        except (OSError, ValueError, KeyError):
            continue
    exits = _torchrun_exits(log_path)
    silent = []
    for rank in range(schedule.world_size):
        if rank in errors:
            continue
        progress = read_progress(out_dir, rank)
        if progress is None or progress[1] == -2:
            continue
        how = exits.get(rank, "no report")
        if rc is None and rank not in exits:
            how = "still running at the wall-clock limit"
        hint = " (out of memory? try a smaller --global-batch)" if how == "signal SIGKILL" and progress[1] < 0 else ""
        silent.append(f"rank {rank} died ({how}) in step {progress[0]} {_op_text(schedule, rank, progress[1])}{hint}")
    parts = []
    if rc is None:
        parts.append(f"the run passed its wall-clock limit of {wall_limit_s:g} s and was stopped")
    parts += silent
    if errors:
        first = min(errors.values(), key=lambda e: (e.get("step", 0), e["rank"]))
        more = f" ({len(errors) - 1} other rank(s) failed too)" if len(errors) > 1 else ""
        parts.append(first["message"] + more)
    if not parts:
        parts.append(f"torchrun exited with code {rc}")
    return "run failed: " + "; ".join(parts) + f"; log: {log_path}"


# ---- clusters -------------------------------------------------------------------

# Per machine: Slurm layout and the environment the sites document for NCCL/RCCL on
# Slingshot-11 (reference/machines.md): the AWS OFI plugin (aws-ofi-nccl / aws-ofi-rccl)
# over libfabric's CXI provider, NCCL_PROTO=^LL128 where the site advises it, and
# CUDA_DEVICE_MAX_CONNECTIONS=1 as AxoNN's launch sets it (algorithms.md section 2).
CLUSTERS = {
    "frontier": {
        "gpus_per_node": 8,
        "srun": "--ntasks-per-node=8 --gpus-per-node=8 --gpu-bind=closest -c 7",
        "env": {
            "FI_PROVIDER": "cxi",  # libfabric CXI provider under the aws-ofi-rccl plugin (machines.md)
            "NCCL_NET": '"AWS Libfabric"',  # select the OFI plugin's network (aws-ofi-rccl on LD_LIBRARY_PATH)
            "NCCL_SOCKET_IFNAME": "hsn0",  # bootstrap over the Slingshot interfaces
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        "note": "load the aws-ofi-rccl plugin (module or LD_LIBRARY_PATH) as the OLCF docs describe",
    },
    "perlmutter": {
        "gpus_per_node": 4,
        "srun": "--ntasks-per-node=4 --gpus-per-node=4 --gpu-bind=none -c 32",
        "env": {
            "FI_PROVIDER": "cxi",
            "NCCL_NET": '"AWS Libfabric"',  # aws-ofi-nccl plugin (NERSC's nccl module)
            "NCCL_PROTO": "^LL128",  # same Slingshot-11 NIC and plugin as Alps (perlmutter.toml)
            "NCCL_SOCKET_IFNAME": "hsn",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        "note": "module load nccl (NERSC's build carries the aws-ofi-nccl plugin)",
    },
    "alps": {
        "gpus_per_node": 4,
        "srun": "--ntasks-per-node=4 --gpus-per-task=1 -c 72",
        "env": {
            "FI_PROVIDER": "cxi",
            "NCCL_NET": '"AWS Libfabric"',  # aws-ofi-nccl plugin (cscs-docs)
            "NCCL_PROTO": "^LL128",  # cscs-docs docs/software/communication (machines.md)
            "NCCL_SOCKET_IFNAME": "hsn",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        "note": "use a uenv/container with NCCL and the aws-ofi-nccl plugin as cscs-docs describe",
    },
}


def srun_script(machine: str, schedule: Schedule, schedule_path: str, out_dir: str, opts: WorkerOptions) -> str:
    """A shell snippet to run inside a Slurm allocation on `machine` (printed by `twin run --launcher srun`)."""
    key = machine.lower()
    if key not in CLUSTERS:
        raise TwinError(f"--launcher srun knows {', '.join(CLUSTERS)}; got --machine {machine!r}")
    c = CLUSTERS[key]
    gpn = c["gpus_per_node"]
    nodes = -(-schedule.world_size // gpn)
    lines = [f"# {schedule.world_size} ranks on {nodes} {key} node(s); {c['note']}"]
    lines += [f"export {k}={v}" for k, v in c["env"].items()]
    lines += [
        "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)",
        "export MASTER_PORT=29500",
        f"srun -N {nodes} -n {schedule.world_size} {c['srun']} \\",
        f"  python -m executor.worker {' '.join(opts.argv(schedule_path, out_dir))}",
    ]
    return "\n".join(lines)
