"""The `sim papers` page (`<out>/index.html`, offline): per comparison, every judged cell's published value
beside the simulator's, and the simulated curves (mean batch size or speed-up against the arrival rate) with
the published points on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import altair as alt
import polars as pl

from sim.io.outputs import atomic_write, write_text
from sim.report.charts import rate_axis
from sim.report.page import Section, chart_png, chart_spec, render_page
from sim.studies.papers import Comparison, as_rows, point_mean, rate_column

PNG_DIR = "charts"

CURVES = {
    "batch_size": "mean batch size (requests)",
    "speedup": "speed-up (baseline latency / policy's)",
    "attainment": "SLO attainment (share of finished requests)",
}


def cell_rows(comparison: Comparison) -> list[dict[str, Any]]:
    """One row per cell with a value: the paper's low and high, the band its tolerance allows, the sim's."""
    rows = []
    for v in comparison.verdicts:
        cell = v.cell
        if cell.low is None:
            continue  # an ordering: the table says it
        high = cell.high if cell.high is not None else cell.low
        rows.append({
            "cell": cell.name, "paper_low": cell.low, "paper_high": high,
            "band_low": cell.low * (1 - v.tolerance), "band_high": high * (1 + v.tolerance),
            "sim": v.value, "status": v.status,
        })  # fmt: skip
    return rows


def cells_chart(rows: list[dict[str, Any]]) -> alt.LayerChart:
    """A row per cell, log x: the tolerance band (bar), the paper's figure (ticks), the simulator's (dot)."""
    data = alt.Data(values=rows)
    y = alt.Y("cell:N", title=None, sort=None, axis=alt.Axis(labelLimit=320))
    base = alt.Chart(data)
    band = base.mark_bar(color="#d8e6f3", height=14).encode(
        x=alt.X("band_low:Q", scale=alt.Scale(type="log"), title="value (log)"), x2="band_high:Q", y=y
    )
    low = base.mark_tick(color="#1f4e79", thickness=2, size=18).encode(x="paper_low:Q", y=y)
    high = base.mark_tick(color="#1f4e79", thickness=2, size=18).encode(x="paper_high:Q", y=y)
    sim = base.mark_point(filled=True, size=90, shape="diamond").encode(
        x="sim:Q", y=y, color=alt.Color("status:N", title="verdict"),
        tooltip=["cell:N", "paper_low:Q", "paper_high:Q", "sim:Q", "status:N"],
    )  # fmt: skip
    return alt.layer(band, low, high, sim).properties(width=760, height=alt.Step(34))


def curve_frames(comparison: Comparison, figure: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The simulated curve (series, rate, value) of every `figure` cell's policies at every swept rate,
    and the published points (series, rate, value) on it."""
    cells = [v.cell for v in comparison.verdicts if v.cell.figure == figure]
    sweep = comparison.sweep
    assert sweep is not None  # a figure read at one rate is read from the sweep
    points = sweep.points
    curve: list[dict[str, Any]] = []
    published: list[dict[str, Any]] = []
    for cell in cells:
        assert cell.rate is not None and cell.low is not None
        column = rate_column(cell)
        single = len(cell.policies) == 1
        series = cell.policies[0] if single else f"{cell.policies[1]} over {cell.policies[0]}"
        swept = [set(points.filter(pl.col("policy") == p)["rate"].to_list()) for p in cell.policies]
        for rate in sorted(set.intersection(*swept)):  # the capacity search's rates are some policies' only
            values = [point_mean(sweep, p, rate, column) for p in cell.policies]
            if None in values or (figure == "speedup" and not values[1]):
                continue
            value = values[0] if single else values[0] / values[1]  # type: ignore[operator]
            curve.append({"series": series, "rate": rate, "value": value})
        for bound in sorted({cell.low, cell.high or cell.low}):  # a range: both of its ends
            published.append({"series": series, "rate": cell.rate, "value": bound, "cell": cell.name})
    return pl.DataFrame(curve), pl.DataFrame(published)


