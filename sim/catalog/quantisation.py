"""Weight and KV-cache formats: which tensor-core peak the layers' GEMMs run at, and at what share; the dtypes
and group sizes a scenario or an option may name.

One definition for both cost models (the engine's roofline in sim/cost/roofline.py and the kernel-level
model in sim/cost/kernel_model.py):

- 16-bit (and fp32) weights: the GPU's peak for that dtype.
- W8A8 (fp8, or int8 with 8-bit activations from a checkpoint): the 8-bit peak where the GPU has one, else the
  16-bit peak (weights upcast). Attention and any module kept in 16-bit still run at the 16-bit peak. FP8
  weights on a GPU without fp8 tensor cores (A100, A10G, T4) run as vLLM runs them there: weight-only FP8
  through Marlin, dequantized as below.
- Weight-only INT4/INT8 (GPTQ/AWQ-style, W4A16/W8A16): weights are dequantized to 16-bit inside the GEMM
  (Marlin-style kernels), so the matmuls run at the 16-bit peak times DEQUANT_COMPUTE_EFF, the share of the
  16-bit GEMM rate left once dequantization shares the SMs. Memory-bound (small-batch) GEMMs read 4x/2x
  fewer bytes and speed up accordingly; compute-bound ones (prefill, large batches) get slower, not faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.catalog.dtypes import DTYPE_BYTES, KV_DTYPES, normalize_dtype
from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.io.errors import SimError

# Share of the 16-bit GEMM rate a weight-only kernel keeps in the compute-bound regime: a prior, from Marlin
# (its W4A16 GEMMs stay near the ideal speed-up up to batch 16-32, still well ahead at 64-128, and large-batch
# prefill runs about 10% below FP16; docs/quantisation.md). The same value as kernel_calibration.toml's
# dequant_compute_eff, which tests/test_quantisation.py checks.
DEQUANT_COMPUTE_EFF = 0.9


@dataclass(frozen=True)
class MatmulRate:
    """FLOP rate of the layers' matmuls for one weight format."""

    peak_flops: float  # tensor-core peak the matmuls use (FLOP/s)
    dequant: bool  # weight-only: dequantized in the kernel, at DEQUANT_COMPUTE_EFF of peak_flops
    w8a8: bool  # 8-bit activations: the GEMMs run at the 8-bit peak
    note: str

    @property
    def effective_flops(self) -> float:
        """Peak FLOP/s the matmuls reach before the cost model's efficiency (dequantization included)."""
        return self.peak_flops * (DEQUANT_COMPUTE_EFF if self.dequant else 1.0)


def matmul_rate(model: ModelSpec, gpu: Gpu, weight_dtype: str | None, group_size: int | None) -> MatmulRate:
    """The matmul rate of `model` on `gpu` with weights in `weight_dtype` (see the module docstring)."""
    wd = normalize_dtype(weight_dtype or model.default_weight_dtype)
    q = model.serving_quant(wd, group_size)
    if not q.dtype:
        peak, note = gpu.peak_flops(wd)
        return MatmulRate(peak, False, False, note)
    if q.activations and fp8_marlin(gpu, q.dtype):
        note = (
            f"{q.method} fp8 on {gpu.name}, which has no fp8 tensor cores: weight-only FP8 (Marlin), "
            f"dequantized in the kernel, {DEQUANT_COMPUTE_EFF:g} x the 16-bit rate"
        )
        return MatmulRate(gpu.flops_16bit, True, False, note)
    if q.activations:
        peak, note = gpu.peak_flops(q.dtype)
        kind = "W8A8" if peak > gpu.flops_16bit else "W8A8 upcast"
        return MatmulRate(peak, False, peak > gpu.flops_16bit, note or f"{q.method} {q.dtype} {kind}")
    group = f", group size {q.group_size}" if q.group_size else ""
    note = (
        f"{q.method} {q.dtype} weight-only{group}: dequantized in the kernel, "
        f"{DEQUANT_COMPUTE_EFF:g} x the 16-bit rate"
    )
    return MatmulRate(gpu.flops_16bit, True, False, note)


def fp8_marlin(gpu: Gpu, dtype: str) -> bool:
    """FP8 weights on a GPU without fp8 tensor cores: vLLM runs them weight-only through Marlin
    (`Fp8LinearMethod.use_marlin` below compute capability 8.9), dequantized to 16-bit in the kernel."""
    return dtype == "fp8" and gpu.flops_fp8 <= 0


def group_flops(gpu: Gpu, dtype: str, activations: bool) -> float:
    """Peak FLOP/s a quantized format's matmuls reach: the 8-bit peak under W8A8 (16-bit where the GPU has
    none), the 16-bit peak times DEQUANT_COMPUTE_EFF when weight-only (FP8 weights through Marlin too)."""
    if activations and not fp8_marlin(gpu, dtype):
        return max(gpu.peak_flops(dtype)[0], gpu.flops_16bit)
    return gpu.flops_16bit * DEQUANT_COMPUTE_EFF


