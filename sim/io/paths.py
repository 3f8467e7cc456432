"""Output paths checked before a command runs: a folder it can write into, a file it can create."""

from __future__ import annotations

import os
from pathlib import Path


def _nearest_folder(path: Path) -> Path:
    """The deepest existing path on the way to `path` (the working folder for a relative one)."""
    for parent in path.absolute().parents:
        if parent.exists():
            return parent
    return Path("/")


def out_folder_problem(path: Path) -> str | None:
    """Why `path` cannot be an output folder this process writes into (made if missing), else None."""
    if path.exists():
        if not path.is_dir():
            return "is a file, not a folder"
        base = path
    else:
        base = _nearest_folder(path)
        if not base.is_dir():
            return f"{base} is a file, not a folder"
    if not os.access(base, os.W_OK | os.X_OK):
        return f"{base} is not writable"
    return None


def out_file_problem(path: Path) -> str | None:
    """Why `path` cannot be written as a file in an existing, writable folder, else None."""
    if path.is_dir():
        return "is a folder; give a file name"
    folder = path.absolute().parent
    if not folder.is_dir():
        return f"folder {path.parent} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {path.parent} is not writable"
    return None
