"""Read what `sim run` and `sim sweep` wrote under reports/<scenario>/ into frames for the report."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from sim.config.scenario import Scenario, load_scenario, validate_scenario
from sim.io.errors import SimError
from sim.studies.folder import SWEEP_DIR, read_sweep_scenario, run_folders, sweep_differences
from sim.studies.run import MANIFEST, RUN_FILES, manifest_differences, read_manifest


@dataclass(slots=True)
class PolicyRun:
    """One policy's records from `sim run`."""

    policy: str
    requests: pl.DataFrame
    steps: pl.DataFrame
    summary: dict[str, Any]
    manifest: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ReportInputs:
    name: str
    description: str = ""
    scenario: Scenario | None = None
    runs: list[PolicyRun] = field(default_factory=list)
    points: pl.DataFrame | None = None  # one row per sweep run (all point files concatenated)
    capacity: dict[str, Any] | None = None  # capacity.json as written by the sweep, if any
    run_scenario: Scenario | None = None  # the scenario the per-policy runs were made from
    notes: list[str] = field(default_factory=list)  # caveats the page must show
    sweep_scenario: Scenario | None = None  # the scenario the sweep ran, from its manifest
    withheld: dict[str, str] = field(default_factory=dict)  # section key -> why its chart is left out
    folder: Path | None = None  # where the records were read: the --out of the runs and the sweep

    @property
    def run_rate(self) -> float | None:
        """The arrival rate of the per-policy runs: their scenario's, else the observed one."""
        arrival = self.run_scenario.workload.arrival if self.run_scenario else None
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


# The record columns the report reads; a run of `sim run` writes them all.
REQUEST_COLUMNS = ("id", "arrival", "scheduled_at", "first_token_at", "finished_at", "queue_wait", "ttft",
                   "tpot", "e2e", "itl_mean", "n", "generated_tokens", "state")  # fmt: skip
STEP_COLUMNS = ("start", "duration", "batch_size", "waiting", "kv_used", "kv_allocated", "kv_capacity")


def _read_records(path: Path, columns: tuple[str, ...]) -> pl.DataFrame:
    """A run's Parquet records, refused when they lack a column the report reads."""
    frame = _read_parquet(path)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise SimError(f"{path}: not the records of `sim run` (no column {', '.join(missing)}); re-run it")
    return frame


def _read_parquet(path: Path, hint: str = "") -> pl.DataFrame:
    try:
        return pl.read_parquet(path)
    except Exception as err:  # polars raises several error types for a damaged file
        raise SimError(f"{path}: cannot read Parquet: {err}{hint}") from None


def _value(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)


def describe_differences(diff: list[tuple[str, Any, Any]], a: str, b: str, limit: int = 6) -> str:
    """`key: x in A, y in B; ...` for the first `limit` differences."""
    shown = [f"{key}: {_value(x)} in {a}, {_value(y)} in {b}" for key, x, y in diff[:limit]]
    more = f"; and {len(diff) - limit} more" if len(diff) > limit else ""
    return "; ".join(shown) + more


def load_runs(report_dir: Path) -> list[PolicyRun]:
    """Every run folder of `sim run` (`<policy>/` with its manifest), in the order of their names.

    Refuses (SimError) a folder with missing files or no manifest, and runs of different scenarios,
    naming the settings that differ: their numbers cannot be compared side by side.
    """
    runs = []
    for sub in run_folders(report_dir):
        missing = [f for f in (*RUN_FILES, MANIFEST) if not (sub / f).is_file()]
        if missing:
            raise SimError(
                f"{sub}: incomplete run ({', '.join(missing)} missing); re-run `sim run` for this policy"
            )
        manifest = read_manifest(sub)
        if manifest is None:
            raise SimError(f"{sub / MANIFEST}: cannot read the run's manifest; re-run `sim run`")
        summary = _read_json(sub / "summary.json")
        requests = _read_records(sub / "requests.parquet", REQUEST_COLUMNS)
        steps = _read_records(sub / "steps.parquet", STEP_COLUMNS)
        runs.append(PolicyRun(str(manifest.get("policy", sub.name)), requests, steps, summary, manifest))
    first = runs[0] if runs else None
    for run in runs[1:]:
        assert first is not None
        diff = manifest_differences(first.manifest, run.manifest)
        if diff:
            raise SimError(
                f"{report_dir}: the runs of {first.policy} and {run.policy} come from different scenarios "
                f"({describe_differences(diff, first.policy, run.policy)}); their numbers cannot be "
                "compared. Re-run every policy with the same settings, or write each setting to its own "
                "folder with `sim run ... --out DIR`"
            )
    return runs


def load_points(sweep_dir: Path) -> pl.DataFrame | None:
    """All sweep point files stacked (None when there are none)."""
    files = sorted((sweep_dir / "points").glob("*.parquet"))
    if not files:
        return None
    frames = [_read_parquet(f, "; re-run `sim sweep` to redo this point") for f in files]
    frame = pl.concat(frames, how="diagonal_relaxed")
    missing = {"policy", "rate"} - set(frame.columns)
    if missing:
        raise SimError(f"{sweep_dir / 'points'}: point files lack columns {sorted(missing)}")
    return frame


def _find_scenario(
    report_dir: Path,
    name: str,
    explicit: Path | None,
    sweep_scenario: Scenario | None,
    run_scenario: Scenario | None,
) -> Scenario | None:
    """The given file; else the scenario the sweep or the runs recorded; else scenarios/<name>.toml."""
    if explicit is not None:
        return load_scenario(explicit)
    if sweep_scenario is not None:
        return sweep_scenario
    if run_scenario is not None:
        return run_scenario
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
    sweep_dir = report_dir / SWEEP_DIR
    points = load_points(sweep_dir) if sweep_dir.is_dir() else None
    if not runs and points is None:
        raise SimError(
            f"{report_dir}: no run records (<policy>/summary.json) and no sweep points; "
            "run `sim run SCENARIO` or `sim sweep SCENARIO` first"
        )
    name = str(runs[0].manifest.get("scenario", report_dir.name)) if runs else report_dir.resolve().name
    run_scenario = _run_scenario(runs[0]) if runs else None
    sweep_scenario = read_sweep_scenario(report_dir)
    scenario = _find_scenario(report_dir, name, scenario_file, sweep_scenario, run_scenario)
    capacity_file = sweep_dir / "capacity.json"
    capacity = _read_json(capacity_file) if capacity_file.is_file() else None
    description = scenario.description if scenario else ""
    notes = []
    if run_scenario is not None and points is not None and sweep_scenario is not None:
        notes += _sweep_differences(sweep_scenario, run_scenario)
    return ReportInputs(
        name,
        description,
        scenario,
        runs,
        points,
        capacity,
        run_scenario,
        notes,
        sweep_scenario,
        folder=report_dir,
    )


def _run_scenario(run: PolicyRun) -> Scenario | None:
    raw = run.manifest.get("as_run")
    return validate_scenario(raw, f"{run.policy}/{MANIFEST}") if isinstance(raw, dict) else None


def _sweep_differences(sweep: Scenario, runs: Scenario) -> list[str]:
    """A caveat when the sweep's scenario differs from the runs' beyond the keys the sweep varies."""
    diff = sweep_differences(sweep, runs)
    if not diff:
        return []
    return [
        "The sweep and the per-policy runs come from different scenarios "
        f"({describe_differences(diff, 'the sweep', 'the runs')}): compare their figures with care."
    ]
