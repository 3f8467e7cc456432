"""Rates are per second of one measurement window: first arrival to last completion, or to the horizon while
requests are still in flight; `summary.json` states it as `window_s`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from sim.config.policies import ContinuousConfig
from sim.config.scenario import validate_scenario
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.records.summary import Slo, summarize
from sim.studies.run import run_policy

DT = 0.01
MEMORY = KvBudget(num_blocks=100_000, block_size=16, max_model_len=100_000)


def constant_step(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return DT, False


def _summary(requests: list[Request], horizon: Horizon, seqs: int = 64) -> dict:
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs), MEMORY)
    out = simulate(sched, constant_step, horizon, open_loop=iter(requests))
    rec = out.recorder
    return summarize(rec.requests_frame(), rec.steps_frame(), out.end_time, Slo(ttft_s=1.0), out.overloaded)


def test_max_requests_before_the_duration_is_measured_to_the_last_completion() -> None:
    """1,000 requests at 10 req/s with `duration_s = 10000` (no drain): 10 req/s, not 0.1."""
    reqs = [Request(i, (i + 1) * 0.1, 16, 5, 5) for i in range(1000)]  # arrivals 0.1 .. 100 s
    s = _summary(reqs, Horizon(duration_s=10_000, max_requests=1000))
    assert s["requests"]["finished"] == 1000
    # Each request takes 5 steps of 10 ms: the last one ends at 100.05 s; the first arrived at 0.1 s.
    assert s["window"] == {"start_s": 0.1, "end_s": pytest.approx(100.05)}
    assert s["window_s"] == pytest.approx(99.95)
    assert s["throughput"]["requests_per_s"] == pytest.approx(1000 / 99.95)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(5000 / 99.95)
    assert s["goodput_per_s"] == pytest.approx(1000 / 99.95)
    # Busy 5 steps per request (no two overlap at this rate).
    assert s["steps"]["busy_fraction"] == pytest.approx(1000 * 5 * DT / 99.95)


def test_requests_in_flight_at_the_horizon_end_the_window_there() -> None:
    reqs = [Request(i, 2.0 + i * 0.05, 16, 400, 400) for i in range(2000)]  # far more than 4 seqs serve
    s = _summary(reqs, Horizon(duration_s=30.0), seqs=4)
    assert s["requests"]["in_flight"] > 0
    assert s["window"] == {"start_s": 2.0, "end_s": 30.0}
    assert s["window_s"] == 28.0
    assert s["throughput"]["requests_per_s"] == pytest.approx(s["requests"]["finished"] / 28.0)
    # Busy from the first arrival on, but for the step the horizon cut (not recorded).
    assert s["steps"]["busy_fraction"] == pytest.approx(1.0 - DT / 28.0)


def test_window_in_a_scenario_run() -> None:
    """End to end: deterministic arrivals at 10 req/s, 1,000 requests, a 10,000 s horizon without drain."""
    text = """
        name = "window"
        seed = 1
        [model]
        name = "llama-2-7b"
        gpu = "A100-80GB"
        [workload]
        arrival = { kind = "deterministic", rate = 10.0 }
        prompt = { kind = "fixed", value = 64 }
        output = { kind = "fixed", value = 16 }
        [horizon]
        duration_s = 10000
        max_requests = 1000
        [policies.continuous]
        scheduler = "continuous"
    """
    scenario = validate_scenario(tomllib.loads(text), "window")
    result = run_policy(scenario, "continuous", Path("."))
    s, req = result.summary, result.requests
    assert s["requests"]["finished"] == 1000
    first, last = req["arrival"].min(), req["finished_at"].max()
    assert s["window_s"] == pytest.approx(last - first)
    assert 99.0 < s["window_s"] < 101.0
    assert s["throughput"]["requests_per_s"] == pytest.approx(10.0, rel=0.01)
    assert s["horizon_s"] == 10_000
