"""`sim capacity --quantisation`'s table: one model under each weight and KV-cache format, side by side."""

from __future__ import annotations

from typing import Any

from sim.catalog.dtypes import dtype_bytes
from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.cost.memory import GB, KvMemory, check_tp
from sim.io.errors import SimError
from sim.studies.capacity import (
    DECODE_BATCH,
    PREFILL_TOKENS,
    Variant,
    baseline,
    variant_figures,
    variants,
)


def _mixed_note(model: ModelSpec, weight_dtype: str) -> str:
    """How the mean bytes per parameter arise when not every parameter has the weight dtype's width."""
    if model.weight_bytes(weight_dtype) == model.params_total * dtype_bytes(weight_dtype):
        return ""
    return f" ({weight_dtype} matmuls; embeddings, norms, modules quantization_config keeps: 16-bit)"


def quantisation_report(
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
