"""What a scenario's output folder holds, and whether its parts may be set side by side: the run folders of
`sim run`, which must all come from one scenario, and the sweep of `sim sweep` beside them, which may
differ from the runs only in what it sweeps. `sim run` warns, and `sim report` refuses or notes, by these
same comparisons of validated scenarios (defaults filled in, `1` and `1.0` one rate)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.config.scenario import Scenario, validate_scenario
from sim.io.errors import SimError
from sim.io.outputs import differences
from sim.studies.run import (
    MANIFEST,
    RESERVED_NAMES,
    compared_scenario,
    is_run_folder,
    manifest_differences,
    read_manifest,
)

SWEEP_DIR = "sweep"  # `sim sweep` writes under <out>/sweep/: its manifest, points and aggregates
# What a sweep varies by design: the arrival rate axis (its form per arrival kind).
SWEPT_KEYS = ("workload.arrival.rate", "workload.arrival.stages", "workload.arrival.users")

Difference = tuple[str, Any, Any]  # (dotted key, one side's value, the other's)


def run_folders(out_dir: Path) -> list[Path]:
    """The folders under `out_dir` that hold a run's records, in the order of their names: neither hidden
    (a run's temporary folder) nor a name no policy's records take (the sweep's, the report's charts)."""
    if not out_dir.is_dir():
        return []
    return [
        p
        for p in sorted(out_dir.iterdir())
        if p.is_dir() and not p.name.startswith(".") and p.name not in RESERVED_NAMES and is_run_folder(p)
    ]


def other_scenario_runs(out_dir: Path, manifest: dict[str, Any]) -> dict[str, list[Difference]]:
    """Run folders under `out_dir` whose scenario differs from `manifest`'s: folder name -> differences
    (`manifest_differences`, the comparison by which `sim report` refuses to set runs side by side)."""
    found: dict[str, list[Difference]] = {}
    for sub in run_folders(out_dir):
        other = read_manifest(sub)
        if other is None:
            diff = [(MANIFEST, "absent (an older run)", "present")]
        else:
            diff = manifest_differences(other, manifest)
        if diff:
            found[sub.name] = diff
    return found


def read_sweep_scenario(out_dir: Path) -> Scenario | None:
    """The scenario the sweep under `out_dir` ran (from its manifest, validated); None without a manifest
    or a scenario in it. Raises SimError for a manifest that cannot be read."""
    path = out_dir / SWEEP_DIR / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SimError(f"{path}: cannot read JSON: {err}") from None
    if not isinstance(data, dict):
        raise SimError(f"{path}: expected a JSON object")
    raw = data.get("scenario")
    return validate_scenario(raw, str(path)) if isinstance(raw, dict) else None


def sweep_differences(sweep: Scenario, runs: Scenario) -> list[Difference]:
    """What differs between a sweep's scenario and the runs' beyond the keys the sweep varies (its rate
    axis and its `params`): `(dotted key, value in the sweep, value in the runs)`."""
    varied = set(SWEPT_KEYS) | set((sweep.sweep or {}).get("params", {}))
    found = differences(compared_scenario(sweep), compared_scenario(runs))
    return [d for d in found if d[0] not in varied]
