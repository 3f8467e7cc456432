"""Overload is steady growth of the delay requests meet over the arrival period after its warm-up, with or
without drain; capacity search never reports a rate above the throughput plateau."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sim.config.policies import ContinuousConfig, StaticConfig
from sim.config.scenario import load_scenario
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.static import StaticScheduler
from sim.records.overload import RISE_Z, backlog_trend
from sim.records.summary import Slo, summarize
from sim.studies import sweep
from sim.studies.run import run_policy

DT = 0.01  # every step takes 10 ms
MEMORY = KvBudget(num_blocks=100_000, block_size=16, max_model_len=1_000_000)


def constant_step(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return DT, False


def poisson(n: int, rate: float, out_len: int, seed: int) -> list[Request]:
    times = np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))
    return [Request(i, float(t), 16, out_len, out_len) for i, t in enumerate(times)]


def run(sched: Scheduler, reqs: list[Request], horizon: Horizon) -> dict:
    out = simulate(sched, constant_step, horizon, open_loop=iter(reqs))
    rec = out.recorder
    summary = summarize(rec.requests_frame(), rec.steps_frame(), out.end_time, Slo(), out.overloaded)
    test = summary["overload_test"]
    assert summary["overloaded"] == (test is not None and backlog_verdict(test))
    return summary


def backlog_verdict(test: dict) -> bool:
    """The README's rule, from the summary's figures."""
    if test["served_fraction"] < 0.5:
        return True
    rise = test["delay_rise_s"]
    if rise is None:
        return False
    return rise > 0.0 and rise > RISE_Z * 2**0.5 * test["delay_fluctuation_s"]


def test_backlog_trend_by_hand() -> None:
    """Arrivals every 0.1 s for 100 s, served every 0.2 s: the i-th request waits 0.1 i s (+ 0.05). The span
    is the arrival period after its first quarter: 0.1 + 99.9 / 4 = 25.075 s to 100 s."""
    arrival = np.arange(1, 1001) * 0.1
    done = np.arange(1, 1001) * 0.2 + 0.05
    trend = backlog_trend(arrival, done)
    assert trend is not None and trend.overloaded
    assert (trend.start_s, trend.end_s) == (pytest.approx(25.075), 100.0)
    assert trend.arrival_rate == pytest.approx(10.0, rel=0.01)
    assert trend.completion_rate == pytest.approx(5.0, rel=0.01)
    assert trend.served_fraction == 1.0
    # delay(t) = 2t + 0.05 - t = t + 0.05: 25.125 s at the span's start, rising by 74.925 s.
    assert trend.delay_start_s == pytest.approx(25.125)
    assert trend.delay_rise_s == pytest.approx(74.925)
    assert trend.delay_fluctuation_s == pytest.approx(0.0, abs=1e-9)
    # Served 50 ms after arriving: no growth at all.
    steady = backlog_trend(arrival, arrival + 0.05)
    assert (
        steady is not None and not steady.overloaded and steady.delay_rise_s == pytest.approx(0.0, abs=1e-9)
    )
    # The arrival rate steps up from 5 to 10 per second while each request still takes 0.5 s: the backlog
    # doubles, the delay does not move.
    stepped = np.concatenate((np.arange(1, 301) * 0.2, 60 + np.arange(1, 401) * 0.1))
    level = backlog_trend(stepped, stepped + 0.5)
    assert level is not None and not level.overloaded
    # Only a third served by the end (a horizon cut an overloaded run): overloaded.
    cut = np.where(np.arange(1000) < 400, arrival * 2.5, np.inf)
    unserved = backlog_trend(arrival, cut)
    assert unserved is not None and unserved.served_fraction < 0.5 and unserved.overloaded
    # All at once, or too few to judge: no verdict.
    assert backlog_trend(np.zeros(100), np.arange(100.0)) is None
    assert backlog_trend(np.array([0.0, 1.0, 2.0]), np.array([5.0, 6.0, 7.0])) is None


@pytest.mark.parametrize("drain", [False, True])
def test_static_far_past_its_capacity_is_overloaded_with_or_without_drain(drain: bool) -> None:
    """Static batches of 4 taking 1 s each serve 4 req/s; 12 req/s are offered for 100 s."""
    reqs = poisson(1200, 12.0, 100, seed=1)
    s = run(
        StaticScheduler(StaticConfig(max_batch_size=4), MEMORY), reqs, Horizon(duration_s=100, drain=drain)
    )
    assert s["latency"]["ttft"]["p50"] > 20
    assert s["overloaded"] is True
    test = s["overload_test"]
    assert test["arrival_rate"] == pytest.approx(12.0, rel=0.15)
    assert test["completion_rate"] == pytest.approx(4.0, rel=0.1)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("drain", [False, True])
def test_stable_runs_are_not_overloaded(seed: int, drain: bool) -> None:
    """80% of capacity (16 sequences of 1 s each serve 16 req/s): never flagged, drained or not."""
    reqs = poisson(4000, 12.8, 100, seed=seed)
    s = run(ContinuousScheduler(ContinuousConfig(max_num_seqs=16), MEMORY), reqs, Horizon(120, drain=drain))
    assert s["overloaded"] is False
    # Static batching at a third of its capacity.
    reqs = poisson(1000, 4 / 3, 100, seed=seed)
    s = run(StaticScheduler(StaticConfig(max_batch_size=4), MEMORY), reqs, Horizon(300, drain=drain))
    assert s["overloaded"] is False


def test_turning_load_away_is_overload() -> None:
    """Admission control keeps the queue short by rejecting: the offered load is not served."""
    reqs = poisson(3000, 20.0, 100, seed=2)
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    s = run(sched, reqs, Horizon(duration_s=60, max_waiting=10))
    assert (
        s["rejected_reasons"] == {"queue full": s["requests"]["rejected"]} and s["requests"]["rejected"] > 500
    )
    assert s["overloaded"] is True


PLATEAU = """
name = "plateau"
seed = 21

