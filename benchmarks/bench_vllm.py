"""Speed of the `vllm` policy in a time-based run: a shared-prefix workload on Llama-2-7B / H100.

Staged arrivals (5 req/s for 600 s, then 10 req/s), prompts of a 100-token system prompt (11 of them, 4 users
each) plus a 466-token question, 247 output tokens each (`ignore_eos`), `max_num_seqs = 128`, a 2,048-token
budget and prefix caching: most steps are decode steps over a few to a few dozen sequences, so the time goes
into the scheduler's per-row work. The run drains; the timed figure covers the simulation, and the records
(polars frames and the summary) apart.

    .venv/bin/python benchmarks/bench_vllm.py                  # 3,000 requests
    .venv/bin/python benchmarks/bench_vllm.py --requests 10000
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sim.config.scenario import Scenario, validate_scenario  # noqa: E402
from sim.cost.replica import build_cost_and_memory
from sim.engine.replica import Horizon, simulate  # noqa: E402
from sim.engine.schedulers.registry import load_all  # noqa: E402
from sim.records.summary import Slo, summarize
from sim.workload.generator import Workload  # noqa: E402


def scenario(requests: int) -> Scenario:
    data: dict[str, Any] = {
        "name": "bench-vllm",
        "seed": 1,
        "model": {"name": "llama-2-7b", "gpu": "H100"},
        "workload": {
            "arrival": {"kind": "staged", "stages": [[5, 600], [10, 600]], "exact_count": True},
            "shared_prefix": {
                "system_prompt_len": 100,
                "question_len": 466,
                "output_len": 247,
                "num_unique_system_prompts": 11,
                "num_users_per_system_prompt": 4,
            },
            "ignore_eos": True,
        },
        "horizon": {"max_requests": requests, "drain": True},
        "policies": {
            "vllm": {
                "scheduler": "vllm",
                "max_num_seqs": 128,
                "max_num_batched_tokens": 2048,
                "enable_prefix_caching": True,
            }
        },
    }
    return validate_scenario(data, "bench_vllm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()

    sc = scenario(args.requests)
    kind, config = sc.policy("vllm")
    cost, budget, _ = build_cost_and_memory(sc)
    sched = load_all()[kind].build(config, budget)
    stream = Workload(sc.workload, sc.seed, Path.cwd()).open_loop(args.requests, None)
    gc.collect()
    t0 = time.perf_counter()
    out = simulate(sched, cost.step_time, Horizon(max_requests=args.requests, drain=True), open_loop=stream)
    t_sim = time.perf_counter() - t0
    req, steps = out.recorder.requests_frame(), out.recorder.steps_frame()
    summary = summarize(req, steps, out.end_time, Slo(), out.overloaded)
    wall = time.perf_counter() - t0
    fin = summary["requests"]["finished"]
    out_tokens = int(req["generated_tokens"].sum())
    step_tokens = int(steps["prefill_tokens"].sum() + steps["decode_tokens"].sum())
    print(f"{args.requests:,} requests; llama-2-7b on H100; vllm: 128 seqs, 2048-token budget, prefix cache")
    print(f"simulated {out.end_time:,.0f} s: {fin:,} finished, {steps.height:,} steps, "
          f"mean batch {summary['steps']['mean_batch_size']:.1f}")  # fmt: skip
    print(f"wall: {wall:.2f} s ({t_sim:.2f} s simulating, {wall - t_sim:.2f} s frames and summary)")
    print(f"simulated requests per wall second: {args.requests / wall:,.0f}")
    print(f"output tokens per wall second: {out_tokens / wall:,.0f}; "
          f"scheduled tokens per wall second: {step_tokens / wall:,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
