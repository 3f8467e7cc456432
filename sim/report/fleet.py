"""Fleet sections of the report (runs made with [cluster]): load balance over time per replica, prefix-cache
hit rate per replica and router, and the prefill/decode transfer timeline."""

from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl

from sim.report import charts, grid
from sim.report.charts import WIDTH
from sim.report.frames import middle_window, replica_averages, run_end
from sim.report.inputs import PolicyRun
from sim.report.page import Section

PD_PHASES = ("queued", "prefill", "transfer", "decode wait", "decode")
PD_COLORS = {"queued": "#bab0ac", "prefill": "#f58518", "transfer": "#e45756", "decode wait": "#eeca3b",
             "decode": "#4c78a8"}  # fmt: skip
BALANCE_MEASURES = ("waiting requests", "KV allocated (share)")


def is_fleet(run: PolicyRun) -> bool:
    return "replica" in run.requests.columns and "cluster" in run.summary


def router_of(run: PolicyRun) -> str:
    return str(run.summary.get("cluster", {}).get("router", "?"))


def load_balance(runs: list[PolicyRun], bins: int = 120) -> pl.DataFrame:
    """Per replica, waiting requests and KV share held over time (bin averages): policy, replica, time,
    measure, value."""
    frames = []
    for run in runs:
        end = run_end(run)
        if run.steps.is_empty() or end <= 0:
            continue
        edges = np.linspace(0.0, end, bins + 1)
        mid = (edges[:-1] + edges[1:]) / 2
        for replica, cols in replica_averages(run.steps, edges).items():
            for measure in BALANCE_MEASURES:
                frames.append(
                    pl.DataFrame(
                        {"policy": run.policy, "replica": replica, "time": mid, "value": cols[measure]}
                    ).with_columns(measure=pl.lit(measure))
                )
    if not frames:
        return pl.DataFrame(schema={"policy": pl.String, "replica": pl.String, "time": pl.Float64,
                                    "value": pl.Float64, "measure": pl.String})  # fmt: skip
    return pl.concat(frames)


def hit_rates(runs: list[PolicyRun]) -> pl.DataFrame:
    """Prefix-cache hit rate of each replica and of the whole fleet, per run (labelled with its router)."""
    rows = []
    for run in runs:
        label = f"{run.policy} ({router_of(run)})"
        rows.append(
            {"run": label, "replica": "fleet", "hit_rate": float(run.summary["prefix_cache_hit_rate"])}
        )
        for name, rep in sorted(run.summary.get("replicas", {}).items()):
            if rep.get("requests", {}).get("arrived", 0):
                rows.append({"run": label, "replica": name, "hit_rate": float(rep["prefix_cache_hit_rate"])})
    return pl.DataFrame(rows, schema={"run": pl.String, "replica": pl.String, "hit_rate": pl.Float64})


def pd_timeline(runs: list[PolicyRun], size: int = 40) -> pl.DataFrame:
    """Phases (queued, prefill, transfer, decode wait, decode) of a middle window of requests, P/D runs."""
    pd_runs = [r for r in runs if "transfer_s" in r.requests.columns]
    ids = middle_window(pd_runs, size)
    frames = []
    for run in pd_runs:
        req = run.requests.filter(pl.col("id").is_in(ids) & pl.col("finished_at").is_not_null())
        t_sched = pl.col("arrival") + pl.col("queue_wait")
        t_pre = t_sched + pl.col("prefill_s")
        t_xfer = t_pre + pl.col("transfer_s").fill_null(0.0)
        t_dec = t_xfer + pl.col("decode_wait_s").fill_null(0.0)
        bounds = {
            "queued": (pl.col("arrival"), t_sched),
            "prefill": (t_sched, t_pre),
            "transfer": (t_pre, t_xfer),
            "decode wait": (t_xfer, t_dec),
            "decode": (t_dec, pl.col("finished_at")),
        }
        for phase, (lo, hi) in bounds.items():
            frames.append(
                req.select(
                    pl.lit(run.policy).alias("policy"),
                    "id",
                    pl.lit(phase).alias("phase"),
                    lo.alias("start"),
                    hi.alias("end"),
                    "replica",
                    "prefill_replica",
                )  # fmt: skip
            )
    if not frames:
        schema = {"policy": pl.String, "id": pl.Int64, "phase": pl.String, "start": pl.Float64,
                  "end": pl.Float64, "replica": pl.String, "prefill_replica": pl.String}  # fmt: skip
        return pl.DataFrame(schema=schema)
    out = pl.concat(frames).drop_nulls(["start", "end"])
    return out.filter(pl.col("end") - pl.col("start") > 1e-7).sort("policy", "id", "start")


