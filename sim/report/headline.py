"""The report's headline: one sentence comparing the policies, and a table of key numbers per policy."""

from __future__ import annotations

from typing import Any

from sim.config.scenario import Scenario
from sim.config.sections import SloSection
from sim.records.summary import Slo
from sim.report.coverage import runs_text
from sim.report.grid import CapacityMark
from sim.report.inputs import PolicyRun

SloBounds = SloSection | Slo


def fmt_seconds(value: object) -> str:
    if not isinstance(value, int | float):
        return "–"
    if value < 1.0:
        return f"{value * 1e3:.3g} ms"
    return f"{value:,.3g} s" if value < 1000 else f"{value:,.0f} s"


def fmt_number(value: object, digits: int = 3) -> str:
    if not isinstance(value, int | float):
        return "–"
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def slo_text(scenario: Scenario | None) -> str:
    """The SLO a page states: its scenario's."""
    return "the scenario's SLO" if scenario is None else bounds_text(scenario.slo)


def bounds_text(slo: SloBounds) -> str:
    """`TTFT ≤ 1 s, TPOT ≤ 100 ms` for an SLO's bounds (an `[slo]` table or a `Slo`)."""
    parts = [
        f"{name} ≤ {fmt_seconds(value)}"
        for name, value in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s), ("E2E", slo.e2e_s))
        if value is not None
    ]
    return ", ".join(parts) if parts else "no SLO set"


def _latency(summary: dict[str, Any], metric: str, q: str) -> object:
    return summary.get("latency", {}).get(metric, {}).get(q)


def capacity_sentence(capacities: list[CapacityMark], scenario: Scenario | None) -> str | None:
    """'X holds 3.1× the arrival rate of Y ...' from the best and worst capacities, if both are known."""
    known = [c for c in capacities if c.rate is not None and c.rate > 0]
    if len(known) < 2:
        return None
    best = max(known, key=lambda c: c.rate or 0.0)
    worst = min(known, key=lambda c: c.rate or 0.0)
    if best.series == worst.series or best.rate == worst.rate:
        return f"All policies hold the same arrival rate within the SLO ({best.label})."
    ratio = (best.rate or 0.0) / (worst.rate or 1.0)
    qualifier = "at least " if best.bound == "at_least" or worst.bound == "below" else ""
    if best.bound == "at_least" and worst.bound == "below":
        qualifier = "more than "
    return (
        f"{best.series} holds {qualifier}{ratio:.1f}× the arrival rate of {worst.series} "
        f"at p99 {slo_text(scenario)} ({best.label} vs {worst.label})."
    )


def run_sentence(runs: list[PolicyRun], rate: float | None) -> str | None:
    """Compare p99 TTFT and goodput of the per-policy runs when no capacity figures exist."""
    ttfts = [(r.policy, _latency(r.summary, "ttft", "p99")) for r in runs]
    known = [(p, float(v)) for p, v in ttfts if isinstance(v, int | float) and v > 0]
    if len(known) < 2:
        return None
    best = min(known, key=lambda x: x[1])
    worst = max(known, key=lambda x: x[1])
    if best[0] == worst[0]:
        return None
    at = f"At {rate:.3g} req/s, " if rate else ""
    ratio = worst[1] / best[1]
    times = f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.1f}"
    summaries = {r.policy: r.summary for r in runs}
    covered = runs_text([(name, summaries[name]) for name in (best[0], worst[0])])
    return (
        f"{at}{best[0]} keeps p99 TTFT at {fmt_seconds(best[1])} against {fmt_seconds(worst[1])} "
        f"for {worst[0]} ({times}× lower), over the requests that finished: {covered}."
    )


SUMMARY_COLUMNS = (
    "policy", "finished / arrived", "overloaded", "req/s", "output tok/s", "goodput req/s", "SLO attained",
    "TTFT p50", "TTFT p99", "TPOT p99", "E2E p99", "mean batch", "KV used", "preemptions", "capacity",
)  # fmt: skip


def summary_rows(runs: list[PolicyRun], capacities: list[CapacityMark]) -> list[list[str]]:
    """One row of SUMMARY_COLUMNS per policy run."""
    caps = {c.series: c.label for c in capacities}
    rows = []
    for run in runs:
        s = run.summary
        counts = s.get("requests", {})
        thr = s.get("throughput", {})
        steps = s.get("steps", {})
        attain = s.get("slo_attainment")
        kv = steps.get("mean_kv_utilization")
        rows.append(
            [
                run.policy,
                f"{fmt_number(counts.get('finished'))} / {fmt_number(counts.get('arrived'))}",
                "yes" if s.get("overloaded") else "no",
                fmt_number(thr.get("requests_per_s")),
                fmt_number(thr.get("output_tokens_per_s")),
                fmt_number(s.get("goodput_per_s")),
                f"{attain:.1%}" if isinstance(attain, int | float) else "–",
                fmt_seconds(_latency(s, "ttft", "p50")),
                fmt_seconds(_latency(s, "ttft", "p99")),
                fmt_seconds(_latency(s, "tpot", "p99")),
                fmt_seconds(_latency(s, "e2e", "p99")),
                fmt_number(steps.get("mean_batch_size")),
                f"{kv:.1%}" if isinstance(kv, int | float) else "–",
                fmt_number(steps.get("preemptions")),
                caps.get(run.policy, "–"),
            ]
        )
    return rows
