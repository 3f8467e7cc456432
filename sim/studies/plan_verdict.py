"""How `sim plan` judges one configuration: the requests a run is judged on, and the verdict over its
replications.

Judged requests. The requests that arrived in the measurement window (`window_s`, as every summary defines
it) after its warm-up, the first `BACKLOG_WARMUP` of the arrival span (the overload test's, so a run that
started empty does not flatter the tail). Among them:
- a finished request is good when it meets every [slo] bound;
- a rejected request (never served) counts against the configuration;
- a request still in flight at the horizon counts against it only when the run is overloaded
  (`records.overload`), or when it has already missed a bound (no first token after ttft_s, a TTFT past
  ttft_s, or more than e2e_s since it arrived); otherwise it is the run's tail, not a failure, and is left
  out.
Goodput is the planned rate x the share of judged requests that are good, so neither the tail in flight at
the horizon nor a drain after it reads as requests that missed the SLO.

Verdict. Each configuration runs `replications` independent seeds (the scenario's own first, so `sim run`
with the configuration's `--set` reproduces it). The judged metric of each replication is its judged
attainment (`--rule goodput`, to be at least `attainment`) or the largest p99 latency over its bound
(`--rule p99`, to be at most 1). Across replications, a Student t interval at `CONFIDENCE` on the metric's
mean gives: *meets* when the whole interval is on the good side of the threshold, *fails* when the whole of
it is on the bad side, *too close to call* otherwise. A replication that is overloaded fails outright; when
some replications are overloaded and others are not, the configuration is too close to call.

Escalation (`settled`). A clear-cut verdict, the interval wholly on one side and the seeds agreeing on
overload, is final at the screening horizon: most configurations are settled there, cheaply. One too close
to call on its interval alone gets `REPLICATION_STEP` more seeds at a time, up to `max_replications`, while
the screening runs can still tell. One whose seeds split on overload (more short seeds cannot mend that:
an overloaded seed keeps the verdict too close), or still too close after `max_replications`, is at the
boundary, and is settled as a deployment would be checked: `SETTLE_SEEDS` seeds (at least `replications`;
the screening seeds' numbers, the scenario's own first) at the longest horizon, `max_horizon_s` (the
overload test's power grows with the run, and a boundary fleet's backlog shows only on long runs), and it
*meets* only when every one of those seeds passes on its own (not overloaded, its metric on the good side
of the threshold), else it *fails*. That is the brute force's standard (`benchmarks/plan_brute_force.py`:
every one of 5 seeds of 600 s runs), so the planner and a brute force over the same grid agree on every
configuration settled at the boundary. With `settle_seeds` 0 there is no settling, and a configuration still
too close after its seeds is not an answer.

Horizon. A quantile q of a metric needs `TAIL_SAMPLES` requests beyond it in each replication, past the
warm-up: at least TAIL_SAMPLES / (1 - q) judged requests, q = 0.99 for `--rule p99` and q = attainment for
`--rule goodput`. A run at rate r therefore lasts at least that / r / (1 - BACKLOG_WARMUP) seconds; a shorter
`horizon.duration_s` is lengthened to it (and the override is part of the configuration's `--set`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from sim.records.columns import FINISHED, IN_FLIGHT, REJECTED
from sim.records.overload import BACKLOG_WARMUP
from sim.records.summary import Slo

CONFIDENCE = 0.95
DEFAULT_REPLICATIONS = 3
DEFAULT_MAX_REPLICATIONS = 9
REPLICATION_STEP = 3
DEFAULT_MAX_HORIZON_S = 600.0  # the horizon a configuration at the boundary is settled on
SETTLE_SEEDS = 5  # seeds a configuration at the boundary is settled on, every one to pass
TAIL_SAMPLES = 10
P99 = 0.99

MEETS, FAILS, TOO_CLOSE = "meets", "fails", "too close to call"

JUDGED_FIGURES = (
    "judged", "judged_good", "judged_in_flight_counted", "judged_in_flight_left_out", "judged_attainment",
    "judged_ttft_p99", "judged_tpot_p99", "judged_e2e_p99",
)  # fmt: skip


def judged_figures(
    requests: pl.DataFrame | pl.LazyFrame, slo: Slo, horizon_s: float, overloaded: bool
) -> dict[str, Any]:
    """The judged requests' counts, attainment and p99 latencies (see the module docstring)."""
    frame = (
        requests.lazy()
        .select("state", "arrival", "first_token_at", "ttft", "tpot", "e2e")
        .with_columns(pl.col("state").cast(pl.String))
        .collect()
    )
    empty = {k: None for k in JUDGED_FIGURES} | {k: 0 for k in JUDGED_FIGURES[:4]}
    if frame.is_empty():
        return empty
    first, last = frame["arrival"].min(), frame["arrival"].max()
    start = float(first) + (float(last) - float(first)) * BACKLOG_WARMUP  # type: ignore[arg-type]
    frame = frame.filter(pl.col("arrival") >= start)
    state = pl.col("state")
    good = state == FINISHED
    if slo.ttft_s is not None:
        good &= pl.col("ttft") <= slo.ttft_s
    if slo.tpot_s is not None:
        good &= pl.col("tpot").fill_null(0.0) <= slo.tpot_s
    if slo.e2e_s is not None:
        good &= pl.col("e2e") <= slo.e2e_s
    elapsed = horizon_s - pl.col("arrival")
    missed = pl.lit(False)
    if slo.ttft_s is not None:
        missed |= (pl.col("first_token_at").is_null() & (elapsed > slo.ttft_s)) | (
            pl.col("first_token_at") - pl.col("arrival") > slo.ttft_s
        ).fill_null(False)
    if slo.e2e_s is not None:
        missed |= elapsed > slo.e2e_s
    flags = frame.select(
        good=good.fill_null(False),
        finished=state == FINISHED,
        rejected=state == REJECTED,
        in_flight=state == IN_FLIGHT,
        missed=(state == IN_FLIGHT) & missed,
    )
    n_good, n_finished, n_rejected, n_in_flight, n_missed = (int(flags[c].sum()) for c in flags.columns)
    counted = n_in_flight if overloaded else n_missed
    judged = n_finished + n_rejected + counted
    done = frame.filter(state == FINISHED)
    p99 = {m: _p99(done[m]) for m in ("ttft", "tpot", "e2e")}
    return {
        "judged": judged,
        "judged_good": n_good,
        "judged_in_flight_counted": counted,
        "judged_in_flight_left_out": n_in_flight - counted,
        "judged_attainment": n_good / judged if judged else None,
        **{f"judged_{m}_p99": v for m, v in p99.items()},
    }


