"""A real run's profiler trace, per op class and per step (twin.trace_comparison sets it beside the twin).

`twin compare` compares the executor's own runs. A real training job
(Megatron-DeepSpeed, AxoNN, torchtitan) on Frontier or Perlmutter can be
compared too, from the trace torch.profiler writes for one rank
(``prof.export_chrome_trace``, Kineto's Chrome trace JSON, ``.json`` or
``.json.gz``): its GPU kernels are summed per op class and per step, and set
beside the busy time per class the twin predicts for the same rank of the
same step: the rank the trace names (Kineto's ``distributedInfo``), or
``--rank``, or else the twin's critical rank (a pipeline's stages differ). Which class is off says where a prediction misses: GEMMs slower
than the shape model, collectives slower than the network model, kernels the
schedule does not have.

Kernels are classed by name, first match wins (`KERNEL_CLASSES`):

- collectives: NCCL's and RCCL's kernels (``nccl...``, ``rccl...``), by the
  kind in the name (AllReduce, AllGather, ReduceScatter, Broadcast, AllToAll;
  Send/Recv/SendRecv are point to point, ``p2p``, beside the twin's sends,
  receives and shifts). Where the name does not say
  the kind (RCCL's ``ncclDevKernel_Generic``), every collective of both sides
  is counted in one ``collectives`` row;
- attention: flash attention and other fused attention kernels;
- gemm: cuBLAS, cuBLASLt (including Hopper's ``nvjet_...``), CUTLASS,
  rocBLAS/Tensile (``Cijk_...``), hipBLASLt kernels;
- a copy from device memory to device memory (``Memcpy DtoD``): element-wise
  work, bytes streamed through HBM (a ``.contiguous()``, a ``torch.cat``; the
  executor's own element-wise ops are such copies);
- every other memcpy (host and device, peer to peer) and memset (the trace's
  own categories): not modelled by the twin;
- every other GPU kernel: element-wise work (norms, activations, dropout,
  softmax, the optimizer, casts), which the twin models as HBM streaming.

Steps: the trace's ``ProfilerStep#N`` annotations on the GPU timeline (what
``torch.profiler.profile(schedule=...)`` with ``prof.step()`` writes) delimit
steps, and a kernel belongs to the step its start falls in. Where only the
CPU side carries them, a step runs from its CPU start to the next step's (the
GPU lags the CPU; the last step until the last kernel ends). A trace without
any needs ``--steps K``, the number of steps it covers (the window from the
first kernel's start to the last one's end, divided by K). Per class the
busy time is the sum of kernel durations (kernels of one class on several
streams overlap, as the twin's per-class busy time counts them too). A
collective kernel's duration includes waiting for its peers, as the twin's
collective times do.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

from twin.errors import TwinError

COLLECTIVE_PATTERN = re.compile(r"nccl|rccl", re.I)
COLLECTIVE_KIND_PATTERNS = (
    ("p2p", re.compile(r"sendrecv|send|recv", re.I)),
    ("all_reduce", re.compile(r"all_?reduce", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all", re.I)),
)
KERNEL_CLASSES = (
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|gemv|Cijk_|cutlass|xmma|s16816|s1688|hmma|wgmma|nvjet|matmul|hipblaslt|_MT\d+x\d+x\d+",
                        re.I)),
)
UNKNOWN_COLLECTIVE = "collectives"  # a collective kernel whose name does not say its kind
STEP_ANNOTATION = re.compile(r"^ProfilerStep#\d+$")


def kernel_class(name: str, category: str = "kernel") -> str:
    """The op class a GPU event is counted under (module docstring)."""
    if category == "gpu_memcpy":
        return "elementwise" if "DtoD" in name else "memcpy"
    if category == "gpu_memset":
        return "memset"
    if COLLECTIVE_PATTERN.search(name):
        for kind, pattern in COLLECTIVE_KIND_PATTERNS:
            if pattern.search(name):
                return kind
        return UNKNOWN_COLLECTIVE
    for cls, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return cls
    return "elementwise"


@dataclass(frozen=True)
class ClassTotal:
    kernels_per_step: float
    seconds_per_step: float


@dataclass(frozen=True)
class ProfiledRun:
    """One rank's GPU kernels, per op class and per step."""

    path: str
    device: int | str
    rank: int | None  # the job rank the trace says it is (Kineto's distributedInfo), if it says
    steps_s: tuple[float, ...]  # each step's duration
    steps_from: str  # "annotations" (on the GPU), "CPU annotations" or "--steps"
    by_class: dict[str, ClassTotal]
    examples: dict[str, tuple[str, ...]] = field(default_factory=dict)  # a few kernel names per class

    @property
    def step_s(self) -> float:
        """The median step."""
        s = sorted(self.steps_s)
        return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


GZIP_MAGIC = b"\x1f\x8b"
_GIVE = "give the file torch.profiler's export_chrome_trace wrote"