def curve_chart(curve: pl.DataFrame, published: pl.DataFrame, title: str) -> alt.LayerChart:
    """Simulated lines per series against the rate; the paper's points as large open circles."""
    color = alt.Color("series:N", title=None)
    lines = (
        alt.Chart(curve)
        .mark_line(point=True)
        .encode(
            x=rate_axis(curve),
            y=alt.Y("value:Q", title=title),
            color=color,
            tooltip=["series", "rate", "value"],
        )
    )
    points = (
        alt.Chart(published)
        .mark_point(size=220, strokeWidth=3, shape="circle")
        .encode(x="rate:Q", y="value:Q", color=color, tooltip=["cell", "rate", "value"])
    )
    return alt.layer(lines, points).properties(width=640, height=300)


def comparison_sections(index: int, comparison: Comparison) -> tuple[list[Section], dict[str, Any]]:
    name = comparison.path.name.removesuffix(".paper.toml")
    sections: list[Section] = []
    specs: dict[str, Any] = {}
    rows = cell_rows(comparison)
    if rows:
        key = f"c{index}-cells"
        chart = cells_chart(rows)
        note = (
            f"{comparison.paper.paper} ({name}). Per cell: the paper's figure (dark ticks: its value, or "
            "the ends of its range), the band its tolerance allows (blue) and the simulator's figure (dot)."
        )
        sections.append(Section(key, f"{name}: every cell", note, chart))
        specs[key] = chart_spec(chart)
    for figure, title in CURVES.items():
        if not any(v.cell.figure == figure for v in comparison.verdicts):
            continue
        curve, published = curve_frames(comparison, figure)
        key = f"c{index}-{figure}"
        note = (
            f"The simulated {title} against the arrival rate (lines, one point per swept rate) and the "
            "paper's figure at the rate it is stated (open circles)."
        )
        if curve.height == 0:
            sections.append(Section(key, f"{name}: {title}", note, None, "No swept rate has finished runs."))
            continue
        chart = curve_chart(curve, published, title)
        sections.append(Section(key, f"{name}: {title}", note, chart))
        specs[key] = chart_spec(chart)
    return sections, specs


def papers_page(comparisons: list[Comparison], quick: bool) -> tuple[str, dict[str, Any]]:
    """The page's HTML and the Vega-Lite spec of each of its charts."""
    sections: list[Section] = []
    specs: dict[str, Any] = {}
    for index, comparison in enumerate(comparisons):
        more, more_specs = comparison_sections(index, comparison)
        sections += more
        specs.update(more_specs)
    rows = as_rows(comparisons)
    header = ("comparison", "cell", "paper", "sim", "ratio", "tolerance", "verdict")
    table = [
        [r["comparison"].removesuffix(".paper.toml"), r["cell"], r["paper"], r["sim"],
         "" if r["ratio"] is None else f"{r['ratio']:.2f}", f"±{r['tolerance']:.0%}", r["status"]]
        for r in rows
    ]  # fmt: skip
    misses = [v for c in comparisons for v in c.verdicts if not v.passed]
    headline = [f"{len(rows) - len(misses)} of {len(rows)} cells match the published figures."]
    meta = "reduced form (--quick): shorter runs, tolerances doubled" if quick else "full form"
    notes = [f"Known gap, {v.cell.name}: {v.cell.known_gap}" for v in misses if v.cell.known_gap]
    html = render_page(
        "sim papers", "The published comparisons of scenarios/papers/ against the simulator (docs/papers.md)",
        meta, headline, (header, table), sections, specs, PNG_DIR, notes,
    )  # fmt: skip
    return html, specs


def write_papers_page(
    comparisons: list[Comparison], out: Path, quick: bool = False, png: bool = True
) -> Path:
    """`out/index.html` and, with `png`, `out/charts/<chart>.png`; returns the page's path."""
    html, specs = papers_page(comparisons, quick)
    index = out / "index.html"
    write_text(index, html)
    for key, spec in specs.items() if png else ():
        image = chart_png(spec)
        atomic_write(out / PNG_DIR / f"{key}.png", lambda p, image=image: Path(p).write_bytes(image))
    return index
