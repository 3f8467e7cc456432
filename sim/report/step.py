"""`sim step`: one step's time as the engine charges it, and its kernel breakdown, as a table or JSON.

Both come from the one step-time implementation (`sim.cost.step_model.StepModel`): the step time under the
engine's parameter set (the calibrated roofline, `CostModel` with the shipped calibration, as
`sim.cost.replica.build_cost_and_memory` builds it for a run), the breakdown under the kernel profiles'
(`KernelCostModel`), whose step takes the longer of its GPU kernels and its host time (asynchronous
scheduling overlaps them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from sim.catalog.gpu_formats import check_formats, served_model
from sim.catalog.gpus import Gpu, get_gpu
from sim.catalog.kernel_gpus import serving_scales
from sim.catalog.model import ModelSpec
from sim.catalog.models import load_model
from sim.catalog.quantisation import checkpoint_format_problem
from sim.config.calibration import Calibration, KernelCalibration
from sim.cost.kernel_model import KernelCostModel
from sim.cost.kernels import moe_format
from sim.cost.memory import DEFAULT_MEMORY_UTILIZATION, kv_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError
from sim.io.limits import MAX_COUNT, MAX_TOKENS


def step_rows(batch: int | None, context: int | None, prefill: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(new tokens, cached tokens) per row: B decodes at context C, or one prefill of L tokens."""
    if prefill is not None:
        if batch is not None or context is not None:
            raise SimError("step: give either --prefill L or --batch B --context C, not both")
        if not 1 <= prefill <= MAX_TOKENS:
            raise SimError(f"step: --prefill: expected a token count in [1, {MAX_TOKENS}], got {prefill}")
        return np.array([prefill]), np.array([0])
    if batch is None or context is None:
        raise SimError("step: give --prefill L, or --batch B with --context C")
    if not (1 <= batch <= MAX_COUNT and 0 <= context <= MAX_TOKENS):
        raise SimError(
            f"step: expected --batch in [1, {MAX_COUNT}] and --context in [0, {MAX_TOKENS}], "
            f"got {batch} and {context}"
        )
    return np.ones(batch, dtype=np.int64), np.full(batch, context, dtype=np.int64)


def check_step_length(spec: ModelSpec, context: int | None, prefill: int | None) -> None:
    """Refuse a prompt, or a decode's cached tokens and its new one, past the model's positions."""
    try:
        if prefill is not None:
            spec.check_length(prefill, " positions")
        elif context is not None:
            spec.check_length(context + 1, " positions (the cached tokens and the new one)")
    except SimError as err:
        raise SimError(f"step: {'--prefill' if prefill is not None else '--context'}: {err}") from None


def check_servable(
    spec: ModelSpec, gpu: Gpu, tp: int, weight_dtype: str | None, kv_dtype: str | None,
    weight_group_size: int | None, context: int | None, prefill: int | None,
) -> None:  # fmt: skip
    """Refuse a step `sim run` would refuse: a sequence past the model's positions (`check_length`), or
    weights that do not fit on the GPUs at vLLM's default memory share (`kv_memory`, which checks tp too),
    or a quantized checkpoint in a format other than its own."""
    why = checkpoint_format_problem(spec, weight_dtype)
    if why is not None:
        raise SimError(f"step: --weight-dtype: {why}")
    check_step_length(spec, context, prefill)
    try:
        kv_memory(spec, gpu, tp, DEFAULT_MEMORY_UTILIZATION, weight_dtype, kv_dtype, 16, weight_group_size)
    except SimError as err:
        raise SimError(f"step: {err}") from None


