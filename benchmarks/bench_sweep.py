"""The same small sweep with --jobs 1 and --jobs 2: wall seconds of each and the speed-up (target >= 1.7x).

    .venv/bin/python benchmarks/bench_sweep.py [--jobs N]

Runs convoy's continuous policy at 16 points (4 rates x 4 replications, 600 s horizon) into a temporary
folder, with --force so nothing is resumed. The process pool starts its workers from a forkserver (about
2 s, once per sweep), which the speed-up includes. The CPU may be shared: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from sim.studies.sweep import run_sweep

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "convoy.toml"
OVERRIDES = [
    "sweep.rates=[4, 6, 8, 10]",
    "sweep.replications=4",
    'sweep.policies=["continuous"]',
    "sweep.params={}",
    "horizon.duration_s=600",
]


def timed(jobs: int, out: Path) -> float:
    start = time.perf_counter()
    run_sweep(SCENARIO, OVERRIDES, jobs=jobs, force=True, out=out)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="parallel jobs to compare with one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        one = timed(1, Path(tmp) / "one")
        many = timed(args.jobs, Path(tmp) / "many")
    print(f"--jobs 1: {one:.2f} s")
    print(f"--jobs {args.jobs}: {many:.2f} s")
    print(f"speed-up: {one / many:.2f}x")


if __name__ == "__main__":
    main()
