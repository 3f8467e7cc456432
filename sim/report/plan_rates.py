"""The highest rate each configuration meeting the SLO sustains (`studies.plan_rates`), as sentences for the
console and the plan page, and its block of plan.json."""

from __future__ import annotations

from typing import Any

from sim.studies.plan_result import PlanResult


def sustained_block(result: PlanResult) -> dict[str, Any]:
    """plan.json's `sustained_rates` (empty when the bisection was off)."""
    return {"rate_steps": result.rate_steps, "configurations": result.sustained}


def sustained_sentences(result: PlanResult) -> list[str]:
    """One sentence per configuration bisected, highest rate first (none when the bisection was off)."""
    if result.rate_steps <= 0 or not result.sustained:
        return []
    rows = sorted(
        result.sustained, key=lambda s: (-s["sustained_rate_per_s"], s["cost_per_hour"], s["config"])
    )
    out = []
    for s in rows:
        high = s["not_met_rate_per_s"]
        bound = s["upper_bound_per_s"]
        above = (
            f"not met at {high:.3g}"
            if high is not None
            else f"capacity bound {bound:.3g}"
            if bound is not None
            else "no rate above it failed"
        )
        tokens = s["output_tokens_per_s_per_gpu"]
        per_gpu = "" if tokens is None else f", {tokens:,.0f} output tokens/s per GPU"
        out.append(
            f"{s['config']} sustains {s['sustained_rate_per_s']:.3g} req/s ({above}; {s['steps']} verdicts)"
            f"{per_gpu}, {s['requests_per_s_per_dollar_hour']:.3g} req/s per $/hour."
        )
    return out
