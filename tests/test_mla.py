"""MLA attention as vLLM runs it: one-token rows decode in the absorbed form (every head over the cached
latent and rope key), and prefill rows up-project their cached latents to per-head keys and values."""

from __future__ import annotations

import numpy as np
import pytest

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.cost.kernel_model import KernelCostModel
from sim.cost.roofline import CostModel

V3 = load_model("deepseek-v3")


def test_absorbed_decode_and_context_up_projection_flops_from_the_config() -> None:
    # DeepSeek-V3: 128 heads, kv_lora_rank 512, rope 64, nope 128, v 128.
    assert V3.attn_flops_per_pair == 2 * 128 * (192 + 128)
    assert V3.decode_attn_flops_per_pair == 2 * 128 * (512 + 64 + 512)
    assert V3.context_upproj_flops_per_token == 2 * 512 * 128 * (128 + 128)
    dense = load_model("llama-3.1-8b")
    assert dense.decode_attn_flops_per_pair == dense.attn_flops_per_pair
    assert dense.context_upproj_flops_per_token == 0.0


@pytest.mark.parametrize("kind", [CostModel, KernelCostModel])
def test_decode_rows_are_charged_the_absorbed_form(kind: type) -> None:
    cost = kind(load_model("deepseek-v2-lite"), get_gpu("H100"))
    m = cost.model
    ctx = np.array([100, 2000, 700])
    step = cost.step(np.ones(3, dtype=int), ctx)
    pairs = m.num_layers * float((ctx + 1).sum())
    attention = [k.flops for k in step.kernels if k.name == "attention"][0] if kind is KernelCostModel else (
        step.flops_attention)  # fmt: skip
    assert attention == pytest.approx(m.decode_attn_flops_per_pair * pairs)


def test_a_prefill_row_up_projects_its_cached_context() -> None:
    cost = CostModel(load_model("deepseek-v2-lite"), get_gpu("H100"))
    m = cost.model
    c, q = np.array([512]), np.array([3000])
    step = cost.step(c, q)
    pairs = 512 * 3000 + 512 * 513 / 2
    expected = m.num_layers * (m.attn_flops_per_pair * pairs + m.context_upproj_flops_per_token * 3000)
    assert step.flops_attention == pytest.approx(expected)
    # without a cached prefix nothing is up-projected: the causal prefill's pairs alone
    fresh = cost.step(c, np.array([0]))
    assert fresh.flops_attention == pytest.approx(m.num_layers * m.attn_flops_per_pair * 512 * 513 / 2)


def test_absorbed_decode_is_dearer_where_heads_are_many() -> None:
    # Under DP attention a rank runs all 128 heads: the absorbed scores and sums are compute the step pays.
    cost = CostModel(V3, get_gpu("H200"), tp=8)
    batch, ctx = np.ones(256, dtype=int), np.full(256, 8000)
    step = cost.step(batch, ctx)
    assert step.flops_attention > 3 * cost.attn_flops_pair * V3.num_layers * float((ctx + 1).sum())


@pytest.mark.parametrize("kind", [CostModel, KernelCostModel])
def test_totals_give_the_rows_seconds_or_defer_to_them(kind: type) -> None:
    cost = kind(load_model("deepseek-v2-lite"), get_gpu("H100"))

    def totals(c: np.ndarray, q: np.ndarray) -> tuple[float, bool] | None:
        return cost.step_time_totals(len(c), int(c.sum()), int((c == 1).sum()), int((c * q).sum()),
                                     int((c * c).sum()), int(q.sum()), int((c + q).max()))  # fmt: skip

    decode = (np.ones(4, dtype=int), np.array([10, 200, 3000, 45]))
    prefill = (np.array([300, 64]), np.array([0, 1200]))
    for c, q in (decode, prefill):
        assert totals(c, q) == cost.step_time(c, q)  # exact
    mixed = (np.array([1, 1, 300]), np.array([10, 200, 1200]))
    assert totals(*mixed) is None  # the one-token rows' context is not in the totals
    assert cost.step_time(*mixed)[0] > 0.0


def test_mlas_down_projections_are_whole_on_every_tensor_parallel_rank() -> None:
    """vLLM builds DeepSeek's q_a_proj and kv_a_proj_with_mqa as ReplicatedLinear: each TP rank holds and
    runs them whole (7,168 x 2,112 weights a layer, with their norms), the rest of attention sharded."""
    ds = load_model("deepseek-v3")
    per_layer = ds.replicated_attention_params / ds.num_layers
    assert per_layer == 7168 * 1536 + 1536 + 7168 * (512 + 64) + 512
    replicated = ds.replicated_weight_bytes()
    assert ds.weight_bytes_per_gpu(8) == pytest.approx((ds.weight_bytes() - replicated) / 8 + replicated)
    assert ds.linear_flops_per_token_per_gpu(8) == pytest.approx(
        (ds.linear_flops_per_token - 2 * ds.replicated_attention_params) / 8
        + 2 * ds.replicated_attention_params
    )
    gpu = get_gpu("H100")
    tp1, tp8 = CostModel(ds, gpu, 1), CostModel(ds, gpu, 8)
    assert tp8.static_weight_bytes - tp1.static_weight_bytes / 8 == pytest.approx(replicated * 7 / 8)
    kernels = {k.name: k for k in KernelCostModel(ds, gpu, 8).linear_kernels(1, 1)}
    assert kernels["qkv_a"].bytes == pytest.approx(replicated, rel=1e-2)  # the whole weights, on each GPU
    dense = load_model("llama-3.1-8b")
    assert dense.replicated_attention_params == 0
    assert dense.weight_bytes_per_gpu(4) == pytest.approx(dense.weight_bytes() / 4)
