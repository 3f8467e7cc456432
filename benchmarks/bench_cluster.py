"""Fleet speed: a 32-replica fleet behind a least-outstanding router, as one whole `sim run` process.

The scenario is ShareGPT-like (Llama-2-7B on A100-80GB; prompts lognormal mean 160 tokens, outputs lognormal
mean 340, both cv 1.0 and capped at 2048; `max_tokens = 2048`; the `vllm` policy with its defaults), with
Poisson arrivals at `--per-replica-rate` (5 req/s, about 60% of one replica's saturation) times the replica
count, `--requests` requests in all, drained. `python -m sim run SCENARIO --force --out TMP` runs as a child
process, and the table gives its wall seconds, CPU seconds (user + system) and peak RSS from the kernel's
accounting of that child (`os.wait4`): interpreter start, imports, the simulation, the records and their
Parquet files all count.

    .venv/bin/python benchmarks/bench_cluster.py                           # 32 replicas, 100,000 requests
    .venv/bin/python benchmarks/bench_cluster.py --requests 1000000        # the full-scale figure
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIO = """
name = "bench-cluster"
seed = {seed}
[model]
name = "llama-2-7b"
gpu = "A100-80GB"
[workload]
arrival = {{ kind = "poisson", rate = {rate} }}
prompt = {{ kind = "lognormal", mean = 160, cv = 1.0, max = 2048 }}
output = {{ kind = "lognormal", mean = 340, cv = 1.0, max = 2048 }}
max_tokens = 2048
[horizon]
max_requests = {requests}
drain = true
[slo]
ttft_s = 1.0
tpot_s = 0.1
[policies.vllm]
scheduler = "{policy}"
[cluster]
router = "{router}"
[[cluster.groups]]
count = {replicas}
"""


def scenario_toml(replicas: int, requests: int, rate: float, policy: str, router: str, seed: int) -> str:
    return SCENARIO.format(
        replicas=replicas, requests=requests, rate=rate * replicas, policy=policy, router=router, seed=seed
    )


def run(scenario: Path, out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one `sim run` child process."""
    cmd = [sys.executable, "-m", "sim", "run", str(scenario), "--force", "--out", str(out)]
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"error: sim run failed; see {out.with_suffix('.log')}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", type=int, default=32)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--per-replica-rate", type=float, default=5.0)
    ap.add_argument("--policy", default="vllm")
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
        wall, cpu, rss = run(scenario, work / "out")
        summary = json.loads((work / "out" / "vllm" / "summary.json").read_text())
    finished = summary["requests"]["finished"]
    print(f"{args.replicas} replicas ({args.router}), {args.requests:,} requests, {finished:,} finished")
    print(
        f"wall {wall:.1f} s, CPU {cpu:.1f} s, peak RSS {rss:,.0f} MiB, {args.requests / wall:,.0f} requests/s"
    )
    rps, batch = summary["throughput"]["requests_per_s"], summary["steps"]["mean_batch_size"]
    print(f"simulated {summary['horizon_s']:.0f} s; fleet throughput {rps:.1f} req/s; mean batch {batch:.1f}")


if __name__ == "__main__":
    main()
