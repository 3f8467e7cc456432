"""Roofline cost model: bounds, scaling, tensor parallelism, MoE, calibration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import Calibration
from sim.core.sampling import SamplingParams
from sim.cost.roofline import CostModel, expected_distinct_experts
from sim.cost.sampler import resolve
from sim.io.errors import SimError


@pytest.fixture(scope="module")
def llama7() -> CostModel:
    return CostModel(load_model("llama-2-7b"), get_gpu("A100-80GB"))


def _arr(*xs: int) -> np.ndarray:
    return np.array(xs, dtype=np.int64)


def test_batch1_decode_is_memory_bound_near_weight_time(llama7: CostModel) -> None:
    cost = llama7.step(_arr(1), _arr(128))
    assert cost.bound == "memory"
    ideal = llama7.model.weight_bytes() / (llama7.gpu.hbm_bandwidth * llama7.cal.bandwidth_eff)
    assert cost.seconds == pytest.approx(ideal, rel=0.15)
    assert llama7.step_time(_arr(1), _arr(128)) == (pytest.approx(cost.seconds), False)


def test_weight_and_kv_bytes_have_their_own_bandwidth() -> None:
    cal = Calibration(bandwidth_eff=0.5, kv_bandwidth_eff=0.8, step_overhead_s=0.0)
    cm = CostModel(load_model("llama-2-7b"), get_gpu("H100"), calibration=cal)
    c, q = np.ones(64, np.int64), np.full(64, 2000)
    cost = cm.step(c, q)
    hbm = cm.gpu.hbm_bandwidth
    kv = cost.kv_read_bytes + cost.kv_write_bytes
    assert cost.bound == "memory" and kv > cost.weight_bytes  # MHA: KV reads dominate at this batch
    assert cost.memory_s == pytest.approx(cost.weight_bytes / (hbm * 0.5) + kv / (hbm * 0.8))
    assert cm.step_time(c, q)[0] == pytest.approx(cost.seconds)
    assert cm.step_time_totals(64, 64, 64, 128_000, 64, 128_000, 2001) == (pytest.approx(cost.seconds), False)


def test_long_prefill_is_compute_bound(llama7: CostModel) -> None:
    cost = llama7.step(_arr(2048), _arr(0))
    assert cost.bound == "compute"
    assert llama7.step_time(_arr(2048), _arr(0))[1] is True


def test_small_decode_batch_doubling_is_cheap(llama7: CostModel) -> None:
    t8 = llama7.step_time(np.ones(8, np.int64), np.full(8, 256))[0]
    t16 = llama7.step_time(np.ones(16, np.int64), np.full(16, 256))[0]
    assert t16 / t8 < 1.10


def test_large_prefill_doubling_roughly_doubles(llama7: CostModel) -> None:
    t1 = llama7.step_time(np.full(4, 2048), np.zeros(4, np.int64))[0]
    t2 = llama7.step_time(np.full(8, 2048), np.zeros(8, np.int64))[0]
    assert 1.8 < t2 / t1 < 2.1


def test_tp2_halves_weight_reads_and_adds_allreduce() -> None:
    m, g = load_model("llama-2-13b"), get_gpu("A100-80GB")
    one, two = CostModel(m, g, tp=1), CostModel(m, g, tp=2)
    c, q = np.ones(16, np.int64), np.full(16, 512)
    a, b = one.step(c, q), two.step(c, q)
    assert b.weight_bytes == pytest.approx(a.weight_bytes / 2)
    assert a.allreduce_s == 0 and b.allreduce_s > 0
    assert b.kv_read_bytes == pytest.approx(a.kv_read_bytes / 2)


def test_kv_replicated_when_fewer_kv_heads_than_tp() -> None:
    m, g = load_model("llama-2-70b"), get_gpu("H100")  # 8 KV heads
    assert CostModel(m, g, tp=16).kv_token_bytes == CostModel(m, g, tp=8).kv_token_bytes


def test_kv_bytes_follow_kv_dtype() -> None:
    m, g = load_model("llama-3.1-8b"), get_gpu("H100")
    assert CostModel(m, g).kv_token_bytes == 131_072
    assert CostModel(m, g, kv_dtype="fp8").kv_token_bytes == 65_536
    cost = CostModel(m, g, kv_dtype="fp8").step(_arr(10), _arr(100))
    assert cost.kv_write_bytes == 10 * 65_536


def test_distinct_experts_formula() -> None:
    assert expected_distinct_experts(8, 2, 1) == pytest.approx(2.0)
    assert expected_distinct_experts(8, 2, 2) == pytest.approx(8 * (1 - (6 / 8) ** 2))
    assert expected_distinct_experts(8, 2, 10_000) == pytest.approx(8.0)
    assert expected_distinct_experts(0, 0, 5) == 0.0


def test_moe_reads_touched_experts_only() -> None:
    m = load_model("mixtral-8x7b")
    cm = CostModel(m, get_gpu("H100"), tp=2)
    small = cm.step(_arr(1), _arr(10))
    big = cm.step(np.ones(256, np.int64), np.full(256, 10))
    assert small.experts_touched == pytest.approx(2.0) and big.experts_touched == pytest.approx(8.0)
    assert small.weight_bytes < 0.4 * big.weight_bytes
    assert big.weight_bytes == pytest.approx((m.params_total - m.embedding_params) * 2 / 2, rel=1e-6)


def test_fp8_weights_use_fp8_peak_or_fall_back() -> None:
    m = load_model("llama-3.1-8b")
    assert CostModel(m, get_gpu("H100"), weight_dtype="fp8").peak_flops == 1979e12
    a100 = CostModel(m, get_gpu("A100-80GB"), weight_dtype="fp8")
    assert a100.peak_flops == 312e12 and "no fp8" in a100.note


def test_step_matches_model_flops_and_fast_path() -> None:
    m = load_model("gemma-2-9b")  # sliding-window layers
    cm = CostModel(m, get_gpu("H100"))
    rng = np.random.default_rng(1)
    c = rng.integers(1, 600, 64)
    q = rng.integers(0, 9000, 64)
    cost = cm.step(c, q)
    assert cost.flops_linear + cost.flops_attention == pytest.approx(float(m.prefill_flops(c, q).sum()))
    assert cm.step_time(c, q)[0] == pytest.approx(cost.seconds)


def test_empty_step_and_bad_tp() -> None:
    cm = CostModel(load_model("llama-2-7b"), get_gpu("H100"))
    assert cm.step_time(np.zeros(0, np.int64), np.zeros(0, np.int64)) == (0.0, False)
    with pytest.raises(SimError):
        CostModel(load_model("llama-2-7b"), get_gpu("H100"), tp=0)


def test_calibration_file_matches_defaults(tmp_path: Path) -> None:
    assert Calibration.load() == Calibration()  # the dataclass defaults are the fitted values
    p = tmp_path / "cal.toml"
    p.write_text("[calibration]\nbandwidth_eff = 0.5\n")
    assert Calibration.load(p).bandwidth_eff == 0.5
    p.write_text("[calibration]\nbogus = 1\n")
    with pytest.raises(SimError, match="bogus"):
        Calibration.load(p)


# Rows sampling alike, as generation_config.json defaults make them (None: the calibration's flat term).
ROW_SAMPLINGS: dict[str, SamplingParams | None] = {
    "flat": None,
    "top-p": SamplingParams(temperature=0.6, top_p=0.9),
    "penalties": SamplingParams(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    "greedy": SamplingParams(temperature=0.0),
    "vllm-defaults": SamplingParams(),
}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["llama-2-7b", "qwen2.5-7b", "mixtral-8x7b", "gemma-2-9b", "llama-4-scout-fp8"]),
    st.integers(1, 4),
    st.lists(st.tuples(st.integers(1, 700), st.integers(0, 3000)), min_size=1, max_size=40),
    st.sampled_from(["H100", "A100-80GB"]),  # without and with a tile fill
    st.sampled_from(list(ROW_SAMPLINGS)),
)
def test_one_definition_behind_step_fast_paths_and_recosting(
    name: str, tp: int, rows: list[tuple[int, int]], gpu: str, sampling: str
) -> None:
    """`step`, `step_time`, `step_time_totals`, the decode timer and the calibration's re-costing give the
    same seconds, under the flat sampler term and under every row sampling alike (`CostModel.sample_as`);
    the breakdown `sim step` prints adds up to them."""
    from sim.studies.calibration_trace import Trace, step_seconds

    cm = CostModel(load_model(name), get_gpu(gpu), tp=tp)
    params = ROW_SAMPLINGS[sampling]
    cm.sample_as(None if params is None else resolve(params, {}))
    c = np.array([r[0] for r in rows], np.int64)
    q = np.array([r[1] for r in rows], np.int64)
    seconds, bound = cm.step_time(c, q)
    assert cm.step(c, q).seconds == seconds
    sums = (int(c.sum()), int((c == 1).sum()), int(c @ q), int(c @ c), int(q.sum()), int((c + q).max()))
    totals = cm.step_time_totals(c.size, *sums)
    assert totals is None or totals == (seconds, bound)
    assert cm.totals_timer()(c.size, *sums) == totals  # the engine's form, its constants computed once
    s = cm.step(c, q)
    parts = s.linear_s + s.attention_s + s.allreduce_s + s.overhead_s
    assert parts == pytest.approx(seconds, rel=1e-12)
    one = np.ones(1)
    tr = Trace(
        "x", "x", 1, {}, one * (s.flops_charged - s.attn_flops_charged), one * s.attn_flops_charged,
        one * ((s.tokens - (c == 1).sum()) / s.tokens),
        one * s.weight_bytes, one * (s.kv_read_bytes + s.kv_write_bytes), one * s.tokens, one * s.rows, one,
        cm.peak_flops, cm.hbm, cm.model.num_layers, cm.sampler.sort_entries, cm.row_stream_s,
        one * cm.token_stream_s * (q.sum() + c.sum()), one * cm.allreduce_seconds(s.tokens),
        *([np.zeros(0, np.int64)] * 6), 0.0, cm.gpu,
    )  # fmt: skip
    assert step_seconds(tr, cm.calibration)[0] == pytest.approx(seconds, rel=1e-12)
    if (c == 1).all():  # a decode step: the engine's decode timer prices it alike
        timer, limit = cm.decode_timer(int(c.size))
        assert (c + q).max() > limit or timer(int(q.sum())) == (seconds, bound)


def test_held_parameters_are_the_kernel_profiles_and_no_row_cost() -> None:
    """Not fitted to the serving rows: the compute efficiencies are the H200 profile's 16-bit GEMM efficiency
    (the rows' prompts come mostly from the prefix cache), the KV efficiency its decode-attention efficiency
    (one model only has KV traffic enough to identify it), and a row costs nothing beyond its bytes and FLOPs
    (vLLM prepares rows on the host while the previous step runs), as `sim calibrate` holds them."""
    from sim.config.calibration import KernelCalibration
    from sim.studies.calibrate import BOUNDS, HELD, held

    kernel = KernelCalibration.load()
    cal = Calibration()
    assert cal.compute_eff_prefill == cal.compute_eff_decode == round(kernel.gemm_compute_eff, 4)
    assert cal.kv_bandwidth_eff == round(kernel.kv_bandwidth_eff, 4) and cal.per_row_overhead_s == 0.0
    assert not set(HELD) & set(BOUNDS)
    fitted = held(dict.fromkeys(HELD, 0.5))
    assert fitted["compute_eff_prefill"] == fitted["compute_eff_decode"] == kernel.gemm_compute_eff
    assert fitted["kv_bandwidth_eff"] == kernel.kv_bandwidth_eff and fitted["per_row_overhead_s"] == 0.0
    assert cal.allreduce_scale == fitted["allreduce_scale"] == 1.0  # the measured all-reduces as they are


def test_the_sampler_costs_each_row_its_vocabulary() -> None:
    """Logits processing and sampling: `sampler_s_per_entry` per row and vocabulary entry, on top of the rest
    of the step, in the step time and in the breakdown's overhead alike."""
    c, q = np.ones(48, np.int64), np.full(48, 700, np.int64)
    model = load_model("qwen2.5-7b")
    base = CostModel(model, get_gpu("H100"), calibration=replace(Calibration(), sampler_s_per_entry=0.0))
    cost = CostModel(model, get_gpu("H100"), calibration=replace(Calibration(), sampler_s_per_entry=2e-10))
    extra = 48 * model.vocab_size * 2e-10  # 152,064 entries: 1.46 ms for 48 rows
    assert cost.step_time(c, q)[0] - base.step_time(c, q)[0] == pytest.approx(extra, rel=1e-9)
    assert cost.step(c, q).overhead_s - base.step(c, q).overhead_s == pytest.approx(extra, rel=1e-9)
    assert model.vocab_size == 152_064 and extra == pytest.approx(1.46e-3, rel=1e-2)


def test_both_cost_models_take_the_rows_attention_sums_from_one_definition() -> None:
    """`layer_sums` against a token-by-token count, on a sliding-window model with rows before, across and
    past the window; the roofline and the kernel model both reduce a step through it."""
    from sim.cost.kernel_model import KernelCostModel
    from sim.cost.kernels import layer_sums

    model = load_model("gemma-2-9b")
    w = int(model.sliding_window or 0)
    assert w and model.num_sliding_layers
    c, q = _arr(1, 300, 1, 2000, 17), _arr(40, 0, w - 1, w - 500, 3 * w)
    full = sum(q[i] * c[i] + c[i] * (c[i] + 1) // 2 for i in range(c.size))
    sliding = sum(min(q[i] + j, w) for i in range(c.size) for j in range(1, c[i] + 1))
    sums = layer_sums(c, q, float(c.sum()), True, float(w))
    assert sums == (full, q.sum(), sliding, np.minimum(q, w).sum(), c.sum() - 2)
    roof = CostModel(model, get_gpu("H100"))
    assert roof._sums(c, q) == sums
    assert roof._over_layers(sums) == (
        roof.full_layers * sums[0] + model.num_sliding_layers * sums[2],
        roof.full_layers * sums[1] + model.num_sliding_layers * sums[3],
        sums[4],
    )
    assert KernelCostModel(model, get_gpu("H100"))._sums(c, q) == sums


@pytest.mark.parametrize(
    ("model", "gpu", "tp", "args"),
    [
        ("llama-3.1-8b", "H100", 1, ["--batch", "32", "--context", "1500"]),
        ("llama-3.1-70b", "H100", 4, ["--prefill", "4096"]),
        ("mixtral-8x7b", "A100-80GB", 2, ["--batch", "64", "--context", "700"]),
    ],
)
def test_engine_and_sim_step_charge_one_step_the_same(model: str, gpu: str, tp: int, args: list[str]) -> None:
    """The step time `sim step` reports is the one the engine charges for the same step: the cost model a
    run builds from its scenario (`build_cost_and_memory`), to the bit."""
    import json

    from typer.testing import CliRunner

    from sim.cli.app import app
    from sim.config.scenario import validate_scenario
    from sim.cost.replica import build_cost_and_memory
    from sim.report.step import step_rows

    cmd = ["step", model, "--gpu", gpu, "--tp", str(tp), *args, "--json"]
    res = CliRunner().invoke(app, cmd)
    assert res.exit_code == 0, res.output
    reported = json.loads(res.output)["seconds"]
    data = {
        "name": "one-step",
        "model": {"name": model, "gpu": gpu, "tp": tp},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 1.0},
            "prompt": {"kind": "fixed", "value": 512},
            "output": {"kind": "fixed", "value": 64},
        },
        "horizon": {"max_requests": 1},
        "policies": {"vllm": {"scheduler": "vllm"}},
    }
    cost = build_cost_and_memory(validate_scenario(data, "test"))[0]
    batch = int(args[1]) if args[0] == "--batch" else None
    context = int(args[3]) if args[0] == "--batch" else None
    prefill = int(args[1]) if args[0] == "--prefill" else None
    c, q = step_rows(batch, context, prefill)
    assert reported == cost.step_time(c, q)[0]


