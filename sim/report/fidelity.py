"""`sim validate ground-truth`'s outputs: the errors per row, and simulated against measured."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import polars as pl

from sim.config.calibration import Calibration
from sim.io.errors import SimError
from sim.io.outputs import atomic_write
from sim.io.progress import progress
from sim.studies.validate import (
    BAR_SCALE,
    CLIENT_TIMEOUT_S,
    FRONTEND_KEY,
    MEDIAN_BAR_PCT,
    METRICS,
    GroundTruthRow,
    Prediction,
    compare,
    default_csv,
    load_frontend,
    load_rows,
    median_errors,
    predict_all,
    select,
)


def print_report(
    rows: Sequence[GroundTruthRow], preds: Sequence[Prediction], frame: pl.DataFrame, console: Any = None
) -> None:
    """Per-row predicted vs measured table, then median errors (steady state and overloaded apart)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title="predicted vs measured: signed error % (full figures in --out fidelity.csv)")
    table.add_column("experiment", overflow="fold", max_width=34)
    table.add_column("E2E mean ms\npred / meas", justify="right")
    for m in METRICS:
        table.add_column(m.replace("_", " "), justify="right")
    table.add_column("overloaded")
    table.add_column("predicted over", justify="right")
    cell = {(k, m): (p, ms, s) for k, m, p, ms, _, s, *_ in frame.rows()}
    by_key = {p.exp_key: p for p in preds}
    for row in rows:
        p, ms, _ = cell[(row.exp_key, "e2e_mean")]
        flags = ["measured"] if row.measured_overloaded else []
        if by_key[row.exp_key].overloaded:
            flags.append("sim")
        signed = [f"{cell[(row.exp_key, m)][2]:+.1f}" for m in METRICS]
        over = predicted_over(by_key[row.exp_key])
        table.add_row(row.exp_key, f"{p:,.0f} / {ms:,.0f}", *signed, " + ".join(flags), over)
    console.print(table)
    console.print(
        "predicted over: the simulated requests the predicted latencies cover, those that finished within "
        f"the load tool's {CLIENT_TIMEOUT_S:g} s timeout",
        highlight=False,
    )
    med = median_errors(frame)
    summary = Table(title="median over rows: absolute % error (signed %)")
    summary.add_column("rows")
    for m in METRICS:
        summary.add_column(m.replace("_", " "), justify="right")
    for overloaded in (False, True):
        part = med.filter(pl.col("overloaded") == overloaded)
        if part.is_empty():
            continue
        got = {m: (a, s, n) for _, m, a, s, n in part.rows()}
        label = f"{'measured overloaded' if overloaded else 'steady state'} ({part['rows'][0]})"
        summary.add_row(label, *[f"{got[m][0]:.1f} ({got[m][1]:+.1f})" for m in METRICS])
    console.print(summary)
    notes = sorted({f"{p.exp_key}: {n}" for p in preds for n in p.notes})
    if notes:
        console.print("fallbacks (knobs the row does not record) and features not modelled:")
        for n in notes:
            console.print(f"  {n}")


def predicted_over(pred: Prediction) -> str:
    """`1,180 of 1,200 (20 unfinished or timed out)`: the simulated requests a row's predictions cover."""
    if not pred.arrived:
        return "–"
    rest = pred.arrived - pred.finished
    tail = f" ({rest:,} unfinished or timed out)" if rest else " (all)"
    return f"{pred.finished:,} of {pred.arrived:,}{tail}"


FACET_PX = 190  # each metric's square: four columns and the axes stay within a 1,100-px window


def fidelity_chart(frame: pl.DataFrame, verdict: str) -> Any:
    """Predicted vs measured per metric, log axes, with the y = x line; the steady-state medians and
    `verdict` (the bar's, one sentence) under the title."""
    import altair as alt

    shown = frame.filter(pl.col("predicted_ms") > 0)
    both = pl.concat([shown["predicted_ms"], shown["measured_ms"]])
    lo, hi = float(both.min()) * 0.8, float(both.max()) * 1.25  # type: ignore[arg-type]
    data = alt.Data(values=shown.to_dicts())
    scale = alt.Scale(type="log", domain=[lo, hi])
    decades = [10.0**k for k in range(math.ceil(math.log10(lo)), math.floor(math.log10(hi)) + 1)]
    axis = {"values": decades, "format": ",~g"} if len(decades) > 1 else {}  # narrow facets: a label a decade
    points = (
        alt.Chart()
        .mark_point(filled=True)
        .encode(
            x=alt.X("measured_ms:Q", scale=scale, title="measured (ms)", axis=alt.Axis(**axis)),
            y=alt.Y("predicted_ms:Q", scale=scale, title="predicted (ms)", axis=alt.Axis(**axis)),
            color=alt.Color(
                "overloaded:N",
                title="measured overloaded",
                legend=alt.Legend(orient="top", direction="horizontal"),
            ),
            tooltip=["exp_key:N", "metric:N", "predicted_ms:Q", "measured_ms:Q", "signed_pct:Q"],
        )
    )
    line = (  # y = x over each metric's measured range
        alt.Chart()
        .mark_line(color="gray", strokeDash=[4, 4])
        .encode(x=alt.X("measured_ms:Q", scale=scale), y=alt.Y("measured_ms:Q", scale=scale))
    )
    title = alt.TitleParams(
        "servesim vs measured vLLM", subtitle=[medians_text(frame), verdict], anchor="start"
    )
    return (
        alt.layer(points, line)
        .properties(width=FACET_PX, height=FACET_PX)
        .facet(facet=alt.Facet("metric:N", sort=list(METRICS), title=None), columns=4, data=data)
        .properties(title=title)
    )


