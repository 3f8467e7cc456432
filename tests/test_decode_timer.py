"""`CostModel.decode_timer`: a run of decode-only steps costed with the constants computed once gives exactly
`step_time_totals`'s seconds (the engine relies on it for byte-identical step records)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.cost.roofline import CostModel

MODELS = {
    "dense": CostModel(load_model("llama-2-7b"), get_gpu("A100-80GB")),
    "tp2, fp8": CostModel(load_model("llama-2-7b"), get_gpu("H100"), tp=2, weight_dtype="fp8"),
    "moe": CostModel(load_model("mixtral-8x7b"), get_gpu("H100"), tp=2),
    "sliding window": CostModel(load_model("gemma-2-9b"), get_gpu("A100-80GB")),
    "mla, absorbed decode": CostModel(load_model("deepseek-v2-lite"), get_gpu("H100")),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 512), ctx_per_row=st.integers(1, 6000))
def test_decode_timer_is_step_time_totals(name: str, rows: int, ctx_per_row: int) -> None:
    cost = MODELS[name]
    seconds_of, window = cost.decode_timer(rows)
    ctx = rows * ctx_per_row
    max_end = ctx_per_row + 1
    expected = cost.step_time_totals(rows, rows, rows, ctx, rows, ctx, max_end)
    if max_end <= window:
        assert seconds_of(ctx) == expected  # exact, not approximately
    else:
        assert expected is None  # past the window only the rows decide
    assert window == (cost.window if cost.model.num_sliding_layers else math.inf)
