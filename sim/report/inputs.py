"""Read what `sim run` and `sim sweep` wrote under reports/<scenario>/ into frames for the report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from sim.errors import SimError
from sim.scenario import Scenario, load_scenario, validate_scenario

RUN_FILES = ("requests.parquet", "steps.parquet", "summary.json")


@dataclass(slots=True)
class PolicyRun:
    """One policy's records from `sim run`."""

    policy: str
    requests: pl.DataFrame
    steps: pl.DataFrame
    summary: dict[str, Any]


@dataclass(slots=True)
class ReportInputs:
    name: str
    description: str = ""
    scenario: Scenario | None = None
    runs: list[PolicyRun] = field(default_factory=list)
    points: pl.DataFrame | None = None  # one row per sweep run (all point files concatenated)
    capacity: dict[str, Any] | None = None  # capacity.json as written by the sweep, if any

    @property
    def run_rate(self) -> float | None:
        """The arrival rate of the per-policy runs: the scenario's, else the observed one."""
        arrival = self.scenario.workload.arrival if self.scenario else None
        rate = getattr(arrival, "rate", None)
        if isinstance(rate, int | float):
            return float(rate)
        if not self.runs:
            return None
        req = self.runs[0].requests
        span = req["arrival"].max()
        return req.height / span if isinstance(span, float) and span > 0 else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise SimError(f"{path}: cannot read JSON: {err}") from None
    if not isinstance(data, dict):
        raise SimError(f"{path}: expected a JSON object")
    return data


def _read_parquet(path: Path) -> pl.DataFrame:
    try:
        return pl.read_parquet(path)
    except Exception as err:  # polars raises several error types for a damaged file
        raise SimError(f"{path}: cannot read Parquet: {err}") from None


def load_runs(report_dir: Path) -> list[PolicyRun]:
    """Every `<policy>/` folder holding the three run files, in the order of their names."""
    runs = []
    for sub in sorted(p for p in report_dir.iterdir() if p.is_dir() and p.name != "sweep"):
        if not all((sub / f).is_file() for f in RUN_FILES):
            continue
        summary = _read_json(sub / "summary.json")
        requests = _read_parquet(sub / "requests.parquet")
        steps = _read_parquet(sub / "steps.parquet")
        runs.append(PolicyRun(str(summary.get("policy", sub.name)), requests, steps, summary))
    return runs


def load_points(sweep_dir: Path) -> pl.DataFrame | None:
    """All sweep point files stacked (None when there are none)."""
    files = sorted((sweep_dir / "points").glob("*.parquet"))
    if not files:
        return None
    frames = [_read_parquet(f) for f in files]
    frame = pl.concat(frames, how="diagonal_relaxed")
    missing = {"policy", "rate"} - set(frame.columns)
    if missing:
        raise SimError(f"{sweep_dir / 'points'}: point files lack columns {sorted(missing)}")
    return frame


def _find_scenario(report_dir: Path, name: str, explicit: Path | None) -> Scenario | None:
    """The given file; else the scenario the sweep or the run recorded; else scenarios/<name>.toml."""
    if explicit is not None:
        return load_scenario(explicit)
    manifest = report_dir / "sweep" / "manifest.json"
    if manifest.is_file():
        raw = _read_json(manifest).get("scenario")
        if isinstance(raw, dict):
            return validate_scenario(raw, str(manifest))
    recorded = report_dir / "scenario.json"  # written by `sim run`
    if recorded.is_file():
        return validate_scenario(_read_json(recorded), str(recorded))
    for candidate in (report_dir / "scenario.toml", Path("scenarios") / f"{name}.toml"):
        if candidate.is_file():
            scenario = load_scenario(candidate)
            if scenario.name == name:
                return scenario
    return None


def load_inputs(report_dir: Path, scenario_file: Path | None = None) -> ReportInputs:
    """Everything the report needs from `report_dir`; raises SimError when there is nothing to show."""
    if not report_dir.is_dir():
        raise SimError(f"{report_dir}: no such folder (run `sim run SCENARIO` first)")
    runs = load_runs(report_dir)
    sweep_dir = report_dir / "sweep"
    points = load_points(sweep_dir) if sweep_dir.is_dir() else None
    if not runs and points is None:
        raise SimError(
            f"{report_dir}: no run records (<policy>/summary.json) and no sweep points; "
            "run `sim run SCENARIO` or `sim sweep SCENARIO` first"
        )
    name = str(runs[0].summary.get("scenario", report_dir.name)) if runs else report_dir.resolve().name
    scenario = _find_scenario(report_dir, name, scenario_file)
    capacity_file = sweep_dir / "capacity.json"
    capacity = _read_json(capacity_file) if capacity_file.is_file() else None
    description = scenario.description if scenario else ""
    return ReportInputs(name, description, scenario, runs, points, capacity)
