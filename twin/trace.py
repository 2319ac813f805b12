"""Chrome trace JSON (opens in Perfetto and chrome://tracing).

One process per rank, one thread (track) per stream of that rank; each op is a
complete ("X") event with its class as category and its sizes as arguments.
The simulator and the executor both write this format, so a simulated and a
measured step open side by side.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Iterable

from twin.ir import Program, op_class, work_type_name
from twin.outputs import atomic_path
from twin.sim.engine import RankTimeline


def trace_events(programs: Iterable[Program], timelines: Iterable[RankTimeline]) -> list[dict]:
    """Trace events for each (program, timeline) pair, times in microseconds: `programs[i]` is the program
    `timelines[i]` ran (RankTimeline.program), not the schedule's i-th."""
    events: list[dict] = []
    for program, timeline in zip(programs, timelines):
        streams = sorted({op.stream for op in program.ops}, key=lambda s: (s != "compute", s))
        tid = {stream: i for i, stream in enumerate(streams)}
        events.append({"ph": "M", "name": "process_name", "pid": timeline.rank, "args": {"name": f"rank {timeline.rank}"}})
        for stream, i in tid.items():
            events.append({"ph": "M", "name": "thread_name", "pid": timeline.rank, "tid": i, "args": {"name": stream}})
        for op in program.ops:
            start, end = float(timeline.start_s[op.id]), float(timeline.end_s[op.id])
            args = {"op": op.id, "type": work_type_name(op.work)}
            fields = ((f.name, getattr(op.work, f.name)) for f in dataclasses.fields(op.work))
            args.update({k: v for k, v in fields if isinstance(v, (int, float, str))})
            events.append({
                "ph": "X", "name": op.name, "cat": op_class(op.work), "pid": timeline.rank, "tid": tid[op.stream],
                "ts": round(start * 1e6, 3), "dur": round((end - start) * 1e6, 3), "args": args,
            })
    return events


def write_trace(path: str, programs: Iterable[Program], timelines: Iterable[RankTimeline], metadata: dict) -> None:
    """Write atomically: a failure never leaves a half-written trace."""
    doc = {"traceEvents": trace_events(programs, timelines), "displayTimeUnit": "ms", "otherData": metadata}
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":"), allow_nan=False)
