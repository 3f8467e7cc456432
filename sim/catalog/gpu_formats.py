"""Which number formats a GPU runs, as vLLM decides, and the 16-bit dtype a checkpoint is served in there.

vLLM's rules, as read in its source (vllm/platforms/cuda.py, vllm/config/model.py):
- bf16 needs compute capability 8.0 (Ampere) or later: `CudaPlatform.check_if_supports_dtype` refuses an
  explicit bfloat16 below it ("Bfloat16 is only supported on GPUs with compute capability of at least
  8.0"). A scenario's or a command's bf16 weights or bf16 KV cache (the 16-bit activation dtype the cache
  holds) on a T4 are refused here, naming the key and the GPU (`format_problem`).
- With no dtype given (vLLM's `--dtype auto`), `_resolve_auto_dtype` serves the checkpoint's dtype when the
  GPU supports it, else the first the platform supports: below 8.0 `supported_dtypes` is
  [float16, float32], so a bf16 (or fp32) checkpoint is served in fp16, with a warning. `served_model`
  does the same; a family for which vLLM refuses float16 (`_FLOAT16_NOT_SUPPORTED_MODELS`: gemma2 among
  the shipped ones) falls to fp32 in vLLM, which the simulator does not model: it is refused, saying so.
- fp8, int8 and int4 weights and an fp8 KV cache are not refused on any catalogued GPU. A100 and A10G
  (8.0, 8.6) run fp8 weights weight-only through Marlin (`Fp8LinearMethod.use_marlin` below 8.9), which
  sim/catalog/quantisation.py costs as weight-only (dequantized at the 16-bit rate), and an fp8 KV cache.
  On Turing, `Fp8Config.get_min_capability` was 80 at the vLLM commits read, so vLLM refused fp8 weights
  on a T4 then; vLLM pull request 29901 (Marlin kernels for Turing, merged before 2026-02-11) runs FP8
  weights with FP16 activations on 7.5. Whether the project's vLLM (0.15.1) has it was not established,
  so fp8 weights on a T4 are not refused, and are costed as that pull request runs them: weight-only, as
  on Ampere.
"""

from __future__ import annotations

from dataclasses import replace

from sim.catalog.dtypes import normalize_dtype
from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.io.errors import SimError

BF16_MIN_CAPABILITY = 8.0  # vLLM: bfloat16 only on compute capability 8.0 or later

# Families for which vLLM refuses float16 (vllm/config/model.py, _FLOAT16_NOT_SUPPORTED_MODELS).
FLOAT16_NOT_SUPPORTED = frozenset({"gemma2", "gemma3", "gemma3_text", "plamo2", "glm4"})


def format_problem(gpu: Gpu, dtype: str | None) -> str | None:
    """Why `gpu` cannot run weights or a KV cache in `dtype` as vLLM serves them, or None if it can."""
    if dtype is None or normalize_dtype(dtype) != "bf16" or gpu.compute_capability >= BF16_MIN_CAPABILITY:
        return None
    return (
        f"bf16 does not run on {gpu.name} (compute capability {gpu.compute_capability:g}): vLLM refuses "
        f"bfloat16 below compute capability {BF16_MIN_CAPABILITY:g}; give fp16"
    )


def served_model(model: ModelSpec, gpu: Gpu) -> ModelSpec:
    """`model` with the 16-bit dtype vLLM's auto dtype serves it in on `gpu`: fp16 for a bf16 checkpoint on
    a GPU without bf16 (SimError for a family vLLM then serves in fp32)."""
    if model.torch_dtype != "bf16" or gpu.compute_capability >= BF16_MIN_CAPABILITY:
        return model
    if model.model_type in FLOAT16_NOT_SUPPORTED:
        raise SimError(
            f"{model.name} on {gpu.name} (compute capability {gpu.compute_capability:g}): vLLM refuses "
            f"float16 for {model.model_type} and bfloat16 below {BF16_MIN_CAPABILITY:g}, and serves it in "
            "fp32, which the simulator does not model; choose a GPU with bf16"
        )
    default = "fp16" if model.default_weight_dtype == "bf16" else model.default_weight_dtype
    return replace(model, torch_dtype="fp16", default_weight_dtype=default)


def check_formats(gpu: Gpu, weight_dtype: str | None, kv_dtype: str | None, keys: tuple[str, str]) -> None:
    """Refuse weights or a KV cache `gpu` cannot run, naming the key (`keys`: the weight and KV keys)."""
    for key, dtype in zip(keys, (weight_dtype, kv_dtype), strict=True):
        why = format_problem(gpu, dtype)
        if why is not None:
            raise SimError(f"{key}: {why}")
