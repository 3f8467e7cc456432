"""LoRA section of the report: throughput and p99 TTFT against the number of adapters, from a sweep over
`workload.lora.adapters` (one line per policy, e.g. one per `max_loras` setting, and per offered rate when
the sweep has several; means over replications)."""

from __future__ import annotations

import json

import altair as alt
import polars as pl

from sim.report.charts import WIDTH, policy_color
from sim.report.coverage import points_text
from sim.report.inputs import PolicyRun
from sim.report.page import Section

ADAPTERS_KEY = "workload.lora.adapters"
LORA_METRICS = {"requests_per_s": "finished requests/s", "ttft_p99": "p99 TTFT (s)"}


def _adapters(raw: object) -> int | None:
    """The swept adapter count of a point's `params` (JSON text), or None."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    try:
        params = json.loads(raw)
    except json.JSONDecodeError:
        return None
    value = params.get(ADAPTERS_KEY) if isinstance(params, dict) else None
    return int(value) if isinstance(value, int | float) else None


def by_adapters(points: pl.DataFrame) -> pl.DataFrame:
    """Long frame: policy, adapters, metric, value (mean over the points of each policy and adapter count)."""
    if "params" not in points.columns:
        return pl.DataFrame()
    frame = points.with_columns(
        adapters=pl.Series([_adapters(p) for p in points["params"]], dtype=pl.Int64)
    ).drop_nulls("adapters")
    if frame.is_empty():
        return pl.DataFrame()
    if frame["rate"].n_unique() > 1:  # one line per policy and offered rate
        label = pl.format("{} @ {} req/s", pl.col("policy"), pl.col("rate").round(3))
        frame = frame.with_columns(policy=label)
    means = frame.group_by("policy", "adapters").agg(pl.col(m).mean() for m in LORA_METRICS)
    return means.unpivot(list(LORA_METRICS), index=["policy", "adapters"], variable_name="metric").sort(
        "policy", "metric", "adapters"
    )


def adapters_chart(frame: pl.DataFrame) -> alt.FacetChart:
    series = sorted(frame["policy"].unique().to_list())
    frame = frame.with_columns(pl.col("metric").replace_strict(LORA_METRICS))
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("adapters:Q", scale=alt.Scale(type="log"), title="adapters (log scale)"),
            y=alt.Y("value:Q", title=None),
            color=alt.Color("policy:N", scale=policy_color(series)),
            tooltip=["policy:N", "adapters:Q", alt.Tooltip("value:Q", format=".3g")],
        )
        .properties(width=WIDTH, height=220)
        .facet(column=alt.Column("metric:N", title=None))
        .resolve_scale(y="independent")
    )


RUN_MEASURES = {
    "distinct_per_step_mean": "adapters per step (mean)",
    "gpu_hit_rate": "GPU slot hit rate",
    "load_time_share": "share of busy time loading adapters",
}


def run_figures(runs: list[PolicyRun]) -> pl.DataFrame:
    """Long frame: policy, measure, value, from the `lora` block of each run's summary."""
    rows = [
        {"policy": run.policy, "measure": label, "value": float(run.summary["lora"].get(key) or 0.0)}
        for run in runs
        if "lora" in run.summary
        for key, label in RUN_MEASURES.items()
    ]
    return pl.DataFrame(rows, schema={"policy": pl.String, "measure": pl.String, "value": pl.Float64})


def run_chart(frame: pl.DataFrame) -> alt.FacetChart:
    series = sorted(frame["policy"].unique().to_list())
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("policy:N", title=None),
            y=alt.Y("value:Q", title=None),
            color=alt.Color("policy:N", scale=policy_color(series), legend=None),
            tooltip=["policy:N", "measure:N", alt.Tooltip("value:Q", format=".3g")],
        )
        .properties(width=WIDTH // 2, height=180)
        .facet(column=alt.Column("measure:N", title=None))
        .resolve_scale(y="independent")
    )


def lora_sections(points: pl.DataFrame | None, runs: list[PolicyRun] | None = None) -> list[Section]:
    """A section for runs that served adapters, and one for sweeps over `workload.lora.adapters`."""
    out = []
    figures = run_figures(runs or [])
    if figures.height:
        out.append(
            Section(
                "lora_runs",
                "LoRA adapters per step, slot hits and load time",
                "From each run's summary: the distinct adapters a step's batch holds (at most max_loras), "
                "the share of step activations that found their adapter already in a GPU slot, and the "
                "share of busy time spent copying adapters in (from disk to host memory and over PCIe).",
                run_chart(figures),
            )
        )
    if points is None:
        return out
    frame = by_adapters(points)
    if frame.is_empty():
        return out
    swept = points.filter(pl.Series([_adapters(p) is not None for p in points["params"]], dtype=pl.Boolean))
    return out + [
        Section(
            "lora_adapters",
            "Throughput and p99 TTFT against the number of LoRA adapters",
            "Each point is a sweep run at one adapter count (mean over replications). While the "
            "popular adapters fit the GPU slots (max_loras) throughput holds; as the adapters outnumber the "
            "slots, a batch may mix at most max_loras of them, requests of other adapters wait in the queue, "
            "and adapters are copied in over PCIe: throughput falls and p99 TTFT climbs. "
            + points_text(swept),
            adapters_chart(frame),
        )
    ]
