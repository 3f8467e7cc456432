"""Output paths checked before a command runs: a folder it can write into, a file it can create.

Each check returns why the path cannot serve (one short sentence), or None. A path is looked up the way
the writes will look it up, so that a symbolic link loop, a link to nothing, a name or a path longer than
the file system takes, or a file where a folder should be is refused before any work starts.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

NAME_MAX = 255  # bytes in one name (Linux, macOS)
PATH_MAX = 4096  # bytes in a path handed to the system
ROOM = 512  # bytes kept free below PATH_MAX for the names a command writes inside its output folder
SHOWN = 160  # characters of a long path shown in a message (its two ends)

REASONS = {
    errno.ELOOP: "a symbolic link on the way loops",
    errno.ENAMETOOLONG: "the path is too long for the file system",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EACCES: "a folder on the way cannot be entered (permission denied)",
}


def shown(path: Path | str) -> str:
    """`path` for a message: whole when short, else its two ends."""
    text = str(path)
    if len(text) <= SHOWN:
        return text
    return f"{text[: SHOWN // 2]}…{text[-SHOWN // 2 :]}"


def _length_problem(path: Path) -> str | None:
    for name in path.parts:
        if (size := len(os.fsencode(name))) > NAME_MAX:
            return f"a name in it is {size:,} bytes long (at most {NAME_MAX})"
    full = len(os.fsencode(path.absolute()))
    if full > PATH_MAX - ROOM:
        return (
            f"the path is too long ({full:,} bytes from the root; at most {PATH_MAX - ROOM:,}, "
            "to leave room for the files written in it)"
        )
    return None


def _stat(path: Path, given: Path) -> tuple[os.stat_result | None, str | None]:
    """`(stat of path, None)`; `(None, None)` when nothing is there; `(None, why)` when it cannot be told.
    `given` is the path the user gave, which `path` is or leads to."""
    where = "" if path == given else f"{shown(path)} "
    try:
        return path.stat(), None
    except FileNotFoundError:
        if path.is_symlink():
            return None, f"{where}is a symbolic link to {shown(os.readlink(path))}, which does not exist"
        return None, None
    except OSError as exc:
        if exc.errno == errno.ELOOP and path.is_symlink():
            return None, f"{where}is a symbolic link that loops"
        return None, REASONS.get(exc.errno or 0, exc.strerror or str(exc))


def _lookup(path: Path) -> tuple[Path | None, str | None]:
    """The deepest existing path on the way to `path` (itself included), or why the way is blocked."""
    if (why := _length_problem(path)) is not None:
        return None, why
    for candidate in (path, *path.parents):
        found, why = _stat(candidate, path)
        if why is not None:
            return None, why
        if found is not None:
            return candidate, None
    return Path.cwd(), None


def out_folder_problem(path: Path) -> str | None:
    """Why `path` cannot be an output folder this process writes into (made if missing), else None."""
    base, why = _lookup(path)
    if base is None:
        return why
    if base == path:
        if not base.is_dir():
            return "is a file, not a folder"
    elif not base.is_dir():
        return f"{shown(base)} is a file, not a folder"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{shown(base)} is not writable"
    return None


def out_file_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a file in an existing, writable folder, else None."""
    base, why = _lookup(path)
    if base is None:
        return why
    if base == path and base.is_dir():
        return "is a folder; give a file name"
    folder = path.parent
    if not folder.is_dir():
        return f"folder {shown(path.parent)} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {shown(path.parent)} is not writable"
    return None
