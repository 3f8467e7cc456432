"""KV-cache capacity of one replica: memory for weights, a reserve, and KV blocks.

The seed identity: max concurrent sequences = KV bytes available / KV bytes per token / sequence length
(in whole blocks of `block_size` tokens, as vLLM allocates them).

Reserve rule (vLLM-like profile of the non-KV memory besides weights), fitted to the KV block counts
of real vLLM runs on H100 (reference/ground-truth/calibration-experiments.csv, 8 runs: within 1.5%):
  0.15 GiB                                      CUDA context, cuBLAS workspaces, allocator slack
  + profile_tokens x 2 B x (hidden + 2 x MLP width / tp)   activation peak of the profile forward pass
  + 256 x vocab x 32 B                           sampler: fp32 logits/probs and sort buffers for 256 seqs
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec, dtype_bytes, normalize_dtype
from sim.io.errors import SimError

if TYPE_CHECKING:
    from sim.config.scenario import ModelSection

GB = 1e9
FIXED_RESERVE = int(0.15 * 2**30)
PROFILE_TOKENS = 2048  # vLLM's default max_num_batched_tokens for online serving
SAMPLER_SEQS = 256  # vLLM's default max_num_seqs
SAMPLER_BYTES_PER_VOCAB = 32  # per sequence: ~8 fp32-sized buffers per logit


@dataclass(frozen=True)
class KvMemory:
    """Memory budget of one GPU of a replica (all byte counts per GPU)."""

    model: str
    gpu: str
    tp: int
    weight_dtype: str
    kv_dtype: str
    gpu_memory_utilization: float
    memory_bytes: int  # device total reported by the driver
    budget_bytes: int  # memory_bytes x gpu_memory_utilization
    weight_bytes: int
    reserve_bytes: int
    kv_bytes_available: int
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    num_blocks: int
    weight_group_size: int | None = None  # online int4/int8 weights: weights per 16-bit scale

    @property
    def token_capacity(self) -> int:
        """Tokens the KV cache holds (whole blocks)."""
        return self.num_blocks * self.block_size

    def blocks_per_seq(self, length: int) -> int:
        """Blocks one sequence of `length` tokens occupies."""
        return math.ceil(length / self.block_size)

    def max_seqs(self, length: int) -> int:
        """Sequences of `length` tokens that fit at once."""
        return self.num_blocks // max(1, self.blocks_per_seq(length))

    def to_dict(self) -> dict[str, object]:
        """Plain dict with integer byte counts (weight_group_size only when set)."""
        out = {**asdict(self), "token_capacity": self.token_capacity}
        if self.weight_group_size is None:
            del out["weight_group_size"]
        return out


def reserve_bytes(model: ModelSpec, tp: int = 1) -> int:
    """Non-KV, non-weight memory per GPU (see the module docstring)."""
    linear_per_layer = model.linear_flops_per_token / 2 - model.attention_params
    mlp_width = linear_per_layer / model.num_layers / (3 * model.hidden_size)
    activation = PROFILE_TOKENS * 2 * (model.hidden_size + 2 * mlp_width / tp)
    sampler = SAMPLER_SEQS * model.vocab_size * SAMPLER_BYTES_PER_VOCAB
    return int(FIXED_RESERVE + activation + sampler)


def replica_kv_memory(section: ModelSection, model: ModelSpec, gpu: Gpu, source: str) -> KvMemory:
    """The KV memory of one replica of a scenario's [model] table (`source` names it in errors)."""
    m = section
    try:
        return kv_memory(model, gpu, m.tp, m.gpu_memory_utilization, m.weight_dtype, m.kv_dtype, m.block_size,
                         m.weight_group_size)  # fmt: skip
    except SimError as err:
        raise SimError(f"{source}: model: {err}") from None


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int, kv_dtype: str) -> int:
    """KV bytes per token on one GPU: KV heads sharded over tp (one head at least); MLA replicated."""
    return int(model.num_layers * model.kv_layer_bytes_per_gpu(tp, kv_dtype))


def check_tp(model: ModelSpec, tp: int) -> None:
    if tp < 1 or model.num_heads % tp:
        raise SimError(
            f"tensor parallel degree {tp} must divide the {model.num_heads} attention heads of {model.name}"
        )


def _usable(model: ModelSpec, gpu: Gpu, tp: int, util: float, wdtype: str) -> float:
    """Bytes left for KV per GPU (negative when weights and reserve do not fit)."""
    budget = gpu.memory_bytes * util
    return budget - model.weight_bytes(wdtype) / tp - reserve_bytes(model, tp)


