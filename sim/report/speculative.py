"""Speculative-decoding sections of the report: tokens per verification step (measured against Leviathan's
formula) from the runs, and the latency ratio to the policy without speculation against the arrival rate
from the sweep (above 1 speculation pays; the crossing of 1 is where it stops paying)."""

from __future__ import annotations

import altair as alt
import polars as pl

from sim.report import charts, grid
from sim.report.charts import WIDTH
from sim.report.coverage import points_text
from sim.report.inputs import PolicyRun, ReportInputs
from sim.report.page import Section

RATIO_METRICS = ("e2e_p50", "tpot_p50")


def tokens_per_step(runs: list[PolicyRun]) -> pl.DataFrame:
    """Per speculating run: measured mean tokens per verification step and the formula's (fixed alpha)."""
    rows = []
    for run in runs:
        spec = run.summary.get("speculative")
        if not spec or spec.get("mean_tokens_per_step") is None:
            continue
        rows.append({"policy": run.policy, "kind": "measured", "tokens": float(spec["mean_tokens_per_step"])})
        if spec.get("expected_tokens_per_step") is not None:
            rows.append(
                {
                    "policy": run.policy,
                    "kind": "(1 - a^(k+1)) / (1 - a)",
                    "tokens": float(spec["expected_tokens_per_step"]),
                }  # fmt: skip
            )
    return pl.DataFrame(rows, schema={"policy": pl.String, "kind": pl.String, "tokens": pl.Float64})


def tokens_chart(frame: pl.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("tokens:Q", title="tokens emitted per sequence and verification step"),
            y=alt.Y("policy:N", title=None),
            yOffset="kind:N",
            color=alt.Color("kind:N", title=None),
            tooltip=["policy:N", "kind:N", alt.Tooltip("tokens:Q", format=".3f")],
        )
        .properties(width=WIDTH)
    )


def speculating(inputs: ReportInputs) -> tuple[list[str], list[str]]:
    """(policies with a speculative table, policies without), from the scenario or else the runs."""
    if inputs.scenario is not None:
        spec, plain = [], []
        for name in inputs.scenario.policies:
            _, config = inputs.scenario.policy(name)
            (spec if getattr(config, "speculative", None) is not None else plain).append(name)
        return spec, plain
    spec = [r.policy for r in inputs.runs if "speculative" in r.summary]
    return spec, [r.policy for r in inputs.runs if r.policy not in spec]


def latency_ratios(points: pl.DataFrame, spec: list[str], base: str) -> pl.DataFrame:
    """Per speculating policy and rate: the base policy's mean p50 latency over the speculating one's."""
    means = grid.summarize_points(points, list(RATIO_METRICS)).select("policy", "rate", "metric", "mean")
    ref = means.filter(pl.col("policy") == base).select("rate", "metric", base_mean="mean")
    out = (
        means.filter(pl.col("policy").is_in(spec))
        .join(ref, on=["rate", "metric"])
        .with_columns(ratio=pl.col("base_mean") / pl.col("mean"), series=pl.col("policy"))
        .with_columns(latency=pl.col("metric").str.replace("_p50", "").str.to_uppercase())
        .select("series", "rate", "latency", "ratio")
        .sort("series", "latency", "rate")
    )
    return out


def ratio_chart(frame: pl.DataFrame, series: list[str], base: str) -> alt.LayerChart:
    color = alt.Color("series:N", title="policy", scale=charts.policy_color(series))
    x = charts.rate_axis(frame)
    line = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=x,
            y=alt.Y("ratio:Q", title=f"p50 latency of {base} / policy's (log)", scale=alt.Scale(type="log")),
            color=color,
            strokeDash=alt.StrokeDash("latency:N", title="latency"),
            tooltip=["series:N", "latency:N", "rate:Q", alt.Tooltip("ratio:Q", format=".3f")],
        )
    )
    one = alt.Chart(pl.DataFrame({"y": [1.0]})).mark_rule(color="grey").encode(y="y:Q")
    return (line + one).properties(width=WIDTH * 2)


def speculative_sections(inputs: ReportInputs, series: list[str]) -> list[Section]:
    """The sections, for scenarios with a speculating policy (none otherwise)."""
    spec, plain = speculating(inputs)
    if not spec:
        return []
    tokens = tokens_per_step(inputs.runs)
    sections = [
        Section(
            "spec_tokens_per_step",
            "Speculative decoding: tokens per verification step",
            "Tokens each verifying sequence emits per step (its accepted drafts plus the target's "
            "own token), measured over the run, beside Leviathan et al.'s expectation "
            "(1 - a^(k+1)) / (1 - a) for k drafts accepted independently with probability a, stopping "
            "at the first rejection. Without speculation a step emits one token.",
            tokens_chart(tokens) if tokens.height else None,
            "This chart needs per-policy runs: run <code>sim run SCENARIO.toml</code>, then this command "
            "again.",
        )
    ]
    ratios = None
    if inputs.points is not None and plain:
        ratios = latency_ratios(inputs.points, spec, plain[0])
    sections.append(
        Section(
            "spec_speedup_vs_rate",
            "Speculative decoding: speed-up against arrival rate",
            f"Median latency of <code>{plain[0] if plain else '?'}</code> (no speculation) over each "
            "speculating policy's, per rate (means over replications). Above 1 speculation pays; where a "
            "line crosses 1 the batch has grown enough for the step to be compute-bound, and the rejected "
            "drafts and the draft's passes cost more than the extra tokens per step buy. "
            + points_text(inputs.points),
            ratio_chart(ratios, series, plain[0]) if ratios is not None and ratios.height else None,
            "This chart needs sweep results with a policy without speculation: run "
            "<code>sim sweep SCENARIO.toml</code>, then this command again.",
        )
    )
    return sections
