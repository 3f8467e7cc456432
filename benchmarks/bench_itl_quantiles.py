"""The recorder's ITL quantiles on a run's own windows: `window_quantiles` against selecting the five ranks.

Runs bench_fleet.py's scenario for `--policy` (Llama-2-7B, ShareGPT-like lengths, Poisson arrivals at
`--rate`, `--gpu`) in process, keeps every batch of finished requests' step windows the recorder hands to
`window_quantiles`, then times, over all the batches kept, today's function (windows of up to `short` steps
sorted in groups, longer ones sorted one by one) against the same with each window longer than 256 steps
partitioned at its five ranks (`np.partition`) instead of sorted. Both give numpy's quantiles bit for bit;
this checks that they agree and prints the milliseconds per batch of each (best of `--repeat` passes).

    .venv/bin/python benchmarks/bench_itl_quantiles.py --requests 20000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_fleet import POLICIES, scenario_toml  # noqa: E402

import sim.records.recorder as recorder  # noqa: E402
from sim.records.window_quantiles import window_quantiles  # noqa: E402

Batch = tuple[np.ndarray, np.ndarray, np.ndarray]


def selected(
    durations: np.ndarray, lo: np.ndarray, n: np.ndarray, select: int = 256
) -> tuple[np.ndarray, ...]:
    """`window_quantiles` with each window of more than `select` steps partitioned at its five ranks."""
    long = np.flatnonzero(n > select)
    short = np.flatnonzero(n <= select)
    p50, p99, top = (np.empty(len(n)) for _ in range(3))
    p50[short], p99[short], top[short] = window_quantiles(durations, lo[short], n[short])
    for k in long.tolist():
        first, size = int(lo[k]), int(n[k])
        end = size - 1
        v50, v99 = end * 0.5, end * 0.99
        i50, i99 = int(v50), int(v99)
        ranks = [i50, min(i50 + 1, end), i99, min(i99 + 1, end), end]
        a, b, c, d, m = np.partition(durations[first : first + size], ranks)[ranks].tolist()
        figures = []
        for v, i, x, y in ((v50, i50, a, b), (v99, i99, c, d)):
            t, diff = v - i, y - x
            figures.append(m if v >= end else (y - diff * (1 - t) if t >= 0.5 else x + diff * t))
        p50[k], p99[k], top[k] = figures[0], figures[1], m
    return p50, p99, top


def batches(policy: str, requests: int, rate: float, gpu: str) -> list[Batch]:
    """Every batch of windows a `sim run` of bench_fleet's scenario hands to `window_quantiles`."""
    from sim.cli.app import main

    kept: list[Batch] = []

    def keep(durations: np.ndarray, lo: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, ...]:
        kept.append((durations.copy(), lo.copy(), n.copy()))
        return window_quantiles(durations, lo, n)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.toml"
        path.write_text(scenario_toml(policy, requests, f'{{ kind = "poisson", rate = {rate} }}', 0, gpu))
        recorder.window_quantiles = keep  # type: ignore[assignment]
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # the run's own table
                main(["run", str(path), "--out", str(Path(tmp) / "out"), "--force"])
        except SystemExit:
            pass
        finally:
            recorder.window_quantiles = window_quantiles
    return kept


def best_ms(fn: object, kept: list[Batch], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for durations, lo, n in kept:
            fn(durations, lo, n)  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return 1e3 * min(times) / len(kept)


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--policy", choices=sorted(POLICIES), default="continuous")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=11.3, help="req/s (11.3: continuous, 70%% load, H100)")
    parser.add_argument("--gpu", default="H100-SXM")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    kept = batches(args.policy, args.requests, args.rate, args.gpu)
    lengths = np.concatenate([n for *_, n in kept])
    for durations, lo, n in kept:
        for got, want in zip(window_quantiles(durations, lo, n), selected(durations, lo, n), strict=True):
            assert got.tobytes() == want.tobytes(), "the two methods disagree"
    sort_ms, select_ms = best_ms(window_quantiles, kept, args.repeat), best_ms(selected, kept, args.repeat)
    print(f"{len(kept)} batches, {len(lengths)} windows, {lengths.mean():.0f} steps each on average")
    print(f"window_quantiles (long windows sorted): {sort_ms:.3f} ms per batch")
    print(f"long windows partitioned instead:       {select_ms:.3f} ms per batch")
    print(f"sorted / partitioned:                   {sort_ms / select_ms:.2f}")


if __name__ == "__main__":
    main()