def write_outputs(frame: pl.DataFrame, out_dir: Path, verdict: str) -> list[Path]:
    """`fidelity.csv` and `fidelity.html` (renders offline; it states `verdict`)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, html_path = out_dir / "fidelity.csv", out_dir / "fidelity.html"
    atomic_write(csv_path, lambda p: frame.write_csv(p))
    chart = fidelity_chart(frame, verdict)
    atomic_write(html_path, lambda p: chart.save(p, format="html", inline=True))
    return [csv_path, html_path]


def run_ground_truth(
    csv_path: Path | None,
    out: Path | None,
    jobs: int,
    calibration: Path | None,
    scale: float = 1.0,
    keys: Sequence[str] = (),
) -> pl.DataFrame:
    """`sim validate ground-truth`: simulate every row, print the comparison, write `--out` files."""
    from rich.console import Console

    if not 0 < scale <= 1:
        raise SimError(f"--scale must be in (0, 1], got {scale}")
    rows = select(load_rows(csv_path), keys)
    cal = None
    if calibration is not None:
        cal = asdict(Calibration.load(calibration)) | {FRONTEND_KEY: load_frontend(calibration)}
    console = Console(width=max(Console().width, 150))
    console.print(f"simulating {len(rows)} rows ({jobs} jobs, stages x{scale:g})…")
    with progress("simulating", len(rows), "rows") as done:
        preds = predict_all(rows, scale, cal, jobs, done)
    frame = compare(rows, preds)
    print_report(rows, preds, frame, console)
    judged = csv_path is None and not keys and scale == BAR_SCALE
    missed = bar_misses(frame) if judged else ""
    verdict = bar_verdict(missed, judged, csv_path is None and not keys, scale)
    if out is not None:
        for path in write_outputs(frame, out, verdict):
            console.print(f"wrote {path}")
    if missed:
        raise SimError(f"{default_csv().name}: steady-state median above the README's bar: {missed}")
    if csv_path is None and not keys:
        console.print(verdict)
    return frame


def bar_verdict(missed: str, judged: bool, whole_set: bool, scale: float) -> str:
    """The bar's verdict on a run, one sentence (`missed`: `bar_misses`, '' when none)."""
    if not whole_set:
        return (
            f"Bar not judged: it applies to the whole shipped set at --scale {BAR_SCALE:g} "
            "(these are other rows)."
        )
    if not judged:
        return (
            f"Bar not judged: the bar ({bar_text()}) applies at --scale {BAR_SCALE:g}, the scale it was "
            f"measured at (`make validate`); not judged at --scale {scale:g}."
        )
    if missed:
        return f"Missed the bar: steady-state median {missed}."
    return f"Within the bar: steady-state medians {bar_text()}."


def medians_text(frame: pl.DataFrame) -> str:
    """The steady-state median absolute errors of the bar's metrics, one line."""
    med = median_errors(frame).filter(~pl.col("overloaded"))
    got = dict(zip(med["metric"], med["median_ape_pct"], strict=True))
    shown = ", ".join(f"{m} {got[m]:.1f}%" for m in MEDIAN_BAR_PCT if m in got)
    return f"steady-state median absolute error: {shown or 'no steady-state rows'}"


def bar_text() -> str:
    return ", ".join(f"{m} <= {v:g}%" for m, v in MEDIAN_BAR_PCT.items())


def bar_misses(frame: pl.DataFrame) -> str:
    """The metrics whose steady-state median APE exceeds MEDIAN_BAR_PCT ('' when none), as one phrase."""
    med = median_errors(frame).filter(~pl.col("overloaded"))
    got = dict(zip(med["metric"], med["median_ape_pct"], strict=True))
    over = [m for m, bar in MEDIAN_BAR_PCT.items() if not got.get(m, math.inf) <= bar]
    return ", ".join(f"{m} {got.get(m, math.inf):.1f}% > {MEDIAN_BAR_PCT[m]:g}%" for m in over)
