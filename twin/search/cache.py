"""Search results on disk, keyed by everything that decides them.

The key hashes the inputs (model, GPU count, batch, search space, top) with
the machine file's text and the source of the simulator itself (every .py
under twin/ and topologies/), so an edited machine file or a changed model
of the physics never serves a stale ranking. Location: $EXATWIN_CACHE_DIR, else
$XDG_CACHE_HOME/exatwin, else ~/.cache/exatwin. Writes are atomic (a
temporary file renamed), so an interrupted search leaves no half-written entry.

An entry is still only a file in the user's home: a disk error, another
version of exatwin or a hand edit can leave one that is not JSON, or JSON
of another shape. Such an entry would fail every identical command until
someone found and deleted it, so ``load`` checks an entry's shape (the
dataclass its reader builds from it, ``shape``) and discards a bad one:
deletes it, says so in one line on stderr, and reports a miss, so the
caller recomputes and stores a good one. A cache never makes a command fail.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import types
import typing
from functools import lru_cache
from pathlib import Path
from typing import Any

from twin.errors import TwinError
from twin.outputs import write_text

ROOT = Path(__file__).resolve().parent.parent.parent


def cache_dir() -> Path:
    if os.environ.get("EXATWIN_CACHE_DIR"):
        return Path(os.environ["EXATWIN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "exatwin"


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A hash of the simulator's source: results of older code are not reused."""
    h = hashlib.sha256()
    for folder in ("twin", "topologies"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def machine_text(machine) -> str:
    """The machine file's text and any --set overrides: part of every key, so an edited file or an
    overridden number is a different machine."""
    try:
        with open(machine.path) as f:
            text = f.read()
    except OSError:
        text = machine.path
    overrides = getattr(machine, "overrides", ())
    return text + "".join(f"\n# --set {path}={value!r}" for path, value in overrides)


def cache_key(kind: str, inputs: dict, machine_text: str) -> str:
    doc = json.dumps({"kind": kind, "inputs": inputs, "machine": machine_text, "code": code_fingerprint()},
                     sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:32]


def load(kind: str, key: str, shape: type | None = None) -> dict | None:
    """The cached JSON object, or None: absent, unreadable, or discarded as corrupt or not of ``shape``
    (a dataclass its fields must match, by name and type; None: any JSON object)."""
    path = cache_dir() / kind / f"{key}.json"
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return _discard(path, "not JSON")
    problem = _mismatch(doc, shape, "entry")
    return _discard(path, problem) if problem else doc


def _discard(path: Path, problem: str) -> None:
    """Delete a bad entry and say so: the caller sees a miss and recomputes it."""
    try:
        path.unlink()
    except OSError:
        pass  # already gone, or a read-only cache: the recomputed result is still right
    print(f"twin: warning: discarded the cache entry {path} ({problem}); recomputing it", file=sys.stderr)
    return None


def _mismatch(value: Any, hint: Any, where: str) -> str | None:
    """How ``value`` (parsed JSON) fails to be of type ``hint``, or None if it is.

    ``hint`` None means any JSON object. Dataclasses must have every field without a default and no other
    key; lists, unions and str/int/float/bool are checked by type (an int where a float is expected is fine,
    as JSON writes 2.0 as 2.0 but a hand edit may not); other hints are accepted as they are."""
    if hint is None:
        return None if isinstance(value, dict) else f"{where} is not a JSON object"
    if dataclasses.is_dataclass(hint):
        return _dataclass_mismatch(value, hint, where)
    origin = typing.get_origin(hint)
    if origin is list:
        if not isinstance(value, list):
            return f"{where} is not a list"
        return next(filter(None, (_mismatch(v, typing.get_args(hint)[0], f"{where}[{i}]")
                                  for i, v in enumerate(value))), None)
    if origin in (typing.Union, types.UnionType):
        problems = [_mismatch(value, h, where) for h in typing.get_args(hint)]
        return None if None in problems else problems[0]
    if hint is type(None):
        return None if value is None else f"{where} is not null"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else f"{where} is not a number"
    if hint in (int, str, bool):
        return None if type(value) is hint else f"{where} is not a {hint.__name__}"
    return None


def _dataclass_mismatch(value: Any, cls: type, where: str) -> str | None:
    if not isinstance(value, dict):
        return f"{where} is not a JSON object"
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    for f in fields:
        if f.name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                return f"{where} has no '{f.name}'"
            continue
        problem = _mismatch(value[f.name], hints[f.name], f"{where}.{f.name}")
        if problem:
            return problem
    unknown = sorted(set(value) - {f.name for f in fields})
    return f"{where} has an unknown key '{unknown[0]}'" if unknown else None


def store(kind: str, key: str, doc: dict) -> None:
    folder = cache_dir() / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text(str(folder / f"{key}.json"), json.dumps(doc))
    except (OSError, TwinError):
        pass  # a read-only home is no reason to fail a search