def _suggest(model: ModelSpec, gpu: Gpu, tp: int, util: float, wdtype: str) -> str:
    tps = [t for t in (2, 4, 8, 16) if t > tp and model.num_heads % t == 0]
    fit_tp = next((t for t in tps if _usable(model, gpu, t, util, wdtype) > 0), None)
    smaller = [d for d in ("fp8", "int8", "int4") if dtype_bytes(d) < dtype_bytes(wdtype)]
    fit_dt = [d for d in smaller if _usable(model, gpu, tp, util, d) > 0]
    hints = []
    if fit_tp:
        hints.append(f"--tp {fit_tp}")
    if fit_dt:
        hints.append(f"--weight-dtype {fit_dt[0]}")
    return (
        f"; it fits with {' or '.join(hints)}" if hints else "; no TP degree up to 16 or dtype makes it fit"
    )


def kv_memory(
    model: ModelSpec,
    gpu: Gpu,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    block_size: int = 16,
    weight_group_size: int | None = None,
) -> KvMemory:
    """Split one GPU's memory into weights, reserve and KV blocks; SimError if weights do not fit."""
    if not 0 < gpu_memory_utilization <= 1:
        raise SimError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise SimError(f"block_size must be >= 1, got {block_size}")
    check_tp(model, tp)
    wdt = normalize_dtype(weight_dtype or model.default_weight_dtype)
    kvdt = normalize_dtype(kv_dtype or model.torch_dtype)
    budget = int(gpu.memory_bytes * gpu_memory_utilization)
    weights = int(model.weight_bytes(wdt, weight_group_size) / tp)
    reserve = reserve_bytes(model, tp)
    available = budget - weights - reserve
    per_token = kv_bytes_per_token_per_gpu(model, tp, kvdt)
    block_bytes = per_token * block_size
    if available < block_bytes:
        short = (block_bytes - available) / GB
        raise SimError(
            f"{model.name} does not fit on {gpu.name} x{tp} at {wdt}: weights {weights / GB:.1f} GB"
            f" + reserve {reserve / GB:.1f} GB per GPU exceed the {budget / GB:.1f} GB usable"
            f" ({gpu_memory_utilization:g} x {gpu.memory_bytes / GB:.1f} GB) by {short:.1f} GB"
            + _suggest(model, gpu, tp, gpu_memory_utilization, wdt)
        )
    return KvMemory(
        model=model.name,
        gpu=gpu.name,
        tp=tp,
        weight_dtype=wdt,
        kv_dtype=kvdt,
        gpu_memory_utilization=gpu_memory_utilization,
        memory_bytes=gpu.memory_bytes,
        budget_bytes=budget,
        weight_bytes=weights,
        reserve_bytes=reserve,
        kv_bytes_available=available,
        kv_bytes_per_token=per_token,
        block_size=block_size,
        block_bytes=block_bytes,
        num_blocks=available // block_bytes,
        weight_group_size=weight_group_size,
    )


# ----------------------------------------------------------------------------- report (`sim capacity`)


def _gb(x: float) -> str:
    return f"{x / GB:,.2f} GB"


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


