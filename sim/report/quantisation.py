"""The report's quantisation section: the weight and KV-cache formats a sweep varied, side by side.

Shown when the sweep's series differ in `model.weight_dtype`, `model.kv_dtype` or `model.weight_group_size`
(e.g. `sweep.variants` in scenarios/what-quantisation-buys.toml): per format, the KV tokens and the
sequences of mean length that fit (sim/cost/memory.py), the capacity under the SLO, and p50/p99 TTFT and ITL
at
the scenario's arrival rate (means over replications of the sweep's points at that rate).
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

import altair as alt
import polars as pl

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.sweep import parse_sweep
from sim.cost.memory import kv_memory
from sim.io.errors import SimError
from sim.report.coverage import count_text
from sim.report.grid import CapacityMark, params_label, with_series
from sim.report.inputs import ReportInputs
from sim.report.page import Section

QUANT_KEYS = ("model.weight_dtype", "model.kv_dtype", "model.weight_group_size")
LATENCIES = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")


def _params(raw: object) -> dict[str, Any]:
    if isinstance(raw, str) and raw.strip():
        loaded = json.loads(raw)
        return loaded if isinstance(loaded, dict) else {}
    return {}


def format_label(params: dict[str, Any]) -> str:
    """ "int4 weights (g128), fp8 KV" from a point's params; "default" when it sets no format key."""
    bits = []
    if "model.weight_dtype" in params:
        group = params.get("model.weight_group_size")
        bits.append(f"{params['model.weight_dtype']} weights" + (f" (g{group})" if group else ""))
    if "model.kv_dtype" in params:
        bits.append(f"{params['model.kv_dtype']} KV")
    return ", ".join(bits) or "default"


def _memory(inputs: ReportInputs, params: dict[str, Any]) -> tuple[int, int] | None:
    """(KV tokens, sequences of mean prompt + output length that fit) of a format, None if it cannot tell."""
    scenario = inputs.scenario
    if scenario is None:
        return None
    m = scenario.model
    try:
        kv = kv_memory(
            load_model(m.name), get_gpu(m.gpu), m.tp, m.gpu_memory_utilization,
            params.get("model.weight_dtype", m.weight_dtype), params.get("model.kv_dtype", m.kv_dtype),
            m.block_size, params.get("model.weight_group_size", m.weight_group_size),
        )  # fmt: skip
    except SimError:
        return None
    w = scenario.workload
    mean_len = int(getattr(w.prompt, "mean", 0) or 0) + int(getattr(w.output, "mean", 0) or 0)
    return kv.token_capacity, kv.max_seqs(max(mean_len, 1))


def _grid_index(inputs: ReportInputs, params: dict[str, Any]) -> int:
    """Where a point's params come in the sweep's grid (the order of `sweep.variants`), else last."""
    sweep = inputs.scenario.sweep if inputs.scenario is not None else None
    try:
        grid = parse_sweep(sweep, "sweep").param_grid() if sweep else []
    except SimError:
        grid = []
    return grid.index(params) if params in grid else len(grid)


def quantisation_rows(inputs: ReportInputs, caps: list[CapacityMark]) -> list[dict[str, Any]]:
    """One row per format the sweep varied (empty when it varied none)."""
    points = inputs.points
    if points is None or points.is_empty() or "params" not in points.columns:
        return []
    named = with_series(points)
    formats = [p for p in dict.fromkeys(named["params"].to_list()) if set(_params(p)) & set(QUANT_KEYS)]
    if not formats:
        return []
    formats.sort(key=lambda p: _grid_index(inputs, _params(p)))
    arrival = inputs.scenario.workload.arrival if inputs.scenario is not None else None
    rates = sorted({float(r) for r in named["rate"].drop_nulls().to_list()})
    wanted = getattr(arrival, "rate", None)
    rate = min(rates, key=lambda r: abs(r - float(wanted))) if rates and wanted else None
    by_series = {c.series: c for c in caps}
    rows = []
    for raw in formats:
        params = _params(raw)
        these = named.filter(pl.col("params") == raw)
        series = str(these["series"][0])
        at = these.filter(pl.col("rate") == rate) if rate is not None else these.head(0)
        cap = by_series.get(series)
        memory = _memory(inputs, params)
        rows.append({
            "format": format_label(params),
            "series": series,
            "params": params_label(params),
            "kv_tokens": memory[0] if memory else None,
            "max_seqs": memory[1] if memory else None,
            "capacity": cap.rate if cap is not None else None,
            "capacity_text": _cap_text(cap),
            "rate": rate,
            **{k: float(at[k].mean()) if at.height and at[k].null_count() < at.height else None
               for k in LATENCIES},
            **{k: int(at[k].sum()) if at.height and k in at.columns else None
               for k in ("finished", "arrived")},
        })  # fmt: skip
    return rows


