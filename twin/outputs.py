"""Where commands write: one policy for every output file, checked before any work.

- An output never replaces an input of the same command (a trace named like
  the schedule it simulates, a figure named like the machine file) and never
  shares a path with another output of the same command.
- An output's folder must exist and be writable, the path must not be a
  folder, and an existing file there must be writable: a read-only file is
  the user saying "keep this", so it is an error, not a silent replacement.
- Every file is written atomically (a temporary file in the same folder, then
  os.replace), so a failure or Ctrl-C never leaves half a file, and the
  original, if any, keeps its bytes.
- Commands write into the repository only where told to: defaults go to
  `out/` in the working directory (DEFAULT_DIR), which --help states.

All of it raises one-line TwinErrors naming the flag; nothing here knows any
command, so every command applies the same rules.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Callable, Iterator, Mapping

from twin.errors import TwinError

DEFAULT_DIR = "out"  # where outputs go when a command's flag is left out

FIGURE_FORMATS = ("png", "pdf", "svg")


def check_outputs(outputs: Mapping[str, str | None], inputs: Mapping[str, str | None] | None = None,
                  formats: Mapping[str, tuple[str, ...]] | None = None) -> None:
    """Every output path (flag -> path; None: not asked for) is writable, distinct and not an input.

    `formats` restricts a flag's file suffixes (e.g. figures: FIGURE_FORMATS)."""
    given = {flag: path for flag, path in outputs.items() if path is not None}
    for flag, path in given.items():
        _check_writable(flag, path, (formats or {}).get(flag))
    seen: dict[str, str] = {}
    for flag, path in given.items():
        key = _identity(path)
        if key in seen:
            raise TwinError(f"{flag} and {seen[key]} name the same file {path}; give each output its own path")
        seen[key] = flag
    for in_flag, in_path in (inputs or {}).items():
        if in_path is None or not os.path.exists(in_path):
            continue
        for flag, path in given.items():
            if os.path.exists(path) and os.path.samefile(path, in_path) or _identity(path) == _identity(in_path):
                raise TwinError(f"{flag} {path} is the input {in_flag}: writing it would destroy the input; "
                                "choose another output path")


_TEMP_EXTRA = 12  # what atomic_path's temporary name adds to the file's name


def _name_max(directory: str) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def _identity(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _check_writable(flag: str, path: str, suffixes: tuple[str, ...] | None) -> None:
    if not path.strip():
        raise TwinError(f"{flag} is empty; give a file name")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise TwinError(f"{flag} {path}: folder {directory} does not exist; create it or choose another path")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise TwinError(f"{flag} {path}: folder {directory} is not writable; choose another path")
    if os.path.isdir(path):
        raise TwinError(f"{flag} {path} is a folder; give a file name")
    if len(os.path.basename(path)) + _TEMP_EXTRA > _name_max(directory):  # the temporary name must fit too
        raise TwinError(f"{flag}: the file name is longer than this file system allows; choose a shorter one")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise TwinError(f"{flag} {path} exists and is not a regular file; choose another path")
    try:  # what access() cannot tell (a read-only or virtual file system): whether a file can be made there
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".twin-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise TwinError(f"{flag} {path}: cannot create a file in {directory} ({e.strerror}); choose another path")
    if os.path.exists(path) and (not os.access(path, os.W_OK) or not os.stat(path).st_mode & 0o222):
        # mode bits too: root may write anything, but a file without write bits is one its owner means to keep
        raise TwinError(f"{flag} {path} is read-only; make it writable or choose another path")
    if suffixes is not None:
        suffix = os.path.splitext(path)[1].lstrip(".").lower()
        if suffix not in suffixes:
            raise TwinError(f"{flag} {path}: unsupported format {suffix!r}; use one of {', '.join(suffixes)}")


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A temporary path beside `path` to write to; it takes `path`'s name only if the block succeeds.

    The temporary file keeps `path`'s suffix (matplotlib picks the format from it) and gets the permissions an
    ordinary new file would (mkstemp's are private)."""
    directory = os.path.dirname(os.path.abspath(path))
    base, suffix = os.path.splitext(os.path.basename(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{base}-", suffix=suffix)
    except OSError as e:
        raise TwinError(f"cannot write {path}: {e.strerror}; choose another path") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise TwinError(f"cannot write {path}: {e.strerror}; choose another path") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str, text: str) -> None:
    """`text` into `path`, atomically."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(text)


def write_with(path: str, write: Callable[[str], None]) -> None:
    """`write(tmp)` writes the file under a temporary name; it takes `path`'s name when done."""
    with atomic_path(path) as tmp:
        write(tmp)
