"""The figures behind `sim capacity`: one replica's memory and KV capacity, with LoRA slots, with a draft
model, and under each weight and KV-cache format (the tables that show them: sim/report/capacity.py).

`--quantisation`, for each format: weight memory per GPU, KV bytes per token, KV token capacity and the
sequences that fit, the
matmul FLOP rate (the dtype's tensor-core peak; dequantized weight-only formats at a share of the 16-bit
rate), and the engine's cost (sim/cost/roofline.py) of one decode step of `batch` sequences at `context`
tokens
(bytes read and seconds) and of one prefill chunk of `prefill` tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from sim.catalog.gpu_formats import served_model
from sim.catalog.gpus import Gpu, get_gpu
from sim.catalog.model import ModelSpec
from sim.catalog.models import load_model
from sim.catalog.quantisation import weight_format
from sim.config.lora import LoraConfig
from sim.config.speculative import SpeculativeConfig, check_draft
from sim.cost.draft import build_drafter, kv_blocks_with_draft
from sim.cost.lora import lora_memory, slot_bytes
from sim.cost.memory import KvMemory, kv_memory
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


def draft_capacity(
    model: str,
    gpu: str,
    tp: int,
    gpu_memory_utilization: float,
    weight_dtype: str | None,
    kv_dtype: str | None,
    draft_model: str,
    draft_tp: int | None,
    typical_len: int,
) -> dict[str, Any]:
    """KV capacity of `model` without and with a draft model beside it (JSON-ready, bytes per GPU)."""
    g = get_gpu(gpu)
    target = served_model(load_model(model), g)
    mem = kv_memory(target, g, tp, gpu_memory_utilization, weight_dtype, kv_dtype)
    cost = CostModel(target, g, tp, weight_dtype, kv_dtype)
    try:
        cfg = SpeculativeConfig(
            method="draft", draft_model=draft_model, draft_tensor_parallel_size=draft_tp,
            num_speculative_tokens=1, acceptance_rate=0.5,
        )  # fmt: skip
    except ValidationError as err:  # an unknown or malformed draft model
        message = err.errors()[0]["msg"].removeprefix("Value error, ").removeprefix("draft_model: ")
        raise SimError(f"--draft-model: {message}") from None
    try:
        check_draft(cfg, target, tp)
    except ValueError as err:
        key, _, why = str(err).partition(": ")
        raise SimError(
            f"{'--draft-tp' if key == 'draft_tensor_parallel_size' else '--draft-model'}: {why}"
        ) from None
    drafter = build_drafter(cfg, cost)
    blocks = kv_blocks_with_draft(mem.kv_bytes_available, mem.kv_bytes_per_token, drafter, mem.block_size)
    per_seq = math.ceil(typical_len / mem.block_size)
    return {
        "model": target.name,
        "draft_model": drafter.name,
        "gpu": g.name,
        "tp": tp,
        "draft_tp": draft_tp or tp,
        "kv_bytes_available": mem.kv_bytes_available,
        "draft_weight_bytes": drafter.weight_bytes,
        "kv_bytes_per_token": mem.kv_bytes_per_token,
        "draft_kv_bytes_per_token": drafter.kv_bytes_per_token,
        "block_size": mem.block_size,
        "kv_blocks": mem.num_blocks,
        "kv_blocks_with_draft": blocks,
        "typical_len": typical_len,
        "max_seqs_at_typical_len": mem.num_blocks // per_seq,
        "max_seqs_at_typical_len_with_draft": blocks // per_seq,
    }


def capacity_summary(
    model: ModelSpec, kv: KvMemory, max_model_len: int | None, typical_len: int
) -> dict[str, object]:
    """JSON-ready capacity figures for one model (bytes as integers)."""
    max_len = max_model_len or model.max_position_embeddings
    if max_len < 1 or typical_len < 1:
        raise SimError("--max-model-len and --typical-len must be positive")
    return {
        **kv.to_dict(),
        "hf_id": model.hf_id,
        "attention": model.attention,
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "params_total": model.params_total,
        "max_model_len": max_len,
        "typical_len": typical_len,
        "max_seqs_at_max_model_len": kv.max_seqs(max_len),
        "max_seqs_at_typical_len": kv.max_seqs(typical_len),
    }


def lora_capacity(model: ModelSpec, kv: KvMemory, config: LoraConfig, typical_len: int) -> dict[str, Any]:
    """KV blocks and concurrent sequences without and with `max_loras` slots (JSON-ready)."""
    reduced = lora_memory(kv, model, config)
    slot = slot_bytes(model, config.max_lora_rank, kv.tp)
    return {
        "max_loras": config.max_loras,
        "max_lora_rank": config.max_lora_rank,
        "slot_bytes": slot,
        "slots_bytes": slot * config.max_loras,
        "kv_blocks_without_slots": kv.num_blocks,
        "kv_blocks_with_slots": reduced.num_blocks,
        "typical_len": typical_len,
        "max_seqs_without_slots": kv.max_seqs(typical_len),
        "max_seqs_with_slots": reduced.max_seqs(typical_len),
    }
