"""Engine speed and memory: ShareGPT-like requests through `continuous` on Llama-2-7B / A100-80GB.

Prompts are lognormal with mean 160 tokens, outputs lognormal with mean 340 (both cv 1.0, capped at 2048).
Each request's `max_tokens` is its own output length (a trace replayed exactly), so the KV reservation is what
the request really uses and `max_num_seqs = 256` (vLLM's default) is the binding limit, not memory.

"80% of capacity" is measured, not assumed: a first run offers every request at t = 0 (overload) and takes the
completion rate between the 10th and 90th percentile finish times as the saturation throughput; the timed run
then offers Poisson arrivals at `--load` times that rate and drains. The timed figure covers simulation and
the records (polars frames and the summary), not Parquet writing.

    .venv/bin/python benchmarks/bench_engine.py                      # 100,000 requests
    .venv/bin/python benchmarks/bench_engine.py --requests 1000000   # the memory check
"""

from __future__ import annotations

import argparse
import gc
import math
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.catalog.gpus import get_gpu  # noqa: E402
from sim.catalog.models import load_model
from sim.config.policies import ContinuousConfig
from sim.core.request import Request  # noqa: E402
from sim.cost.memory import (
    KvBudget,
    kv_memory,  # noqa: E402
)
from sim.cost.roofline import CostModel  # noqa: E402
from sim.engine.replica import Horizon, simulate  # noqa: E402
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.records.summary import Slo, summarize

MODEL, GPU = "llama-2-7b", "A100-80GB"
PROMPT_MEAN, OUTPUT_MEAN, CV, MAX_LEN = 160.0, 340.0, 1.0, 2048
CHUNK = 8192


def lognormal(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    sigma2 = math.log1p(CV * CV)
    draws = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.clip(np.rint(draws), 1, MAX_LEN).astype(np.int64)


def requests(n: int, rate: float | None, seed: int) -> Iterator[Request]:
    """`n` requests, Poisson at `rate` per second (all at t = 0 when `rate` is None), generated lazily."""
    rng = np.random.default_rng(seed)
    t = 0.0
    for start in range(0, n, CHUNK):
        k = min(CHUNK, n - start)
        if rate is None:
            times = np.zeros(k)
        else:
            times = t + np.cumsum(rng.exponential(1.0 / rate, k))
            t = float(times[-1])
        prompts, outputs = lognormal(rng, PROMPT_MEAN, k), lognormal(rng, OUTPUT_MEAN, k)
        rows = zip(times.tolist(), prompts.tolist(), outputs.tolist(), strict=True)
        for i, (arrival, prompt, output) in enumerate(rows, start):
            yield Request(i, arrival, prompt, output, output)


def setup(max_num_seqs: int) -> tuple[CostModel, ContinuousScheduler]:
    model, gpu = load_model(MODEL), get_gpu(GPU)
    mem = kv_memory(model, gpu)
    sched = ContinuousScheduler(
        ContinuousConfig(max_num_seqs=max_num_seqs), KvBudget(mem.num_blocks, 16, 4096)
    )
    return CostModel(model, gpu), sched


def saturation(n: int, max_num_seqs: int, seed: int) -> float:
    """Completions per simulated second with every request queued at t = 0 (middle 80% of finishes)."""
    cost, sched = setup(max_num_seqs)
    out = simulate(
        sched, cost.step_time, Horizon(max_requests=n, drain=True), open_loop=requests(n, None, seed)
    )
    done = np.sort(out.recorder.requests_frame()["finished_at"].to_numpy())
    lo, hi = int(0.1 * len(done)), int(0.9 * len(done))
    return (hi - lo) / float(done[hi] - done[lo])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=0.8, help="offered load as a fraction of saturation")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--saturation-requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=None, help="skip the saturation run; offer this rate")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    if args.rate is None:
        t0 = time.perf_counter()
        sat = saturation(args.saturation_requests, args.max_num_seqs, args.seed + 1)
        rate = args.load * sat
        print(f"saturation: {sat:.2f} req/s ({args.saturation_requests:,} requests offered at t=0, "
              f"{time.perf_counter() - t0:.1f} s wall)")  # fmt: skip
    else:
        rate = args.rate
    print(f"offered rate: {rate:.3f} req/s; {args.requests:,} requests; max_num_seqs {args.max_num_seqs}; "
          f"{MODEL} on {GPU}")  # fmt: skip
    gc.collect()
    cost, sched = setup(args.max_num_seqs)
    t0 = time.perf_counter()
    out = simulate(
        sched,
        cost.step_time,
        Horizon(max_requests=args.requests, drain=True),
        open_loop=requests(args.requests, rate, args.seed),
    )
    t_sim = time.perf_counter() - t0
    sim_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    req, steps = out.recorder.requests_frame(), out.recorder.steps_frame()
    summary = summarize(req, steps, out.end_time, Slo(), out.overloaded)
    wall = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fin = summary["requests"]["finished"]  # type: ignore[index]
    print(f"simulated {out.end_time:,.0f} s: {fin:,} finished, {steps.height:,} steps, "
          f"mean batch {summary['steps']['mean_batch_size']:.1f}, overloaded={summary['overloaded']}")  # type: ignore[index]  # fmt: skip
    print(f"wall: {wall:.2f} s ({t_sim:.2f} s simulating, {wall - t_sim:.2f} s frames and summary)")
    print(f"simulated requests per wall second: {args.requests / wall:,.0f}")
    print(f"peak RSS: {sim_rss_mb:,.0f} MB through the simulation, {rss_mb:,.0f} MB with frames and summary")


if __name__ == "__main__":
    main()
