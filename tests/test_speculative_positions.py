"""Acceptance per draft position (alpha_i from a list, a decay, or vLLM's per-position counters), n-gram
lookups that find no match, and EAGLE-3's reduced draft vocabulary."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.scenario import validate_scenario
from sim.config.speculative import SpeculativeConfig
from sim.cost.draft import build_drafter
from sim.cost.roofline import CostModel
from sim.engine.speculative import accepted_positions
from sim.io.errors import SimError
from sim.studies.run import run_policy

ROOT = Path(__file__).resolve().parents[1]
BASE: dict[str, Any] = {
    "name": "positions",
    "seed": 5,
    "model": {"name": "llama-3.1-8b", "gpu": "H100-SXM", "max_model_len": 8192},
    "workload": {
        "arrival": {"kind": "poisson", "rate": 0.5},
        "prompt": {"kind": "fixed", "value": 64},
        "output": {"kind": "fixed", "value": 400},
        "max_tokens": 400,
    },
    "horizon": {"max_requests": 20, "drain": True},
    "policies": {"vllm": {"scheduler": "vllm"}},
}


def _spec(**spec: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["policies"]["spec"] = {
        "scheduler": "vllm",
        "speculative": {"method": "ngram", "num_speculative_tokens": 4, **spec},
    }
    return run_policy(validate_scenario(data, "test"), "spec", ROOT).summary["speculative"]


def test_accepted_positions_tail_is_the_product_of_the_alphas() -> None:
    alphas = [0.9, 0.6, 0.4, 0.2]
    cumulative = tuple(np.cumprod(alphas).tolist())
    u = (np.arange(20000) + 0.5) / 20000
    a = np.array([accepted_positions(float(x), cumulative, 4) for x in u])
    for i in range(5):
        assert (a >= i).mean() == pytest.approx(float(np.prod(alphas[:i])), abs=1e-4)


def test_per_position_acceptance_sets_the_tokens_per_step() -> None:
    spec = _spec(acceptance_per_position=[0.9, 0.6, 0.4, 0.2])
    expected = 1 + 0.9 + 0.9 * 0.6 + 0.9 * 0.6 * 0.4 + 0.9 * 0.6 * 0.4 * 0.2
    assert spec["expected_tokens_per_step"] == pytest.approx(expected)
    assert spec["mean_tokens_per_step"] == pytest.approx(expected, rel=0.03)


def test_alphas_from_vllms_per_position_counters_and_from_a_decay() -> None:
    """vLLM's spec_decode_num_accepted_tokens_per_pos and spec_decode_num_drafts: alpha_i = n_i / n_(i-1)."""
    counts = {"accepted_per_position": [800, 600, 300, 100], "num_drafts": 1000}
    cfg = SpeculativeConfig(method="ngram", num_speculative_tokens=4, **counts)  # type: ignore[arg-type]
    assert cfg.position_rates() == pytest.approx([0.8, 0.75, 0.5, 1 / 3])
    decayed = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, acceptance_rate=0.8, acceptance_decay=0.5
    )
    assert decayed.position_rates() == pytest.approx([0.8, 0.4, 0.2])
    spec = _spec(accepted_per_position=[800, 600, 300, 100], num_drafts=1000)
    assert spec["expected_tokens_per_step"] == pytest.approx(1 + 0.8 + 0.6 + 0.3 + 0.1)


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"accepted_per_position": [800, 900, 100, 0], "num_drafts": 1000}, "accepted_per_position"),
        ({"accepted_per_position": [800, 600, 300, 100]}, "accepted_per_position"),
        ({"acceptance_per_position": [0.9, 0.5]}, "acceptance_per_position"),
        (
            {"acceptance_per_position": [0.9, 0.5, 0.5, 0.5], "acceptance_rate": 0.5},
            "acceptance_per_position",
        ),
        ({"acceptance_rate": 0.5, "acceptance_decay": 0.0}, "acceptance_decay"),
        ({"acceptance_rate": 0.5, "num_drafts": 10}, "num_drafts"),
        ({"acceptance_rate": 0.5, "ngram_match_rate": 1.5}, "ngram_match_rate"),
        ({"acceptance_rate": 0.5, "draft_vocab_size": 32000}, "draft_vocab_size"),
    ],
)
def test_bad_position_tables_name_the_key(spec: dict[str, Any], key: str) -> None:
    data = copy.deepcopy(BASE)
    data["policies"]["spec"] = {
        "scheduler": "vllm",
        "speculative": {"method": "ngram", "num_speculative_tokens": 4, **spec},
    }
    with pytest.raises(SimError) as err:
        validate_scenario(data, "test")
    assert str(err.value).startswith(f"test: policies.spec.speculative.{key}: "), err.value


