"""`sim capacity`'s tables: KV capacity, weight and KV formats, LoRA slots and draft models side by side."""

from __future__ import annotations

from typing import Any

from sim.catalog.dtypes import dtype_bytes
from sim.catalog.gpu_formats import check_formats, served_model
from sim.catalog.gpus import get_gpu
from sim.catalog.model import ModelSpec
from sim.catalog.models import load_model
from sim.catalog.quantisation import check_format_options, checkpoint_format_problem
from sim.config.lora import LoraConfig
from sim.cost.lora import LORA_BYTES, module_shapes, per_gpu_widths
from sim.cost.memory import GB, KvMemory, kv_memory
from sim.io.errors import SimError
from sim.report.formats import _add_format_rows, _format_figures, _mixed_note, quantisation_report
from sim.studies.capacity import (
    capacity_summary,
    draft_capacity,
    lora_capacity,
)


def print_draft_capacity(figures: dict[str, Any], as_json: bool) -> None:
    """`sim capacity MODEL --draft-model DRAFT`: the KV blocks the draft's weights and KV take."""
    import json

    from rich.console import Console
    from rich.table import Table

    if as_json:
        print(json.dumps(figures))
        return
    f, gb = figures, 1e9
    t = Table(title=f"{f['model']} on {f['gpu']} x{f['tp']} with draft {f['draft_model']} (x{f['draft_tp']})")
    t.add_column("quantity")
    t.add_column("without draft", justify="right")
    t.add_column("with draft", justify="right")
    t.add_column("arithmetic")
    t.add_row("draft weights / GPU", "0", f"{f['draft_weight_bytes'] / gb:,.2f} GB", "on the draft's GPUs")
    per, dper = f["kv_bytes_per_token"], f["draft_kv_bytes_per_token"]
    t.add_row("KV bytes / token", f"{per:,} B", f"{per + dper:,} B", f"target {per:,} + draft {dper:,}")
    t.add_row(
        "KV blocks", f"{f['kv_blocks']:,}", f"{f['kv_blocks_with_draft']:,}",
        f"({f['kv_bytes_available'] / gb:,.2f} GB - draft weights) / ({f['block_size']} x KV bytes / token)",
    )  # fmt: skip
    t.add_row(
        f"max seqs @ {f['typical_len']:,} tokens", f"{f['max_seqs_at_typical_len']:,}",
        f"{f['max_seqs_at_typical_len_with_draft']:,}", "blocks / blocks per sequence",
    )  # fmt: skip
    Console(width=140).print(t)