def _cap_text(cap: CapacityMark | None) -> str:
    if cap is None:
        return "-"
    return cap.text or (f"{cap.rate:.3g}" if cap.rate is not None else "-")


def _cell(value: object, scale: float = 1.0, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * scale:.{digits}g}"
    return f"{value:,}" if isinstance(value, int) else escape(str(value))


def _table(rows: list[dict[str, Any]]) -> str:
    rate = rows[0]["rate"]
    at = f" at {rate:g} req/s" if rate is not None else ""
    head = ["format", "KV tokens", "sequences that fit", "capacity (req/s)",
            f"TTFT p50 / p99 (ms){at}", f"ITL p50 / p99 (ms){at}", f"latencies over{at}"]  # fmt: skip
    body = "".join(
        "<tr>" + "".join(f"<td>{c}</td>" for c in (
            escape(r["format"]), _cell(r["kv_tokens"]), _cell(r["max_seqs"]), escape(str(r["capacity_text"])),
            f"{_cell(r['ttft_p50'], 1e3)} / {_cell(r['ttft_p99'], 1e3)}",
            f"{_cell(r['itl_p50'], 1e3)} / {_cell(r['itl_p99'], 1e3)}",
            "-" if r["arrived"] is None else escape(count_text(r["finished"], r["arrived"])),
        )) + "</tr>"
        for r in rows
    )  # fmt: skip
    return "<table><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr>{body}</table>"


def _metric(key: str) -> str:
    name, stat = key.split("_")
    return f"{name.upper()} {stat}"


def latency_chart(rows: list[dict[str, Any]]) -> alt.FacetChart:
    """p50 and p99 TTFT and ITL per format at the fixed rate, one panel per metric."""
    data = [
        {"format": r["format"], "metric": _metric(k), "ms": r[k] * 1e3}
        for r in rows
        for k in LATENCIES
        if r[k] is not None
    ]
    return (
        alt.Chart(alt.Data(values=data))
        .mark_bar()
        .encode(
            y=alt.Y("format:N", title=None, sort=None),
            x=alt.X("ms:Q", title="ms"),
            color=alt.Color("format:N", legend=None),
            tooltip=["format:N", "metric:N", alt.Tooltip("ms:Q", format=".1f")],
        )
        .properties(width=240, height=24 * max(len(rows), 1))
        .facet(facet=alt.Facet("metric:N", title=None, sort=[_metric(k) for k in LATENCIES]), columns=2)
        .resolve_scale(x="independent")
    )


def quantisation_sections(inputs: ReportInputs, caps: list[CapacityMark]) -> list[Section]:
    """The quantisation section, or none when the sweep varied no weight or KV format."""
    rows = quantisation_rows(inputs, caps)
    if not rows:
        return []
    have = any(r[k] is not None for r in rows for k in LATENCIES)
    note = (
        "The weight and KV-cache formats the sweep compared. Smaller weights leave more memory to the KV "
        "cache (more sequences at once) and cut the bytes each memory-bound decode step reads (lower ITL); "
        "an FP8 KV cache doubles the KV tokens. Compute-bound prefill speeds up only where the matmuls get a "
        "faster FLOP rate (FP8 W8A8); weight-only INT4 is dequantized to 16-bit and prefills no faster. "
        "Capacity: the highest rate within the SLO (sweep <code>--find-capacity</code>). Latencies: means "
        "over the replications at that rate, each over the requests that finished (the last column adds "
        "them up)." + _table(rows)
    )
    return [
        Section(
            "quantisation",
            "What quantisation buys",
            note,
            latency_chart(rows) if have else None,
            "No sweep points at the scenario's rate.",
        )
    ]
