"""What every `sim run` pays before its first step: start-up, generating the requests, recording them.

Times, in this one process, the imports a run needs, then generating bench_fleet.py's ShareGPT-like stream
of `--requests` requests from its scenario while handing each one to a `Recorder` as finished (one `arrive`
and one `request` call; records streamed to Parquet, as `sim run` does) and closing the recorder. No
scheduler and no step runs. The sum is a lower bound on the whole `sim run` process of any policy on that
stream, to set beside the floor (`benchmarks/floor.py`, whole process) at the same request count.

    .venv/bin/python benchmarks/fixed_cost.py --requests 100000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
from sim.config.scenario import load_scenario  # noqa: E402
from sim.records.columns import FINISHED  # noqa: E402  (timed: the imports are part of the cost)
from sim.records.recorder import Recorder  # noqa: E402
from sim.records.sinks import ParquetSink  # noqa: E402
from sim.studies.run import run_policy  # noqa: E402, F401
from sim.workload.generator import Workload  # noqa: E402

IMPORTED = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fleet  # noqa: E402  (the benchmark next to this one)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=10.963, help="Poisson arrivals per second")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of prose")
    args = ap.parse_args()
    if args.requests < 1 or args.rate <= 0:
        ap.error("--requests and --rate must be positive")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.toml"
        arrival = f'{{ kind = "poisson", rate = {args.rate!r} }}'
        path.write_text(bench_fleet.scenario_toml("vllm", args.requests, arrival, args.seed))
        scenario = load_scenario(path)
        t0 = time.perf_counter()
        (Path(tmp) / "records").mkdir()
        recorder = Recorder(ParquetSink(Path(tmp) / "records"))
        for req in Workload(scenario.workload, scenario.seed, path.parent).open_loop(args.requests):
            recorder.arrive(req)
            req.first_token_at = req.last_token_at = req.finished_at = req.arrival
            req.num_generated = 1
            recorder.request(req, FINISHED)
        recorder.finish()
        t1 = time.perf_counter()
    figures = {
        "requests": args.requests,
        "imports_s": IMPORTED - START,
        "generate_and_record_s": t1 - t0,
        "total_s": (IMPORTED - START) + (t1 - t0),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(
        f"{args.requests:,} requests, no steps: imports {figures['imports_s']:.2f} s, generating and "
        f"recording {figures['generate_and_record_s']:.2f} s; {figures['total_s']:.2f} s in all "
        "(interpreter start not included)"
    )


if __name__ == "__main__":
    main()
