"""Number formats: the bytes of one element of each dtype, and the spellings a config may use for them."""

from __future__ import annotations

from sim.io.errors import SimError

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
}


def normalize_dtype(dtype: str) -> str:
    """Canonical dtype name (fp32, bf16, fp16, fp8, int8, int4); SimError if unknown."""
    d = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if d not in DTYPE_BYTES:
        raise SimError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return d


def dtype_bytes(dtype: str) -> float:
    """Bytes per value of a dtype (int4 is 0.5)."""
    return DTYPE_BYTES[normalize_dtype(dtype)]


# Weight dtypes a 16-bit checkpoint can be served in by online quantization (see `ModelSpec.serving_quant`).
ONLINE_QUANT_DTYPES = ("fp8", "int8", "int4")


# KV-cache dtypes: the 16-bit activation dtypes and the 8-bit caches (vLLM's kv_cache_dtype fp8 / int8).
KV_DTYPES = ("bf16", "fp16", "fp8", "int8")
