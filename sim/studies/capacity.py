"""`sim capacity --quantisation`: what each weight and KV-cache format does to one replica.

For each format: weight memory per GPU, KV bytes per token, KV token capacity and the sequences that fit, the
matmul FLOP rate (the dtype's tensor-core peak; dequantized weight-only formats at a share of the 16-bit
rate), and the engine's cost (sim/cost/roofline.py) of one decode step of `batch` sequences at `context` tokens
(bytes read and seconds) and of one prefill chunk of `prefill` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.catalog.quantisation import weight_format
from sim.cost.memory import GB, kv_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError

DEFAULT_GROUP_SIZE = 128  # GPTQ/AWQ's usual group
DECODE_BATCH = 32  # sequences in the decode step costed
PREFILL_TOKENS = 2048  # tokens in the prefill chunk costed (vLLM's default token budget)


@dataclass(frozen=True)
class Variant:
    """One weight format and KV-cache format."""

    label: str
    weight_dtype: str | None
    kv_dtype: str | None
    group_size: int | None


def variants(model: ModelSpec, group_size: int | None) -> list[Variant]:
    """The checkpoint's own format (when quantized), 16-bit, FP8 W8A8, INT8/INT4 weight-only, FP8/INT8 KV."""
    g = DEFAULT_GROUP_SIZE if group_size is None else group_size
    sixteen = model.torch_dtype
    out = [
        Variant("16-bit", sixteen, None, None),
        Variant("FP8 weights (W8A8)", "fp8", None, None),
        Variant(f"INT8 weights (W8A16{f' g{g}' if g else ''})", "int8", None, g),
        Variant(f"INT4 weights (W4A16{f' g{g}' if g else ''})", "int4", None, g),
        Variant("16-bit, FP8 KV", sixteen, "fp8", None),
        Variant("16-bit, INT8 KV", sixteen, "int8", None),
    ]
    if model.quant.dtype:
        out.insert(0, Variant(f"checkpoint ({weight_format(model.quant)})", None, None, None))
    return out


def variant_figures(
    model: ModelSpec,
    gpu: Gpu,
    v: Variant,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    typical_len: int = 1024,
    batch: int = DECODE_BATCH,
    prefill: int = PREFILL_TOKENS,
) -> dict[str, Any]:
    """One variant's figures as plain data (`fits` False and no other figures when weights do not fit)."""
    base: dict[str, Any] = {"variant": v.label, "weight_dtype": v.weight_dtype, "kv_dtype": v.kv_dtype}
    try:
        kv = kv_memory(model, gpu, tp, gpu_memory_utilization, v.weight_dtype, v.kv_dtype, 16, v.group_size)
    except SimError as err:
        return {**base, "fits": False, "reason": str(err)}
    cost = CostModel(model, gpu, tp, v.weight_dtype, v.kv_dtype, weight_group_size=v.group_size)
    max_len = max_model_len or model.max_position_embeddings
    decode = cost.step(np.ones(batch, dtype=np.int64), np.full(batch, typical_len, dtype=np.int64))
    chunk = cost.step(np.array([prefill]), np.array([0]))
    return {
        **base,
        "fits": True,
        "weight_dtype": kv.weight_dtype,
        "kv_dtype": kv.kv_dtype,
        "weight_format": weight_format(model.serving_quant(kv.weight_dtype, v.group_size)),
        "weight_bytes": kv.weight_bytes,
        "kv_bytes_per_token": kv.kv_bytes_per_token,
        "kv_tokens": kv.token_capacity,
        "max_seqs_at_max_model_len": kv.max_seqs(max_len),
        "max_seqs_at_typical_len": kv.max_seqs(typical_len),
        "matmul_peak_flops": cost.rate.peak_flops,
        "matmul_effective_flops": cost.rate.effective_flops,
        "decode_batch": batch,
        "decode_context": typical_len,
        "decode_step_bytes": decode.weight_bytes + decode.kv_read_bytes + decode.kv_write_bytes,
        "decode_step_s": decode.seconds,
        "decode_bound": decode.bound,
        "prefill_tokens": prefill,
        "prefill_step_s": chunk.seconds,
        "prefill_bound": chunk.bound,
        "note": cost.note,
    }


def baseline(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The row speed-ups are relative to: 16-bit where it fits, else the first format that fits."""
    fits = [r for r in rows if r["fits"]]
    return next((r for r in fits if r["variant"] == "16-bit"), fits[0] if fits else None)


def quantisation_table(rows: list[dict[str, Any]], title: str) -> object:
    """A rich table of `variant_figures` rows, one variant per row (speed-ups over `baseline`)."""
    from rich.table import Table

    t = Table(title=title)
    names = ("format", "weights/GPU", "KV B/token", "KV tokens", "seqs@max", "seqs@typical", "TFLOP/s",
             "decode GB", "decode ms", "prefill ms")  # fmt: skip
    for name in names:
        t.add_column(name, justify="left" if name == "format" else "right", no_wrap=name == "format")
    base = baseline(rows)
    for r in rows:
        if not r["fits"]:
            t.add_row(str(r["variant"]), "does not fit", *[""] * (len(names) - 2))
            continue
        dec = pre = ""
        if base is not None and r is not base:
            dec = f" ({base['decode_step_s'] / r['decode_step_s']:.2f}x)"
            pre = f" ({base['prefill_step_s'] / r['prefill_step_s']:.2f}x)"
        t.add_row(
            str(r["variant"]),
            f"{r['weight_bytes'] / GB:,.2f} GB",
            f"{r['kv_bytes_per_token']:,}",
            f"{r['kv_tokens']:,}",
            f"{r['max_seqs_at_max_model_len']:,}",
            f"{r['max_seqs_at_typical_len']:,}",
            f"{r['matmul_effective_flops'] / 1e12:,.0f}",
            f"{r['decode_step_bytes'] / GB:.2f}"
            + ("*" if r["max_seqs_at_typical_len"] < r["decode_batch"] else ""),
            f"{r['decode_step_s'] * 1e3:.2f}{dec}",
            f"{r['prefill_step_s'] * 1e3:.1f}{pre}",
        )
    return t
