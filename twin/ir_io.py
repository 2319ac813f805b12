"""Versioned JSON for the schedule IR.

The file is the contract between the builder, the simulator and the executor
(which may run on another machine, days later), so it is strict:

    {"format": "exatwin-schedule", "version": 3, "world_size": 8,
     "info": {"model": "GPT-5B", "plan": {...every ParallelPlan field...}, ...StepInfo fields...},
     "groups": [{"name": "x", "instances": [[0, 1], [2, 3]]}, ...],
     "programs": [{"ranks": [0, 1, 2, 3],
                   "ops": [{"id": 0, "name": "mb0.fwd.L0.qkv.gemm", "stream": "compute", "deps": [],
                            "tag": {"micro_batch": 0, "phase": "fwd", "layer": 0, "block": "qkv", "role": "gemm"},
                            "type": "gemm", "work": {"m": 8192, "n": 3072, ...}}, ...]}]}

- `type` is the key of `twin.ir.WORK_TYPES`; the work's own fields sit in a
  nested `work` object (Collective and P2P have a field named `kind` too, so a
  flat op would clash).
- A field equal to its dataclass default is left out (deps [], layout "NN",
  batch 1, a tag's chunk None, ...): that keeps a builder's op to about 200
  bytes, its tag included (a 5,000-op program to about 1 MB). So a change
  to any IR default is a format change: bump IR_VERSION with it. The plan
  is the exception: it is written in full and read back only in full, so
  that a change to ParallelPlan's fields or defaults is an error on old
  files, never a silent guess.
  Loading is otherwise strict: a missing field that has no default, an
  unknown field, or a value of the wrong JSON type is an error naming the
  op and the field, never a silent guess. A file of another IR version is
  refused with the command that writes a current one.
- (De)serialization walks `dataclasses.fields` and the type hints of the IR
  classes, so a new Work type needs no code here, only a WORK_TYPES entry.
- Saving is deterministic (field order, compact separators: same schedule,
  same bytes) and atomic (temp file in the same folder + os.replace).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

from twin.errors import TwinError
from twin.ir import IR_VERSION, WORK_TYPES, Op, Schedule, work_type_name
from twin.ir_validate import validate_schedule
from twin.outputs import atomic_path
from twin.plan import ParallelPlan

FORMAT = "exatwin-schedule"
_IN_FULL = (ParallelPlan,)  # dataclasses written with every field and read back only with every field
_MAX_FLOAT_INT = 10**308  # the largest JSON integer a float field may hold (a float tops out at 1.8e308)


def schedule_to_dict(s: Schedule) -> dict[str, Any]:
    """Plain JSON-ready data, in the on-disk layout above."""
    body = _fields(s)
    body.pop("version", None)  # always written, first, even though it equals its default
    head = {"format": FORMAT, "version": s.version, "world_size": body.pop("world_size"), "info": body.pop("info")}
    return {**head, **body}


def schedule_from_dict(d: Any, source: str = "the schedule") -> Schedule:
    """Inverse of schedule_to_dict, checking format, version, fields and types (not semantics).

    `source` names the data where an error reads better with it first (a file of another IR version)."""
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        got = repr(d.get("format")) if isinstance(d, dict) else f"a JSON {_json_type(d)}"
        raise TwinError(f"not an exatwin schedule: 'format' is {got}, expected '{FORMAT}'; pass a schedule written by exatwin")
    version = d.get("version")
    if type(version) is not int:
        raise TwinError(f"schedule 'version' is {version!r}, expected an integer: re-export the schedule")
    if version != IR_VERSION:
        raise TwinError(f"{source} has IR version {version}; this twin reads version {IR_VERSION}: "
                        "re-export it with `twin export`")
    body = {k: v for k, v in d.items() if k != "format"}
    return _decode_dataclass(Schedule, body, "schedule")


def save_schedule(s: Schedule, path: str | os.PathLike[str]) -> None:
    """Write `s` to `path`: byte-identical for equal schedules, never half-written."""
    data = (json.dumps(schedule_to_dict(s), separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n").encode()
    with atomic_path(str(path)) as tmp, open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def load_schedule(path: str | os.PathLike[str]) -> Schedule:
    """Read, check and validate a schedule file; every problem is a one-line TwinError naming the file.

    Everything is checked before a backend sees the schedule, and nothing is
    allocated in proportion to the `world_size` the file claims before that
    claim is checked against the ranks the file lists (twin.ir_validate)."""
    d = _read_json(path)
    source = f"schedule file {path}"
    try:
        s = schedule_from_dict(d, source)
        validate_schedule(s)
    except TwinError as e:
        message = str(e)
        raise TwinError(message if message.startswith(source) else f"{source}: {message}") from None
    return s


def _read_json(path: str | os.PathLike[str]) -> Any:
    """The file's JSON value: a one-line TwinError for a missing, unreadable, non-UTF-8 or malformed file."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise TwinError(f"schedule file {path} does not exist: check the path") from None
    except OSError as e:
        raise TwinError(f"schedule file {path} cannot be read ({type(e).__name__}: {e.strerror or e}): check the path and permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TwinError(f"schedule file {path} is not UTF-8 text (byte {e.start} is 0x{raw[e.start]:02x}): "
                        "give a schedule JSON file written by exatwin") from None
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise TwinError(f"schedule file {path} is not JSON ({e.msg} at line {e.lineno} column {e.colno}): re-export the schedule") from None
    except RecursionError:  # a JSON value nested deeper than Python's parser goes: no schedule is
        raise TwinError(f"schedule file {path} is not IR JSON (nested too deeply): re-export the schedule") from None
    except ValueError as e:
        raise TwinError(f"schedule file {path} is not valid IR JSON ({e}): re-export the schedule") from None


