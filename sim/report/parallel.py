"""`sim step` and `sim capacity` under a placement beyond TP (`--pp`, `--ep`, `--dp`): the memory of a GPU
and one step per stage and per rank, communication kernels included (sim/cost/parallel.py, over the
roofline model the engine runs)."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import numpy as np

from sim.catalog.gpu_formats import check_formats, served_model
from sim.catalog.gpus import get_gpu
from sim.catalog.model import ModelSpec
from sim.catalog.models import load_model
from sim.catalog.quantisation import checkpoint_format_problem
from sim.config.calibration import Calibration
from sim.cost.memory import GB
from sim.cost.parallel import ParallelCost
from sim.cost.placement import Placement, check_placement, rank_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError


def _model(model: str, gpu: str, weight_dtype: str | None, kv_dtype: str | None, command: str) -> ModelSpec:
    """The model as served on the GPU, refusing formats the GPU or the checkpoint cannot serve (as the
    TP-only `sim step` and `sim capacity` do; `command` starts the error)."""
    g = get_gpu(gpu)
    check_formats(g, weight_dtype, kv_dtype, ("--weight-dtype", "--kv-dtype"))
    spec = load_model(model)
    why = checkpoint_format_problem(spec, weight_dtype)
    if why is not None:
        raise SimError(f"{command}--weight-dtype: {why}")
    return served_model(spec, g)


def parallel_capacity(
    model: str, gpu: str, p: Placement, util: float, weight_dtype: str | None, kv_dtype: str | None,
    as_json: bool,
) -> dict[str, Any]:  # fmt: skip
    """Memory per GPU of the placement, and the KV tokens of each attention rank and the replica."""
    spec = _model(model, gpu, weight_dtype, kv_dtype, "")
    check_placement(spec, p, "capacity: --", "")
    mem = rank_memory(spec, get_gpu(gpu), p, util, weight_dtype, kv_dtype, 16, "capacity: --", None, "")
    out = {
        "model": spec.name,
        "gpu": gpu,
        **asdict(p),
        "gpus": p.gpus,
        "nodes": p.node_count,
        **mem.to_dict(),
    }
    if as_json:
        print(json.dumps(out, indent=2))
        return out
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{spec.name} on {p.gpus} x {gpu}: tp {p.tp} x pp {p.pp} x dp {p.dp}, ep {p.ep}")
    t.add_column("per GPU")
    t.add_column("value", justify="right")
    for label, value in (
        ("layers (busiest stage)", str(mem.layers)),
        ("weights", f"{mem.weight_bytes / GB:.2f} GB"),
        ("reserve", f"{mem.reserve_bytes / GB:.2f} GB"),
        ("usable", f"{mem.budget_bytes / GB:.2f} GB"),
        ("KV bytes per token", f"{mem.kv_bytes_per_token:,}"),
        ("KV tokens per attention rank", f"{mem.kv_tokens_per_rank:,}"),
        (f"KV tokens of the replica ({p.dp} rank{'s' if p.dp > 1 else ''})", f"{mem.kv_tokens:,}"),
    ):
        t.add_row(label, value)
    Console().print(t)
    return out


def parallel_step(
    model: str, gpu: str, p: Placement, weight_dtype: str | None, kv_dtype: str | None,
    new_tokens: np.ndarray, context: np.ndarray, as_json: bool,
) -> dict[str, Any]:  # fmt: skip
    """One step under the placement: each stage, each attention rank, each EP rank, the all-to-alls."""
    spec = _model(model, gpu, weight_dtype, kv_dtype, "step: ")
    check_placement(spec, p, "step: --", "")
    g = get_gpu(gpu)
    rank_memory(spec, g, p, 0.9, weight_dtype, kv_dtype, 16, "step: --", None, "")
    base = CostModel(spec, g, p.tp, weight_dtype, kv_dtype, Calibration.load())
    pc = ParallelCost(base, spec, g, p)
    b = pc.breakdown(new_tokens, context)
    moe = spec.num_moe_layers
    out: dict[str, Any] = {
        "model": spec.name, "gpu": g.name, **asdict(p), "tokens": int(np.sum(new_tokens)),
        "rows": int(np.size(new_tokens)), "seconds": b.seconds, "stage_s": b.stage_s,
        "attention_rank_s": b.rank_s, "expert_rank_s_per_layer": b.expert_rank_s,
        "dispatch_s_per_layer": b.dispatch_s, "combine_s_per_layer": b.combine_s,
        "skew_s_per_layer": b.skew_s, "pp_send_s": b.pp_send_s, "overlap_s": b.overlap_s,
        "gather_s_per_layer": b.gather_s, "group_reads_s_per_layer": b.group_reads_s,
        "ep_link": pc.ep_link.name if p.ep > 1 else None, "pp_link": pc.pp_link.name if p.pp > 1 else None,
    }  # fmt: skip
    if as_json:
        print(json.dumps(out, indent=2))
        return out
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{spec.name} on {p.gpus} x {g.name}: tp {p.tp} x pp {p.pp} x dp {p.dp}, ep {p.ep}")
    for col in ("part", "count", "ms each", "ms in step"):
        t.add_column(col, justify="left" if col == "part" else "right")
    for i, s in enumerate(b.stage_s):
        t.add_row(f"stage {i} ({pc.layers[i]} layers)", "1", f"{s * 1e3:.3f}", f"{s * 1e3:.3f}")
    for r, s in enumerate(b.rank_s):
        t.add_row(f"  attention rank {r} (all layers, its rows)", "", f"{s * 1e3:.3f}", "")
    if p.ep > 1:
        for r, s in enumerate(b.expert_rank_s):
            t.add_row(f"  expert GEMMs, EP rank {r}", str(moe), f"{s * 1e3:.4f}", "")
        t.add_row(f"  dispatch all-to-all ({pc.ep_link.name})", str(moe), f"{b.dispatch_s * 1e3:.4f}",
                  f"{moe * b.dispatch_s * 1e3:.3f}")  # fmt: skip
        t.add_row(f"  combine all-to-all ({pc.ep_link.name})", str(moe), f"{b.combine_s * 1e3:.4f}",
                  f"{moe * b.combine_s * 1e3:.3f}")  # fmt: skip
        t.add_row(
            "  busiest EP rank over the mean",
            str(moe),
            f"{b.skew_s * 1e3:.4f}",
            f"{moe * b.skew_s * 1e3:.3f}",
        )
    if b.gather_s:  # DP attention over TP-sharded experts
        t.add_row(f"  all-gather + reduce-scatter of the step's tokens ({pc.group_link.name})", str(moe),
                  f"{b.gather_s * 1e3:.4f}", f"{moe * b.gather_s * 1e3:.3f}")  # fmt: skip
        t.add_row("  experts the step touches beyond the rank's own", str(moe),
                  f"{b.group_reads_s * 1e3:.4f}", f"{moe * b.group_reads_s * 1e3:.3f}")  # fmt: skip
    if b.overlap_s:
        t.add_row("  two-batch overlap: communication hidden", "", "", f"-{sum(b.overlap_s) * 1e3:.3f}")
    if p.pp > 1:
        t.add_row(f"PP send ({pc.pp_link.name})", str(p.pp - 1), f"{b.pp_send_s * 1e3:.4f}",
                  f"{(p.pp - 1) * b.pp_send_s * 1e3:.3f}")  # fmt: skip
    console = Console()
    console.print(t)
    console.print(
        f"step: {b.seconds * 1e3:.3f} ms, one batch's latency (its stages and sends); the engine keeps"
        f" {p.pp} in flight, so the slowest stage bounds throughput at {1 / max(b.stage_s):.1f} steps/s"
        if p.pp > 1 else f"step: {b.seconds * 1e3:.3f} ms (the slowest attention rank, then the MoE layers)"
    )  # fmt: skip
    return out