def _read_trace(path: str) -> tuple[list[dict], int | None]:
    """The trace's events, and its job rank where Kineto recorded one (``distributedInfo.rank``).

    Every way a file can be wrong (unreadable, a truncated or corrupt gzip, not UTF-8, not JSON, JSON of
    another shape, a span of infinite or NaN time) is a one-line TwinError here, before the twin's side of
    the comparison is simulated."""
    doc = _parse(path, _text(path, _read_bytes(path)))
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise TwinError(f"trace {path}: no traceEvents list (the file is a JSON {_json_type(doc)}); {_GIVE}")
    events = [e for e in events if isinstance(e, dict)]
    _check_times(path, events)
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    rank = info.get("rank") if isinstance(info, dict) else None
    return events, rank if type(rank) is int else None


# The largest trace, as JSON text, the twin reads: one rank's torch.profiler trace of a few steps is tens to
# hundreds of MB; parsing JSON takes several times its size in memory, so more than this would exhaust a
# workstation. The cap holds for the file and for what a gzip file decompresses to (a "gzip bomb" of a few KB
# can expand to many GB).
MAX_TRACE_BYTES = 4 << 30


def _too_large(path: str, what: str) -> TwinError:
    return TwinError(f"trace {path}: {what} more than {MAX_TRACE_BYTES >> 30} GiB of JSON, beyond what the twin "
                     "reads; profile fewer steps (--profile-steps, torch.profiler's schedule)")


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_TRACE_BYTES + 1)
    except OSError as e:
        raise TwinError(f"trace {path}: cannot read it ({e.strerror or e}); check the path") from None
    if len(raw) > MAX_TRACE_BYTES:
        raise _too_large(path, "it holds")
    return raw