[model]
name = "llama-2-7b"
gpu = "A100-80GB"

[workload]
arrival = { kind = "poisson", rate = 4.0 }
prompt = { kind = "lognormal", mean = 200, cv = 0.5, min = 8, max = 1024 }
output = { kind = "lognormal", mean = 100, cv = 0.5, min = 2, max = 400 }
max_tokens = 400

[horizon]
duration_s = 60
drain = true

[slo]
ttft_s = 1000.0  # loose: only overload limits the capacity

[policies.continuous]
scheduler = "continuous"
max_num_seqs = 16

[sweep]
rates = [2, 4, 8, 16, 24, 32, 64]
capacity_steps = 5
"""


def test_find_capacity_stays_at_or_below_the_throughput_plateau(tmp_path: Path) -> None:
    """Drained runs and a loose SLO: only overload decides. The plateau is measured apart, as the
    throughput of runs far past saturation with other seeds; the capacity found must not exceed it."""
    path = tmp_path / "plateau.toml"
    path.write_text(PLATEAU)
    measured = []
    for rate in (48, 96, 192):
        for seed in (101, 102):
            scenario = load_scenario(path, [f"workload.arrival.rate={rate}", f"seed={seed}"])
            summary = run_policy(scenario, "continuous", tmp_path).summary
            assert summary["overloaded"] is True
            measured.append(summary["throughput"]["requests_per_s"])
    plateau = float(np.median(measured))
    assert max(measured) / min(measured) < 1.05  # a plateau indeed
    res = sweep.run_sweep(path, find_capacity=True, out=tmp_path)
    (cap,) = json.loads((tmp_path / "sweep/capacity.json").read_text())["capacities"]
    assert cap["status"] == "found"
    print(f"plateau {plateau:.3f} req/s (runs: {sorted(measured)}), capacity {cap}")
    assert 0.8 * plateau < cap["capacity"] <= plateau, (cap, plateau)
    assert cap["plateau_per_s"] <= plateau * 1.02
    # Every point clearly past the plateau reads overloaded (closer to it, a 60 s run cannot tell: the cap).
    past = res.points.filter(res.points["rate"] > 1.15 * plateau)
    assert past.height >= 3 and past["overloaded"].all()


def _convoy_like(rate: float, seed: int, n: int) -> list[Request]:
    """Output lengths as varied as in a chat workload: whole static batches finish at once."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    outs = np.minimum(rng.lognormal(np.log(100) - 0.6, 1.1, n).astype(int) + 2, 1000)
    return [Request(i, float(t), 16, 1000, int(o)) for i, (t, o) in enumerate(zip(times, outs, strict=True))]