# ---- encoding ---------------------------------------------------------------


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass as a dict in field order, defaults left out.

    An Op's work goes last, as {"type": name, "work": fields}, so a line reads
    id, name, stream, deps, then what the op does.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(obj, Op) and f.name == "work":
            continue
        if (isinstance(obj, _IN_FULL) or f.default is dataclasses.MISSING or type(value) is not type(f.default)
                or value != f.default):
            out[f.name] = _plain(value)
    if isinstance(obj, Op):
        out["type"] = work_type_name(obj.work)
        out["work"] = _fields(obj.work)
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return _fields(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


# ---- decoding ---------------------------------------------------------------


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_dataclass(cls: type, d: Any, where: str, extra: tuple[str, ...] = ()) -> Any:
    """Build `cls` from `d`: every field without a default (plus `extra`), no unknown key, each of the hinted type."""
    if not isinstance(d, dict):
        raise TwinError(f"{where} must be a JSON object, got a JSON {_json_type(d)}: re-export the schedule")
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    required = [f.name for f in fields if f.default is dataclasses.MISSING or cls in _IN_FULL] + list(extra)
    missing = [n for n in required if n not in d]
    unknown = [k for k in d if k not in names and k not in extra]
    if missing or unknown:
        problem = f"is missing field '{missing[0]}'" if missing else f"has unknown field '{unknown[0]}'"
        raise TwinError(f"{where} {problem} (fields: {', '.join((*names, *extra))}): re-export the schedule")
    hints = _hints(cls)
    kwargs = {}
    for n in names:
        if n not in d:
            continue  # an optional field left out: the dataclass default applies
        if cls is Op and n == "work":
            kwargs[n] = _decode_work(d, where)
        else:
            kwargs[n] = _decode_value(hints[n], d[n], f"{where}.{n}")
    return cls(**kwargs)


def _decode_op(d: Any, where: str) -> Op:
    if isinstance(d, dict) and isinstance(d.get("name"), str):
        where = f"{where} '{d['name']}'"
    return _decode_dataclass(Op, d, where, extra=("type",))


def _decode_work(op: dict[str, Any], where: str) -> Any:
    kind = op["type"]
    if not isinstance(kind, str) or kind not in WORK_TYPES:  # a list or object here is not hashable either
        raise TwinError(f"{where}.type {kind!r} is not a work type: use one of {', '.join(WORK_TYPES)}")
    return _decode_dataclass(WORK_TYPES[kind], op["work"], f"{where}.work")


def _decode_value(hint: Any, value: Any, where: str) -> Any:
    """Check `value` against a field's type hint and convert lists back to tuples."""
    if isinstance(hint, types.UnionType):  # X | None: an optional field, written as null when None
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        (hint,) = (a for a in args if a is not type(None))
    if hint is bool or hint is str:
        if type(value) is not hint:
            raise _type_error(where, "a boolean" if hint is bool else "a string", value)
        return value
    if hint is int:
        if type(value) is not int:
            raise _type_error(where, "an integer", value)
        return value
    if hint is float:
        if type(value) not in (int, float):
            raise _type_error(where, "a number", value)
        if type(value) is int and abs(value) > _MAX_FLOAT_INT:  # float() of it would overflow
            raise _type_error(where, "a finite number", value)
        return float(value)
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise _type_error(where, "a list", value)
        if item is int and all(type(v) is int for v in value):
            return tuple(value)  # fast path: rank lists hold up to world_size ints
        if item is Op:
            return tuple(_decode_op(v, f"{where}[{i}]") for i, v in enumerate(value))
        return tuple(_decode_value(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(hint, value, where)
    raise TypeError(f"ir_io cannot decode fields of type {hint!r} ({where}): teach _decode_value about it")


def _type_error(where: str, expected: str, value: Any) -> TwinError:
    shown = json.dumps(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return TwinError(f"{where} must be {expected}, got {shown}: re-export the schedule")


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"key '{dup}' appears twice in one object")
    return d


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a valid number")
