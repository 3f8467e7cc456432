"""A fixed prompt pool (`prefix.prompts_per_group`) through the vllm policy's prefix cache."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from sim.config.scenario import validate_scenario
from sim.studies.run import run_policy

BLOCK = 16


def _run(prefix: dict[str, int], requests: int) -> pl.DataFrame:
    data = {
        "name": "pool",
        "seed": 3,
        "model": {"name": "llama-2-7b", "gpu": "A100-80GB"},
        "workload": {
            "arrival": {"kind": "deterministic", "rate": 1.0},
            "prefix": prefix,
            "prompt": {"kind": "fixed", "value": 100},
            "output": {"kind": "fixed", "value": 8},
            "max_tokens": 8,
        },
        "policies": {"vllm": {"scheduler": "vllm", "enable_prefix_caching": True}},
        "horizon": {"max_requests": requests, "drain": True},
    }
    result = run_policy(validate_scenario(data, "test"), "vllm", Path.cwd(), source="test")
    return result.requests.sort("id")


def test_a_pool_prompt_hits_all_but_its_last_token_from_its_second_use() -> None:
    """One request a second, 8 output tokens: nothing overlaps, nothing is evicted. A prompt's first use
    finds its group's system prompt if an earlier prompt of the group brought it (whole blocks only);
    every later use finds every whole block but the one holding the last token, which vLLM recomputes."""
    groups, per_group, prefix_len = 3, 4, 40
    size = groups * per_group
    reqs = _run({"groups": groups, "prefix_len": prefix_len, "prompts_per_group": per_group}, 3 * size)
    prompt_len = prefix_len + 100
    assert (reqs["prompt_len"] == prompt_len).all()
    seen_groups: set[int] = set()
    for k, (group, hit) in enumerate(zip(reqs["prefix_group"], reqs["prefix_hit_tokens"], strict=True)):
        if k < size:  # each pool prompt's first use
            expected = BLOCK * (prefix_len // BLOCK) if group in seen_groups else 0
            seen_groups.add(group)
        else:
            expected = BLOCK * ((prompt_len - 1) // BLOCK)
        assert hit == expected, (k, group, hit, expected)


def test_without_a_pool_only_the_system_prompt_is_shared() -> None:
    reqs = _run({"groups": 3, "prefix_len": 40}, 36)
    assert reqs["prefix_hit_tokens"].max() == BLOCK * (40 // BLOCK)
