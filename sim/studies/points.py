"""Sweep points: one scenario per (policy, rate, parameters, replication), run, written and read back."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sim.config.scenario import Scenario, apply_overrides, validate_scenario
from sim.io.errors import SimError
from sim.io.outputs import atomic_write
from sim.records.columns import LATENCY_METRICS
from sim.studies.run import run_policy

LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")


# The point-file contract (one row per file); the report reads exactly these columns.
POINT_SCHEMA: dict[str, Any] = {
    "point_key": pl.String, "policy": pl.String, "scheduler": pl.String, "rate": pl.Float64,
    "replication": pl.Int64, "seed_entropy": pl.String, "spawn_key": pl.List(pl.Int64), "params": pl.String,
    "arrived": pl.Int64, "finished": pl.Int64, "rejected": pl.Int64, "in_flight": pl.Int64,
    "overloaded": pl.Boolean, "requests_per_s": pl.Float64, "output_tokens_per_s": pl.Float64,
    "total_tokens_per_s": pl.Float64, "goodput_per_s": pl.Float64, "slo_attainment": pl.Float64,
    **{f"{m}_{s}": pl.Float64 for m in LATENCY_METRICS for s in LATENCY_STATS},
    "mean_batch_size": pl.Float64, "mean_kv_utilization": pl.Float64, "preemptions": pl.Int64,
    "prefix_cache_hit_rate": pl.Float64,
}  # fmt: skip


def _params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def point_key(policy: str, rate: float | None, params: dict[str, Any], replication: int) -> str:
    """The file-name rule: `<policy>[__rate=<repr>][__params=<hash>]__rep=<n>` (points/<key>.parquet)."""
    parts = ["".join(c if c.isalnum() or c in "_.-" else "-" for c in policy)]
    if rate is not None:
        parts.append(f"rate={float(rate)!r}")
    if params:
        parts.append("params=" + hashlib.sha256(_params_json(params).encode()).hexdigest()[:12])
    parts.append(f"rep={replication}")
    return "__".join(parts)


def point_path(points_dir: Path, key: str) -> Path:
    return points_dir / f"{key}.parquet"


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The metric columns of a point row, from a run's `summary.json` mapping."""
    req, thr, lat, steps = summary["requests"], summary["throughput"], summary["latency"], summary["steps"]
    out: dict[str, Any] = {k: req[k] for k in ("arrived", "finished", "rejected", "in_flight")}
    out["overloaded"] = bool(summary["overloaded"])
    out.update({k: thr[k] for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s")})
    out["goodput_per_s"] = summary["goodput_per_s"]
    out["slo_attainment"] = summary["slo_attainment"]
    for metric in LATENCY_METRICS:
        for stat in LATENCY_STATS:
            out[f"{metric}_{stat}"] = lat[metric][stat]
    out["mean_batch_size"] = steps["mean_batch_size"]
    out["mean_kv_utilization"] = steps["mean_kv_utilization"]
    out["preemptions"] = steps["preemptions"]
    out["prefix_cache_hit_rate"] = summary["prefix_cache_hit_rate"]
    return out


def apply_rate(raw: dict[str, Any], scenario: Scenario, rate: float, source: str) -> dict[str, Any]:
    """Set the swept rate on a raw scenario mapping (see the module docstring for each arrival kind)."""
    arrival = scenario.workload.arrival
    kind = arrival.kind
    if kind in ("poisson", "gamma", "deterministic"):
        return apply_overrides(raw, {"workload.arrival.rate": rate}, source)
    if kind == "staged":
        stages = [list(s) for s in raw["workload"]["arrival"]["stages"]]
        total = sum(d for _, d in stages)
        mean = sum(r * d for r, d in stages) / total
        if mean <= 0:
            raise SimError(
                f"{source}: sweep.rates: the staged arrival has a zero mean rate; nothing to scale"
            )
        scaled = [[r * rate / mean, d] for r, d in stages]
        return apply_overrides(raw, {"workload.arrival.stages": scaled}, source)
    if kind == "closed_loop":
        if rate != int(rate):
            raise SimError(f"{source}: sweep.rates: closed_loop sweeps users; {rate:g} is not a whole number")
        return apply_overrides(raw, {"workload.arrival.users": int(rate)}, source)
    raise SimError(
        f"{source}: sweep.rates: a {kind} arrival has no rate; sweep its parameters via sweep.params"
    )


def rate_key(scenario: Scenario) -> str:
    """The dotted key the rate axis writes (for clash checks and messages)."""
    kind = scenario.workload.arrival.kind
    return {"staged": "workload.arrival.stages", "closed_loop": "workload.arrival.users"}.get(
        kind, "workload.arrival.rate"
    )


def point_scenario(raw: dict[str, Any], rate: float | None, params: dict[str, Any], source: str) -> Scenario:
    """The validated scenario of one grid point: `params` first, then the rate."""
    data = apply_overrides(raw, params, source)
    scenario = validate_scenario(data, source)
    if rate is None:
        return scenario
    return validate_scenario(apply_rate(data, scenario, rate, source), source)


@dataclass(frozen=True, slots=True)
class Task:
    """Everything a worker needs to run one point (picklable)."""

    raw: dict[str, Any]
    source: str
    base_dir: str
    policy: str
    rate: float | None
    params: dict[str, Any]
    replication: int
    seed: np.random.SeedSequence

    @property
    def key(self) -> str:
        return point_key(self.policy, self.rate, self.params, self.replication)


def run_point(task: Task) -> dict[str, Any]:
    """Run one point and return its row (the worker function; writes nothing)."""
    scenario = point_scenario(task.raw, task.rate, task.params, task.source)
    result = run_policy(scenario, task.policy, Path(task.base_dir), seed=task.seed)
    return {
        "point_key": task.key,
        "policy": task.policy,
        "scheduler": result.summary["scheduler"],
        "rate": task.rate,
        "replication": task.replication,
        "seed_entropy": str(task.seed.entropy),
        "spawn_key": list(task.seed.spawn_key),
        "params": _params_json(task.params),
        **flatten_summary(result.summary),
    }


def point_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=POINT_SCHEMA)


def write_point(points_dir: Path, row: dict[str, Any]) -> Path:
    path = point_path(points_dir, row["point_key"])
    atomic_write(path, lambda p: point_frame([row]).write_parquet(p))
    return path


def read_point(path: Path, key: str | None = None) -> dict[str, Any] | None:
    """A point file's row, or None when the file is damaged (torn, truncated) or is not point `key`."""
    try:
        frame = pl.read_parquet(path)
    except Exception:  # polars raises several error types for a damaged file
        return None
    if frame.height != 1 or set(POINT_SCHEMA) - set(frame.columns):
        return None
    row = frame.row(0, named=True)
    return row if key is None or row["point_key"] == key else None