def _gb(x: float) -> str:
    return f"{x / GB:,.2f} GB"


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

    if not models:
        raise SimError("give at least one model")
    g = get_gpu(gpu)
    specs = [served_model(load_model(m), g) for m in models]
    try:  # as `sim run` refuses model.max_model_len
        for spec in specs:
            spec.check_length(max_model_len or 0)
    except SimError as err:
        raise SimError(f"--max-model-len: {err}") from None
    if quantisation:
        quantisation_report(specs, g, tp, gpu_memory_utilization, max_model_len, typical_len, as_json,
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


def lora_capacity_report(
    model_name: str, gpu: str, tp: int, util: float, weight_dtype: str | None, kv_dtype: str | None,
    max_loras: int, max_lora_rank: int, typical_len: int, as_json: bool,
) -> None:  # fmt: skip
    """Print what `max_loras` slots of `max_lora_rank` take from one model's KV cache."""
    import json

    from pydantic import ValidationError
    from rich.console import Console
    from rich.table import Table

    try:
        config = LoraConfig(max_loras=max_loras, max_lora_rank=max_lora_rank)
    except ValidationError as err:
        raise SimError(f"--max-lora-rank: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    g = get_gpu(gpu)
    model = served_model(load_model(model_name), g)
    kv = kv_memory(model, g, tp, util, weight_dtype, kv_dtype)
    out = lora_capacity(model, kv, config, typical_len)
    if as_json:
        print(json.dumps({"model": model.name, "gpu": kv.gpu, "tp": tp, "lora": out}))
        return
    shapes = module_shapes(model)
    t = Table(title=f"LoRA slots: {max_loras} x rank {max_lora_rank} on {model.name}, {kv.gpu} x{tp}")
    t.add_column("quantity")
    t.add_column("without slots", justify="right")
    t.add_column("with slots", justify="right")
    t.add_column("arithmetic")
    widths = sum(a + b for a, b in (per_gpu_widths(model, n, s, tp) for n, s in shapes.items()))
    names = ",".join(n.removesuffix("_proj") for n in shapes)
    t.add_row("slot bytes", "", f"{out['slot_bytes']:,} B",
              f"{model.num_layers} layers x rank {max_lora_rank} x {widths:,} (in + out of {names}) "
              f"x {LORA_BYTES} B")  # fmt: skip
    t.add_row("slots", "", f"{out['slots_bytes'] / 1e9:,.2f} GB", f"{max_loras} x slot bytes")
    t.add_row("KV blocks", f"{kv.num_blocks:,}", f"{out['kv_blocks_with_slots']:,}",
              f"(KV available - slots) / {kv.block_bytes:,} B per block")  # fmt: skip
    per_seq = kv.blocks_per_seq(typical_len)
    t.add_row(f"max seqs @ {typical_len:,}", f"{out['max_seqs_without_slots']:,}",
              f"{out['max_seqs_with_slots']:,}", f"blocks / {per_seq} blocks per seq")  # fmt: skip
    Console(width=160).print(t)


def _check_checkpoint_formats(models: list[str], weight_dtype: str | None, quantisation: bool) -> None:
    """A quantized checkpoint is served in its own format only (an unknown model is reported later)."""
    for name in models:
        try:
            model = load_model(name)
        except SimError:
            continue
        why = checkpoint_format_problem(model, weight_dtype)
        if why is not None:
            raise SimError(f"--weight-dtype: {why}")
        if quantisation and model.quant.dtype:
            raise SimError(
                f"--quantisation: {model.name} is a {model.quant.method} checkpoint, served in its own "
                "format only; the comparison of weight formats is for 16-bit checkpoints"
            )


def print_capacity(
    models: list[str], gpu: str, tp: int, gpu_memory_utilization: float, weight_dtype: str | None,
    kv_dtype: str | None, max_model_len: int | None, typical_len: int, compare: bool, as_json: bool,
    draft_model: str | None, draft_tp: int | None, max_loras: int, max_lora_rank: int,
    weight_group_size: int | None, quantisation: bool,
) -> None:  # fmt: skip
    """`sim capacity`: one model's KV capacity, several side by side, or one with a draft model, LoRA slots
    or each weight and KV-cache format; the options checked together first."""
    for option, value in (("--weight-dtype", weight_dtype), ("--kv-dtype", kv_dtype)):
        if quantisation and value is not None:
            raise SimError(
                f"{option} goes without --quantisation, which shows every weight and KV-cache format "
                "side by side: drop one"
            )
    check_format_options(weight_dtype, kv_dtype, weight_group_size, any_int=quantisation)
    check_formats(get_gpu(gpu), weight_dtype, kv_dtype, ("--weight-dtype", "--kv-dtype"))
    if len(models) > 1 and not compare:
        raise SimError("several models given: add --compare to show them side by side")
    _check_checkpoint_formats(models, weight_dtype, quantisation)
    if draft_model is not None and max_loras:
        raise SimError("give --draft-model or --max-loras, not both")
    if (draft_model is not None or max_loras) and (quantisation or weight_group_size is not None):
        raise SimError("--quantisation and --weight-group-size go without --draft-model and --max-loras")
    if draft_model is not None:  # speculative decoding: the KV the draft model takes (sim/cost/draft.py)
        if len(models) > 1:
            raise SimError("--draft-model takes one model")
        args = (models[0], gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, draft_model, draft_tp)
        print_draft_capacity(draft_capacity(*args, typical_len), as_json)
        return
    if max_loras:  # the LoRA slots' effect on one model's KV cache (sim/cost/lora.py)
        if len(models) > 1:
            raise SimError("--max-loras: give one model")
        lora_args = (gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, max_loras, max_lora_rank)
        if not as_json:
            capacity_report(models, gpu, tp, gpu_memory_utilization, weight_dtype, kv_dtype, max_model_len,
                            typical_len)  # fmt: skip
        lora_capacity_report(models[0], *lora_args, typical_len, as_json)
        return
    capacity_report(
        models,
        gpu,
        tp=tp,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        max_model_len=max_model_len,
        typical_len=typical_len,
        as_json=as_json,
        weight_group_size=weight_group_size,
        quantisation=quantisation,
    )