def _text(path: str, raw: bytes) -> str:
    """The JSON text: gunzipped where the file is gzip (by its first bytes; a .gz name must be), UTF-8."""
    if raw[:2] == GZIP_MAGIC:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unzipped:
                raw = unzipped.read(MAX_TRACE_BYTES + 1)  # never more than the cap, however it was compressed
        except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; a cut file ends early
            raise TwinError(f"trace {path}: a truncated or corrupt gzip file ({' '.join(str(e).split())}); "
                            f"{_GIVE}, whole") from None
        if len(raw) > MAX_TRACE_BYTES:
            raise _too_large(path, "it decompresses to")
    elif path.endswith(".gz"):
        raise TwinError(f"trace {path}: named .gz but not gzip-compressed (its first bytes are not 1f 8b); {_GIVE}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TwinError(f"trace {path}: not a JSON trace (byte {e.start} is not UTF-8); {_GIVE}") from None


def _parse(path: str, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TwinError(f"trace {path}: not a JSON trace ({e.msg} at line {e.lineno} column {e.colno}); "
                        f"{_GIVE}") from None
    except (RecursionError, ValueError) as e:  # nested too deep; an integer of thousands of digits
        what = "nested too deeply" if isinstance(e, RecursionError) else " ".join(str(e).split())[:80]
        raise TwinError(f"trace {path}: not a JSON trace ({what}); {_GIVE}") from None


def _json_type(x) -> str:
    """What a JSON reader calls a parsed value's type, for messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(x), "null")


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_times(path: str, events: list[dict]) -> None:
    """A complete event's start and duration must be finite: JSON's 1e999 reads as infinity (and Python's
    json as NaN), which would make every step and class total infinite or NaN."""
    for e in events:
        if e.get("ph") != "X":
            continue
        for key in ("ts", "dur"):
            value = e.get(key)
            if _is_number(value) and not math.isfinite(value):
                raise TwinError(f"trace {path}: event {str(e.get('name'))[:60]!r} has {key} = {value}, not a finite "
                                f"time; the trace is corrupt: {_GIVE}")


def _device_of(event: dict):
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    return args.get("device", event.get("pid"))


def _is_span(event: dict) -> bool:
    """A complete event with a start and a duration (a negative one is not a span: ignored)."""
    ts, dur = event.get("ts"), event.get("dur")
    return event.get("ph") == "X" and _is_number(ts) and _is_number(dur) and dur >= 0


def _step_windows(events: list[dict], category: str, device=None) -> list[tuple[float, float]]:
    """One (start, end) per ProfilerStep#N of `category` (on `device`, if given; an annotation on several
    streams spans them all)."""
    spans: dict[str, list[float]] = {}
    for e in events:
        if not (_is_span(e) and e.get("cat") == category and STEP_ANNOTATION.match(str(e.get("name")))):
            continue
        if device is not None and _device_of(e) is not None and str(_device_of(e)) != str(device):
            continue
        a, b = e["ts"], e["ts"] + e["dur"]
        span = spans.setdefault(e["name"], [a, b])
        span[0], span[1] = min(span[0], a), max(span[1], b)
    return sorted((a, b) for a, b in spans.values())


@dataclass(frozen=True)
class Kernel:
    """One GPU kernel of a trace: its name, when it started (the trace's microseconds), how long it ran and the op
    class it counts under (kernel_class)."""

    name: str
    start_us: float
    duration_s: float
    op_class: str = "elementwise"
    host_op: int | None = None  # Kineto's "External id": kernels of one host call share it
    nbytes: float | None = None  # a copy's or memset's bytes (one side), as Kineto records them

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_s * 1e6


def trace_kernels(path: str, device=None) -> list[Kernel]:
    """The trace's GPU spans (kernels, copies, memsets) on `device` (default: the first), in the order they
    started."""
    events, _ = _read_trace(path)
    kernels, _ = _device_kernels(path, events, device)
    out = []
    for e in sorted(kernels, key=lambda e: e["ts"]):
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        host_op, nbytes = args.get("External id"), args.get("bytes")
        out.append(Kernel(str(e.get("name", "")), e["ts"], e["dur"] * 1e-6,
                          kernel_class(str(e.get("name", "")), e.get("cat", "kernel")),
                          host_op if isinstance(host_op, int) else None,
                          float(nbytes) if _is_number(nbytes) else None))
    return out


def kernels_of_class(path: str, op_class: str, device=None) -> list[Kernel]:
    """The trace's GPU kernels of one op class (kernel_class) on `device` (default: the first), in the order they
    started: one rank's GEMMs, say, to set beside the schedule's GEMM ops one by one."""
    return [k for k in trace_kernels(path, device) if k.op_class == op_class]


def _device_kernels(path: str, events: list[dict], device=None) -> tuple[list[dict], object]:
    """The trace's GPU spans (kernels, memcpy, memset) on `device` (default: the only, or first, device) and that
    device; a one-line TwinError for a trace without GPU kernels or without that device."""
    kernels = [e for e in events if _is_span(e) and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        raise TwinError(f"trace {path}: no GPU kernels (events of category 'kernel'; a CPU-only run has none); "
                        "profile a GPU run with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]")
    devices = sorted({_device_of(e) for e in kernels}, key=str)
    if device is None:
        device = devices[0]
    elif str(device) not in {str(d) for d in devices}:
        raise TwinError(f"--device {device}: the trace has kernels on device(s) {', '.join(map(str, devices))}; "
                        "pick one of them")
    return [e for e in kernels if str(_device_of(e)) == str(device)], device


def load_profiled_run(path: str, steps: int | None = None, device=None) -> ProfiledRun:
    """Read one rank's trace: its GPU kernels on `device` (default: the trace's only, or first, device)."""
    events, rank = _read_trace(path)
    kernels, device = _device_kernels(path, events, device)
    windows = _step_windows(events, "gpu_user_annotation", device)
    if not windows and steps is None:
        # Only the CPU side marks the steps: a step's kernels run from its CPU start to the next one's (the GPU
        # lags the CPU), the last until the last kernel ends.
        starts = [a for a, _ in _step_windows(events, "user_annotation")]
        ends = starts[1:] + [max([e["ts"] + e["dur"] for e in kernels] + starts[-1:])]
        windows = list(zip(starts, ends))
        steps_from = "CPU annotations"
    else:
        steps_from = "annotations"
    if steps is not None:
        if steps < 1:
            raise TwinError(f"--steps {steps} must be at least 1 (how many steps the trace covers)")
        if steps > len(kernels):
            raise TwinError(f"--steps {steps} is more than the trace's {len(kernels)} kernels on device {device}; "
                            "give the number of training steps the trace covers")
        start, end = min(e["ts"] for e in kernels), max(e["ts"] + e["dur"] for e in kernels)
        windows, steps_from = [(start + i * (end - start) / steps, start + (i + 1) * (end - start) / steps)
                               for i in range(steps)], "--steps"
        inside = kernels
    elif windows:
        inside = [e for e in kernels if any(a <= e["ts"] < b for a, b in windows)]
    else:
        raise TwinError(f"trace {path}: no ProfilerStep#N annotations; give --steps K, the number of training "
                        "steps the trace covers")
    if any(b <= a for a, b in windows):
        raise TwinError(f"trace {path}: a step of the trace lasts no time; check --steps or the trace's "
                        "ProfilerStep marks")
    n = len(windows)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    examples: dict[str, list[str]] = defaultdict(list)
    for e in inside:
        name = str(e.get("name", ""))
        cls = kernel_class(name, e.get("cat", "kernel"))
        totals[cls][0] += 1
        totals[cls][1] += e["dur"] * 1e-6
        if len(examples[cls]) < 3 and name not in examples[cls]:
            examples[cls].append(name)
    by_class = {cls: ClassTotal(k / n, s / n) for cls, (k, s) in totals.items()}
    return ProfiledRun(path, device, rank, tuple((b - a) * 1e-6 for a, b in windows), steps_from, by_class,
                       {k: tuple(v) for k, v in examples.items()})