def _kv_formula(model: ModelSpec, kv: KvMemory) -> str:
    b = dtype_bytes(kv.kv_dtype)
    if model.attention == "MLA":
        latent = f"({model.kv_lora_rank} latent + {model.qk_rope_head_dim} rope)"
        return f"{model.num_layers} layers x {latent} x {b:g} B"
    heads = max(1, model.num_kv_heads // kv.tp)
    return f"{model.num_layers} layers x 2 (K,V) x {heads} KV heads x {model.head_dim} x {b:g} B"


def _single_table(model: ModelSpec, kv: KvMemory, s: dict[str, object]) -> object:
    from rich.table import Table

    t = Table(title=f"{model.name} on {kv.gpu} x{kv.tp} ({kv.weight_dtype} weights, {kv.kv_dtype} KV)")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_column("arithmetic")
    max_len, typ = int(s["max_model_len"]), int(s["typical_len"])  # type: ignore[call-overload]
    t.add_row("GPU memory", _gb(kv.memory_bytes), "driver-reported total")
    t.add_row("budget", _gb(kv.budget_bytes), f"{kv.gpu_memory_utilization:g} x {_gb(kv.memory_bytes)}")
    t.add_row(
        "weights / GPU",
        _gb(kv.weight_bytes),
        f"{model.params_total / 1e9:.2f}e9 params x "
        f"{model.weight_bytes(kv.weight_dtype) / model.params_total:.3g} B / {kv.tp}"
        + _mixed_note(model, kv.weight_dtype),
    )
    t.add_row("reserve / GPU", _gb(kv.reserve_bytes), "context + activation peak + sampler")
    t.add_row("KV available", _gb(kv.kv_bytes_available), "budget - weights - reserve")
    t.add_row("KV bytes / token", f"{kv.kv_bytes_per_token:,} B", _kv_formula(model, kv))
    t.add_row(
        "KV blocks",
        f"{kv.num_blocks:,}",
        f"{_gb(kv.kv_bytes_available)} / ({kv.block_size} x {kv.kv_bytes_per_token:,} B)",
    )
    t.add_row("KV tokens", f"{kv.token_capacity:,}", f"{kv.num_blocks:,} x {kv.block_size}")
    for label, n in (("max_model_len", max_len), ("typical length", typ)):
        t.add_row(
            f"max seqs @ {label} {n:,}",
            f"{kv.max_seqs(n):,}",
            f"{kv.num_blocks:,} blocks / {kv.blocks_per_seq(n):,} blocks per seq",
        )
    return t


def _attention_line(models: list[ModelSpec], kvs: list[KvMemory]) -> str:
    parts = []
    for m in models:
        if m.attention == "MLA":
            parts.append(f"{m.name} caches one compressed latent per layer (MLA)")
        else:
            share = m.num_heads // m.num_kv_heads
            kind = "every query head has its own" if share == 1 else f"{share} query heads share each"
            parts.append(f"{m.name}: {m.attention}, {m.num_heads} query / {m.num_kv_heads} KV heads ({kind})")
    per_tok = [k.kv_bytes_per_token for k in kvs]
    ratio = max(per_tok) / min(per_tok)
    return (
        "; ".join(parts) + f". KV bytes per token differ by {ratio:.1f}x, and so do the sequences that fit."
    )


def _compare_table(models: list[ModelSpec], kvs: list[KvMemory], sums: list[dict[str, object]]) -> object:
    from rich.table import Table

    t = Table(title=f"KV capacity on {kvs[0].gpu} x{kvs[0].tp}")
    t.add_column("")
    for m in models:
        t.add_column(m.name, justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("attention", [f"{m.attention} {m.num_heads}Q/{m.num_kv_heads}KV" for m in models]),
        ("weights / GPU", [f"{_gb(k.weight_bytes)} ({k.weight_dtype})" for k in kvs]),
        ("reserve / GPU", [_gb(k.reserve_bytes) for k in kvs]),
        ("KV available", [_gb(k.kv_bytes_available) for k in kvs]),
        ("KV bytes / token", [f"{k.kv_bytes_per_token:,} B" for k in kvs]),
        ("KV blocks", [f"{k.num_blocks:,}" for k in kvs]),
        ("KV tokens", [f"{k.token_capacity:,}" for k in kvs]),
        ("max_model_len", [f"{s['max_model_len']:,}" for s in sums]),
        ("max seqs @ max_model_len", [f"{s['max_seqs_at_max_model_len']:,}" for s in sums]),
        (f"max seqs @ {sums[0]['typical_len']:,}", [f"{s['max_seqs_at_typical_len']:,}" for s in sums]),
    ]
    for label, vals in rows:
        t.add_row(label, *vals)
    return t


def capacity_report(
    models: list[str],
    gpu: str,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    max_model_len: int | None = None,
    typical_len: int = 1024,
    as_json: bool = False,
    weight_group_size: int | None = None,
    quantisation: bool = False,
) -> None:
    """Print the capacity of one model, or of several side by side, as rich tables or one JSON object.

    `quantisation`: one model under each weight and KV-cache format instead (sim/studies/capacity.py)."""
    import json

    from rich.console import Console

    from sim.catalog.gpus import get_gpu
    from sim.catalog.model import load_model

    if not models:
        raise SimError("give at least one model")
    g = get_gpu(gpu)
    specs = [load_model(m) for m in models]
    if quantisation:
        _quantisation_report(specs, g, tp, gpu_memory_utilization, max_model_len, typical_len, as_json,
                             weight_group_size)  # fmt: skip
        return
    kvs = [
        kv_memory(m, g, tp, gpu_memory_utilization, weight_dtype, kv_dtype, 16, weight_group_size)
        for m in specs
    ]
    if max_model_len is None and len(specs) > 1:  # compare at one length: the shortest model limit
        max_model_len = min(m.max_position_embeddings or 2**31 for m in specs)
    sums = [capacity_summary(m, k, max_model_len, typical_len) for m, k in zip(specs, kvs, strict=True)]
    console = Console(width=140)
    if len(specs) == 1:
        quantised = bool(weight_dtype or kv_dtype or specs[0].quant.dtype)
        if quantised:  # the format's FLOP rate and decode-step bytes (16-bit output unchanged)
            sums[0].update(_format_figures(specs[0], g, tp, kvs[0], max_model_len, typical_len))
        if as_json:
            print(json.dumps(sums[0]))
        else:
            table = _single_table(specs[0], kvs[0], sums[0])
            if quantised:
                _add_format_rows(table, sums[0])
            console.print(table)
        return
    note = _attention_line(specs, kvs)
    if as_json:
        print(json.dumps({"gpu": g.name, "tp": tp, "models": sums, "note": note}))
        return
    console.print(_compare_table(specs, kvs, sums))
    console.print(note, soft_wrap=True)


def _mixed_note(model: ModelSpec, weight_dtype: str) -> str:
    """How the mean bytes per parameter arise when not every parameter has the weight dtype's width."""
    if model.weight_bytes(weight_dtype) == model.params_total * dtype_bytes(weight_dtype):
        return ""
    return f" ({weight_dtype} matmuls; embeddings, norms, modules quantization_config keeps: 16-bit)"


def _quantisation_report(
    specs: list[ModelSpec],
    gpu: Gpu,
    tp: int,
    util: float,
    max_model_len: int | None,
    typical_len: int,
    as_json: bool,
    group_size: int | None,
) -> None:
    import json

    from rich.console import Console

    from sim.studies.capacity import (
        DECODE_BATCH,
        PREFILL_TOKENS,
        baseline,
        quantisation_table,
        variant_figures,
        variants,
    )

    if len(specs) != 1:
        raise SimError("--quantisation compares the formats of one model: give one model")
    m = specs[0]
    check_tp(m, tp)
    rows = [variant_figures(m, gpu, v, tp, util, max_model_len, typical_len) for v in variants(m, group_size)]
    if as_json:
        print(json.dumps({"model": m.name, "gpu": gpu.name, "tp": tp, "variants": rows}))
        return
    console = Console(width=160)
    title = (
        f"{m.name} on {gpu.name} x{tp}: weight and KV-cache formats (decode step: {DECODE_BATCH} sequences "
        f"at {typical_len:,} tokens; prefill chunk: {PREFILL_TOKENS:,} tokens)"
    )
    console.print(quantisation_table(rows, title))
    base = baseline(rows)
    console.print(
        "TFLOP/s: the tensor-core peak the layers' GEMMs use (W8A8 at the 8-bit peak; weight-only formats "
        "dequantized at a share of the 16-bit peak). Times: the engine's roofline step cost, with the "
        f"speed-up over {base['variant'] if base else '16-bit'} in brackets. *: more sequences than the KV "
        "cache holds at that length (the step's cost, not one the engine would run).",
        soft_wrap=True,
    )


def _format_figures(
    model: ModelSpec, gpu: Gpu, tp: int, kv: KvMemory, max_model_len: int | None, typical_len: int
) -> dict[str, object]:
    from sim.studies.capacity import Variant, variant_figures

    v = Variant("", kv.weight_dtype, kv.kv_dtype, kv.weight_group_size)
    fig = variant_figures(model, gpu, v, tp, kv.gpu_memory_utilization, max_model_len, typical_len)
    keys = ("weight_format", "matmul_peak_flops", "matmul_effective_flops", "decode_batch", "decode_context",
            "decode_step_bytes", "decode_step_s", "prefill_tokens", "prefill_step_s", "note")  # fmt: skip
    return {k: fig[k] for k in keys}


def _add_format_rows(table: Any, s: dict[str, Any]) -> None:
    table.add_row("weight format", str(s["weight_format"]), str(s["note"]))
    table.add_row(
        "matmul FLOP rate",
        f"{s['matmul_effective_flops'] / 1e12:,.1f} TFLOP/s",
        f"peak {s['matmul_peak_flops'] / 1e12:,.1f} TFLOP/s"
        + ("" if s["matmul_effective_flops"] == s["matmul_peak_flops"] else " x dequantization share"),
    )
    table.add_row(
        "bytes / decode step",
        f"{s['decode_step_bytes'] / GB:,.2f} GB",
        f"weights + KV of {s['decode_batch']} sequences at {s['decode_context']:,} tokens "
        f"({s['decode_step_s'] * 1e3:.2f} ms)",
    )
