"""Overload: whether requests pile up over a run, from arrival and completion times alone (numpy).

`backlog_trend` is the test `summary.json` reports as `overload_test`; the README ("Throughput window and
overload") states the rule.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from sim.records.columns import QUEUE_FULL, REJECTED

# Overload: the trend of the delay requests meet over the arrival period after its first `BACKLOG_WARMUP`
# (the backlog filling to its level). The delay of the i-th arrival is the i-th completion's time minus its
# arrival time (the horizontal distance between the cumulative arrival and completion curves), so that a
# step in the arrival rate, which moves the backlog to another level, does not read as growth.
BACKLOG_WARMUP = 0.25
BACKLOG_MIN_ARRIVALS = 8  # fewer arrivals (or matched completions) in the span: no verdict from them
RISE_Z = 2.0  # the rise must exceed RISE_Z standard deviations of the difference of two fluctuations
MIN_RISE_S = 1e-6  # a rise below a microsecond is rounding, not growth (delays that do not fluctuate at all)


@dataclass(frozen=True, slots=True)
class BacklogTrend:
    """How requests fared over `[start_s, end_s]`, the arrival period after its warm-up: arrival and
    completion rates there, the share of its arrivals served by the end of the run, and the straight line
    fitted to their delays (`delay_start_s` at the span's start, rising by `delay_rise_s`, with
    `delay_fluctuation_s` the standard deviation about the line; None without enough served arrivals)."""

    start_s: float
    end_s: float
    arrival_rate: float
    completion_rate: float
    served_fraction: float
    delay_start_s: float | None
    delay_rise_s: float | None
    delay_fluctuation_s: float | None

    @property
    def overloaded(self) -> bool:
        """Requests pile up: most arrivals of the span were never served, or the delay rose steadily, by
        more than RISE_Z standard deviations of the difference of two independent fluctuations
        (RISE_Z·√2·fluctuation). A stable system's delay fluctuates about its level, or moves to another
        level when the load steps."""
        if self.served_fraction < 0.5:
            return True
        if self.delay_rise_s is None or self.delay_start_s is None or self.delay_fluctuation_s is None:
            return False
        rise = self.delay_rise_s
        return rise > MIN_RISE_S and rise > RISE_Z * math.sqrt(2.0) * self.delay_fluctuation_s

    def as_dict(self) -> dict[str, float | None]:
        return {
            "from_s": self.start_s,
            "to_s": self.end_s,
            "arrival_rate": self.arrival_rate,
            "completion_rate": self.completion_rate,
            "served_fraction": self.served_fraction,
            "delay_start_s": self.delay_start_s,
            "delay_rise_s": self.delay_rise_s,
            "delay_fluctuation_s": self.delay_fluctuation_s,
        }


def backlog_inputs(
    arrival: np.ndarray, finished_at: np.ndarray, rejected: np.ndarray, turned_away: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times, service completion times) of the requests the overload test counts: a request
    rejected because it can never run is left out; one turned away by admission control (queue full) counts
    as never served, like one still in flight (completion at infinity)."""
    keep = ~rejected | turned_away
    done = np.where(np.isnan(finished_at) | turned_away, np.inf, finished_at)
    return arrival[keep], done[keep]


def backlog_trend(
    arrival: np.ndarray, done_at: np.ndarray, rate_steps: tuple[float, ...] = ()
) -> BacklogTrend | None:
    """How requests fared over the arrival period (first to last arrival) after its first `BACKLOG_WARMUP`,
    whatever happens after it (a drain, or the horizon): None when that span has fewer than
    `BACKLOG_MIN_ARRIVALS` arrivals (all arrived at once, or too few to judge).

    The i-th arrival (in time order) is matched with the i-th completion: their distance is the delay a
    first-come-first-served system would give it, and an overloaded system's grows by (1 - service rate /
    arrival rate) seconds per second, while a stable one's fluctuates about its level. Arrivals past the
    last completion were not served by the end of the run.

    `rate_steps` are the times at which the offered rate changes (staged arrivals). A higher rate raises
    a stable system's delay to another level too (larger batches, slower steps), which a line fitted across
    the step would read as growth, so each stretch of constant rate is judged on its own, after its own
    warm-up: the run is overloaded when any stretch is, and the figures are that stretch's (else the last's).
    """
    if len(arrival) == 0:
        return None
    arrivals = np.sort(arrival)
    done = np.sort(done_at)
    first, last = float(arrivals[0]), float(arrivals[-1])
    inner = [t for t in sorted(rate_steps) if first < t < last]
    if not inner:
        return _trend(arrivals, done, first, last)
    bounds = [first, *inner, last]
    trends = [_trend(arrivals, done, a, b) for a, b in itertools.pairwise(bounds)]
    judged = [t for t in trends if t is not None]
    if not judged:
        return None
    return next((t for t in judged if t.overloaded), judged[-1])


def _trend(arrivals: np.ndarray, done: np.ndarray, first: float, last: float) -> BacklogTrend | None:
    """`backlog_trend` over the arrivals in [first, last] (sorted arrays; the i-th arrival of the whole run
    matched with its i-th completion)."""
    if last <= first:
        return None
    served_total = int(np.searchsorted(done, np.inf, side="left"))  # finite completions
    start = first + (last - first) * BACKLOG_WARMUP
    lo = int(np.searchsorted(arrivals, start, side="left"))
    hi = int(np.searchsorted(arrivals, last, side="right"))
    count = hi - lo
    if count < BACKLOG_MIN_ARRIVALS:
        return None
    span = last - start
    completed = int(np.searchsorted(done[:served_total], last, side="right")) - int(
        np.searchsorted(done[:served_total], start, side="left")
    )
    matched = max(0, min(served_total, hi) - lo)
    delay_start = delay_rise = fluctuation = None
    if matched >= BACKLOG_MIN_ARRIVALS:
        x = arrivals[lo : lo + matched]
        y = done[lo : lo + matched] - x
        dx = x - x.mean()
        slope = float(np.dot(dx, y - y.mean()) / np.dot(dx, dx)) if np.dot(dx, dx) > 0 else 0.0
        resid = y - y.mean() - slope * dx
        fluctuation = math.sqrt(float(np.dot(resid, resid)) / (matched - 2))
        delay_start = float(y.mean() + slope * (start - x.mean()))
        delay_rise = slope * (float(x[-1]) - start)
    return BacklogTrend(
        start, last, count / span, completed / span, matched / count, delay_start, delay_rise, fluctuation
    )


def requests_backlog_trend(requests: pl.DataFrame, rate_steps: tuple[float, ...] = ()) -> BacklogTrend | None:
    """`backlog_trend` of a requests frame."""
    state = requests["state"].cast(pl.String)
    rejected = (state == REJECTED).to_numpy()
    turned_away = (requests["reject_reason"] == QUEUE_FULL).fill_null(False).to_numpy()
    finished_at = requests["finished_at"].cast(pl.Float64).fill_null(np.nan).to_numpy()
    arrival = requests["arrival"].to_numpy()
    return backlog_trend(*backlog_inputs(arrival, finished_at, rejected, turned_away), rate_steps)
