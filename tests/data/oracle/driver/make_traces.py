#!/usr/bin/env python3
"""Write the conformance cases' traces (`../NAME.trace.json`), seeded: same output on every run.

    python3 tests/data/oracle/driver/make_traces.py

Each trace is shaped to exercise one rule of vLLM's scheduler; ../README.md lists the driver command
line that turns each into its steps log.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent


def request(i: int, step: int, prompt: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"id": f"r{i}", "arrival_step": step, "prompt_len": prompt, "max_tokens": max_tokens, **extra}


def spread(
    rng: random.Random,
    count: int,
    prompts: tuple[int, int],
    outputs: tuple[int, int],
    gaps: tuple[int, ...] = (0, 0, 1, 2, 3),
    start: int = 0,
    first: int = 0,
) -> list[dict[str, Any]]:
    """Requests arriving a random number of steps apart."""
    out, step = [], start
    for i in range(first, first + count):
        out.append(request(i, step, rng.randint(*prompts), rng.randint(*outputs)))
        step += rng.choice(gaps)
    return out


def long_prefill() -> list[dict[str, Any]]:
    """A lone 864-token prompt first (the threshold does not apply to it), then a mix where it does."""
    rng = random.Random(11)
    trace = [request(0, 0, 864, 20)]
    trace += spread(rng, 24, (200, 1500), (1, 40), start=3, first=1)
    trace.append(request(25, 160, 1800, 5))  # alone again later: chunked by the budget only
    return trace


def long_prefill_running() -> list[dict[str, Any]]:
    """Long prompts that stay running while others come and go: the threshold switches on and off."""
    rng = random.Random(12)
    trace = [request(0, 0, 2000, 30), request(1, 1, 1500, 10)]
    trace += spread(rng, 14, (50, 700), (1, 30), start=4, first=2)
    trace.append(request(16, 90, 2500, 3))
    return trace


def watermark() -> list[dict[str, Any]]:
    """Admissions gated by the watermark under memory pressure. A lone request first, and again after the
    others drained, needs more blocks than the watermark leaves: it is admitted, as nothing else runs."""
    rng = random.Random(13)
    trace = [request(0, 0, 2900, 8)]
    trace += spread(rng, 28, (100, 800), (20, 160), start=12, first=1)
    trace.append(request(29, 400, 2950, 4))
    return trace


def multi_preempt() -> list[dict[str, Any]]:
    """Equal requests that cross a block boundary in the same step, small ones admitted behind them: in
    one step several running requests each preempt the most recently admitted one."""
    trace = [request(i, 0, 31, 60) for i in range(6)]
    trace += [request(i, 1 + (i - 6) // 2, 8, 60) for i in range(6, 16)]
    return trace


def preempt_chain() -> list[dict[str, Any]]:
    """A long prompt chunked by the threshold while small requests are admitted beside it: its next chunk
    preempts several of them in one step."""
    trace = [request(0, 0, 4000, 5), request(1, 0, 40, 200)]
    trace += [request(i, i - 1, 60, 60) for i in range(2, 22)]
    return trace


def max_model_len() -> list[dict[str, Any]]:
    """Prompts plus outputs beyond max_model_len (output capped), with preemption near the cap."""
    rng = random.Random(15)
    return spread(rng, 24, (100, 500), (100, 450))


def parallel_sampling(seed: int, prefix: bool, outputs: tuple[int, int]) -> list[dict[str, Any]]:
    """Requests with n in 1..4, fanned out into child sequences."""
    rng = random.Random(seed)
    trace = spread(rng, 18, (20, 400), outputs)
    for t in trace:
        t["n"] = rng.choice([1, 2, 3, 4])
        if prefix and rng.random() < 0.5:
            t["prefix_group"] = rng.randint(0, 1)
            t["prefix_len"] = min(t["prompt_len"], rng.choice([32, 64, 100]))
    return trace


def block_size(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    trace = spread(rng, 30, (16, 700), (1, 80))
    for t in trace:
        if rng.random() < 0.6:
            t["prefix_group"] = rng.randint(0, 2)
            t["prefix_len"] = min(t["prompt_len"], rng.choice([40, 96, 200]))
    return trace


def burst() -> list[dict[str, Any]]:
    """Three bursts of simultaneous arrivals, file order breaking the ties."""
    rng = random.Random(17)
    trace: list[dict[str, Any]] = []
    for b, step in enumerate((0, 60, 61)):
        for _ in range(12 if b < 2 else 6):
            trace.append(request(len(trace), step, rng.randint(16, 600), rng.randint(1, 50)))
    return trace


def max_seqs() -> list[dict[str, Any]]:
    """Short requests, a large budget and ample blocks: max_num_seqs is what binds."""
    rng = random.Random(18)
    return spread(rng, 30, (10, 120), (5, 60), gaps=(0, 0, 0, 1))


def prefix_preempt() -> list[dict[str, Any]]:
    """Prefix groups under memory pressure: preempted requests hold shared cached blocks."""
    rng = random.Random(19)
    trace = spread(rng, 40, (100, 600), (10, 120))
    for t in trace:
        if rng.random() < 0.75:
            t["prefix_group"] = rng.randint(0, 2)
            t["prefix_len"] = min(t["prompt_len"], rng.choice([64, 128, 200, 300]))
    return trace


TRACES = {
    "long-prefill": long_prefill,
    "long-prefill-running": long_prefill_running,
    "watermark": watermark,
    "multi-preempt": multi_preempt,
    "preempt-chain": preempt_chain,
    "max-model-len": max_model_len,
    "n-parallel": lambda: parallel_sampling(21, prefix=False, outputs=(1, 40)),
    "n-parallel-prefix": lambda: parallel_sampling(22, prefix=True, outputs=(20, 150)),
    "block-32": lambda: block_size(23),
    "block-8": lambda: block_size(24),
    "burst": burst,
    "max-seqs": max_seqs,
    "prefix-preempt": prefix_preempt,
}


def main() -> None:
    for name, make in TRACES.items():
        path = OUT / f"{name}.trace.json"
        path.write_text(json.dumps(make(), separators=(", ", ": ")) + "\n")
        print(path)


if __name__ == "__main__":
    main()
