"""ModelSpec: KV bytes per token, parameter counts, FLOPs and config loading."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from sim.catalog.dtypes import dtype_bytes
from sim.catalog.hf_config import from_config, position_limit
from sim.catalog.model import causal_pairs
from sim.catalog.models import catalog_names, load_model
from sim.io.errors import SimError

KV_16BIT = {
    "llama-2-7b": 524_288,
    "llama-2-13b": 819_200,
    "llama-2-70b": 327_680,
    "llama-3.1-8b": 131_072,
    "mistral-7b": 131_072,
    "qwen2.5-7b": 57_344,
    "mixtral-8x7b": 131_072,
    "deepseek-v3": 61 * 576 * 2,
}

PARAMS = {  # (total, active)
    "llama-2-7b": (6.74e9, 6.74e9),
    "llama-2-70b": (68.98e9, 68.98e9),
    "llama-3.1-8b": (8.03e9, 8.03e9),
    "mixtral-8x7b": (46.7e9, 12.9e9),
    "qwen2.5-7b": (7.62e9, 7.62e9),
}


@pytest.mark.parametrize(("name", "expected"), KV_16BIT.items())
def test_kv_bytes_per_token_16bit(name: str, expected: int) -> None:
    assert load_model(name).kv_bytes_per_token("bf16") == expected


@pytest.mark.parametrize(("name", "expected"), PARAMS.items())
def test_param_counts_within_1_percent(name: str, expected: tuple[float, float]) -> None:
    m = load_model(name)
    assert m.params_total == pytest.approx(expected[0], rel=0.01)
    assert m.params_active == pytest.approx(expected[1], rel=0.01)


@pytest.mark.parametrize("name", catalog_names())
def test_every_shipped_config_loads(name: str) -> None:
    m = load_model(name)
    assert m.params_total > m.params_active * 0.99 > 0
    assert m.kv_bytes_per_token() > 0
    assert m.decode_flops(100) > 2 * (m.params_active - m.embedding_params - m.lm_head_params)


def test_attention_kinds() -> None:
    assert load_model("llama-2-7b").attention == "MHA"
    assert load_model("llama-3.1-8b").attention == "GQA"
    assert load_model("deepseek-v3").attention == "MLA"


def test_kv_dtype_scales_kv_bytes() -> None:
    m = load_model("llama-2-7b")
    assert m.kv_bytes_per_token("fp8") == 262_144
    assert m.kv_bytes_per_token("fp32") == 2 * 524_288


def test_mla_and_deepseek_moe() -> None:
    m = load_model("deepseek-v3")
    assert m.kv_values_per_token_layer == 512 + 64
    assert m.num_moe_layers == 61 - 3
    assert m.params_total == pytest.approx(671e9, rel=0.01)
    assert m.params_active == pytest.approx(37.5e9, rel=0.02)
    assert m.default_weight_dtype == "fp8"
    lite = load_model("deepseek-v2-lite")  # q_lora_rank is null
    assert lite.params_total == pytest.approx(15.7e9, rel=0.01)


def test_llama4_text_config_and_shared_expert() -> None:
    m = load_model("llama-4-scout")
    assert (m.num_experts, m.experts_per_token, m.num_moe_layers) == (16, 1, 48)
    assert m.params_total == pytest.approx(107.8e9, rel=0.01)
    assert m.params_active == pytest.approx(17.2e9, rel=0.01)
    assert m.default_weight_dtype == "bf16"
    assert load_model("llama-4-scout-fp8").default_weight_dtype == "fp8"


def test_qwen3_moe_and_head_dim() -> None:
    m = load_model("qwen3-30b-a3b")
    assert m.head_dim == 128  # config's head_dim, not 2048 / 32
    assert m.params_total == pytest.approx(30.5e9, rel=0.01)
    assert m.params_active == pytest.approx(3.3e9, rel=0.03)


def test_gemma2_sliding_layers() -> None:
    m = load_model("gemma-2-9b")
    assert (m.sliding_window, m.num_sliding_layers) == (4096, 21)
    assert m.kv_bytes_per_token("bf16") == 42 * 2 * 8 * 256 * 2  # all layers at full size
    assert m.params_total == pytest.approx(9.24e9, rel=0.01)
    full = m.num_layers * causal_pairs(1, 8000)
    assert m.attention_pairs(1, 8000) < full


def test_opt_and_phi3() -> None:
    opt = load_model("opt-13b")
    assert opt.attention == "MHA" and opt.params_total == pytest.approx(12.85e9, rel=0.01)
    assert load_model("phi-3-mini").params_total == pytest.approx(3.82e9, rel=0.01)


def test_weight_bytes_dtypes() -> None:
    m = load_model("llama-2-7b")
    assert m.default_weight_dtype == "fp16"
    assert m.weight_bytes() == m.params_total * 2
    # online INT4: the layers' matmul weights at half a byte; embeddings, LM head and norms stay 16-bit
    sixteen = m.embedding_params + m.lm_head_params + m.norm_params
    assert m.weight_bytes("int4") == (m.params_total - sixteen) / 2 + sixteen * 2
    assert dtype_bytes("float16") == 2
    with pytest.raises(SimError, match="unknown dtype"):
        m.weight_bytes("fp6")


def test_causal_pairs_brute_force() -> None:
    for c, q, w in [(5, 0, None), (3, 10, None), (7, 2, 4), (1, 100, 8), (20, 3, 10)]:
        brute = sum(min(p + 1, w or 10**9) for p in range(q, q + c))
        assert causal_pairs(c, q, w) == brute


def test_flops_vectorised_and_consistent() -> None:
    m = load_model("llama-2-7b")
    q = np.array([0, 10, 1000])
    assert m.decode_flops(q).shape == (3,)
    # A 2-token chunk equals two decodes minus one logits computation.
    two = m.prefill_flops(2, 50)
    assert two == pytest.approx(m.decode_flops(50) + m.decode_flops(51) - m.lm_head_flops)
    per_tok = m.decode_flops(0)
    assert per_tok == pytest.approx(2 * (m.params_active - m.embedding_params), rel=0.01)


def test_name_resolution(tmp_path: Path) -> None:
    assert load_model("META-LLAMA/llama-2-7b-hf").name == "llama-2-7b"
    src = Path(__file__).parents[1] / "sim" / "catalog" / "models" / "mistral-7b.json"
    (tmp_path / "config.json").write_text(src.read_text())
    assert load_model(str(tmp_path)).kv_bytes_per_token() == 131_072
    assert load_model(str(tmp_path / "config.json")).num_kv_heads == 8


def test_unknown_name_lists_closest() -> None:
    with pytest.raises(SimError, match="closest: llama-2-7b"):
        load_model("llama-2-7")


def test_missing_field_names_field_and_file(tmp_path: Path) -> None:
    cfg = json.loads((Path(__file__).parents[1] / "sim/catalog/models/llama-2-7b.json").read_text())
    del cfg["num_hidden_layers"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SimError, match=r"config.json: missing field 'num_hidden_layers'"):
        load_model(str(path))


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(SimError, match="unsupported architecture mamba"):
        load_model(str(path))


def _llama_config(**quant: object) -> dict[str, object]:
    cfg: dict[str, object] = {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "torch_dtype": "bfloat16",
    }  # fmt: skip
    if quant:
        cfg["quantization_config"] = quant
    return cfg


def test_fp8_checkpoint_keeps_its_ignored_modules_in_16_bit() -> None:
    """Llama-4-Scout-FP8 keeps q/k/v/o of all 48 layers, the routers and the LM head in bf16 (`ignore`)."""
    m = load_model("llama-4-scout-fp8")
    assert (m.quant.dtype, m.quant.activations) == ("fp8", True)
    kept = dict(m.quant.sixteen_bit)
    assert kept["attention"] == 1.0 and kept["lm_head"] == 1.0
    assert "dense" not in kept and "experts" not in kept
    # one byte per parameter, plus a second byte for every parameter kept in 16-bit
    sixteen = m.attention_params + m.lm_head_params + m.embedding_params + m.norm_params
    assert m.weight_bytes() == pytest.approx(m.params_total + sixteen)
    static_before = m.params_total - m.routed_expert_params - m.embedding_params  # all at one byte
    static_now = sum(m.group_params(g) * m.param_bytes(g) for g in ("attention", "dense", "lm_head", "norm"))
    assert 1 - static_before / static_now == pytest.approx(0.29, abs=0.01)  # was understated by 29%


def test_gptq_and_awq_are_int4_weight_only_with_group_scales() -> None:
    gptq = from_config(_llama_config(quant_method="gptq", bits=4, group_size=128), "g", "g", "g.json")
    awq = from_config(_llama_config(quant_method="awq", w_bit=4, q_group_size=128), "a", "a", "a.json")
    plain = from_config(_llama_config(), "p", "p", "p.json")
    for m in (gptq, awq):
        assert (m.default_weight_dtype, m.quant.activations, m.quant.group_size) == ("int4", False, 128)
        layers = m.attention_params + m.dense_params
        sixteen = m.embedding_params + m.lm_head_params + m.norm_params
        assert m.weight_bytes() == pytest.approx(layers * (0.5 + 2 / 128) + sixteen * 2)
    assert plain.weight_bytes() == plain.params_total * 2
    int8 = from_config(_llama_config(quant_method="gptq", bits=8, group_size=-1), "i", "i", "i.json")
    assert (int8.default_weight_dtype, int8.quant.group_size) == ("int8", 0)


def test_compressed_tensors_int_schemes() -> None:
    w4a16 = {"format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128},
        "input_activations": None}}, "ignore": ["lm_head"]}  # fmt: skip
    m = from_config(_llama_config(quant_method="compressed-tensors", **w4a16), "w", "w", "w.json")
    assert (m.default_weight_dtype, m.quant.activations) == ("int4", False)
    w8a8 = {"format": "int-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int"},
        "input_activations": {"num_bits": 8, "type": "int"}}}, "ignore": ["lm_head"]}  # fmt: skip
    m = from_config(_llama_config(quant_method="compressed-tensors", **w8a8), "w", "w", "w.json")
    assert (m.default_weight_dtype, m.quant.activations) == ("int8", True)


def test_unknown_quantization_is_an_error_not_16_bit() -> None:
    with pytest.raises(SimError, match="quant_method: expected fp8, gptq, awq or compressed-tensors"):
        from_config(_llama_config(quant_method="bitsandbytes"), "b", "b", "b.json")
    with pytest.raises(SimError, match="bits: expected 4 or 8"):
        from_config(_llama_config(quant_method="gptq", bits=3), "b", "b", "b.json")


def test_position_limit_follows_rope_scaling_as_vllm_derives_it() -> None:
    """vLLM's derived max_model_len: the positions, times the RoPE factor except for the types already
    counted in them (llama3, longrope, su); yarn scales its original positions."""
    assert position_limit(32_768, None, "x") == 32_768
    assert position_limit(32_768, {"rope_type": "linear", "factor": 2.0}, "x") == 65_536
    assert position_limit(131_072, {"rope_type": "llama3", "factor": 8.0}, "x") == 131_072
    yarn = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32_768}
    assert position_limit(32_768, yarn, "x") == 131_072
    assert position_limit(0, yarn, "x") == 0  # the config does not say: no limit
    with pytest.raises(SimError, match=r"x: rope_scaling.factor: expected a number in \[1, 10000\]"):
        position_limit(4096, {"rope_type": "dynamic", "factor": "big"}, "x")
    assert load_model("opt-13b").position_limit == 2048
    assert load_model("deepseek-v3").position_limit == 163_840  # yarn: 4,096 x 40


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"num_key_value_heads": 64},
            "c.json: num_key_value_heads: 64 does not divide num_attention_heads (32)",
        ),
        (
            {"num_key_value_heads": 12},
            "c.json: num_key_value_heads: 12 does not divide num_attention_heads (32)",
        ),
        ({"hidden_size": 4100}, "c.json: hidden_size: 4100 is not a multiple of num_attention_heads (32)"),
        ({"hidden_size": 16, "num_key_value_heads": 32}, "c.json: hidden_size: 16 is not a multiple of"),
    ],
)
def test_impossible_head_shapes_are_refused_naming_the_key(changes: dict[str, object], expected: str) -> None:
    """64 KV heads for 32 query heads, 12 KV heads that split them unevenly, and a hidden size that is not
    heads x head_dim with no head_dim given built a model spec, its KV bytes and FLOPs from shapes vLLM
    cannot load."""
    with pytest.raises(SimError, match=re.escape(expected)):
        from_config({**_llama_config(), **changes}, "c", "c", "c.json")


def test_an_explicit_head_dim_allows_hidden_size_other_than_heads_times_head_dim() -> None:
    """Gemma-2, Qwen3 and Mistral-Nemo give head_dim, and heads x head_dim differs from hidden_size."""
    m = from_config({**_llama_config(), "hidden_size": 4100, "head_dim": 128}, "c", "c", "c.json")
    assert (m.hidden_size, m.head_dim) == (4100, 128)
    for name in ("gemma-2-9b", "qwen3-4b", "mistral-nemo-12b"):
        spec = load_model(name)
        assert spec.hidden_size != spec.num_heads * spec.head_dim


def test_opt_hidden_size_not_a_multiple_of_heads_is_refused() -> None:
    """OPT has no head_dim: its head width is hidden_size / num_attention_heads, which must be whole."""
    raw = {**json.loads((Path(__file__).parents[1] / "sim/catalog/models/opt-13b.json").read_text())}
    raw["hidden_size"] = 5121
    with pytest.raises(SimError, match=re.escape("o.json: hidden_size: 5121 is not a multiple of num_atten")):
        from_config(raw, "o", "o", "o.json")
