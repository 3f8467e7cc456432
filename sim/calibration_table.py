"""The `[calibration]` table of a cost model's parameter file: the shipped one by default, or a user's."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from sim.errors import SimError


def calibration_table(shipped: str, path: str | Path | None, known: set[str]) -> dict[str, float]:
    """`[calibration]` of `path`, or of `sim/catalog/<shipped>` when `path` is None; keys outside `known`
    are errors naming the file."""
    if path is None:
        text = (resources.files("sim") / "catalog" / shipped).read_text()
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SimError(f"cannot read calibration file {path}: {exc}") from exc
    table = tomllib.loads(text).get("calibration", {})
    unknown = set(table) - known
    if unknown:
        raise SimError(
            f"{path or shipped}: calibration: unknown keys {sorted(unknown)}; known: {sorted(known)}"
        )
    return {k: float(v) for k, v in table.items()}
