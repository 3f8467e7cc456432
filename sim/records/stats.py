"""Statistics over sweep points: t-intervals across replications and the capacity under an SLO.

`mean_ci` is the Student-t confidence interval of a mean over replications; applied to each summary metric
(including percentiles such as `ttft_p99`) it gives the percentile CIs of `aggregate`.

Capacity: a rate *passes* when every replication at it finished something, none is overloaded, the
mean over replications of p99 TTFT, p99 TPOT (and p99 E2E) meets the `[slo]` bounds that are set, and the
rate is not above the throughput plateau (`plateau`): no rate above what the saturated system delivers is
sustainable, even where a short run cannot tell slight overload from noise. The capacity is the last
passing grid rate below the first failing one, refined by bisection (`bisect`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import polars as pl

# Point columns that identify a group of replications, and columns that are not metrics.
GROUP_COLUMNS = ("policy", "scheduler", "rate", "params")
NON_METRICS = ("point_key", "replication", "seed_entropy", "spawn_key", *GROUP_COLUMNS)


def mean_ci(
    values: Sequence[float | None], confidence: float = 0.95
) -> tuple[float | None, float | None, float | None, int]:
    """`(mean, low, high, n)` of the non-null values: a two-sided Student-t interval (ci = mean if n = 1)."""
    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = len(arr)
    if n == 0:
        return None, None, None, 0
    mean = float(arr.mean())
    if n == 1:
        return mean, mean, mean, 1
    from scipy import stats as sps  # imported here: sweep workers never need it

    sem = float(arr.std(ddof=1)) / math.sqrt(n)
    half = float(sps.t.ppf(0.5 + confidence / 2, df=n - 1)) * sem
    return mean, mean - half, mean + half, n


def aggregate(points: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """Long frame: one row per (policy, scheduler, rate, params, metric) with `mean, ci_low, ci_high, n`."""
    metrics = [c for c in points.columns if c not in NON_METRICS]
    rows: list[dict[str, Any]] = []
    for key, group in points.group_by(list(GROUP_COLUMNS), maintain_order=True):
        base = dict(zip(GROUP_COLUMNS, key, strict=True))
        for metric in metrics:
            values = group[metric].cast(pl.Float64).to_list()
            mean, low, high, n = mean_ci(values, confidence)
            rows.append({**base, "metric": metric, "mean": mean, "ci_low": low, "ci_high": high, "n": n})
    schema = {
        "policy": pl.String, "scheduler": pl.String, "rate": pl.Float64, "params": pl.String,
        "metric": pl.String, "mean": pl.Float64, "ci_low": pl.Float64, "ci_high": pl.Float64, "n": pl.Int64,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema).sort(["policy", "params", "rate", "metric"], nulls_last=True)


# --- capacity -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SloBounds:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


def meets_slo(rows: Sequence[Mapping[str, Any]], slo: SloBounds) -> bool:
    """Whether the replications `rows` (flattened point rows) at one rate pass the SLO."""
    if not rows or any(r["overloaded"] or not r["finished"] for r in rows):
        return False
    for metric, bound in (("ttft_p99", slo.ttft_s), ("tpot_p99", slo.tpot_s), ("e2e_p99", slo.e2e_s)):
        if bound is None:
            continue
        values = [r[metric] for r in rows]
        if metric == "tpot_p99":  # single-token outputs have no TPOT
            values = [v for v in values if v is not None]
            if not values:
                continue
        if any(v is None for v in values) or float(np.mean(values)) > bound:
            return False
    return True


def plateau(rows_by_rate: Mapping[float, Sequence[Mapping[str, Any]]]) -> float | None:
    """The throughput plateau (requests per second): the mean over replications of `requests_per_s` at the
    lowest rate where every replication is overloaded, the saturated rate nearest the knee; None when no rate
    is (the sweep never saturated). Further past the knee a finite run finishes fewer requests than the
    system serves (each one waits longer, and more of them are still running when the run ends), so those
    rates' throughputs understate the plateau: the lowest of them would cap rates the system sustains."""
    saturated = sorted(r for r, rows in rows_by_rate.items() if rows and all(x["overloaded"] for x in rows))
    if not saturated:
        return None
    return float(np.mean([r["requests_per_s"] for r in rows_by_rate[saturated[0]]]))


def sustainable(
    rate: float, rows: Sequence[Mapping[str, Any]], slo: SloBounds, ceiling: float | None
) -> bool:
    """Whether `rate` passes: `meets_slo` and not above `ceiling` (the `plateau`, when known)."""
    return meets_slo(rows, slo) and (ceiling is None or rate <= ceiling)


Status = Literal["found", "above_grid", "below_grid"]


@dataclass(slots=True)
class Capacity:
    """`capacity` is the highest passing rate found (None when every grid rate fails)."""

    status: Status
    capacity: float | None
    last_pass: float | None
    first_fail: float | None
    grid: list[tuple[float, bool]]
    refined: list[tuple[float, bool]] = field(default_factory=list)

    def label(self, unit: str = "req/s") -> str:
        if self.status == "above_grid":
            return f"≥ {self.last_pass:g} {unit}"
        if self.status == "below_grid":
            return f"< {self.first_fail:g} {unit}"
        return f"{self.capacity:.4g} {unit}"

    def as_dict(self, unit: str = "req/s") -> dict[str, Any]:
        out = asdict(self)
        out["grid"] = [{"rate": r, "pass": p} for r, p in self.grid]
        out["refined"] = [{"rate": r, "pass": p} for r, p in self.refined]
        out["label"] = self.label(unit)
        return out


def grid_capacity(results: Mapping[float, bool]) -> Capacity:
    """Bracket the capacity on the grid: the last pass below the first failure."""
    grid = sorted(results.items())
    fails = [r for r, ok in grid if not ok]
    if not fails:
        return Capacity("above_grid", grid[-1][0], grid[-1][0], None, grid)
    first_fail = fails[0]
    passes = [r for r, ok in grid if ok and r < first_fail]
    if not passes:
        return Capacity("below_grid", None, None, first_fail, grid)
    return Capacity("found", passes[-1], passes[-1], first_fail, grid)


def bisect_midpoint(cap: Capacity, integer: bool = False) -> float | None:
    """The next rate to try for a `found` bracket, or None when it cannot be narrowed further."""
    if cap.status != "found" or cap.first_fail is None or cap.capacity is None:
        return None
    lo = cap.capacity
    hi = min([cap.first_fail, *[r for r, ok in cap.refined if not ok]])
    if integer:
        mid = float((int(lo) + int(hi)) // 2)
        return None if mid <= lo else mid
    return (lo + hi) / 2


def record(cap: Capacity, rate: float, ok: bool) -> None:
    """Fold a refinement run's outcome into `cap` (a pass raises the capacity)."""
    cap.refined.append((rate, ok))
    if ok and cap.capacity is not None and rate > cap.capacity:
        cap.capacity = rate


def bisect(
    results: Mapping[float, bool], passes: Callable[[float], bool], steps: int, integer: bool = False
) -> Capacity:
    """Grid bracket, then `steps` bisection runs of `passes(rate)` (what `sim sweep` does, in sequence)."""
    cap = grid_capacity(results)
    for _ in range(steps):
        mid = bisect_midpoint(cap, integer)
        if mid is None:
            break
        record(cap, mid, passes(mid))
    return cap
