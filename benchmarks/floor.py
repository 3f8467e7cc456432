"""The floor: the barest SimPy loop that serves a ShareGPT-like stream with continuous batching.

One SimPy process, one `yield env.timeout(step)` per engine step, continuous batching up to `--max-batch`
running requests, constant step times (`--prefill-s` for a step that admits a request, `--decode-s` for any
other), requests as plain arrays, no records: only a count of finished requests. It is what `sim run` would
cost if the simulator did nothing but move the clock, so `benchmarks/bench_fleet.py` reports `sim run`'s
requests per second as a multiple of this loop's, measured in the same run on the same machine.

Lengths are ShareGPT-like (outputs lognormal with mean 340 tokens, cv 1.0, capped at 2048; prompts do not
matter with constant step times); arrivals are Poisson at `--load` times the loop's saturation, which with
constant step times is `max_batch / (mean output × decode_s)`. A request admitted in a step produces its first
token in that step and one more in each following step; every step counts down each running request's tokens
(one list comprehension over the batch, the plain way to write iteration-level batching).

    .venv/bin/python benchmarks/floor.py --requests 100000
    .venv/bin/python benchmarks/floor.py --requests 100000 --json   # one JSON object, for scripts
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import deque
from collections.abc import Generator
from dataclasses import asdict, dataclass

import numpy as np
import simpy

OUTPUT_MEAN, CV, MAX_LEN = 340.0, 1.0, 2048
MAX_BATCH, PREFILL_S, DECODE_S, LOAD = 256, 0.025, 0.020, 0.7


@dataclass(frozen=True, slots=True)
class FloorResult:
    """What one floor run did, and how long its loop took (`loop_s`, wall seconds)."""

    requests: int
    finished: int
    steps: int
    simulated_s: float
    loop_s: float

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.loop_s if self.loop_s > 0 else math.inf


def output_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    """ShareGPT-like output lengths: lognormal, mean `OUTPUT_MEAN`, cv `CV`, rounded, in [1, `MAX_LEN`]."""
    sigma2 = math.log1p(CV * CV)
    draws = rng.lognormal(math.log(OUTPUT_MEAN) - sigma2 / 2, math.sqrt(sigma2), n)
    return np.clip(np.rint(draws), 1, MAX_LEN).astype(np.int64)


def stream(
    n: int, load: float, seed: int, max_batch: int = MAX_BATCH, decode_s: float = DECODE_S
) -> tuple[np.ndarray, np.ndarray]:
    """`n` requests as (arrival times, output lengths) arrays, Poisson at `load` × the loop's saturation."""
    rng = np.random.default_rng(seed)
    outputs = output_lengths(rng, n)
    rate = load * max_batch / (float(outputs.mean()) * decode_s)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    return arrivals, outputs


def serve(
    env: simpy.Environment,
    arrivals: list[float],
    outputs: list[int],
    max_batch: int,
    prefill_s: float,
    decode_s: float,
    counts: list[int],
) -> Generator[simpy.Event, None, None]:
    """The replica loop: admit arrivals, take one step, retire finished requests; sleep when idle.

    `counts` receives [finished, steps] at the end.
    """
    n = len(arrivals)
    nxt = 0  # next arrival not yet queued
    waiting: deque[int] = deque()  # output lengths of queued requests
    running: list[int] = []  # tokens each running request has still to produce, this step's included
    step = finished = 0
    while finished < n:
        if not running and not waiting:
            yield env.timeout(arrivals[nxt] - env.now)
            waiting.append(outputs[nxt])
            nxt += 1
        now = env.now
        while nxt < n and arrivals[nxt] <= now:
            waiting.append(outputs[nxt])
            nxt += 1
        admitted = False
        while waiting and len(running) < max_batch:
            running.append(waiting.popleft())
            admitted = True
        yield env.timeout(prefill_s if admitted else decode_s)
        before = len(running)
        running = [left - 1 for left in running if left > 1]
        finished += before - len(running)
        step += 1
    counts[:] = [finished, step]


def run_floor(
    arrivals: np.ndarray,
    outputs: np.ndarray,
    max_batch: int = MAX_BATCH,
    prefill_s: float = PREFILL_S,
    decode_s: float = DECODE_S,
) -> FloorResult:
    """Serve every request of the stream to the end; time the loop alone (not the stream's generation)."""
    if len(arrivals) != len(outputs) or len(arrivals) == 0:
        raise ValueError("arrivals and outputs must be non-empty and of the same length")
    times, lengths = arrivals.tolist(), outputs.tolist()
    env = simpy.Environment()
    counts = [0, 0]
    start = time.perf_counter()
    env.process(serve(env, times, lengths, max_batch, prefill_s, decode_s, counts))
    env.run()
    loop_s = time.perf_counter() - start
    return FloorResult(len(times), counts[0], counts[1], float(env.now), loop_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--load", type=float, default=LOAD, help="offered load, a fraction of saturation")
    ap.add_argument("--max-batch", type=int, default=MAX_BATCH)
    ap.add_argument("--prefill-s", type=float, default=PREFILL_S, help="length of a step that admits")
    ap.add_argument("--decode-s", type=float, default=DECODE_S, help="length of any other step")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of prose")
    args = ap.parse_args()
    if min(args.requests, args.max_batch) < 1 or min(args.load, args.prefill_s, args.decode_s) <= 0:
        ap.error("--requests, --load, --max-batch, --prefill-s and --decode-s must be positive")

    arrivals, outputs = stream(args.requests, args.load, args.seed, args.max_batch, args.decode_s)
    result = run_floor(arrivals, outputs, args.max_batch, args.prefill_s, args.decode_s)
    if args.json:
        print(json.dumps({**asdict(result), "requests_per_s": result.requests_per_s}))
        return
    batch = outputs.sum() / result.steps
    print(f"floor: {result.requests:,} requests, {result.finished:,} finished, {result.steps:,} steps, "
          f"{result.simulated_s:,.0f} simulated s, mean batch {batch:.1f}")  # fmt: skip
    print(f"loop: {result.loop_s:.2f} s wall, {result.requests_per_s:,.0f} requests per wall second")


if __name__ == "__main__":
    main()
