"""One function per report chart: a small polars frame in, an altair chart out (no aggregation here)."""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import polars as pl

from sim.report.frames import KV_PARTS, SEGMENTS
from sim.report.grid import CapacityMark

WIDTH = 300
SEGMENT_COLORS = {"queued": "#bab0ac", "prefill": "#f58518", "decode": "#4c78a8", "padding": "#e45756"}
KV_COLORS = {"token states": "#4c78a8", "reserved, unused": "#f58518", "free": "#e5e5e5"}
LATENCY_NAMES = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E", "queue_wait": "queue wait", "itl": "ITL"}
MIN_SECONDS = 1e-4  # floor for log-scaled latency axes (a zero-width CI touches zero)
# The widest step, in log(rate), between two points of the offered-load line on a log rate axis: the
# renderer draws a straight segment between them, which stays within (step)²/8 = 0.03% of y = x.
DIAGONAL_LOG_STEP = 0.05


def log_rates(frame: pl.DataFrame) -> bool:
    """Whether the rate axis is logarithmic: when the grid spans a decade or more (sweeps are often
    geometric)."""
    rates = frame["rate"].drop_nulls()
    return rates.len() > 0 and float(rates.min()) > 0 and float(rates.max()) >= 10 * float(rates.min())  # type: ignore[arg-type]


def rate_axis(frame: pl.DataFrame) -> alt.X:
    """Arrival rate on x, logarithmic or linear as `log_rates` says."""
    wide = log_rates(frame)
    scale = alt.Scale(type="log", nice=False) if wide else alt.Scale(zero=False)
    return alt.X("rate:Q", title="arrival rate (req/s)" + (" (log)" if wide else ""), scale=scale)


def policy_color(series: list[str]) -> alt.Scale:
    """The same colour for a policy in every chart."""
    return alt.Scale(domain=series, scheme="tableau10")


def latency_vs_rate(stats: pl.DataFrame, series: list[str]) -> alt.FacetChart:
    """p50 and p99 of TTFT, TPOT and E2E against the arrival rate, one panel each, with CI bands (give
    bands for a log axis, `grid.log_bands`)."""
    metrics = [f"{m}_{q}" for m in ("ttft", "tpot", "e2e") for q in ("p50", "p99")]
    frame = (
        stats.filter(pl.col("metric").is_in(metrics))
        .with_columns(
            latency=pl.col("metric").str.split("_").list.first().replace_strict(LATENCY_NAMES, default=None),
            quantile=pl.col("metric").str.split("_").list.last(),
            mean=pl.col("mean").clip(lower_bound=MIN_SECONDS),
            ci_low=pl.col("ci_low").clip(lower_bound=MIN_SECONDS),
            ci_high=pl.col("ci_high").clip(lower_bound=MIN_SECONDS),
        )
        .select("series", "rate", "latency", "quantile", "mean", "ci_low", "ci_high", "n")
    )
    color = alt.Color("series:N", title="policy", scale=policy_color(series))
    x = rate_axis(frame)
    band = (
        alt.Chart()
        .mark_area(opacity=0.12)
        .encode(x=x, y=alt.Y("ci_low:Q"), y2="ci_high:Q", color=color, detail="quantile:N")
    )
    line = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("mean:Q", title="seconds (log)", scale=alt.Scale(type="log")),
            color=color,
            strokeDash=alt.StrokeDash(
                "quantile:N",
                sort=["p50", "p99"],
                legend=alt.Legend(symbolType="stroke", symbolStrokeColor="#444", symbolStrokeWidth=2),
            ),
            tooltip=[
                "series:N",
                "rate:Q",
                "quantile:N",
                alt.Tooltip("mean:Q", format=".3g"),
                alt.Tooltip("ci_low:Q", format=".3g", title="95% CI low"),
                alt.Tooltip("ci_high:Q", format=".3g", title="95% CI high"),
                "n:Q",
            ],
        )
    )
    return (
        alt.layer(band, line, data=frame)
        .properties(width=WIDTH, height=220)
        .facet(column=alt.Column("latency:N", title=None, sort=["TTFT", "TPOT", "E2E"]))
        .resolve_scale(y="independent")
    )


