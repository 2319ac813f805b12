"""Search results on disk, keyed by everything that decides them.

The key hashes the inputs (model, GPU count, batch, search space, top) with
the machine file's text and the source of the simulator itself (every .py
under twin/ and topologies/), so an edited machine file or a changed model
of the physics never serves a stale ranking. Location: $EXATWIN_CACHE_DIR, else
$XDG_CACHE_HOME/exatwin, else ~/.cache/exatwin. Writes are atomic (a
temporary file renamed), so an interrupted search leaves no half-written entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path

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


def load(kind: str, key: str) -> dict | None:
    path = cache_dir() / kind / f"{key}.json"
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def store(kind: str, key: str, doc: dict) -> None:
    folder = cache_dir() / kind
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        pass  # a read-only home is no reason to fail a search