def flop_costs(
    model: ModelSpec, gpu: Gpu, weight_dtype: str | None, group_size: int | None, rate: MatmulRate
) -> tuple[float, float, float]:
    """Cost of one FLOP of (the layers' matmuls, the LM head, attention) in FLOPs at `rate.peak_flops`.

    All 1 for unquantized weights. A quantized group's FLOP costs 1 / DEQUANT_COMPUTE_EFF when dequantized
    (else 1); 16-bit work (attention, modules kept in 16-bit) costs peak / 16-bit peak, above 1 under W8A8.
    """
    q = model.serving_quant(weight_dtype, group_size)
    if not q.dtype:
        return 1.0, 1.0, 1.0
    sixteen = rate.peak_flops / gpu.flops_16bit
    chosen = model.num_moe_layers * model.experts_per_token * model.expert_params
    params = {"attention": model.attention_params, "dense": model.dense_params, "experts": chosen}
    total = sum(params.values())

    def cost(group: str) -> float:
        kept = q.kept_fraction(group)
        dtype, activations, _ = q.format_of(group)
        quant = rate.peak_flops / group_flops(gpu, dtype, activations)
        return kept * sixteen + (1.0 - kept) * quant

    layers = sum(p * cost(g) for g, p in params.items()) / total if total else 1.0
    return layers, cost("lm_head"), sixteen


def checkpoint_format_problem(model: ModelSpec, weight_dtype: str | None) -> str | None:
    """Why a quantized checkpoint cannot be served with weights in `weight_dtype`, or None: vLLM serves a
    checkpoint with a quantization_config in that format and refuses another `--quantization` ("Quantization
    method specified in the model config ... does not match the quantization method specified in the
    `quantization` argument"); it cannot dequantize it to 16-bit or requantize it to another format."""
    if not model.quant.dtype or weight_dtype is None:
        return None
    d = normalize_dtype(weight_dtype)
    if d == model.default_weight_dtype:
        return None
    return (
        f"{model.name} is a {model.quant.method} checkpoint stored as {weight_format(model.quant)} (its "
        f"quantization_config); vLLM serves it in that format and refuses another, so {d} is not a format "
        f"it can be served in: leave the weight dtype unset or give {model.default_weight_dtype}"
    )


def check_dtype(key: str, value: str | None) -> str | None:
    """Validate `model.weight_dtype` / `model.kv_dtype` (ValueError naming what is expected)."""
    if value is None:
        return None
    allowed = KV_DTYPES if key == "kv_dtype" else tuple(DTYPE_BYTES)
    try:
        d = normalize_dtype(value)
    except SimError:
        d = ""
    if d not in allowed:
        raise ValueError(f"expected one of {', '.join(allowed)}")
    return value


def check_group_size(weight_dtype: str | None, group_size: int | None) -> None:
    """Validate `model.weight_group_size` against `model.weight_dtype` (ValueError naming the key)."""
    if group_size is None:
        return
    if group_size != 0 and not (32 <= group_size <= 1024 and group_size & (group_size - 1) == 0):
        raise ValueError(
            f"weight_group_size: expected 0 (per-channel scales) or a power of two from 32 to 1024 "
            f"(got {group_size})"
        )
    if weight_dtype is None or normalize_dtype(weight_dtype) not in ("int4", "int8"):
        raise ValueError(
            "weight_group_size: applies to int4 or int8 weights; set model.weight_dtype to int4 or int8 "
            "(a checkpoint's own group size comes from its quantization_config)"
        )


def quantisation_info(cost: Any, mem: Any) -> dict[str, Any]:
    """The weight and KV formats of a replica, for its summary: `cost` a CostModel, `mem` its KvMemory."""
    q = cost.model.serving_quant(cost.weight_dtype, mem.weight_group_size)
    return {
        "weight_dtype": cost.weight_dtype,
        "weight_format": weight_format(q),
        "weight_group_size": q.group_size,
        "kv_dtype": cost.kv_dtype,
        "weight_bytes": mem.weight_bytes,
        "matmul_peak_flops": cost.rate.peak_flops,
        "dequantized": cost.rate.dequant,
    }


def weight_format(q: Any) -> str:
    """A weight format's short name: 16-bit, W8A8 fp8, W4A16 int4 g128, ..."""
    if not q.dtype:
        return "16-bit"

    def name(dtype: str, activations: bool, group_size: int) -> str:
        bits = 8 if dtype in ("fp8", "int8") else 4
        kind = f"W{bits}A8" if activations else f"W{bits}A16"
        return f"{kind} {dtype}{f' g{group_size}' if group_size else ''}"

    mixed = "".join(f" + {name(*fmt)} {group}" for group, *fmt in q.per_group)
    return name(q.dtype, q.activations, q.group_size) + mixed


def check_format_options(
    weight_dtype: str | None, kv_dtype: str | None, weight_group_size: int | None, any_int: bool = False
) -> None:
    """The `--weight-dtype`, `--kv-dtype` and `--weight-group-size` a scenario's `[model]` would accept
    (`any_int`: the group size applies to whichever int4 / int8 rows a comparison shows)."""
    for option, key, value in (
        ("--weight-dtype", "weight_dtype", weight_dtype),
        ("--kv-dtype", "kv_dtype", kv_dtype),
    ):
        try:
            check_dtype(key, value)
        except ValueError as err:
            raise SimError(f"{option}: {err} (got {value!r})") from None
    try:
        check_group_size("int4" if any_int else weight_dtype, weight_group_size)
    except ValueError as err:  # "weight_group_size: why", in the scenario's words
        why = str(err).partition(": ")[2].replace("model.weight_dtype", "--weight-dtype")
        raise SimError(f"--weight-group-size: {why}") from None
