"""What every microbenchmark schedule (twin calibrate's and benchmarks/'s) writes between its sections.

One definition of the synchronisation, so that calibrate and the benchmarks that set their own conditions
beside calibrate's time their ops after the same thing.
"""

from __future__ import annotations

from twin.builders.program import ProgramWriter
from twin.ir import Collective, Elementwise

DTYPE = "bf16"
TINY_BYTES = 64  # the compute op that makes the host wait for a collective


def synchronise(w: ProgramWriter, name: str, axis: str) -> None:
    """Every rank of `axis` waits for a 4-byte all-reduce of all of them, then a tiny op makes its host wait
    too: the ops after it start together."""
    w.wait(w.collective(name, axis, Collective("all_reduce", axis, 4, DTYPE)))
    w.compute(f"{name}.done", Elementwise(TINY_BYTES))
