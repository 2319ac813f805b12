"""Reading sourced numbers out of a machine file.

Every number in a machine file carries where it came from, so that a reader
of a prediction can tell a datasheet figure from a guess:

    hbm_gb = { value = 64.0, source = "OLCF Frontier user guide" }
    gemm_k_half = { value = 256.0, estimate = "why this value" }

A number may carry both (a sourced figure with a stated assumption). A number
that `twin fit` learned from measured runs carries ``fitted`` instead: which
runs, when, and how well the fit predicts runs it did not see. Pure
structure (device and NIC indices, link counts) may be a plain integer when
the table holding it carries a table-level ``source`` or ``estimate``.

``Fields`` walks one TOML table. It returns values in the file's units (the
caller converts to SI), records each number's provenance under its dotted
path (``node.links[3].bw_per_direction_gb_per_s``), and turns each mistake
into a one-line ``InputError`` naming the file, the field and the fix. It also
rejects keys nobody read, so a typo fails loudly instead of being ignored.

Every number, whatever reads it, passes one check here (``Fields.bounds``):
it must be finite (TOML allows ``inf`` and ``nan``) and at most a generous
physical ceiling picked by the unit its key names (``_UNIT_LIMITS``), so a
slipped exponent (``hbm_gb = 1e308``) or a unit mistake fails at load time
instead of turning into an infinite or absurd prediction, or a simulation
that allocates per device of a 10^300-GPU node. What-if values set on the
command line (``--set``) are written into the parsed file first
(``topologies.overrides``) and so pass the very same check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from topologies.errors import InputError

NOTE_KEYS = ("source", "estimate", "fitted")

# Range checks by name: (predicate, what the message says it must be).
_RANGES = {
    "positive": (lambda x: x > 0, "> 0"),
    "nonneg": (lambda x: x >= 0, ">= 0"),
    "fraction": (lambda x: 0 < x <= 1, "in (0, 1]"),
    "share": (lambda x: 0 <= x <= 1, "in [0, 1]"),
}

# Upper bounds by unit, far above any machine built (a GPU of 2 PF/s, 200 GB of HBM at 8 TB/s, links of
# 100 GB/s, latencies of microseconds to milliseconds) yet finite. A key names its unit (hbm_gb,
# kernel_overhead_us); a protocol key under collectives.base_latency_us takes its table's unit, so the
# dotted path is searched from the leaf up. First suffix that matches wins.
_UNIT_LIMITS = (
    ("tflop_per_s", 1e5, "100,000 TF/s"),
    ("gb_per_s", 1e5, "100,000 GB/s"),
    ("_gb", 1e5, "100,000 GB"),
    ("_us", 1e6, "1,000,000 us (1 s)"),
)
# Per key where the unit rule is too loose: a node's devices are routed pair by pair (topologies.fabric),
# so their number must stay what one node can hold (the largest NVLink domain has 72 GPUs); a time-slicing
# lag of more than ten times the compute before it, or a collective slowed a hundredfold, is a broken
# measurement, not a host.
_KEY_LIMITS = {"gpus_per_node": (1024, "1,024 devices"), "timeslice_skew": (10.0, "10 (a lag ten times the compute)"),
               "timeslice_skew_beyond_span": (10.0, "10 (a lag ten times the compute)"),
               "comm_stretch_under_compute": (100.0, "100 (a collective a hundred times slower)")}
# Counts, ratios and sizes without a unit (compute units, tiles, groups, nodes, GEMM dimensions).
_COUNT_LIMIT = (1e7, "10,000,000")


def limit_of(where: str) -> tuple[float, str]:
    """The largest value the number at dotted path ``where`` may take, and how a message says it."""
    steps = [step.split("[")[0] for step in where.split(".")]
    if steps[-1] in _KEY_LIMITS:
        return _KEY_LIMITS[steps[-1]]
    for step in reversed(steps):
        for suffix, limit, text in _UNIT_LIMITS:
            if step.endswith(suffix):
                return limit, text
    return _COUNT_LIMIT


def _show(x: float) -> str:
    """A number for a one-line message, short even for a 400-digit TOML integer."""
    if isinstance(x, int) and abs(x) >= 10**16:
        digits = str(abs(x))
        return f"{'-' if x < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    return f"{x:g}"


@dataclass(frozen=True)
class Sourced:
    """One number of a machine file, in the file's units, with its provenance."""

    value: float
    source: str | None
    estimate: str | None
    integral: bool = False  # read as an integer (a count, a tile size): what-if values must be whole too
    fitted: str | None = None  # learned by `twin fit`: from which runs, when, with what cross-validated error

    @property
    def provenance(self) -> str:
        """One line for people: where the number comes from."""
        if self.fitted:
            return f"FITTED: {self.fitted}"
        return f"source: {self.source}" if self.source else f"ESTIMATE: {self.estimate}"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _note(x: Any) -> str | None:
    return x if isinstance(x, str) and x.strip() else None