def test_static_batches_finishing_in_lumps_are_judged_by_their_trend() -> None:
    """Static batches of 32 complete up to 32 requests at one instant. The plateau is measured first (a
    run offered far more than it serves); 1.5x the plateau is overloaded, 0.6x is not, for every seed."""
    static = lambda: StaticScheduler(StaticConfig(max_batch_size=32), MEMORY)  # noqa: E731
    flood = run(static(), _convoy_like(50.0, 0, 20_000), Horizon(duration_s=300))
    plateau = flood["throughput"]["requests_per_s"]
    assert flood["overloaded"] and 1.0 < plateau < 20.0
    for seed in range(1, 4):
        over = run(
            static(), _convoy_like(1.5 * plateau, seed, 20_000), Horizon(duration_s=300, drain=seed % 2 == 0)
        )
        assert over["overloaded"], (seed, over["overload_test"])
        under = run(
            static(), _convoy_like(0.6 * plateau, seed, 20_000), Horizon(duration_s=300, drain=seed % 2 == 0)
        )
        assert not under["overloaded"], (seed, under["overload_test"])


def test_a_higher_stable_level_after_a_rate_step_is_not_overload() -> None:
    """Staged load, stable in both stages: the delay moves from one level (3.4 s) to a higher one (6.0 s:
    bigger batches, slower steps) and stays there. Judged across the step, a line reads the step as growth;
    judged stage by stage (`rate_steps`), neither stage grows. A delay that climbs in the second stage is
    still overload."""
    rng = np.random.default_rng(5)
    arrival = np.sort(rng.uniform(0.0, 200.0, 1000))
    level = np.where(arrival < 100.0, 3.4, 6.0) + rng.normal(0.0, 0.05, arrival.size)
    done = arrival + level
    across = backlog_trend(arrival, done)
    assert across is not None and across.overloaded  # the false alarm the stage-by-stage test removes
    staged = backlog_trend(arrival, done, rate_steps=(100.0,))
    assert staged is not None and not staged.overloaded
    assert staged.start_s == pytest.approx(100.0 + 0.25 * (arrival[-1] - 100.0))  # the last stage's figures
    noise = rng.normal(0.0, 0.05, arrival.size)
    climbing = arrival + noise + np.where(arrival < 100.0, 3.4, 3.4 + 0.2 * (arrival - 100.0))
    worse = backlog_trend(arrival, climbing, rate_steps=(100.0,))
    assert worse is not None and worse.overloaded
    assert worse.start_s > 100.0  # the second stage's verdict
    assert worse.delay_rise_s == pytest.approx(0.2 * (arrival[-1] - worse.start_s), rel=0.05)
    flat = backlog_trend(arrival, arrival + 3.4)  # no fluctuation at all: rounding is no rise
    assert flat is not None and not flat.overloaded


def test_staged_scenario_stable_in_each_stage_is_not_overloaded(tmp_path: Path) -> None:
    """End to end: fixed lengths (little fluctuation), 2 then 6 requests a second, far below capacity."""
    scenario = tmp_path / "staged.toml"
    scenario.write_text(
        """
        name = "staged"
        [model]
        name = "llama-2-7b"
        gpu = "A100-80GB"
        [workload]
        arrival = { kind = "staged", stages = [[2.0, 150.0], [6.0, 150.0]], exact_count = true }
        prompt = { kind = "fixed", value = 400 }
        output = { kind = "fixed", value = 200 }
        max_tokens = 200
        [horizon]
        duration_s = 300
        drain = true
        [policies.vllm]
        scheduler = "vllm"
        """
    )
    result = run_policy(load_scenario(scenario), "vllm", tmp_path)
    e2e = result.requests.sort("arrival")["e2e"].to_numpy()
    assert e2e[-300:].mean() > 1.1 * e2e[:300].mean()  # the second stage's level is higher
    assert result.summary["overloaded"] is False