def _vs_rate(frame: pl.DataFrame, series: list[str], title: str) -> alt.LayerChart:
    """Mean and CI band per series; rates per second cannot be negative, so the band stops at zero."""
    frame = frame.with_columns(pl.col("ci_low").clip(lower_bound=0.0))
    color = alt.Color("series:N", title="policy", scale=policy_color(series))
    x = rate_axis(frame)
    band = alt.Chart().mark_area(opacity=0.12).encode(x=x, y="ci_low:Q", y2="ci_high:Q", color=color)
    line = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("mean:Q", title=title),
            color=color,
            tooltip=["series:N", "rate:Q", alt.Tooltip("mean:Q", format=".3g"), "n:Q"],
        )
    )
    return alt.layer(band, line, data=frame)


def diagonal_rates(rates: list[float], log: bool) -> list[float]:
    """Where the offered-load line y = x is drawn: the grid's rates and 1 req/s when inside it; on a log
    axis also enough rates between them (at most `DIAGONAL_LOG_STEP` apart in log(rate)) that the straight
    segments drawn between points follow y = x. A linear axis needs no more: there y = x is straight."""
    drawn = sorted(set(rates) | ({1.0} if rates and min(rates) < 1.0 < max(rates) else set()))
    if not log:
        return drawn
    out = drawn[:1]
    for low, high in zip(drawn, drawn[1:], strict=False):
        steps = math.ceil(math.log(high / low) / DIAGONAL_LOG_STEP)
        out += [low * (high / low) ** (i / steps) for i in range(1, steps)] + [high]
    return out


def throughput_vs_rate(stats: pl.DataFrame, series: list[str]) -> alt.LayerChart:
    """Completed requests per second against the offered rate; the dashed diagonal, y = x on the chart's
    rate axis, is 'keeps up'."""
    frame = stats.filter(pl.col("metric") == "requests_per_s")
    rates = [float(r) for r in frame["rate"].drop_nulls().unique()]
    line = [{"rate": r, "mean": r} for r in diagonal_rates(rates, log_rates(frame))]
    diagonal = (
        alt.Chart(alt.Data(values=line))
        .mark_line(strokeDash=[4, 4], color="#888")
        .encode(x="rate:Q", y="mean:Q")
    )
    return alt.layer(_vs_rate(frame, series, "finished requests/s"), diagonal).properties(
        width=2 * WIDTH, height=260
    )


def goodput_vs_rate(stats: pl.DataFrame, series: list[str], capacities: list[CapacityMark]) -> alt.LayerChart:
    """Requests per second meeting the SLO; a vertical rule marks each policy's capacity."""
    frame = stats.filter(pl.col("metric") == "goodput_per_s")
    chart = _vs_rate(frame, series, "goodput (req/s within SLO)")
    marks = pl.DataFrame(
        [
            {"series": c.series, "rate": c.rate, "label": f"{c.series}: {c.label}"}
            for c in capacities
            if c.rate is not None and c.series in series
        ]  # fmt: skip
    )
    if marks.height:
        rules = (
            alt.Chart(marks)
            .mark_rule(strokeDash=[6, 3], strokeWidth=2)
            .encode(
                x="rate:Q",
                color=alt.Color("series:N", scale=policy_color(series), title="policy"),
                tooltip=["label:N"],
            )
        )
        chart = alt.layer(chart, rules)
    return chart.properties(width=2 * WIDTH, height=260)


