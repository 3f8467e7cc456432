"""Power of two choices against the supermarket model, on a settled fleet: `--replicas` single-sequence
replicas at utilisation `--rho`, geometric prompt lengths (mean 1,000 tokens, 1 ms a token: exponential-like
service), Poisson arrivals. The first `--warmup` share of requests (by arrival) is left out, so the figure
is the fleet's settled state, not the transient of a fleet that started empty. Prints the mean time in
system in mean service times for random routing (M/M/1: 1 / (1 - rho)) and power of two (the large-N
limit: sum_i rho^(2^i - 2), 2.61 at rho = 0.9).

    .venv/bin/python benchmarks/fleet_supermarket.py --replicas 32 --rho 0.9 --requests 200000
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

from sim.config.policies import ContinuousConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.fleet.engine import Fleet, ReplicaSpec
from sim.fleet.routers import load_all

UNIT = 1e-3  # seconds per prompt token


def _step_time(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return float(new_tokens.sum()) * UNIT, True


def time_in_system(router: str, replicas: int, rho: float, n: int, warmup: float, seed: int) -> float:
    """Mean time in system of the requests past the warm-up, in mean service times."""
    sizes = np.maximum(1, np.round(np.random.default_rng(seed).exponential(1000, n))).astype(int)
    mean_s = float(sizes.mean()) * UNIT
    rng = np.random.default_rng(seed + 1)
    times = np.cumsum(rng.exponential(mean_s / (rho * replicas), n))
    requests = (Request(i, float(times[i]), int(sizes[i]), 1, 1) for i in range(n))
    specs = [
        ReplicaSpec(
            f"r{i}", "g", "both",
            ContinuousScheduler(ContinuousConfig(max_num_seqs=1), KvBudget(10**6, 16, 10**6)), _step_time,
        )
        for i in range(replicas)
    ]  # fmt: skip
    kind = load_all()[router]
    streams = iter(np.random.default_rng(seed + 2).spawn(2))
    fleet = Fleet(
        specs, lambda k: kind.build(kind.config(), k, next(streams)), Horizon(max_requests=n, drain=True)
    )
    frame = pl.concat([m.recorder.requests_frame() for m in fleet.run(requests).members])
    settled = frame.filter(pl.col("arrival") >= float(times[int(warmup * n)]))
    return float(((settled["queue_wait"] + settled["prompt_len"] * UNIT) / mean_s).mean())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--replicas", type=int, default=32)
    parser.add_argument("--rho", type=float, default=0.9)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--warmup", type=float, default=0.25, help="share of requests left out (by arrival)")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    limit = sum(args.rho ** (2**i - 2) for i in range(1, 40))
    print(
        f"{args.replicas} replicas, rho {args.rho}, {args.requests} requests, "
        f"first {args.warmup:.0%} left out"
    )
    for router, theory in (("random", 1 / (1 - args.rho)), ("power_of_two", limit)):
        t = time_in_system(router, args.replicas, args.rho, args.requests, args.warmup, args.seed)
        print(f"{router}: {t:.2f} mean service times (theory {theory:.2f})")


if __name__ == "__main__":
    main()
