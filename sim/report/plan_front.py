"""The `sim plan` page's throughput front and its aggregated-versus-disaggregated comparison.

Throughput front (aiconfigurator's axes): output tokens per second per GPU against tokens per second per
user (1 / median TPOT), one point per simulated configuration (its first replication's run); the
configurations no other beats on both are ringed. Comparison: the cheapest configuration meeting the SLO
of each kind (colocated, prefill/decode), and at each GPU count where both kinds met it, the best of each:
its output tokens/s per GPU and its margin (the verdict's judged metric: attainment, or the largest p99
over its bound). At one rate, two configurations that both meet the SLO serve about the same tokens, so the
margin is what tells them apart; the highest rate each sustains is not searched.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import polars as pl

from sim.report.page import Section


def throughput_points(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Per simulated configuration: tokens/s per GPU and tokens/s per user, and whether it is on the
    front (no other configuration is at least as good on both and better on one)."""
    pts = [
        {
            "config": r["config"],
            "mode": r["mode"],
            "gpus": r["gpus"],
            "verdict": r.get("verdict", ""),
            "tokens_per_s_per_gpu": r["output_tokens_per_s"] / r["gpus"],
            "tokens_per_s_per_user": 1.0 / r["tpot_p50"],
        }  # fmt: skip
        for r in rows
        if r.get("output_tokens_per_s") is not None and r.get("tpot_p50")
    ]
    for p in pts:
        x, y = p["tokens_per_s_per_gpu"], p["tokens_per_s_per_user"]
        p["on_front"] = not any(
            q["tokens_per_s_per_gpu"] >= x
            and q["tokens_per_s_per_user"] >= y
            and (q["tokens_per_s_per_gpu"] > x or q["tokens_per_s_per_user"] > y)
            for q in pts
        )
    schema = {"config": pl.String, "mode": pl.String, "gpus": pl.Int64, "verdict": pl.String,
              "tokens_per_s_per_gpu": pl.Float64, "tokens_per_s_per_user": pl.Float64,
              "on_front": pl.Boolean}  # fmt: skip
    return pl.DataFrame(pts, schema=schema)


def throughput_chart(points: pl.DataFrame) -> alt.LayerChart:
    data = alt.Data(values=points.to_dicts())
    base = alt.Chart(data).encode(
        x=alt.X("tokens_per_s_per_user:Q", title="tokens/s per user (1 / median TPOT)"),
        y=alt.Y("tokens_per_s_per_gpu:Q", title="output tokens/s per GPU"),
    )
    dots = base.mark_point(size=70, filled=True).encode(
        color=alt.Color("verdict:N", title="verdict"),
        shape=alt.Shape("mode:N", title="mode"),
        tooltip=["config:N", "gpus:Q", "tokens_per_s_per_gpu:Q", "tokens_per_s_per_user:Q", "verdict:N"],
    )
    front = alt.Data(values=points.filter(pl.col("on_front")).sort("tokens_per_s_per_user").to_dicts())
    ring = (
        alt.Chart(front)
        .mark_point(size=260, filled=False, color="#333", strokeWidth=1.5)
        .encode(x="tokens_per_s_per_user:Q", y="tokens_per_s_per_gpu:Q", tooltip=["config:N"])
    )
    line = (
        alt.Chart(front)
        .mark_line(color="#333")
        .encode(x="tokens_per_s_per_user:Q", y="tokens_per_s_per_gpu:Q")
    )
    return alt.layer(dots, line, ring).properties(width=640, height=320)