class Fields:
    """A view of one TOML table that records provenance and reports errors."""

    def __init__(self, table: dict[str, Any], path: str, origin: str, sources: dict[str, Sourced]) -> None:
        self._table = table
        self._path = path
        self._origin = origin
        self._sources = sources
        self._used: set[str] = set(NOTE_KEYS)

    # -- errors ---------------------------------------------------------
    def where(self, key: str | None = None) -> str:
        """The dotted path of ``key`` in this table (of the table if None)."""
        if key is None:
            return self._path or "<top>"
        return f"{self._path}.{key}" if self._path else key

    def fail(self, key: str | None, message: str) -> NoReturn:
        """Raise an InputError naming the file and the field."""
        raise InputError(f"{self._origin}: field '{self.where(key)}' {message}")

    def _get(self, key: str) -> Any:
        if key not in self._table:
            self.fail(key, "is missing; add it to the machine file")
        self._used.add(key)
        return self._table[key]

    def has(self, key: str) -> bool:
        return key in self._table

    def finish(self) -> None:
        """Fail on keys nobody read: they are typos or unsupported fields."""
        extra = sorted(set(self._table) - self._used)
        if extra:
            self.fail(extra[0], "is not a known field; remove it or fix its spelling")

    # -- nested tables --------------------------------------------------
    def table(self, key: str) -> Fields:
        value = self._get(key)
        if not isinstance(value, dict):
            self.fail(key, "must be a table, e.g. [" + self.where(key) + "]")
        return Fields(value, self.where(key), self._origin, self._sources)

    def tables(self, key: str) -> list[Fields]:
        """An array of tables ([[key]] entries), possibly empty if absent."""
        if key not in self._table:
            self._used.add(key)
            return []
        value = self._get(key)
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            self.fail(key, "must be an array of tables, e.g. [[" + self.where(key) + "]]")
        return [Fields(v, f"{self.where(key)}[{i}]", self._origin, self._sources) for i, v in enumerate(value)]

    def keys(self) -> list[str]:
        """The table's keys other than source/estimate notes, in file order."""
        return [k for k in self._table if k not in NOTE_KEYS]

    # -- leaves ---------------------------------------------------------
    def text(self, key: str) -> str:
        value = self._get(key)
        if not isinstance(value, str) or not value.strip():
            self.fail(key, 'must be a non-empty string, e.g. "..."')
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self._get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            self.fail(key, 'must be a non-empty list of strings, e.g. ["ll", "simple"]')
        return tuple(value)

    def number(self, key: str, check: str = "positive") -> float:
        """A sourced number ``{ value, source | estimate }``, range-checked."""
        raw = self._get(key)
        if _is_number(raw):
            self.fail(key, 'has no source; write { value = %s, source = "..." } or estimate = "why"' % raw)
        if not isinstance(raw, dict) or "value" not in raw:
            self.fail(key, 'must be { value = <number>, source = "..." } or { value = ..., estimate = "..." }')
        unknown = sorted(set(raw) - {"value", *NOTE_KEYS})
        if unknown:
            self.fail(key, f"has unknown key '{unknown[0]}'; allowed: value, {', '.join(NOTE_KEYS)}")
        value = raw["value"]
        if not _is_number(value):
            self.fail(key, f"value must be a number, got {value!r}")
        source, estimate, fitted = (_note(raw.get(k)) for k in NOTE_KEYS)
        if source is None and estimate is None and fitted is None:
            self.fail(key, 'needs a non-empty source = "..." or estimate = "why" (or fitted = "by twin fit on ...")')
        self.bounds(key, value, check)
        self._sources[self.where(key)] = Sourced(float(value), source, estimate, fitted=fitted)
        return float(value)

    def bounds(self, key: str, value: float, check: str) -> None:
        """The one range check every number of a machine file passes: finite, ``check``, and at most its limit.

        Finiteness comes first: ``nan`` compares false to everything and ``inf`` is above every lower bound,
        so without it either would slip past the range check into the physics."""
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(key, f"must be a finite number, got {value}; write the sourced or measured value")
        ok, bound = _RANGES[check]
        if not ok(value):
            self.fail(key, f"must be {bound}, got {_show(value)}")
        limit, text = limit_of(self.where(key))
        if value > limit:
            self.fail(key, f"is {_show(value)}, above the physical limit of {text}; check the value and its unit")

    def integer(self, key: str, check: str = "positive") -> int:
        """A sourced number that must be integral."""
        value = self.number(key, check)
        if not value.is_integer():
            self.fail(key, f"must be an integer, got {value}")
        where = self.where(key)
        self._sources[where] = replace(self._sources[where], integral=True)
        return int(value)

    def structure(self, key: str, check: str = "nonneg") -> int:
        """A plain structural integer (an index, a link count).

        Allowed plain only when this table carries a source or estimate note;
        a sourced inline table is accepted as well.
        """
        raw = self._table.get(key)
        if isinstance(raw, dict):
            return self.integer(key, check)
        raw = self._get(key)
        if not isinstance(raw, int) or isinstance(raw, bool):
            self.fail(key, f"must be an integer, got {raw!r}")
        if not any(_note(self._table.get(k)) for k in NOTE_KEYS):
            self.fail(key, f'is a plain integer; add source = "..." or estimate = "..." to [{self.where()}]')
        self.bounds(key, raw, check)
        return raw