def test_an_ngram_lookup_without_a_match_carries_no_drafts_for_that_row() -> None:
    """A match rate is not a lower alpha: rows without a match decode one token and verify nothing, so
    there are fewer verification steps while the acceptance measured over the drafts stays alpha."""
    every = _spec(acceptance_rate=0.7)
    some = _spec(acceptance_rate=0.7, ngram_match_rate=0.3)
    decode_tokens = 20 * 399  # each request's tokens after the one its prefill emits
    for spec, share in ((every, 1.0), (some, 0.3)):
        steps, accepted = spec["verification_steps"], spec["accepted_tokens"]
        plain = decode_tokens - steps - accepted  # decode steps that carried no drafts, one token each
        assert steps / (steps + plain) == pytest.approx(share, abs=0.03)
    assert some["per_token_acceptance"] == pytest.approx(0.7, abs=0.03)
    assert some["expected_tokens_per_step"] == pytest.approx(
        1 + 0.3 * (every["expected_tokens_per_step"] - 1)
    )


def test_eagle3_reduced_draft_vocabulary_reads_a_smaller_lm_head() -> None:
    target = CostModel(load_model("llama-3.1-8b"), get_gpu("H100-SXM"))
    full = build_drafter(
        SpeculativeConfig(method="eagle", head_layers=1, num_speculative_tokens=3, acceptance_rate=0.8),
        target,
    )
    eagle3 = SpeculativeConfig(
        method="eagle", head_layers=1, num_speculative_tokens=3, acceptance_rate=0.8, draft_vocab_size=32000
    )
    reduced = build_drafter(eagle3, target)
    assert full.cost is not None and reduced.cost is not None
    assert reduced.cost.model.vocab_size == 32000
    ones, ctx = np.ones(32, np.int64), np.full(32, 1000, np.int64)
    step_full, step_reduced = full.cost.step(ones, ctx), reduced.cost.step(ones, ctx)
    # a batch-32 pass: the LM head read drops from 128,256 x 4096 to 32,000 x 4096 bf16 weights
    assert step_full.weight_bytes - step_reduced.weight_bytes == pytest.approx((128256 - 32000) * 4096 * 2)
    assert step_reduced.seconds < 0.7 * step_full.seconds
    assert (
        reduced.weight_bytes - full.weight_bytes == 32000 * 4096 * 2
    )  # its own LM head, beside the target's


def test_keys_not_given_stay_out_of_the_manifest() -> None:
    """A run without the per-position, match-rate and draft-vocabulary keys dumps its table as before."""
    dump = SpeculativeConfig(method="ngram", num_speculative_tokens=2, acceptance_rate=0.5).model_dump()
    assert not {"ngram_match_rate", "draft_vocab_size", "acceptance_per_position", "acceptance_decay",
                "accepted_per_position", "num_drafts", "acceptance_half_life"} & set(dump)  # fmt: skip


def _along_a_response(alpha: float, k: int, half_life: float, length: int) -> tuple[float, float]:
    """Expected accepted drafts and rejections (steps stopped short) over one response of `length`
    tokens, each verification after g tokens accepting every draft i with probability alpha x
    2^(-g / half_life) given the ones before it: worked step by step, from the first token (the prefill's)."""
    accepted, stops = [0.0] * (length + 1), [0.0] * (length + 1)
    for g in range(length - 1, 0, -1):
        p = alpha * 0.5 ** (g / half_life)
        for a in range(k + 1):
            prob = p**a * (1 - p) if a < k else p**k
            nxt = min(g + a + 1, length)
            accepted[g] += prob * (a + accepted[nxt])
            stops[g] += prob * ((a < k) + stops[nxt])
    return accepted[1], stops[1]


def test_acceptance_falls_along_a_response_by_its_half_life() -> None:
    """alpha 0.9 halving every 200 tokens of a 400-token response: the measured per-token acceptance is
    the one the step-by-step expectation gives (0.48), not the configured 0.9."""
    steady = _spec(acceptance_rate=0.9)
    falling = _spec(acceptance_rate=0.9, acceptance_half_life=200.0)
    assert steady["per_token_acceptance"] == pytest.approx(0.9, abs=0.01)
    accepted, stops = _along_a_response(0.9, 4, 200.0, 400)
    assert falling["per_token_acceptance"] == pytest.approx(accepted / (accepted + stops), abs=0.015)
    assert falling["accepted_tokens"] / 20 == pytest.approx(accepted, rel=0.03)
    assert falling["expected_tokens_per_step"] is None and falling["acceptance_half_life"] == 200.0
    assert "acceptance_half_life" not in steady
    # per draft position too: every alpha_i times the same factor
    positions = SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, acceptance_per_position=[0.8, 0.5], acceptance_half_life=100
    )
    assert positions.along_response(100) == pytest.approx(0.5)
    cumulative = (0.8, 0.4)
    assert accepted_positions(0.39, cumulative, 2, 0.5) == 1  # 0.39 < 0.8 x 0.5, not < 0.4 x 0.25
    assert accepted_positions(0.09, cumulative, 2, 0.5) == 2
