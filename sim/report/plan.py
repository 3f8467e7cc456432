"""The `sim plan` page: the ranked configurations and the cost-latency Pareto front (offline HTML)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import altair as alt
import polars as pl

from sim.report.page import Section, chart_spec, render_page

if TYPE_CHECKING:
    from sim.studies.plan import PlanResult


def front_chart(rows: pl.DataFrame, front: pl.DataFrame) -> alt.LayerChart:
    """Every simulated configuration (cost vs p99 TTFT; filled: meets the SLO) and the front's step line."""
    data = rows.select(
        "config", "cost_per_hour", "gpus", "ttft_p99", "tpot_p99", "goodput_per_s", "meets_slo"
    )
    points = (
        alt.Chart(alt.Data(values=data.to_dicts()))
        .mark_point(size=70, filled=True)
        .encode(
            x=alt.X("cost_per_hour:Q", title="cost ($/hour)"),
            y=alt.Y("ttft_p99:Q", title="p99 TTFT (s)", scale=alt.Scale(type="log")),
            color=alt.Color("meets_slo:N", title="meets SLO"),
            tooltip=["config:N", "cost_per_hour:Q", "gpus:Q", "ttft_p99:Q", "tpot_p99:Q", "goodput_per_s:Q"],
        )
    )
    line = (
        alt.Chart(alt.Data(values=front.select("cost_per_hour", "ttft_p99").to_dicts()))
        .mark_line(interpolate="step-after", color="#333")
        .encode(x="cost_per_hour:Q", y="ttft_p99:Q")
    )
    return alt.layer(points, line).properties(width=640, height=320)


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def plan_page(result: PlanResult, rows: pl.DataFrame, front: pl.DataFrame, scenario: str) -> str:
    header = (
        "rank",
        "configuration",
        "$/hour",
        "GPUs",
        "p99 TTFT (s)",
        "p99 TPOT (s)",
        "goodput (req/s)",
        "meets SLO",
    )
    table: list[list[str]] = []
    if rows.height:
        for i, r in enumerate(result.ranked(), 1):
            table.append([
                str(i), r["config"], f"{r['cost_per_hour']:.2f}", str(r["gpus"]), _fmt(r["ttft_p99"]),
                _fmt(r["tpot_p99"]), _fmt(r["goodput_per_s"]), "yes" if r["meets_slo"] else "no",
            ])  # fmt: skip
    best = result.best
    headline = [
        f"Cheapest configuration meeting the SLO at {result.rate:g} req/s: {best['config']}, "
        f"${best['cost_per_hour']:.2f}/hour."
        if best
        else f"No configuration met the SLO at {result.rate:g} req/s."
    ]
    meta = (
        f"{scenario}; grid of {result.grid_size} configurations: {result.unfit} do not fit the model, "
        f"{result.theory_pruned} ruled out by theory, "
        f"{result.capacity_pruned} by single-replica capacity, "
        f"{result.dominance_pruned} by dominance, {result.simulated} simulated."
    )
    sections, specs = [], {}
    note = (
        "Each point is one simulated configuration; the line is the cost-latency Pareto front of those "
        "meeting the SLO."
    )
    if rows.height:
        chart = front_chart(rows, front)
        sections.append(Section("front", "Cost against p99 TTFT", note, chart))
        specs["front"] = chart_spec(chart)
    else:
        sections.append(Section("front", "Cost against p99 TTFT", note, None, "Nothing was simulated."))
    return render_page(
        "sim plan", "Cheapest fleet within the SLO", meta, headline, (header, table), sections, specs
    )