def throughput_section(rows: list[dict[str, Any]]) -> tuple[Section, dict[str, Any] | None]:
    """The front's section, and its chart (None when no run has the figures)."""
    points = throughput_points(rows)
    n = int(points["on_front"].sum()) if points.height else 0
    note = (
        "Output tokens per second per GPU against tokens per second per user (1 / median TPOT), one point "
        f"per simulated configuration (its first seed's run), coloured by verdict; ringed: the {n} "
        "configuration" + ("" if n == 1 else "s") + " that no other beats on both axes. Only the "
        "configurations the search ran are here (--explore runs more past the answer)."
    )
    if not points.height:
        return Section("throughput", "Tokens/s per GPU against tokens/s per user", note, None,
                       "Nothing was simulated."), None  # fmt: skip
    chart = throughput_chart(points)
    return Section("throughput", "Tokens/s per GPU against tokens/s per user", note, chart), chart.to_dict(
        validate=False
    )


def _per_gpu(r: dict[str, Any]) -> float:
    """Output tokens/s per GPU (0 for a row without the figure)."""
    tokens = r.get("output_tokens_per_s")
    return float(tokens) / float(r["gpus"]) if tokens is not None and r["gpus"] else 0.0


def comparison(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The cheapest configuration meeting the SLO of each kind, and at each GPU count where both kinds met
    it, the best output tokens/s per GPU of each and the disaggregated one's gain."""
    ok = [r for r in rows if r["meets_slo"]]
    best: dict[str, Any] = {}
    for mode in ("colocated", "pd"):
        mine = sorted((r for r in ok if r["mode"] == mode), key=lambda r: (r["cost_per_hour"], r["config"]))
        best[mode] = None if not mine else {
            "config": mine[0]["config"], "gpus": mine[0]["gpus"], "cost_per_hour": mine[0]["cost_per_hour"],
            "output_tokens_per_s_per_gpu": _per_gpu(mine[0]),
        }  # fmt: skip
    equal = []
    for n in sorted({r["gpus"] for r in ok}):
        tops = {}
        for mode in ("colocated", "pd"):
            mine = [r for r in ok if r["gpus"] == n and r["mode"] == mode]
            if mine:
                tops[mode] = max(mine, key=lambda r: (_per_gpu(r), r["config"]))
        if len(tops) == 2:
            agg, dis = _per_gpu(tops["colocated"]), _per_gpu(tops["pd"])
            equal.append({
                "gpus": n, "colocated": tops["colocated"]["config"], "pd": tops["pd"]["config"],
                "colocated_tokens_per_s_per_gpu": agg, "pd_tokens_per_s_per_gpu": dis,
                "pd_gain": dis / agg if agg > 0 else None,
                "colocated_margin": tops["colocated"].get("metric_mean"),
                "pd_margin": tops["pd"].get("metric_mean"), "metric": tops["pd"].get("metric"),
            })  # fmt: skip
    return {"cheapest": best, "equal_gpus": equal}


def comparison_sentences(cmp: dict[str, Any]) -> list[str]:
    out = []
    for mode, name in (("colocated", "aggregated (colocated)"), ("pd", "disaggregated (prefill/decode)")):
        b = cmp["cheapest"][mode]
        out.append(
            f"Cheapest {name} meeting the SLO: none simulated met it."
            if b is None
            else f"Cheapest {name} meeting the SLO: {b['config']}, {b['gpus']} GPUs, "
            f"${b['cost_per_hour']:.2f}/hour, {b['output_tokens_per_s_per_gpu']:.0f} output tokens/s per GPU."
        )
    for e in cmp["equal_gpus"]:
        out.append(
            f"At {e['gpus']} GPUs: {e['colocated']} {e['colocated_tokens_per_s_per_gpu']:.0f} tokens/s per "
            f"GPU, {e['pd']} {e['pd_tokens_per_s_per_gpu']:.0f} ({e['pd_gain']:.2f}x)"
            + (
                f"; {e['metric']}: {e['colocated_margin']:.3g} against {e['pd_margin']:.3g}."
                if e.get("colocated_margin") is not None and e.get("pd_margin") is not None
                else "."
            )
        )
    if not cmp["equal_gpus"]:
        out.append(
            "No GPU count had both kinds meeting the SLO among the configurations run (--explore runs more)."
        )
    return out
