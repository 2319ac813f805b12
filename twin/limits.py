"""What a number a user gives may be: one policy for command-line flags, plan fields and model specs.

Every count or duration a user types is checked here, before any work, for
its type, for being finite and for a physical range. The ranges are generous
(far beyond any machine or model built) but finite, so a typo of a few extra
digits is an error naming the field instead of an hour-long search, an
OverflowError or the kernel's OOM killer. Machine files and IR files are
checked by their own loaders (topologies.schema, twin.ir_validate).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Callable

from twin.errors import TwinError


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of one kind of number, and what it counts (for messages)."""

    lo: float
    hi: float
    unit: str

    def check(self, value: float, field: str) -> None:
        """A one-line TwinError naming `field` unless lo <= value <= hi (and finite)."""
        if isinstance(value, float) and not math.isfinite(value):
            raise TwinError(f"{field}={value} is not a finite number; give {self.describe()}")
        if not self.lo <= value <= self.hi:
            raise TwinError(f"{field}={value} is out of range; give {self.describe()}")

    def describe(self) -> str:
        return f"{_number(self.lo)}..{_number(self.hi)} {self.unit}".rstrip()


def _number(x: float) -> str:
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:g}"


# Counts. A machine of 10^7 GPUs, a batch of 10^9 sequences or 10^12 tokens, a model of
# 10^5 layers or hidden 10^6: each beyond anything built by orders of magnitude.
GPUS = Range(1, 10_000_000, "GPUs")
SEQUENCES = Range(1, 1_000_000_000, "sequences")
TOKENS = Range(1, 10**12, "tokens")
SEQ_LEN = Range(1, 10_000_000, "tokens")
LAYERS = Range(1, 100_000, "layers")
RECOMPUTED_LAYERS = Range(0, 100_000, "layers (0: every layer)")  # ParallelPlan.rcl
CACHED_LAYERS = Range(0, 100_000, "layers (0: none)")  # ParallelPlan.cache
WIDTH = Range(1, 10_000_000, "")  # hidden, heads, ffn
VOCAB = Range(1, 100_000_000, "tokens")
DEGREE = Range(1, 10_000_000, "")  # a parallel degree
STEPS = Range(1, 1_000_000, "steps")
RANK = Range(0, 10_000_000, "")
# Worker processes: more than the cores only slows a run (and a thousand forks can exhaust memory);
# callers cap the value at the cores available (twin.search.rank.worker_count).
JOBS = Range(1, 1024, "processes")
# Durations (seconds) and ratios.
SECONDS = Range(1e-9, 1e7, "seconds")


def check_count(value: int, field: str, allowed: Range, zero_ok: bool = False) -> int:
    """`value` if it is an int in `allowed` (or 0 where `zero_ok`), else a one-line TwinError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TwinError(f"{field}={value!r} is not an integer; give {allowed.describe()}")
    if not (zero_ok and value == 0):
        allowed.check(value, field)
    return value


def count_flag(allowed: Range, zero_ok: bool = False) -> Callable[[str], int]:
    """An argparse `type` for an integer flag in `allowed`: bad text becomes argparse's one-line usage error."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give {allowed.describe()}") from None
        try:
            return check_count(value, "value", allowed, zero_ok)
        except TwinError:
            extra = " (or 0)" if zero_ok else ""
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {allowed.describe()}{extra}") from None
    parse.__name__ = "integer"  # argparse names the type in its messages
    return parse


def real_flag(allowed: Range) -> Callable[[str], float]:
    """An argparse `type` for a finite real flag in `allowed` (nan, inf and out-of-range values are refused)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {allowed.describe()}") from None
        if not math.isfinite(value) or not allowed.lo <= value <= allowed.hi:
            raise argparse.ArgumentTypeError(f"{text} is out of range; give {allowed.describe()}")
        return value
    parse.__name__ = "number"
    return parse