def test_both_parameter_sets_share_one_step_time_path() -> None:
    """The roofline and the kernel model are one step-time implementation (`StepModel`) priced under two
    parameter sets: neither has a step-time path, a row reduction or a shape derivation of its own."""
    from sim.cost.kernel_model import KernelCostModel
    from sim.cost.step_model import StepModel

    for method in ("step_time", "step_time_totals", "_sums", "touched"):
        assert getattr(CostModel, method) is getattr(StepModel, method), method
        assert getattr(KernelCostModel, method) is getattr(StepModel, method), method
    model, gpu = load_model("mixtral-8x7b"), get_gpu("H100")
    roof, kern = CostModel(model, gpu, tp=2), KernelCostModel(model, gpu, tp=2)
    shapes = ("kv_layer_bytes", "kv_token_bytes", "expert_bytes_per_layer", "attn_flops_pair", "allreduces")
    for name in shapes:
        assert getattr(roof, name) == getattr(kern, name), name


def test_the_roofline_fills_each_gpus_measured_gemm_tiles() -> None:
    """A step's 16-bit GEMMs and LM head compute as M + the GPU's fitted `gemm_m_half_tokens` rows, in whole
    rows (A100 93; the Hoppers' fit on its floor, none); quantized weights run other kernels and fill none."""
    spec = load_model("yi-34b")
    a100, h100 = CostModel(spec, get_gpu("A100-80GB"), 2), CostModel(spec, get_gpu("H100-SXM"), 2)
    assert (a100.tile_fill_tokens, h100.tile_fill_tokens) == (93.0, 0.0)
    s = a100.step(np.array([512]), np.array([0]))
    pairs = s.flops_attention / a100.attn_flops_pair
    filled = a100.lin_cost_tok * (512 + 93) + a100.head_cost_row * (1 + 93) + a100.attn_cost_pair * pairs
    assert s.flops_charged == pytest.approx(filled, rel=1e-12)
    assert s.compute_s == pytest.approx(filled / (a100.peak_flops * a100.cal.compute_eff_prefill), rel=1e-12)
    assert a100.step_time(np.array([512]), np.array([0]))[0] == s.seconds
    int4 = CostModel(
        load_model("llama-3.1-70b"), get_gpu("A100-80GB"), weight_dtype="int4", weight_group_size=128
    )
    assert int4.tile_fill_tokens == 0.0


def test_sim_step_shows_the_tile_fill_it_charged() -> None:
    from sim.cost.kernel_model import KernelCostModel
    from sim.report.step import step_summary

    spec, g = load_model("yi-34b"), get_gpu("A100-80GB")
    c, q = np.array([512]), np.array([0])
    summary = step_summary(KernelCostModel(spec, g, 2), c, q, CostModel(spec, g, 2))
    assert summary["engine"]["tile_fill_tokens"] == 93.0  # type: ignore[index]
