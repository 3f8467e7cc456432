"""Fleet routing against queueing theory: single-sequence replicas with deterministic step times are
single-server queues whose service time is the prompt length times a fixed cost per token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from sim.config.policies import ContinuousConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.fleet.engine import Fleet, ReplicaSpec
from sim.fleet.routers import load_all

UNIT = 1e-3  # seconds per prompt token: a request of P tokens is served in P ms


def _step_time(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return float(new_tokens.sum()) * UNIT, True


def run_queue(router: str, replicas: int, rate: float, sizes: np.ndarray, seed: int) -> pl.DataFrame:
    """Poisson(rate) arrivals of one-token requests of `sizes` prompt tokens, served one at a time."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, len(sizes)))
    requests = (Request(i, float(times[i]), int(sizes[i]), 1, 1) for i in range(len(sizes)))
    specs = [
        ReplicaSpec(
            f"r{i}",
            "g",
            "both",
            ContinuousScheduler(ContinuousConfig(max_num_seqs=1), KvBudget(10**6, 16, 10**6)),
            _step_time,
        )
        for i in range(replicas)
    ]
    kind = load_all()[router]
    streams = iter(np.random.default_rng(seed + 1).spawn(2))
    fleet = Fleet(
        specs,
        lambda n: kind.build(kind.config(), n, next(streams)),
        Horizon(max_requests=len(sizes), drain=True),
    )
    out = fleet.run(requests)
    return pl.concat([m.recorder.requests_frame() for m in out.members])


def test_random_routing_is_independent_md1_queues() -> None:
    """Random routing splits Poisson arrivals into c Poisson streams: each replica is an M/D/1 queue, whose
    mean wait is rho D / (2 (1 - rho)) (Pollaczek-Khinchine). 60,000 requests put the estimate's standard
    error near 0.6%; round-robin (Erlang arrivals) waits far less, so the check tells the routers apart."""
    c, size, rho, n = 4, 1000, 0.5, 60_000
    service = size * UNIT
    rate = rho * c / service
    pk = rho * service / (2 * (1 - rho))
    sizes = np.full(n, size)
    wait = run_queue("random", c, rate, sizes, seed=1)["queue_wait"].mean()
    assert abs(wait / pk - 1) < 0.03, (wait, pk)
    rr_wait = run_queue("round_robin", c, rate, sizes, seed=1)["queue_wait"].mean()
    assert rr_wait < 0.5 * pk


def test_random_routing_variable_lengths_is_mg1() -> None:
    """With prompt lengths uniform on {200, ..., 1800}, each replica is M/G/1: mean wait
    lambda E[S^2] / (2 (1 - rho)), with E[S^2] from the uniform distribution, not from the sample."""
    c, n, rho = 4, 60_000, 0.5
    lo, hi = 200, 1800
    k = np.arange(lo, hi + 1)
    es, es2 = float(k.mean()) * UNIT, float((k.astype(float) ** 2).mean()) * UNIT**2
    lam = rho / es  # per replica
    pk = lam * es2 / (2 * (1 - rho))
    sizes = np.random.default_rng(5).integers(lo, hi + 1, n)
    wait = run_queue("random", c, lam * c, sizes, seed=2)["queue_wait"].mean()
    assert abs(wait / pk - 1) < 0.03, (wait, pk)


def test_power_of_two_beats_random_as_the_supermarket_model_says() -> None:
    """32 replicas at rho = 0.9 with exponential-like service (geometric prompt lengths, mean 1,000 tokens).
    Mean time in system, in mean service times: random assignment is M/M/1, 1 / (1 - rho) = 10; the
    supermarket model's large-N limit for two choices is sum_i rho^(2^i - 2) = 2.61 (finite N sits a little
    above it)."""
    c, n, rho = 32, 40_000, 0.9
    sizes = np.maximum(1, np.round(np.random.default_rng(8).exponential(1000, n))).astype(int)
    mean_s = 1000 * UNIT
    rate = rho * c / mean_s
    limit = sum(rho ** (2**i - 2) for i in range(1, 40))
    assert abs(limit - 2.61) < 0.01
    out = {}
    for router in ("random", "power_of_two"):
        frame = run_queue(router, c, rate, sizes, seed=3)
        in_system = (frame["queue_wait"] + frame["prompt_len"] * UNIT) / mean_s
        out[router] = (float(in_system.mean()), float(frame["queue_wait"].quantile(0.99)))
    (t_random, p99_random), (t_two, p99_two) = out["random"], out["power_of_two"]
    assert 0.8 * 10 < t_random < 1.2 * 10, t_random
    assert limit * 0.97 < t_two < limit * 1.2, t_two
    assert p99_two < 0.5 * p99_random


def test_fleet_at_n_times_the_rate_serves_like_one_replica() -> None:
    """N identical replicas at N x rate against one replica at 1 x rate (real cost model, 300 s at 2 req/s
    per replica). Random routing splits a Poisson stream into N Poisson streams of 1 x rate, so mean TTFT
    and TPOT must agree within the 95% confidence intervals (they overlap). Round-robin gives each replica
    Erlang-N gaps, more regular than Poisson ones: it must do no worse than one replica (at this load it
    queues less, so it is a little better, not equal: see docs/fleet.md)."""
    from sim.config.scenario import load_scenario
    from sim.records.stats import mean_ci
    from sim.studies.run import run_policy

    rag = Path(__file__).resolve().parents[1] / "scenarios" / "rag-chatbot.toml"

    def run(rate: float, cluster: list[str]) -> dict[str, tuple[float, float, float]]:
        sc = load_scenario(rag, ["horizon.duration_s=300", f"workload.arrival.rate={rate}", *cluster])
        frame = run_policy(sc, "vllm", rag.parent).requests
        out = {}
        for metric in ("ttft", "tpot"):
            mean, low, high, _ = mean_ci(frame[metric].drop_nulls().to_list())
            assert mean is not None and low is not None and high is not None
            out[metric] = (mean, low, high)
        return out

    one = run(2.0, [])
    rand = run(8.0, ["cluster.groups=[{count=4}]", "cluster.router='random'"])
    rr = run(8.0, ["cluster.groups=[{count=4}]", "cluster.router='round_robin'"])
    for metric in ("ttft", "tpot"):
        (_, lo1, hi1), (_, lo4, hi4) = one[metric], rand[metric]
        assert lo1 <= hi4 and lo4 <= hi1, (metric, one[metric], rand[metric])  # the intervals overlap
        assert rr[metric][0] <= hi1, (metric, one[metric], rr[metric])