def print_step(
    model: str,
    gpu: str,
    tp: int,
    weight_dtype: str | None,
    kv_dtype: str | None,
    batch: int | None,
    context: int | None,
    prefill: int | None,
    calibration: Path | None,
    as_json: bool,
    weight_group_size: int | None = None,
) -> dict[str, object]:
    from rich.console import Console
    from rich.table import Table

    c, q = step_rows(batch, context, prefill)
    g = get_gpu(gpu)
    check_formats(g, weight_dtype, kv_dtype, ("step: --weight-dtype", "step: --kv-dtype"))
    spec = served_model(load_model(model), g)
    check_servable(spec, g, tp, weight_dtype, kv_dtype, weight_group_size, context, prefill)
    cost = KernelCostModel(
        spec, g, tp, weight_dtype, kv_dtype, KernelCalibration.load(calibration, g), weight_group_size
    )
    engine = CostModel(spec, g, tp, weight_dtype, kv_dtype, Calibration.load(), weight_group_size)
    summary = step_summary(cost, c, q, engine)
    if as_json:
        print(json.dumps(summary, indent=2))
        return summary
    kind = (
        f"prefill of {prefill} tokens"
        if prefill is not None
        else f"decode of {batch} x 1 token at context {context}"
    )
    table = Table(
        title=f"{cost.model.name} on {cost.gpu.name} x{tp} "
        f"({cost.weight_dtype} weights, {cost.kv_dtype} KV): {kind}"
    )
    for col in ("kernel", "count", "bound", "ms", "share"):
        table.add_column(col, justify="left" if col in ("kernel", "bound") else "right")
    total = float(summary["kernel_seconds"])  # type: ignore[arg-type]
    for k in summary["kernels"]:  # type: ignore[attr-defined]
        table.add_row(
            k["kernel"],
            str(k["count"]),
            k["bound"],
            f"{k['seconds'] * 1e3:.3f}",
            f"{k['seconds'] / total:.0%}",
        )
    host = float(summary["host_s"])  # type: ignore[arg-type]
    table.add_row("host (overlapped)", "", "", f"{host * 1e3:.3f}", f"{host / total:.0%}")
    console = Console()
    console.print(table)
    e: dict[str, float] = summary["engine"]  # type: ignore[assignment]
    moe = f"; routed experts as the fused-MoE kernel's {e['moe_kernel']} fit" if e.get("moe_kernel") else ""
    mla = f" (MLA's module kernels {e['mla_module_s'] * 1e3:.3f} of them)" if e.get("mla_module_s") else ""
    console.print(
        f"engine step: {float(summary['seconds']) * 1e3:.3f} ms (calibrated roofline, {e['bound']}-bound: "
        f"linear layers {e['linear_s'] * 1e3:.3f} + attention {e['attention_s'] * 1e3:.3f}, each the "
        f"longer of its compute and its memory (compute {e['compute_s'] * 1e3:.3f}, memory "
        f"{e['memory_s'] * 1e3:.3f} in all), all-reduce {e['allreduce_s'] * 1e3:.3f}, serving terms "
        f"{e['overhead_s'] * 1e3:.3f} ms{mla}; "
        f"GEMM tiles filled as {e['tile_fill_tokens']:g} more rows{moe}; weights streamed at "
        f"{e['bandwidth_eff']:.3f} of HBM, KV at {e['kv_bandwidth_eff']:.3f}, compute at "
        f"{e['compute_eff_prefill']:.3f} of peak: the H100-fitted efficiencies times the ratios "
        f"{e['efficiency_source']})"
    )
    gpu_ms = float(summary["gpu_s"]) * 1e3  # type: ignore[arg-type]
    console.print(
        f"kernels: {total * 1e3:.3f} ms = max(GPU {gpu_ms:.3f}, host {host * 1e3:.3f}) "
        f"({summary['bound']}-bound kernels), "
        f"all-reduce {float(summary['allreduce_s']) * 1e3:.3f} ms"
    )  # type: ignore[arg-type]
    for note in summary["notes"]:  # type: ignore[attr-defined]
        console.print(f"note: {note}")
    return summary


def step_summary(
    cost: KernelCostModel, new_tokens: np.ndarray, context: np.ndarray, engine: CostModel
) -> dict[str, object]:
    """One step's time as the engine charges it (`engine`) and its kernel breakdown (`cost`) as plain data
    (`sim step --json`): `seconds` is the engine's, `kernel_seconds` the kernel profiles'."""
    s = cost.step(new_tokens, context)
    r = engine.step(new_tokens, context)
    c = np.asarray(new_tokens)
    rule = cost.allreduce.source(cost.ar_bytes_token * s.tokens) if cost.allreduces else None
    notes = [n for n in (cost.note,) if n]
    if rule == "prior":
        notes.append(
            f"all-reduce: no measured table covers {cost.gpu.name} at TP {cost.tp} for this message size: "
            "priced by the prior (a latency plus the ring bytes at a share of the link; "
            "sim/cost/allreduce_pricing.py)"
        )
    return {
        "model": cost.model.name,
        "gpu": cost.gpu.name,
        "tp": cost.tp,
        "weight_dtype": cost.weight_dtype,
        "kv_dtype": cost.kv_dtype,
        "rows": s.rows,
        "tokens": s.tokens,
        "seconds": r.seconds,
        "engine": {
            "bound": r.bound,
            "compute_s": r.compute_s,
            "memory_s": r.memory_s,
            # seconds = linear_s + attention_s + allreduce_s + overhead_s: each group max(compute, memory)
            "linear_s": r.linear_s,
            "attention_s": r.attention_s,
            "allreduce_s": r.allreduce_s,
            "overhead_s": r.overhead_s,
            # of the serving terms, MLA's module beyond its projections and attention (sim.cost.mla_fit)
            "mla_module_s": engine.mla_rest(float(r.tokens), float(np.sum(c[c > 1]))),
            "tile_fill_tokens": engine.tile_fill_tokens,  # rows the 16-bit GEMMs' tiles add (the GPU's fit)
            # the fused-MoE fit the routed experts are charged by ("bf16", "fp8"), or None
            "moe_kernel": moe_format(engine.model, engine.gpu, engine.weight_dtype, engine.group_size),
            # the efficiencies charged on this GPU: the H100-fitted ones times its kernels' ratios
            "bandwidth_eff": engine.cal.bandwidth_eff,
            "kv_bandwidth_eff": engine.cal.kv_bandwidth_eff,
            "compute_eff_prefill": engine.cal.compute_eff_prefill,
            "efficiency_source": serving_scales(engine.gpu)[1],
        },
        "kernel_seconds": s.seconds,
        "bound": s.bound,
        "gpu_s": s.gpu_s,
        "host_s": s.host_s,
        "allreduce_s": s.allreduce_s,
        "allreduce_rule": rule,  # custom (vLLM's kernel), nccl, prior, or None without TP
        "flops": s.flops,
        "weight_bytes": s.weight_bytes,
        "kv_read_bytes": s.kv_read_bytes,
        "kernels": [
            {
                "kernel": k.name,
                "count": k.count,
                "bound": k.bound,
                "seconds": k.seconds,
                "flops": k.flops,
                "bytes": k.bytes,
            }
            for k in s.kernels
        ],  # fmt: skip
        "notes": notes,
    }
