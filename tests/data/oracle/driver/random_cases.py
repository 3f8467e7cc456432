#!/usr/bin/env python3
"""Random conformance cases from the real vLLM scheduler: seeded settings and traces, one process.

Each seed draws the settings (block size 8/16/32, blocks, max_num_seqs, budget, chunked prefill, threshold,
watermark, prefix caching, max_model_len) and a trace (n > 1, prefix groups, bursts), runs it through
`vllm_drive.drive` and writes SEED.trace.json and SEED.steps.jsonl into --out. Run it with the Python of a
vLLM 0.32.0 install, then compare each with `sim replay-steps SEED.trace.json --compare SEED.steps.jsonl`:

    $VLLM_PY tests/data/oracle/driver/random_cases.py --out /tmp/random --seeds 0 240
    for t in /tmp/random/*.trace.json; do
      .venv/bin/python -m sim replay-steps "$t" --compare "${t%.trace.json}.steps.jsonl" | sed -n 2p
    done | sed "s|identical steps: [0-9]*/[0-9]* ||" | sort | uniq -c   # 240 (100.00%)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import vllm_drive  # noqa: E402


def settings(rng: random.Random) -> list[str]:
    block_size = rng.choice([8, 16, 16, 32])
    max_model_len = rng.choice([512, 1024, 4096])
    chunked = rng.random() < 0.8
    budget = rng.choice([256, 512, 1024, 2048])
    if not chunked:
        budget = max(budget, max_model_len)
    flags = [
        f"--num-blocks={rng.randint(40, 400)}",
        f"--block-size={block_size}",
        f"--max-num-seqs={rng.choice([2, 4, 8, 16])}",
        f"--max-num-batched-tokens={budget}",
        f"--max-model-len={max_model_len}",
        f"--long-prefill-token-threshold={rng.choice([0, 0, 64, 200])}",
        f"--watermark={rng.choice([0.0, 0.0, 0.02, 0.1])}",
    ]
    if rng.random() < 0.5:
        flags.append("--prefix-caching")
    if not chunked:
        flags.append("--no-chunked-prefill")
    return flags


def trace(rng: random.Random, a: argparse.Namespace) -> list[dict]:
    usable_tokens = (a.num_blocks - 1) * a.block_size
    out, step = [], 0
    for i in range(rng.randint(5, 30)):
        step += rng.choice([0, 0, 0, 1, 2, 5])
        prompt = rng.randint(1, min(a.max_model_len - 1, usable_tokens // 2, 1500))
        t = {"id": f"r{i}", "arrival_step": step, "prompt_len": prompt, "max_tokens": rng.randint(1, 150)}
        if rng.random() < 0.3:
            t["n"] = rng.randint(2, 4)
        if rng.random() < 0.5:
            t["prefix_group"] = rng.randint(0, 2)
            t["prefix_len"] = rng.randint(0, prompt)
        out.append(t)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--seeds", type=int, nargs=2, default=(0, 240), metavar=("FIRST", "END"))
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for seed in range(*args.seeds):
        rng = random.Random(seed)
        a = vllm_drive.parser().parse_args(settings(rng) + ["--max-steps=20000"])
        t = trace(rng, a)
        effective, records = vllm_drive.drive(t, a)
        with open(os.path.join(args.out, f"{seed}.trace.json"), "w") as f:
            json.dump(t, f)
        vllm_drive.write_log(os.path.join(args.out, f"{seed}.steps.jsonl"), effective, records)
    print(json.dumps({"out": args.out, "cases": args.seeds[1] - args.seeds[0]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
