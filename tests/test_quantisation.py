"""Quantisation: weight formats and KV-cache dtypes in memory and in both cost models, against hand figures,
vLLM's FP8 KV capacity on an L4 and the shape of Marlin's INT4 speed-up curve."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.hf_config import from_config
from sim.catalog.models import load_model
from sim.catalog.quantisation import DEQUANT_COMPUTE_EFF
from sim.cli import app
from sim.config.calibration import Calibration, KernelCalibration
from sim.config.scenario import load_scenario
from sim.config.sweep import parse_sweep
from sim.cost.kernel_model import KernelCostModel
from sim.cost.memory import kv_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError
from sim.report.capacity import capacity_report

runner = CliRunner()
LLAMA_8B = Path("sim/catalog/models/llama-3.1-8b.json")


def _llama(quant: dict[str, object] | None = None) -> object:
    cfg = json.loads(LLAMA_8B.read_text())
    if quant is not None:
        cfg["quantization_config"] = quant
    return from_config(cfg, "l", "l", "l.json")


def _decode(batch: int, context: int = 0) -> tuple[np.ndarray, np.ndarray]:
    return np.ones(batch, np.int64), np.full(batch, context, np.int64)


# ----------------------------------------------------------------------------- anchor 1: FP8 KV on an L4

# vLLM's docs, "Quantized KV Cache" (Performance Considerations): Qwen/Qwen3-4B on a 24 GB L4, vLLM 0.25.1,
# --max-model-len 32768, 11.47 GiB KV reservation: 83,488 tokens (auto/BF16) and 166,992 (fp8); max
# concurrency for 32,768-token requests 2.55x and 5.10x.
VLLM_TOKENS = {"bf16": 83_488, "fp8": 166_992}


def test_fp8_kv_doubles_qwen3_4b_kv_tokens_on_an_l4_as_vllm_reports() -> None:
    m, g = load_model("qwen3-4b"), get_gpu("L4")
    per_token = 36 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head_dim x bf16 bytes
    bf16, fp8 = kv_memory(m, g), kv_memory(m, g, kv_dtype="fp8")
    assert (bf16.kv_bytes_per_token, fp8.kv_bytes_per_token) == (per_token, per_token // 2)
    # Same memory, half the bytes per token: twice the blocks, up to the one block the floor can add.
    assert fp8.num_blocks - 2 * bf16.num_blocks in (0, 1)
    assert VLLM_TOKENS["fp8"] - 2 * VLLM_TOKENS["bf16"] == 16  # vLLM's own figures: one block over double
    # vLLM's figure follows from its 11.47 GiB reservation at the same bytes per token (2-decimal rounding).
    assert abs(11.47 * 2**30 // per_token // 16 * 16 - VLLM_TOKENS["bf16"]) <= 64
    # Absolute tokens within 2%: vLLM profiles the activation peak; we use a fitted reserve
    # (sim/cost/memory.py).
    assert bf16.token_capacity == pytest.approx(VLLM_TOKENS["bf16"], rel=0.02)
    assert fp8.token_capacity == pytest.approx(VLLM_TOKENS["fp8"], rel=0.02)
    conc = [kv.token_capacity / 32_768 for kv in (bf16, fp8)]
    assert conc[0] == pytest.approx(2.55, rel=0.02) and conc[1] == pytest.approx(5.10, rel=0.02)


def test_int8_kv_holds_as_many_tokens_as_fp8_and_decode_reads_half_the_kv_bytes() -> None:
    m, g = load_model("llama-3.1-8b"), get_gpu("H100")
    assert kv_memory(m, g, kv_dtype="int8").num_blocks == kv_memory(m, g, kv_dtype="fp8").num_blocks
    steps = {d: CostModel(m, g, kv_dtype=d).step(*_decode(32, 4000)) for d in ("bf16", "fp8", "int8")}
    read16 = 32 * 4000 * 32 * 2 * 8 * 128 * 2  # sequences x context x layers x (K, V) x heads x dim x bytes
    assert steps["bf16"].kv_read_bytes == read16
    assert steps["fp8"].kv_read_bytes == steps["int8"].kv_read_bytes == read16 / 2
    assert steps["fp8"].weight_bytes == steps["bf16"].weight_bytes  # the weights are untouched
    assert steps["fp8"].seconds < steps["bf16"].seconds


# ----------------------------------------------------------------------------- anchor 2: Marlin's curve


def _marlin_ideal(m: int, k: float, n: float, flops: float, bandwidth: float, fill: float = 0.0) -> float:
    """Marlin's ideal speed-up (its bench plot's model): FP16 time over INT4 time with group-128 scales,
    no dequantization cost; the FP16 GEMM filling its tiles as `fill` more rows (the GPU's fit; Marlin's
    16-row tiles charged none)."""
    fp16 = max((2 * m * k + 2 * k * n + 2 * m * n) / bandwidth, 2 * (m + fill) * n * k / flops)
    int4 = max((2 * m * k + k * n / 2 + 2 * m * n + 2 * (k / 128) * n) / bandwidth, 2 * m * n * k / flops)
    return fp16 / int4


@pytest.mark.parametrize("gpu", ["A10G", "A100-80GB", "H100"])
def test_int4_weight_only_speedup_is_near_4x_to_batch_32_and_falls_by_128(gpu: str) -> None:
    """Marlin (IST-DASLab/marlin README; Frantar et al. 2024, measured on an A10): close to the ideal 3.87x up
    to batch 16-32, gradually decreasing but still significant at 64-128. The engine's decode step of
    Llama-3.1-70B, whose fixed costs (per step and per layer, 2.2 ms a step, and the sampler's per row) do not
    shrink with the weights: within 20% of the ideal to batch 32, most on an H100, whose steps are shortest
    (3.14x at 32); there the fall starts later (higher FLOP/byte ratio) but has come by 128 too."""
    m, g = load_model("llama-3.1-70b"), get_gpu(gpu)
    bf16, int4 = CostModel(m, g), CostModel(m, g, weight_dtype="int4", weight_group_size=128)
    batches = (1, 16, 32, 64, 128, 256)
    speedup = {b: bf16.step(*_decode(b)).seconds / int4.step(*_decode(b)).seconds for b in batches}
    assert all(speedup[b] >= 0.80 * 3.87 for b in (1, 16, 32)), speedup
    assert 1.0 < speedup[128] < 0.6 * speedup[16], speedup  # falls, still a gain
    assert all(speedup[a] >= speedup[b] for a, b in zip(batches[1:], batches[2:], strict=False)), speedup
    cal = Calibration()
    flops, bandwidth = g.flops_16bit * cal.compute_eff_decode, g.hbm_bandwidth * cal.bandwidth_eff
    assert int4.tile_fill_tokens == 0.0
    for b, s in speedup.items():  # never above Marlin's ideal on the model's MLP at the same efficiencies
        ideal = _marlin_ideal(b, m.hidden_size, 28672, flops, bandwidth, bf16.tile_fill_tokens)
        assert s <= ideal * 1.001, (b, s)


@pytest.mark.parametrize(("gpu", "fallen"), [("A10G", 128), ("H100", 128)])
def test_kernel_model_int4_gemm_follows_the_same_curve(gpu: str, fallen: int) -> None:
    """The kernel-level model's MLP up-projection GEMM alone, on Marlin's A10 (and an H100)."""
    m, g = load_model("llama-3.1-70b"), get_gpu(gpu)
    bf16 = KernelCostModel(m, g)
    int4 = KernelCostModel(m, g, weight_dtype="int4", weight_group_size=128)

    def up(cost: KernelCostModel, b: int) -> float:
        return next(k.seconds for k in cost.linear_kernels(b, b) if k.name == "mlp_up")

    speedup = {b: up(bf16, b) / up(int4, b) for b in (1, 16, 32, 64, 128, 256)}
    assert all(speedup[b] >= 3.4 for b in (1, 16, 32)), speedup
    assert 1.0 < speedup[fallen] < 0.6 * speedup[16], speedup


def test_both_cost_models_share_the_dequantization_share() -> None:
    assert KernelCalibration().dequant_compute_eff == KernelCalibration.load().dequant_compute_eff
    assert KernelCalibration().dequant_compute_eff == DEQUANT_COMPUTE_EFF


# ----------------------------------------------------------------------------- anchor 3: checkpoints


def _layers(m: object) -> float:
    return float(m.attention_params + m.dense_params)  # type: ignore[attr-defined]


W8A8_INT8 = {
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int"},
            "input_activations": {"num_bits": 8},
        }
    },
}
W4A16 = {"format": "pack-quantized", "config_groups": {"group_0": {
    "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128}}}}  # fmt: skip


@pytest.mark.parametrize(
    ("quant", "bytes_per_weight", "peak", "dequant"),
    [
        ({"quant_method": "fp8"}, 1.0, "fp8", False),
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 0.5 + 2 / 128, "16", True),
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64}, 0.5 + 2 / 64, "16", True),
        ({"quant_method": "gptq", "bits": 8, "group_size": 32}, 1.0 + 2 / 32, "16", True),
        ({"quant_method": "compressed-tensors", **W8A8_INT8}, 1.0, "int8", False),
        ({"quant_method": "compressed-tensors", **W4A16}, 0.5 + 2 / 128, "16", True),
    ],
)
def test_checkpoint_costs_what_its_quantization_config_says(
    quant: dict[str, object], bytes_per_weight: float, peak: str, dequant: bool
) -> None:
    m, g = _llama(quant), get_gpu("H100")
    cost = CostModel(m, g)  # type: ignore[arg-type]
    sixteen = 2.0 * (m.lm_head_params + m.norm_params)  # type: ignore[attr-defined]
    assert cost.static_weight_bytes == pytest.approx(_layers(m) * bytes_per_weight + sixteen, rel=1e-12)
    assert cost.peak_flops == {"fp8": g.flops_fp8, "int8": g.flops_int8, "16": g.flops_16bit}[peak]
    assert cost.rate.dequant is dequant
    # A compute-bound prefill: matmul FLOPs at the format's rate, the 16-bit LM head and attention at 16-bit.
    s = cost.step(np.array([8192]), np.array([0]))
    cal = Calibration()
    lin = m.linear_flops_per_token * 8192  # type: ignore[attr-defined]
    head, attn = m.lm_head_flops, s.flops_attention  # type: ignore[attr-defined]
    rate = cost.peak_flops * cal.compute_eff_prefill * (DEQUANT_COMPUTE_EFF if dequant else 1.0)
    p16 = g.flops_16bit * cal.compute_eff_prefill
    assert s.compute_s == pytest.approx(lin / rate + (head + attn) / p16, rel=1e-9)


def test_checkpoint_and_online_quantisation_of_the_same_format_cost_the_same() -> None:
    g = get_gpu("A100-80GB")
    gptq = CostModel(_llama({"quant_method": "gptq", "bits": 4, "group_size": 128}), g)  # type: ignore[arg-type]
    online = CostModel(load_model("llama-3.1-8b"), g, weight_dtype="int4", weight_group_size=128)
    for c, q in ((np.array([1] * 8), np.array([500] * 8)), (np.array([4096]), np.array([0]))):
        assert gptq.step(c, q).seconds == pytest.approx(online.step(c, q).seconds, rel=1e-12)


def test_kernel_model_reads_the_same_weight_bytes_as_the_engine() -> None:
    m, g = load_model("llama-3.1-8b"), get_gpu("H100")
    for dtype, group in (("fp8", None), ("int4", 128), ("int8", 64), ("bf16", None)):
        engine = CostModel(m, g, weight_dtype=dtype, weight_group_size=group)
        kernel = KernelCostModel(m, g, weight_dtype=dtype, weight_group_size=group)
        assert kernel.weight_bytes_static == pytest.approx(
            engine.static_weight_bytes - 2 * m.norm_params, rel=1e-9
        )
        assert (kernel.peak_flops, kernel.rate) == (engine.peak_flops, engine.rate)


def test_mixed_precision_checkpoint_charges_its_16_bit_modules_at_16_bit() -> None:
    """An FP8 checkpoint that keeps every attention projection in 16-bit (`ignore`): attention weights at 2
    bytes, and their FLOPs at the 16-bit rate inside the FP8 step."""
    ignore = [
        f"model.layers.{i}.self_attn.{p}" for i in range(32) for p in ("q_proj", "k_proj", "v_proj", "o_proj")
    ]
    m, g = _llama({"quant_method": "fp8", "ignore": ignore}), get_gpu("H100")
    cost = CostModel(m, g)  # type: ignore[arg-type]
    dense, attn = m.dense_params, m.attention_params  # type: ignore[attr-defined]
    sixteen = 2.0 * (m.lm_head_params + m.norm_params)  # type: ignore[attr-defined]
    assert cost.static_weight_bytes == pytest.approx(dense * 1.0 + attn * 2.0 + sixteen, rel=1e-12)
    k16 = g.flops_fp8 / g.flops_16bit
    assert cost.lin_cost_tok == pytest.approx(2 * (dense + attn * k16), rel=1e-12)


# ----------------------------------------------------------------------------- anchor 4: decode vs prefill


def test_memory_bound_decode_speeds_up_and_compute_bound_prefill_only_with_w8a8() -> None:
    m, g = load_model("llama-3.1-8b"), get_gpu("H100")
    costs = {
        "bf16": CostModel(m, g),
        "fp8": CostModel(m, g, weight_dtype="fp8"),
        "int4": CostModel(m, g, weight_dtype="int4", weight_group_size=128),
    }
    decode = {k: c.step(*_decode(8, 1000)) for k, c in costs.items()}
    prefill = {k: c.step(np.array([8192]), np.array([0])) for k, c in costs.items()}
    assert all(s.bound == "memory" for s in decode.values())
    assert all(s.bound == "compute" for s in prefill.values())
    # Decode: time follows the bytes read (weights + KV), so it falls with the weight bytes.
    for k in ("fp8", "int4"):
        ratio = decode["bf16"].seconds / decode[k].seconds
        bytes_ratio = (decode["bf16"].weight_bytes + decode["bf16"].kv_read_bytes) / (
            decode[k].weight_bytes + decode[k].kv_read_bytes
        )
        assert 1.3 < ratio <= bytes_ratio * 1.001
    # Prefill: FP8 W8A8 runs the matmuls at twice the rate; INT4 weight-only dequantizes, so it is no faster.
    assert prefill["bf16"].seconds / prefill["fp8"].seconds > 1.5
    assert prefill["int4"].seconds >= prefill["bf16"].seconds
    assert prefill["int4"].seconds / prefill["bf16"].seconds < 1 / DEQUANT_COMPUTE_EFF


# ----------------------------------------------------------------------------- scenario keys and errors


def _scenario(tmp_path: Path, **model: object) -> Path:
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in model.items())
    path = tmp_path / "q.toml"
    path.write_text(f"""name = "q"
[model]
name = "llama-3.1-8b"
gpu = "L4"
max_model_len = 2048
{lines}
[workload]
arrival = {{ kind = "poisson", rate = 2.0 }}
prompt = {{ kind = "fixed", value = 200 }}
output = {{ kind = "fixed", value = 50 }}
[policies.vllm]
scheduler = "vllm"
[horizon]
duration_s = 20
[slo]
ttft_s = 2.0
""")
    return path


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"kv_dtype": "int4"}, "model.kv_dtype: expected one of bf16, fp16, fp8, int8"),
        ({"kv_dtype": "e4m3"}, "model.kv_dtype: expected one of bf16, fp16, fp8, int8"),
        ({"weight_dtype": "fp6"}, "model.weight_dtype: expected one of fp32, bf16, fp16, fp8, int8, int4"),
        ({"weight_dtype": "int4", "weight_group_size": 100}, "model.weight_group_size: expected 0"),
        (
            {"weight_dtype": "fp8", "weight_group_size": 128},
            "model.weight_group_size: applies to int4 or int8",
        ),
        ({"weight_group_size": 128}, "model.weight_group_size: applies to int4 or int8"),
    ],
)
def test_bad_formats_are_one_line_errors_naming_the_key(
    tmp_path: Path, model: dict[str, object], message: str
) -> None:
    with pytest.raises(SimError, match=message) as err:
        load_scenario(_scenario(tmp_path, **model))
    assert "\n" not in str(err.value)


def test_quantised_run_reports_its_formats_and_16_bit_runs_do_not(tmp_path: Path) -> None:
    from sim.studies.run import run_policy

    plain = run_policy(load_scenario(_scenario(tmp_path)), "vllm", tmp_path).summary["replica"]
    assert "weight_format" not in plain
    sc = load_scenario(_scenario(tmp_path, weight_dtype="int4", weight_group_size=128, kv_dtype="fp8"))
    replica = run_policy(sc, "vllm", tmp_path).summary["replica"]
    m, g = load_model("llama-3.1-8b"), get_gpu("L4")
    assert replica["weight_format"] == "W4A16 int4 g128" and replica["kv_dtype"] == "fp8"
    assert replica["weight_bytes"] == int(m.weight_bytes("int4", 128))
    assert replica["kv_bytes_per_token"] == plain["kv_bytes_per_token"] // 2
    assert replica["kv_tokens"] > 2 * plain["kv_tokens"]  # smaller weights and half the bytes per token
    assert replica["matmul_peak_flops"] == g.flops_16bit and replica["dequantized"] is True


# ----------------------------------------------------------------------------- sim capacity


def test_capacity_quantisation_table_by_hand(capsys: pytest.CaptureFixture[str]) -> None:
    capacity_report(["llama-3.1-8b"], "L4", as_json=True, quantisation=True, typical_len=1024)
    out = json.loads(capsys.readouterr().out)
    rows = {r["variant"]: r for r in out["variants"]}
    m = load_model("llama-3.1-8b")
    sixteen = m.embedding_params + m.lm_head_params + m.norm_params
    layers = m.params_total - sixteen
    int4 = rows["INT4 weights (W4A16 g128)"]
    assert int4["weight_bytes"] == int(layers * (0.5 + 2 / 128) + sixteen * 2)
    assert rows["FP8 weights (W8A8)"]["weight_bytes"] == int(layers * 1 + sixteen * 2)
    assert rows["FP8 weights (W8A8)"]["matmul_peak_flops"] == get_gpu("L4").flops_fp8
    assert int4["matmul_effective_flops"] == pytest.approx(get_gpu("L4").flops_16bit * DEQUANT_COMPUTE_EFF)
    base, fp8kv = rows["16-bit"], rows["16-bit, FP8 KV"]
    assert fp8kv["kv_bytes_per_token"] * 2 == base["kv_bytes_per_token"]
    assert abs(fp8kv["kv_tokens"] - 2 * base["kv_tokens"]) <= 16
    # Bytes of a decode step of 32 sequences at 1,024 tokens: weights read + KV read + KV written.
    kv = 32 * 1024 * base["kv_bytes_per_token"] + 32 * base["kv_bytes_per_token"]
    assert base["decode_step_bytes"] == pytest.approx(CostModel(m, get_gpu("L4")).static_weight_bytes + kv)
    assert int4["decode_step_s"] < rows["FP8 weights (W8A8)"]["decode_step_s"] < base["decode_step_s"]
    assert int4["prefill_step_s"] > base["prefill_step_s"] > rows["FP8 weights (W8A8)"]["prefill_step_s"]


def test_capacity_shows_the_chosen_format_and_leaves_16_bit_output_alone() -> None:
    args = ["capacity", "llama-3.1-8b", "--gpu", "L4"]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 0 and "matmul FLOP rate" not in plain.output
    chosen = runner.invoke(
        app, [*args, "--weight-dtype", "int4", "--weight-group-size", "128", "--kv-dtype", "fp8"]
    )
    assert chosen.exit_code == 0, chosen.output
    assert "W4A16 int4 g128" in chosen.output and "matmul FLOP rate" in chosen.output
    assert "bytes / decode step" in chosen.output
    table = runner.invoke(app, [*args, "--quantisation"])
    assert table.exit_code == 0 and "INT4 weights (W4A16 g128)" in table.output


# ----------------------------------------------------------------------------- sweep variants and the report


def test_sweep_variants_are_one_grid_axis() -> None:
    variants = [{"model.weight_dtype": "fp8"}, {"model.kv_dtype": "fp8", "model.block_size": 32}]
    raw = {"params": {"horizon.duration_s": [10, 20]}, "variants": variants}
    grid = parse_sweep(raw, "s.toml").param_grid()
    assert grid == [
        {"horizon.duration_s": d, **v}
        for d in (10, 20)
        for v in ({"model.weight_dtype": "fp8"}, {"model.kv_dtype": "fp8", "model.block_size": 32})
    ]
    assert parse_sweep({}, "s.toml").param_grid() == [{}]
    with pytest.raises(SimError, match=r"sweep.variants\[0\]: give at least one key"):
        parse_sweep({"variants": [{}]}, "s.toml")
    with pytest.raises(SimError, match=r"sweep.variants\[1\]: horizon.duration_s is a sweep.params key"):
        parse_sweep({**raw, "variants": [{"a.b": 1}, {"horizon.duration_s": 5}]}, "s.toml")


def test_report_puts_the_formats_side_by_side(tmp_path: Path) -> None:
    from sim.report.build import build_report, capacities
    from sim.report.inputs import load_inputs
    from sim.report.quantisation import latency_chart, quantisation_rows
    from sim.studies.sweep import run_sweep

    path = _scenario(tmp_path)
    path.write_text(
        path.read_text()
        + """
[sweep]
rates = [1, 2]
variants = [{ "model.weight_dtype" = "bf16" }, { "model.kv_dtype" = "fp8" }]
"""
    )
    out = tmp_path / "reports" / "q"
    run_sweep(path, jobs=1, find_capacity=True, out=out)
    inputs = load_inputs(out)
    rows = quantisation_rows(inputs, capacities(inputs))
    assert [r["format"] for r in rows] == ["bf16 weights", "fp8 KV"]
    g, m = get_gpu("L4"), load_model("llama-3.1-8b")
    expected = [kv_memory(m, g, kv_dtype=d).token_capacity for d in (None, "fp8")]
    assert [r["kv_tokens"] for r in rows] == expected
    points = inputs.points
    assert points is not None
    at2 = points.filter((points["rate"] == 2.0) & points["params"].str.contains("kv_dtype"))
    assert rows[1]["rate"] == 2.0 and rows[1]["ttft_p99"] == pytest.approx(float(at2["ttft_p99"].mean()))
    # the latencies at that rate cover the finished requests of its replications, said in the table
    sums = (int(at2["finished"].sum()), int(at2["arrived"].sum()))
    assert (rows[1]["finished"], rows[1]["arrived"]) == sums
    latency_chart(rows).to_dict(validate=True)
    build_report(out, path, png=False)
    html = (out / "index.html").read_text()
    assert "What quantisation buys" in html and "fp8 KV" in html and f"{expected[1]:,}" in html
    assert "<th>latencies over at 2 req/s</th>" in html
    done, n = rows[1]["finished"], rows[1]["arrived"]
    assert f"<td>{done:,} of {n:,} requests (" in html
    assert math.isfinite(rows[0]["itl_p50"])


def test_shipped_scenario_compares_the_four_formats() -> None:
    sc = load_scenario("scenarios/what-quantisation-buys.toml")
    cfg = parse_sweep(sc.sweep, "what-quantisation-buys.toml")
    assert [v.get("model.weight_dtype") or v.get("model.kv_dtype") for v in cfg.variants] == [
        "bf16",
        "fp8",
        "int4",
        "fp8",
    ]
    g, m = get_gpu(sc.model.gpu), load_model(sc.model.name)
    formats = ((None, None, None), ("fp8", None, None), ("int4", None, 128), (None, "fp8", None))
    tokens = [
        kv_memory(m, g, weight_dtype=w, kv_dtype=k, weight_group_size=gs).token_capacity
        for w, k, gs in formats
    ]
    assert tokens[0] < tokens[3] and tokens[0] < tokens[1] < tokens[2]  # every format holds more than 16-bit


def test_run_manifest_names_the_group_size_only_when_given(tmp_path: Path) -> None:
    """Records of scenarios without the new key keep their manifests and scenario hashes."""
    from sim.studies.run import compared_scenario

    plain = compared_scenario(load_scenario(_scenario(tmp_path)))
    assert "weight_group_size" not in plain["model"]
    assert set(plain["model"]) == {"name", "gpu", "tp", "weight_dtype", "kv_dtype", "gpu_memory_utilization",
                                   "max_model_len", "block_size", "num_kv_blocks"}  # fmt: skip
    grouped = compared_scenario(load_scenario(_scenario(tmp_path, weight_dtype="int4", weight_group_size=64)))
    assert grouped["model"]["weight_group_size"] == 64


def test_sim_step_takes_the_group_size() -> None:
    args = [
        "--weight-dtype",
        "int4",
        "--weight-group-size",
        "128",
        "--batch",
        "1",
        "--context",
        "0",
        "--json",
    ]
    out = runner.invoke(app, ["step", "llama-3.1-8b", "--gpu", "H100", *args])
    assert out.exit_code == 0, out.output
    step = json.loads(out.output)
    m = load_model("llama-3.1-8b")
    layers = m.attention_params + m.dense_params
    assert step["weight_bytes"] == pytest.approx(layers * (0.5 + 2 / 128) + 2 * m.lm_head_params, rel=1e-9)


def test_bulk_decoding_stays_exact_under_quantised_costs() -> None:
    """The vllm policy's bulk decode path costs steps through `step_time_totals`: with a quantised cost model
    it must still give the step-by-step records (KV pressure included: 400 blocks)."""
    from polars.testing import assert_frame_equal

    from sim.config.policies import VllmConfig
    from sim.core.request import Request
    from sim.cost.memory import KvBudget
    from sim.engine.replica import Horizon, simulate
    from sim.engine.schedulers.vllm.scheduler import VllmScheduler

    m, g = load_model("llama-3.1-8b"), get_gpu("L4")
    cost = CostModel(m, g, weight_dtype="int4", kv_dtype="fp8", weight_group_size=128)
    arrivals = np.cumsum(np.random.default_rng(3).exponential(0.3, 60))

    def records(fast: bool) -> list[object]:
        sched = VllmScheduler(VllmConfig(max_num_seqs=16), KvBudget(400, 16, 4096), fast=fast)
        reqs = [
            Request(i, float(t), 100 + (i * 53) % 900, 40 + (i * 37) % 300, 40 + (i * 37) % 300)
            for i, t in enumerate(arrivals)
        ]
        out = simulate(sched, cost.step_time, Horizon(max_requests=60, drain=True), open_loop=iter(reqs))
        return [out.recorder.requests_frame(), out.recorder.steps_frame()]

    for slow, fast in zip(records(False), records(True), strict=True):
        assert_frame_equal(slow, fast)  # type: ignore[arg-type]


MIXED = {"quant_method": "compressed-tensors", "format": "mixed-precision", "config_groups": {
    "group_0": {"targets": ["re:.*self_attn.(k|q|o|v)_proj$"], "weights": {"num_bits": 8, "type": "int"},
                "input_activations": {"num_bits": 8, "type": "int"}},
    "group_1": {"targets": ["re:.*mlp.(down|gate|up)_proj$"],
                "weights": {"num_bits": 4, "type": "int", "group_size": 128}},
}}  # fmt: skip


def test_mixed_precision_config_groups_cost_each_module_kind_in_its_format() -> None:
    """A compressed-tensors checkpoint with W8A8 INT8 attention and W4A16 (g128) MLPs: bytes and FLOP rate
    per module kind, in the engine and in the kernel model."""
    m, g = _llama(MIXED), get_gpu("H100")
    q = m.quant  # type: ignore[attr-defined]
    assert (q.dtype, q.activations, q.group_size) == ("int4", False, 128)  # the MLPs: most module kinds
    assert q.format_of("attention") == ("int8", True, 0)
    cost = CostModel(m, g)  # type: ignore[arg-type]
    attn, dense = m.attention_params, m.dense_params  # type: ignore[attr-defined]
    sixteen = 2.0 * (m.lm_head_params + m.norm_params)  # type: ignore[attr-defined]
    assert cost.static_weight_bytes == pytest.approx(
        attn * 1.0 + dense * (0.5 + 2 / 128) + sixteen, rel=1e-12
    )
    s = cost.step(np.array([8192]), np.array([0]))
    e = Calibration().compute_eff_prefill
    expected = (
        2 * 8192 * dense / (g.flops_16bit * DEQUANT_COMPUTE_EFF * e)
        + 2 * 8192 * attn / (g.flops_int8 * e)
        + (m.lm_head_flops + s.flops_attention) / (g.flops_16bit * e)  # type: ignore[attr-defined]
    )
    assert s.compute_s == pytest.approx(expected, rel=1e-9)
    kernel = {k.name: k for k in KernelCostModel(m, g).step(np.array([8192]), np.array([0])).kernels}  # type: ignore[arg-type]
    cal = KernelCalibration()
    qkv, up = kernel["qkv"], kernel["mlp_up"]
    assert qkv.seconds == pytest.approx(
        qkv.flops / (g.flops_int8 * cal.gemm_compute_eff_fp8) + qkv.count * cal.graph_kernel_fixed_s, rel=1e-9
    )
    rate16 = g.flops_16bit * cal.gemm_compute_eff * cal.dequant_compute_eff
    assert up.seconds == pytest.approx(up.flops / rate16 + up.count * cal.graph_kernel_fixed_s, rel=1e-9)
    from sim.catalog.quantisation import weight_format

    assert weight_format(q) == "W4A16 int4 g128 + W8A8 int8 attention"


def test_capacity_quantisation_compares_against_the_first_format_that_fits() -> None:
    """Llama-3.1-70B (141 GB at 16-bit) on one H100: 16-bit does not fit, FP8 (72.7 GB) does, with fewer KV
    tokens than 32 sequences of 1,024 need; INT4 leaves room for over a hundred."""
    out = runner.invoke(app, ["capacity", "llama-3.1-70b", "--gpu", "H100", "--quantisation", "--json"])
    assert out.exit_code == 0, out.output
    rows = {r["variant"]: r for r in json.loads(out.output)["variants"]}
    assert rows["16-bit"]["fits"] is False and "does not fit" in rows["16-bit"]["reason"]
    assert (
        rows["FP8 weights (W8A8)"]["max_seqs_at_typical_len"]
        < 32
        <= rows["INT4 weights (W4A16 g128)"]["max_seqs_at_typical_len"]
    )
    text = runner.invoke(app, ["capacity", "llama-3.1-70b", "--gpu", "H100", "--quantisation"]).output
    assert "speed-up over FP8 weights (W8A8)" in text and "*" in text


# ----------------------------------------------------------------------------- ignore, per module

LLAMA2_7B = Path("sim/catalog/models/llama-2-7b.json")


def _llama2(quant: dict[str, object]) -> object:
    cfg = json.loads(LLAMA2_7B.read_text())
    cfg["quantization_config"] = quant
    return from_config(cfg, "l", "l", "l.json")


def _w4a16(**extra: object) -> dict[str, object]:
    return {"quant_method": "compressed-tensors", **W4A16, **extra}


@pytest.mark.parametrize(
    ("quant", "down_projs"),
    [
        (_w4a16(ignore=["model.layers.1.mlp.down_proj"]), 1),
        (_w4a16(ignore=[f"model.layers.{i}.mlp.down_proj" for i in range(0, 20, 2)]), 10),
        (_w4a16(ignore=["re:.*down_proj"]), 32),
        (_w4a16(ignore=["re:model\\.layers\\.[0-9]\\.mlp\\.down_proj$"]), 10),
        (_w4a16(ignore=["mlp.down_proj"]), 0),  # compressed-tensors: exact names only
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["down_proj"]}, 32),
        (
            {"quant_method": "awq", "bits": 4, "group_size": 128, "modules_to_not_convert": ["layers.3.mlp"]},
            3,
        ),
    ],
)
def test_ignore_keeps_each_named_module_in_16_bit_and_no_more(
    quant: dict[str, object], down_projs: int
) -> None:
    """Llama-2-7B W4A16 g128: each ignored down_proj (4096 x 11008) adds its own 2 - (0.5 + 2/128) bytes per
    weight, not its layer's whole MLP; `re:` entries are regular expressions matched from the name's start
    (compressed-tensors), AWQ's `modules_to_not_convert` entries match any name containing them (the
    "layers.3.mlp" entry: gate, up and down of layer 3)."""
    base = _llama2(_w4a16()).weight_bytes()  # type: ignore[attr-defined]
    m = _llama2(quant)
    per_module = 4096 * 11008 * (2.0 - (0.5 + 2 / 128))
    assert m.weight_bytes() - base == pytest.approx(down_projs * per_module, rel=1e-9)  # type: ignore[attr-defined]


def test_ignore_of_some_fused_shards_is_refused_as_vllm_refuses_it() -> None:
    with pytest.raises(
        SimError, match=r"quantization_config\.ignore: model\.layers\.0\.self_attn\.q_proj.*k_proj, v_proj"
    ):
        _llama2(_w4a16(ignore=["model.layers.0.self_attn.q_proj"]))
    _llama2(_w4a16(ignore=[f"model.layers.0.self_attn.{p}_proj" for p in "qkv"]))  # all three: accepted


@pytest.mark.parametrize("gpu", ["A100-80GB", "T4"])
def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_weight_only_marlin(gpu: str) -> None:
    """vLLM runs FP8 weights below compute capability 8.9 through Marlin: one byte a weight read, the
    matmuls dequantized to 16-bit (DEQUANT_COMPUTE_EFF of the 16-bit rate), not W8A8 at the 16-bit rate."""
    g = get_gpu(gpu)
    m = _llama({"quant_method": "fp8"}) if gpu != "T4" else load_model("llama-3.1-8b")
    cost = CostModel(m, g, weight_dtype=None if gpu != "T4" else "fp8")  # type: ignore[arg-type]
    assert cost.rate.dequant and not cost.rate.w8a8 and cost.peak_flops == g.flops_16bit
    assert "Marlin" in cost.rate.note
    sixteen = CostModel(load_model("llama-3.1-8b"), g)
    s, s16 = cost.step(np.array([8192]), np.array([0])), sixteen.step(np.array([8192]), np.array([0]))
    assert s.compute_s > s16.compute_s  # compute-bound prefill: slower than 16-bit, by the dequantization
    lin = m.linear_flops_per_token * 8192  # type: ignore[attr-defined]
    e = Calibration().on_gpu(g).compute_eff_prefill  # the H100-fitted efficiency as this GPU reaches it
    head_attn = (m.lm_head_flops + s.flops_attention) / (g.flops_16bit * e)  # type: ignore[attr-defined]
    assert s.compute_s == pytest.approx(lin / (g.flops_16bit * e * DEQUANT_COMPUTE_EFF) + head_attn, rel=1e-9)