def latency_cdf(cdf: pl.DataFrame, series: list[str]) -> alt.FacetChart:
    """Empirical CDFs of TTFT and E2E per policy (log time axis)."""
    frame = cdf.with_columns(
        latency=pl.col("metric").replace_strict(LATENCY_NAMES, default=None),
        value=pl.col("value").clip(lower_bound=MIN_SECONDS),
    )
    return (
        alt.Chart(frame)
        .mark_line(interpolate="step-after")
        .encode(
            x=alt.X("value:Q", title="seconds (log)", scale=alt.Scale(type="log")),
            y=alt.Y("fraction:Q", title="fraction of requests", axis=alt.Axis(format="%")),
            color=alt.Color("policy:N", scale=policy_color(series)),
            tooltip=[
                "policy:N",
                alt.Tooltip("value:Q", format=".3g"),
                alt.Tooltip("fraction:Q", format=".0%"),
            ],
        )
        .properties(width=1.5 * WIDTH, height=240)
        .facet(column=alt.Column("latency:N", title=None, sort=["TTFT", "E2E"]))
        .resolve_scale(x="independent")
    )


def gantt(
    frame: pl.DataFrame, field: str, colors: dict[str, str], tooltip: list[Any], row_px: int
) -> alt.FacetChart:
    """One row per request (`id`), a bar from `start` to `end` per `field` value in its colour; one panel per
    policy."""
    rows = max(int(frame["id"].n_unique()), 1)
    phases = list(colors)
    return (
        alt.Chart(frame)
        .mark_bar(height={"band": 0.8})
        .encode(
            x=alt.X("start:Q", title="simulated time (s)", scale=alt.Scale(zero=False, nice=False)),
            x2="end:Q",
            y=alt.Y("id:O", title="request id", axis=alt.Axis(labelFontSize=8, labelOverlap="greedy")),
            color=alt.Color(
                f"{field}:N", scale=alt.Scale(domain=phases, range=[colors[p] for p in phases]), sort=phases
            ),
            tooltip=tooltip,
        )
        .properties(width=3 * WIDTH, height=min(row_px * rows, 400))
        .facet(row=alt.Row("policy:N", title=None))
        .resolve_scale(x="independent")
    )


def convoy_timeline(segments: pl.DataFrame) -> alt.FacetChart:
    """Gantt view: one row per request, bars for queued, prefill, decode and padding; one panel per policy."""
    tooltip = ["policy:N", "id:O", "output_len:Q", "segment:N",
               alt.Tooltip("start:Q", format=".3f"), alt.Tooltip("end:Q", format=".3f")]  # fmt: skip
    return gantt(segments, "segment", {s: SEGMENT_COLORS[s] for s in SEGMENTS}, tooltip, 6)


def utilisation_over_time(ts: pl.DataFrame, series: list[str]) -> alt.FacetChart:
    """Batch size, waiting requests and KV use over simulated time (bin averages)."""
    order = ["batch size", "waiting requests", "KV used (share)", "KV allocated (share)"]
    return (
        alt.Chart(ts)
        .mark_line(interpolate="step-after", strokeWidth=1.2)
        .encode(
            x=alt.X("time:Q", title="simulated time (s)"),
            y=alt.Y("value:Q", title=None),
            color=alt.Color("policy:N", scale=policy_color(series)),
            tooltip=[
                "policy:N",
                "measure:N",
                alt.Tooltip("time:Q", format=".1f"),
                alt.Tooltip("value:Q", format=".3g"),
            ],  # fmt: skip
        )
        .properties(width=3 * WIDTH, height=110)
        .facet(row=alt.Row("measure:N", title=None, sort=order))
        .resolve_scale(y="independent")
    )


def kv_breakdown(shares: pl.DataFrame) -> alt.Chart:
    """Time-averaged KV memory split per policy: token states, reserved but unused, free."""
    return (
        alt.Chart(shares)
        .mark_bar()
        .encode(
            y=alt.Y("policy:N", title=None),
            x=alt.X(
                "share:Q",
                title="share of KV memory (time-averaged)",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),  # fmt: skip
            color=alt.Color(
                "part:N",
                scale=alt.Scale(domain=list(KV_PARTS), range=[KV_COLORS[p] for p in KV_PARTS]),
                sort=list(KV_PARTS),
                title="KV memory",
            ),
            order=alt.Order("order:Q"),
            tooltip=["policy:N", "part:N", alt.Tooltip("share:Q", format=".1%")],
        )
        .properties(width=2 * WIDTH, height=alt.Step(28))
    )
