"""What the simulator's results depend on besides the scenario: its code and its shipped data (the catalog's
calibrations, kernel fits, GPUs and models). A digest of every file of the `sim` package, so that results kept
on disk for reuse (a sweep's points, a plan's runs) are never read back by a simulator that would compute them
differently."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
SUFFIXES = (".py", ".toml", ".csv", ".json")


@cache
def simulator_fingerprint() -> str:
    """sha256 over the package's source and data files (relative path and contents, in path order)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in PACKAGE.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
