"""Confidence intervals against scipy, aggregation over replications, SLO checks and capacity bisection."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from sim.records import stats


@pytest.mark.parametrize("n", [2, 3, 7, 30])
def test_mean_ci_matches_scipy_t_interval(n: int) -> None:
    values = np.random.default_rng(n).normal(5.0, 2.0, n)
    mean, low, high, count = stats.mean_ci(list(values))
    lo, hi = sps.t.interval(0.95, df=n - 1, loc=values.mean(), scale=sps.sem(values))
    assert count == n
    assert mean == pytest.approx(values.mean())
    assert (low, high) == (pytest.approx(lo), pytest.approx(hi))


def test_mean_ci_other_confidence_and_degenerate_cases() -> None:
    values = [1.0, 2.0, 4.0, 8.0]
    lo, hi = sps.t.interval(0.9, df=3, loc=np.mean(values), scale=sps.sem(values))
    assert stats.mean_ci(values, 0.9)[1:3] == (pytest.approx(lo), pytest.approx(hi))
    assert stats.mean_ci([3.0]) == (3.0, 3.0, 3.0, 1)
    assert stats.mean_ci([None, 2.0, math.nan]) == (2.0, 2.0, 2.0, 1)
    assert stats.mean_ci([]) == (None, None, None, 0)
    assert stats.mean_ci([2.0, 2.0, 2.0]) == (2.0, 2.0, 2.0, 3)


def test_aggregate_groups_replications_per_policy_rate_and_params() -> None:
    points = pl.DataFrame(
        {
            "point_key": ["a", "b", "c", "d"],
            "policy": ["p", "p", "p", "q"],
            "scheduler": ["s", "s", "s", "s"],
            "rate": [1.0, 1.0, 2.0, 1.0],
            "replication": [0, 1, 0, 0],
            "seed_entropy": ["7"] * 4,
            "spawn_key": [[0], [1], [0], [0]],
            "params": ["{}"] * 4,
            "ttft_p99": [1.0, 3.0, 5.0, None],
            "overloaded": [False, True, False, False],
        }
    )
    agg = stats.aggregate(points)
    assert set(agg["metric"]) == {"ttft_p99", "overloaded"}
    row = agg.filter(policy="p", rate=1.0, metric="ttft_p99").row(0, named=True)
    lo, hi = sps.t.interval(0.95, df=1, loc=2.0, scale=sps.sem([1.0, 3.0]))
    assert (row["mean"], row["n"]) == (2.0, 2)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(lo), pytest.approx(hi))
    assert agg.filter(policy="p", rate=1.0, metric="overloaded")["mean"].item() == 0.5
    single = agg.filter(policy="p", rate=2.0, metric="ttft_p99").row(0, named=True)
    assert single["ci_low"] == single["ci_high"] == single["mean"] == 5.0
    assert agg.filter(policy="q", metric="ttft_p99")["n"].item() == 0


def _row(ttft: float | None = 0.5, tpot: float | None = 0.05, overloaded: bool = False, finished: int = 10):
    return {
        "ttft_p99": ttft,
        "tpot_p99": tpot,
        "e2e_p99": 3.0,
        "overloaded": overloaded,
        "finished": finished,
    }


def test_meets_slo() -> None:
    slo = stats.SloBounds(ttft_s=1.0, tpot_s=0.1)
    assert stats.meets_slo([_row(), _row()], slo)
    assert not stats.meets_slo([_row(), _row(overloaded=True)], slo)
    assert not stats.meets_slo([_row(ttft=1.5), _row(ttft=0.9)], slo)  # mean 1.2 > 1.0
    assert stats.meets_slo([_row(ttft=1.05), _row(ttft=0.9)], slo)  # mean 0.975
    assert not stats.meets_slo([_row(ttft=None)], slo)
    assert not stats.meets_slo([_row(finished=0)], slo)
    assert stats.meets_slo([_row(tpot=None)], slo)  # one-token outputs have no TPOT
    assert not stats.meets_slo([_row()], stats.SloBounds(e2e_s=2.0))
    assert not stats.meets_slo([], slo)


def test_bisection_converges_on_a_monotone_threshold() -> None:
    threshold = 3.7
    calls: list[float] = []

    def passes(rate: float) -> bool:
        calls.append(rate)
        return rate <= threshold

    grid = {r: passes(r) for r in (1.0, 2.0, 4.0, 8.0)}
    calls.clear()
    cap = stats.bisect(grid, passes, steps=10)
    assert cap.status == "found" and (cap.last_pass, cap.first_fail) == (2.0, 4.0)
    assert len(calls) == 10 and all(2.0 < r < 4.0 for r in calls)
    assert cap.capacity is not None and threshold - 2.0 / 2**10 <= cap.capacity <= threshold
    assert cap.label().endswith("req/s")


def test_bisection_on_integers_finds_the_exact_user_count() -> None:
    cap = stats.bisect(
        {4.0: True, 8.0: True, 16.0: False, 32.0: False}, lambda u: u <= 13, steps=10, integer=True
    )
    assert cap.capacity == 13.0
    assert len(cap.refined) == 3  # 12, 14, 13, then the bracket is closed


def test_capacity_outside_the_grid() -> None:
    above = stats.bisect({1.0: True, 2.0: True}, lambda r: True, steps=3)
    assert above.status == "above_grid" and above.refined == [] and above.label() == "≥ 2 req/s"
    below = stats.bisect({1.0: False, 2.0: False}, lambda r: True, steps=3)
    assert below.status == "below_grid" and below.capacity is None and below.label() == "< 1 req/s"
    # A pass above the first failure does not count: capacity is below the first failing rate.
    bumpy = stats.grid_capacity({1.0: True, 2.0: False, 3.0: True})
    assert (bumpy.capacity, bumpy.first_fail) == (1.0, 2.0)
    assert bumpy.as_dict()["grid"][1] == {"rate": 2.0, "pass": False}


def test_plateau_is_the_throughput_nearest_the_knee_and_caps_passing_rates() -> None:
    def rows(throughputs: list[float], overloaded: bool) -> list[dict]:
        return [{**_row(overloaded=overloaded), "requests_per_s": t} for t in throughputs]

    by_rate = {
        4.0: rows([3.9, 4.1], False),
        16.0: rows([13.0, 14.0], True),  # mean 13.5
        32.0: rows([13.8, 14.0], True),
        12.0: rows([11.0, 12.0], False),
        14.0: rows([13.0, 13.2], False),  # not every replication... none overloaded: not saturated
    }
    assert stats.plateau(by_rate) == pytest.approx(13.5)
    assert stats.plateau({4.0: rows([4.0], False), 8.0: rows([8.0, 7.0], True) + rows([7.5], False)}) is None
    # Far past the knee a finite run finishes few requests or none: those rates do not set the plateau.
    collapsing = {1.0: rows([1.0], False), 8.0: rows([2.4, 1.2], True), 16.0: rows([0.3, 0.1], True),
                  32.0: rows([0.0, 0.0], True)}  # fmt: skip
    assert stats.plateau(collapsing) == pytest.approx(1.8)
    slo = stats.SloBounds(ttft_s=1.0)
    assert stats.sustainable(13.5, rows([13.0], False), slo, 13.5)
    assert not stats.sustainable(14.0, rows([13.0], False), slo, 13.5)  # meets the SLO, above the plateau
    assert stats.sustainable(14.0, rows([13.0], False), slo, None)
