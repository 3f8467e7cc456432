"""The same-steps floor: a run's own steps and arrivals through the barest SimPy loop.

`benchmarks/floor.py` serves a stream with its own constant step times, so its step count is not the run's.
This loop replays what a `sim run` actually did: one `yield env.timeout(duration)` per step of the run (and
one idle wait before a step that starts later than the previous one ended), and one arrival process that
wakes once per request at its arrival time, as `sim run`'s arrivals do. No scheduling, no cost model, no
records: the clock alone, over exactly the run's steps and arrivals. `benchmarks/bench_fleet.py` reports each
policy's process against it (`x same`) beside the floor.

Input: a `.npz` file with `start` and `duration` (one entry per step, in step order) and `arrival` (one per
request, any order), as `bench_fleet.write_same_steps_inputs` writes from a run's `steps.parquet` and
`requests.parquet`. The replay imports numpy and simpy only, as `floor.py` does.

    .venv/bin/python benchmarks/same_steps_floor.py RUN.npz [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Generator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import simpy


@dataclass(frozen=True, slots=True)
class SameStepsResult:
    """What one replay did, and how long its loop took (`loop_s`, wall seconds)."""

    steps: int
    arrivals: int
    simulated_s: float
    loop_s: float


def steps_process(
    env: simpy.Environment, starts: list[float], durations: list[float]
) -> Generator[simpy.Event, None, None]:
    """The replica: each step in turn, waiting first when it starts after the previous one ended."""
    for start, duration in zip(starts, durations, strict=True):
        if start > env.now:
            yield env.timeout(start - env.now)
        yield env.timeout(duration)


def arrivals_process(
    env: simpy.Environment, arrivals: list[float], seen: list[int]
) -> Generator[simpy.Event, None, None]:
    """One wake-up per arrival (`seen[0]` counts them)."""
    for t in arrivals:
        if t > env.now:
            yield env.timeout(t - env.now)
        seen[0] += 1


def replay(starts: np.ndarray, durations: np.ndarray, arrivals: np.ndarray) -> SameStepsResult:
    """Run the steps and the arrivals on one clock; time the loop alone."""
    if len(starts) != len(durations):
        raise ValueError("start and duration must have one entry per step")
    env = simpy.Environment()
    seen = [0]
    begin = time.perf_counter()
    env.process(steps_process(env, starts.tolist(), durations.tolist()))
    env.process(arrivals_process(env, np.sort(arrivals).tolist(), seen))
    env.run()
    loop_s = time.perf_counter() - begin
    return SameStepsResult(len(starts), seen[0], float(env.now), loop_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", type=Path, help=".npz with start, duration and arrival arrays")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of prose")
    args = ap.parse_args()
    if not args.inputs.is_file():
        ap.error(f"{args.inputs}: no such file")
    with np.load(args.inputs) as data:
        starts, durations, arrivals = data["start"], data["duration"], data["arrival"]
    result = replay(starts, durations, arrivals)
    if args.json:
        print(json.dumps(asdict(result)))
        return
    print(f"same-steps floor: {result.steps:,} steps, {result.arrivals:,} arrivals, "
          f"{result.simulated_s:,.0f} simulated s; loop {result.loop_s:.2f} s wall")  # fmt: skip


if __name__ == "__main__":
    main()
