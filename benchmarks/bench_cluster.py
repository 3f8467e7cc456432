"""Fleet speed: a 32-replica fleet behind a least-outstanding router, as one whole `sim run` process.

The scenario is bench_fleet.py's, ShareGPT-like (Llama-2-7B on A100-80GB; prompts lognormal mean 160 tokens,
outputs lognormal mean 340, both cv 1.0 and capped at 2048; `max_tokens = 2048`; the `vllm` policy with
vLLM's default max_num_seqs 256 and max_num_batched_tokens 8192), with Poisson arrivals at
`--per-replica-rate` (5 req/s, about 60% of one replica's saturation) times the replica count, `--requests`
requests in all, drained. `python -m sim run SCENARIO --force --out TMP` runs as a child process, timed by
bench_fleet.measure: wall seconds, CPU seconds (user + system) and peak RSS from the kernel's accounting of
that child (`os.wait4`); interpreter start, imports, the simulation, the records and their Parquet files all
count.

    .venv/bin/python benchmarks/bench_cluster.py                           # 32 replicas, 100,000 requests
    .venv/bin/python benchmarks/bench_cluster.py --requests 1000000        # the full-scale figure
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fleet  # noqa: E402  (the benchmark next to this one)


def scenario_toml(replicas: int, requests: int, rate: float, policy: str, router: str, seed: int) -> str:
    """bench_fleet's one-replica scenario at `rate` per replica, as `replicas` replicas behind `router`."""
    arrival = f'{{ kind = "poisson", rate = {rate * replicas!r} }}'
    fleet = f'\n[cluster]\nrouter = "{router}"\n\n[[cluster.groups]]\ncount = {replicas}\n'
    return bench_fleet.scenario_toml(policy, requests, arrival, seed) + fleet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--per-replica-rate", type=float, default=5.0)
    ap.add_argument("--policy", default="vllm", choices=list(bench_fleet.POLICIES))
    ap.add_argument("--router", default="least_outstanding")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.replicas < 1 or args.requests < 1 or args.per_replica_rate <= 0:
        ap.error("--replicas, --requests and --per-replica-rate must be positive")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scenario = work / "cluster.toml"
        text = scenario_toml(
            args.replicas, args.requests, args.per_replica_rate, args.policy, args.router, args.seed
        )
        scenario.write_text(text)
        cmd = [sys.executable, "-m", "sim", "run", str(scenario), "--force", "--out", str(work / "out")]
        usage = bench_fleet.measure(cmd, work / "run.log")
        summary = json.loads((work / "out" / args.policy / "summary.json").read_text())
    wall, cpu, rss = usage.wall_s, usage.cpu_s, usage.peak_rss / 2**20
    finished = summary["requests"]["finished"]
    print(f"{args.replicas} replicas ({args.router}), {args.requests:,} requests, {finished:,} finished")
    print(
        f"wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:,.0f} MiB, {args.requests / wall:,.0f} requests/s"
    )
    rps, batch = summary["throughput"]["requests_per_s"], summary["steps"]["mean_batch_size"]
    print(f"simulated {summary['horizon_s']:.0f} s; fleet throughput {rps:.1f} req/s; mean batch {batch:.1f}")


if __name__ == "__main__":
    main()
