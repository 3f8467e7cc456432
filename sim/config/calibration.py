"""The `[calibration]` table of a cost model's parameter file: the shipped one by default, or a user's."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from sim.io.errors import SimError


def calibration_range(key: str) -> tuple[float, float]:
    """The values a calibration parameter may take: efficiencies (`*_eff*`, fractions of a peak) in
    [0.001, 1], overheads and latencies (seconds) in [0, 1]."""
    return (1e-3, 1.0) if "_eff" in key else (0.0, 1.0)


def calibration_problem(key: str, value: object) -> str | None:
    """Why `value` cannot be calibration parameter `key`, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number (got {value!r})"
    low, high = calibration_range(key)
    if not low <= value <= high:  # also refuses nan
        return f"must be in [{low:g}, {high:g}] (got {value:g})"
    return None


def calibration_table(shipped: str, path: str | Path | None, known: set[str]) -> dict[str, float]:
    """`[calibration]` of `path`, or of `sim/catalog/<shipped>` when `path` is None; keys outside `known`,
    malformed TOML and values that are no number in range are errors naming the file."""
    if path is None:
        text = (resources.files("sim") / "catalog" / shipped).read_text()
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SimError(f"cannot read calibration file {path}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise SimError(f"{path}: not a UTF-8 text file (bad byte at offset {exc.start})") from None
    try:
        table = tomllib.loads(text).get("calibration", {})
    except tomllib.TOMLDecodeError as exc:
        raise SimError(f"{path or shipped}: not valid TOML: {exc}") from None
    if not isinstance(table, dict):
        raise SimError(f"{path or shipped}: calibration: expected a table of parameters")
    unknown = set(table) - known
    if unknown:
        raise SimError(
            f"{path or shipped}: calibration: unknown keys {sorted(unknown)}; known: {sorted(known)}"
        )
    for key, value in table.items():
        why = calibration_problem(key, value)
        if why is not None:
            raise SimError(f"{path or shipped}: calibration.{key}: {why}")
    return {k: float(v) for k, v in table.items()}