def _p99(values: pl.Series) -> float | None:
    arr = values.drop_nulls().to_numpy()
    return float(np.quantile(arr, P99)) if arr.size else None


def replication_metric(figures: dict[str, Any], rule: str, slo: Slo) -> float | None:
    """The judged metric of one replication: attainment (goodput rule) or the largest p99 / bound (p99
    rule); None when nothing was judged."""
    if rule == "goodput":
        return figures["judged_attainment"]
    if not figures["judged"]:
        return None
    ratios = []
    for key, bound in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s), ("e2e", slo.e2e_s)):
        value = figures[f"judged_{key}_p99"]
        if bound is None:
            continue
        if value is None and key == "tpot" and figures["judged_ttft_p99"] is not None:
            continue  # requests finished, none with a TPOT: one-token outputs only
        if value is None:  # no judged request finished: nothing to judge the bound on
            return None
        ratios.append(value / bound)
    return max(ratios, default=0.0)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The verdict over a configuration's replications, with its interval on the judged metric."""

    verdict: str
    replications: int
    overloaded: int  # replications overloaded
    mean: float | None
    low: float | None
    high: float | None
    metric: str  # what the interval is on
    threshold: float

    settled: bool = False  # settled at the longest horizon, every seed to pass (`settled`)

    def as_row(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "replications": self.replications, "settled": self.settled,
            "replications_overloaded": self.overloaded, "metric": self.metric, "threshold": self.threshold,
            "metric_mean": self.mean, "ci_low": self.low, "ci_high": self.high,
        }  # fmt: skip


def interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the Student t interval at CONFIDENCE on the mean of `values` (a point for one)."""
    arr = np.asarray(values, float)
    mean = float(arr.mean())
    if arr.size < 2:
        return mean, mean, mean
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, arr.size - 1) * arr.std(ddof=1) / math.sqrt(arr.size))
    return mean, mean - half, mean + half


def verdict(figures: list[dict[str, Any]], rule: str, slo: Slo, attainment: float) -> Verdict:
    """The verdict over replications' figures (each with `overloaded`, `finished` and the judged figures)."""
    higher = rule == "goodput"
    threshold = attainment if higher else 1.0
    metric = "judged attainment" if higher else "max p99 / bound"
    n = len(figures)
    overloaded = sum(bool(f["overloaded"]) for f in figures)
    values = [replication_metric(f, rule, slo) for f in figures]
    clean = [
        v
        for v, f in zip(values, figures, strict=True)
        if v is not None and f["finished"] and not f["overloaded"]
    ]
    mean = low = high = None
    if clean:
        mean, low, high = interval(clean)
    if not clean:
        outcome = FAILS  # every replication overloaded, or none finished a request
    elif len(clean) < n:
        outcome = TOO_CLOSE
    else:
        assert low is not None and high is not None
        good_side = low >= threshold if higher else high <= threshold
        bad_side = high < threshold if higher else low > threshold
        outcome = MEETS if good_side else FAILS if bad_side else TOO_CLOSE
    return Verdict(outcome, n, overloaded, mean, low, high, metric, threshold)


def split_on_overload(judged: Verdict) -> bool:
    """Some seeds overloaded and some not: a verdict more seeds of the same horizon cannot settle."""
    return 0 < judged.overloaded < judged.replications


def settled(figures: list[dict[str, Any]], rule: str, slo: Slo, attainment: float) -> Verdict:
    """The verdict at the boundary (see the module docstring): *meets* when every replication passes on its
    own, else *fails*; the interval is the screening verdict's over the same figures."""
    screen = verdict(figures, rule, slo, attainment)
    each = (verdict([f], rule, slo, attainment).verdict == MEETS for f in figures)
    outcome = MEETS if figures and all(each) else FAILS
    return Verdict(outcome, screen.replications, screen.overloaded, screen.mean, screen.low, screen.high,
                   screen.metric, screen.threshold, settled=True)  # fmt: skip


def replication_seed(base_seed: int, replication: int) -> int:
    """The seed of a replication: the scenario's own for the first, then independent streams drawn from
    (seed, replication) by numpy's SeedSequence (within the scenario schema's 63-bit range)."""
    if replication == 0:
        return base_seed
    state = np.random.SeedSequence([base_seed, replication]).generate_state(1, np.uint64)[0]
    return int(state) >> 1


def tail_horizon(rule: str, attainment: float, rate: float, tail_samples: int = TAIL_SAMPLES) -> float:
    """The shortest arrival period (s) with `tail_samples` judged requests past the judged quantile."""
    q = P99 if rule == "p99" else attainment
    need = tail_samples / max(1.0 - q, 1e-9)
    return math.ceil(need / rate / (1.0 - BACKLOG_WARMUP))
