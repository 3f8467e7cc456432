"""Sweep results for the report: means with confidence intervals per rate, and each policy's capacity.

Computed from the point files alone, so the report does not depend on `aggregate.parquet`. A policy swept
over several knob settings becomes several series ("policy {knobs}").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

CONFIDENCE = 0.95
ATTAINMENT_TARGET = 0.99  # a rate is held when 99% of requests meet the SLO (p99 within the SLO)


def _params_label(raw: object) -> str:
    if not isinstance(raw, str) or not raw.strip():
        return ""
    try:
        params = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    if not isinstance(params, dict):
        return str(params)
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()) if k != "rate")


def with_series(points: pl.DataFrame) -> pl.DataFrame:
    """Add `series`: the policy name, plus its knobs when a policy was swept over several settings."""
    if "params" not in points.columns:
        return points.with_columns(series=pl.col("policy"))
    labelled = points.with_columns(
        _label=pl.col("params").map_elements(_params_label, return_dtype=pl.String).fill_null("")
    )
    multi = labelled.group_by("policy").agg(pl.col("_label").n_unique().alias("_k"))
    return (
        labelled.join(multi, on="policy")
        .with_columns(
            series=pl.when(pl.col("_k") > 1)
            .then(pl.concat_str(["policy", "_label"], separator=" "))
            .otherwise(pl.col("policy"))
        )
        .drop("_label", "_k")
    )


def summarize_points(points: pl.DataFrame, metrics: list[str]) -> pl.DataFrame:
    """Long frame: series, policy, rate, metric, mean, ci_low, ci_high, n (Student-t interval)."""
    present = [m for m in metrics if m in points.columns]
    long = (
        with_series(points)
        .select("series", "policy", "rate", *[pl.col(m).cast(pl.Float64) for m in present])
        .unpivot(index=["series", "policy", "rate"], on=present, variable_name="metric", value_name="value")
        .drop_nulls("value")
        .filter(pl.col("value").is_finite())
    )
    agg = long.group_by("series", "policy", "rate", "metric").agg(
        pl.col("value").mean().alias("mean"),
        pl.col("value").std().fill_null(0.0).alias("std"),
        pl.len().alias("n"),
    )
    dof = np.maximum(agg["n"].to_numpy() - 1, 1)
    tcrit = stats.t.ppf(0.5 + CONFIDENCE / 2, dof)
    half = np.where(
        agg["n"].to_numpy() > 1, tcrit * agg["std"].to_numpy() / np.sqrt(agg["n"].to_numpy()), 0.0
    )
    return (
        agg.with_columns(half=pl.Series(half))
        .with_columns(ci_low=pl.col("mean") - pl.col("half"), ci_high=pl.col("mean") + pl.col("half"))
        .drop("std", "half")
        .sort("series", "metric", "rate")
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    """The highest arrival rate a series holds under the SLO; `bound` says how exact that is.

    within: the next rate tried fails; at_least: every rate tried passes; below: even the lowest fails
    (`rate` is then that lowest rate); unknown: no figure.
    """

    series: str
    rate: float | None
    bound: str = "within"

    @property
    def label(self) -> str:
        if self.rate is None:
            return "n/a"
        prefix = {"at_least": "≥ ", "below": "< "}.get(self.bound, "")
        return f"{prefix}{self.rate:.3g} req/s"


def capacity_from_grid(points: pl.DataFrame) -> list[Capacity]:
    """Per series: the highest rate such that it and every lower rate keep mean SLO attainment at the
    target with no overloaded replication."""
    if "slo_attainment" not in points.columns:
        return []
    checks = ["slo_attainment"] + (["overloaded"] if "overloaded" in points.columns else [])
    frame = with_series(points).with_columns(
        pl.col("slo_attainment").cast(pl.Float64).fill_null(0.0),
        *([pl.col("overloaded").cast(pl.Float64).fill_null(0.0)] if "overloaded" in checks else []),
    )
    per_rate = frame.group_by("series", "rate").agg(
        pl.col("slo_attainment").mean().alias("attain"),
        (pl.col("overloaded").max() if "overloaded" in checks else pl.lit(0.0)).alias("over"),
    )
    out = []
    for (series,), group in per_rate.sort("rate").group_by("series", maintain_order=True):
        rates = group["rate"].to_list()
        ok = ((group["attain"] >= ATTAINMENT_TARGET) & (group["over"] == 0)).to_list()
        held = None
        for rate, good in zip(rates, ok, strict=True):
            if not good:
                break
            held = rate
        if held is None:
            out.append(Capacity(str(series), float(rates[0]), "below"))
        else:
            out.append(Capacity(str(series), float(held), "at_least" if all(ok) else "within"))
    return sorted(out, key=lambda c: c.series)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def capacity_from_json(data: dict[str, Any]) -> list[Capacity]:
    """Read `capacity.json`: {policy: rate} or {policy: {rate|capacity, bound}}, optionally under
    a "policies" key. Entries it cannot read are left out."""
    table = data.get("policies", data)
    if not isinstance(table, dict):
        return []
    out = []
    for policy, entry in table.items():
        if isinstance(entry, dict):
            rate = next(
                (_number(entry[k]) for k in ("rate", "capacity", "capacity_rate") if k in entry), None
            )
            bound = str(entry.get("bound") or "within")
            bound = {"lower": "at_least", "upper": "below", "exact": "within"}.get(bound, bound)
            out.append(Capacity(str(policy), rate, bound if rate is not None else "unknown"))
        elif _number(entry) is not None:
            out.append(Capacity(str(policy), _number(entry)))
    return sorted(out, key=lambda c: c.series)
