"""Sweep results for the report: means with confidence intervals per rate, and each policy's capacity.

Computed from the point files alone (with `sim.records.stats`), so the report does not need
`aggregate.parquet`.
A policy swept over several knob settings becomes several series ("policy knob=value").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import polars as pl

from sim.records import stats


def params_label(raw: object) -> str:
    """`{"max_num_seqs": 8}` (JSON text or a mapping) as `max_num_seqs=8`."""
    params = raw
    if isinstance(raw, str):
        try:
            params = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            return raw
    if not isinstance(params, dict):
        return "" if params is None else str(params)
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


def series_names(frame: pl.DataFrame) -> dict[tuple[str, str], str]:
    """(policy, params label) -> series name: the policy, plus its knobs if it has several settings."""
    pairs = sorted({(str(p), params_label(q)) for p, q in zip(frame["policy"], frame["params"], strict=True)})
    settings: dict[str, int] = {}
    for policy, _ in pairs:
        settings[policy] = settings.get(policy, 0) + 1
    return {(p, q): f"{p} {q}" if settings[p] > 1 and q else p for p, q in pairs}


def with_series(points: pl.DataFrame) -> pl.DataFrame:
    """Add a `series` column (see `series_names`)."""
    if "params" not in points.columns:
        points = points.with_columns(params=pl.lit(None, dtype=pl.String))
    names = series_names(points)
    return points.with_columns(
        series=pl.Series(
            [
                names[(str(p), params_label(q))]
                for p, q in zip(points["policy"], points["params"], strict=True)
            ],
            dtype=pl.String,
        )
    )


def summarize_points(points: pl.DataFrame, metrics: list[str]) -> pl.DataFrame:
    """Long frame: series, policy, rate, params, metric, mean, ci_low, ci_high, n (`stats.aggregate`)."""
    group = {c: pl.lit(None, dtype=pl.String) for c in stats.GROUP_COLUMNS if c not in points.columns}
    present = [m for m in metrics if m in points.columns]
    frame = points.with_columns(**group).select(*stats.GROUP_COLUMNS, *present)
    agg = stats.aggregate(frame).drop_nulls("mean")
    return with_series(agg).sort("series", "metric", "rate")


def log_bands(means: pl.DataFrame) -> pl.DataFrame:
    """Confidence bands for a log axis: the t-interval of log(mean) by the delta method.

    The linear interval `mean ± h` (h = t·s/√n) becomes `mean ×/÷ exp(h / mean)`: the same width to first
    order, symmetric on a log axis, and never at or below zero, where a linear lower bound would be clipped
    to an arbitrary floor. Rows whose mean is not positive keep their interval.
    """
    half = pl.col("ci_high") - pl.col("mean")
    factor = (half / pl.col("mean")).exp()
    positive = pl.col("mean") > 0
    return means.with_columns(
        ci_low=pl.when(positive).then(pl.col("mean") / factor).otherwise(pl.col("ci_low")),
        ci_high=pl.when(positive).then(pl.col("mean") * factor).otherwise(pl.col("ci_high")),
    )


@dataclass(frozen=True, slots=True)
class CapacityMark:
    """The highest arrival rate a series holds under the SLO, as the report shows it.

    bound: within (a failing rate lies above), at_least (every rate tried passes), below (even the
    lowest fails; `rate` is that failing rate), unknown (no figure).
    """

    series: str
    rate: float | None
    bound: str = "within"
    text: str = ""

    @property
    def label(self) -> str:
        if self.text:
            return self.text
        if self.rate is None:
            return "n/a"
        prefix = {"at_least": "≥ ", "below": "< "}.get(self.bound, "")
        return f"{prefix}{self.rate:.4g} req/s"


_BOUNDS = {"found": "within", "above_grid": "at_least", "below_grid": "below"}


def _mark(series: str, cap: stats.Capacity | dict[str, Any], text: str = "") -> CapacityMark:
    get = cap.get if isinstance(cap, dict) else lambda k, d=None: getattr(cap, k, d)
    bound = _BOUNDS.get(str(get("status")), "unknown")
    rate = get("first_fail") if bound == "below" else get("capacity")
    if not isinstance(rate, int | float) or not math.isfinite(rate):
        return CapacityMark(series, None, "unknown", text)
    return CapacityMark(series, float(rate), bound, text)


def capacity_from_grid(points: pl.DataFrame, slo: stats.SloBounds) -> list[CapacityMark]:
    """Per series, the grid bracket of `stats.grid_capacity` with the sweep's pass rule `stats.meets_slo`."""
    if all(v is None for v in (slo.ttft_s, slo.tpot_s, slo.e2e_s)):
        return []
    marks = []
    for (series,), group in with_series(points).group_by("series", maintain_order=True):
        results = {
            float(rate): stats.meets_slo(rows.to_dicts(), slo)
            for (rate,), rows in group.group_by("rate")
            if rate is not None
        }
        if results:
            marks.append(_mark(str(series), stats.grid_capacity(results)))
    return sorted(marks, key=lambda m: m.series)


def capacity_from_json(data: dict[str, Any]) -> list[CapacityMark]:
    """Read the `capacities` list of the sweep's `capacity.json` (entries it cannot read are left out)."""
    entries = [e for e in data.get("capacities", []) if isinstance(e, dict) and "policy" in e]
    frame = pl.DataFrame(
        {
            "policy": [str(e["policy"]) for e in entries],
            "params": [params_label(e.get("params")) for e in entries],
        },
        schema={"policy": pl.String, "params": pl.String},
    )
    names = series_names(frame)
    marks = [
        _mark(names[(str(e["policy"]), params_label(e.get("params")))], e, str(e.get("label") or ""))
        for e in entries
    ]
    return sorted(marks, key=lambda m: m.series)