def load_balance_chart(frame: pl.DataFrame) -> alt.FacetChart:
    return (
        alt.Chart(frame)
        .mark_line(interpolate="step-after", strokeWidth=1.0)
        .encode(
            x=alt.X("time:Q", title="simulated time (s)"),
            y=alt.Y("value:Q", title=None),
            color=alt.Color("replica:N"),
            tooltip=[
                "policy:N",
                "replica:N",
                "measure:N",
                alt.Tooltip("time:Q", format=".1f"),
                alt.Tooltip("value:Q", format=".3g"),
            ],  # fmt: skip
        )
        .properties(width=3 * WIDTH, height=110)
        .facet(
            row=alt.Row("measure:N", title=None, sort=list(BALANCE_MEASURES)), column=alt.Column("policy:N")
        )
        .resolve_scale(y="independent")
    )


def hit_rate_chart(frame: pl.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X(
                "hit_rate:Q",
                title="prefix-cache hit rate",
                axis=alt.Axis(format="%"),
                scale=alt.Scale(domain=[0, 1]),
            ),  # fmt: skip
            y=alt.Y("replica:N", title=None),
            color=alt.condition(alt.datum.replica == "fleet", alt.value("#333"), alt.value("#4c78a8")),
            row=alt.Row("run:N", title=None),
            tooltip=["run:N", "replica:N", alt.Tooltip("hit_rate:Q", format=".1%")],
        )
        .properties(width=2 * WIDTH, height=alt.Step(16))
    )


def pd_chart(frame: pl.DataFrame) -> alt.FacetChart:
    tooltip = ["id:O", "phase:N", "prefill_replica:N", "replica:N",
               alt.Tooltip("start:Q", format=".4f"), alt.Tooltip("end:Q", format=".4f")]  # fmt: skip
    return charts.gantt(frame, "phase", {p: PD_COLORS[p] for p in PD_PHASES}, tooltip, 8)


def sweep_hit_rates(points: pl.DataFrame, series: list[str]) -> alt.LayerChart | None:
    """Prefix-cache hit rate against rate per series (e.g. one per router swept through `params`)."""
    if "prefix_cache_hit_rate" not in points.columns:
        return None
    means = grid.summarize_points(points, ["prefix_cache_hit_rate"])
    if means.is_empty():
        return None
    return charts._vs_rate(means, series, "prefix-cache hit rate")


def fleet_sections(
    runs: list[PolicyRun], points: pl.DataFrame | None = None, series: list[str] | None = None
) -> list[Section]:
    """The fleet sections, for runs made with [cluster] and sweeps of a scenario with one (none otherwise)."""
    fleet = [r for r in runs if is_fleet(r)]
    out: list[Section] = []
    if points is not None:
        chart = sweep_hit_rates(points, series or [])
        if chart is not None:
            out.append(
                Section(
                    "fleet_sweep_hits",
                    "Prefix-cache hit rate against arrival rate",
                    "Mean over replications, per series of the sweep (a router swept through "
                    "<code>params</code> is a series of its own).",
                    chart,
                )
            )
    if not fleet:
        return out
    balance = load_balance(fleet)
    hits = hit_rates(fleet)
    sections = [
        Section(
            "fleet_balance",
            "Load balance across replicas",
            "Waiting requests and the share of KV cache held, per replica over time (bin averages). Lines "
            "that drift apart mean the router sends work where it queues; a well-balanced fleet keeps them "
            "together.",
            load_balance_chart(balance) if balance.height else None,
            "No steps were recorded.",
        ),
        Section(
            "fleet_prefix_hits",
            "Prefix-cache hit rate per replica and router",
            "Prompt tokens found in the prefix cache over those looked up, per replica and for the whole "
            "fleet. A router that keeps a prefix on one replica (prefix_affinity) finds it cached there; one "
            "that spreads requests by load recomputes it on every replica.",
            hit_rate_chart(hits) if hits.height else None,
            "No requests were recorded.",
        ),
    ]
    timeline = pd_timeline(fleet)
    if timeline.height:
        sections.append(
            Section(
                "pd_timeline",
                "Prefill/decode: where each request's time goes",
                "A window of requests from the middle of the run: queued for a prefill replica, prefill, KV "
                "transfer over the link, waiting for decode blocks, and decode. The first token reaches the "
                "user at the end of the transfer.",
                pd_chart(timeline),
            )
        )
    return out + sections
