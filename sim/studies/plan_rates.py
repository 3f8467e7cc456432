"""The highest rate each configuration meeting the SLO sustains (`sim plan --rate-steps N`).

A bisection on the arrival rate, judged by the plan's own verdict (`plan_judge`: the same seeds, the tail
rule's horizon at each rate, settling at the boundary), bounded in verdicts: `steps` per configuration.
It starts from the planned rate R, which the configuration meets. The upper end is a proof where the plan
has one: c colocated replicas cannot serve above c x one replica's saturated throughput / CAPACITY_SLACK
(the single-replica capacity rule's own bound); without one (a prefill/decode split) the rate doubles
until a verdict does not meet. Each step judges the middle of [highest met, lowest not met]; a verdict
that is not *meets* (fails, or too close to call) lowers the upper end, so the rate reported is one the
configuration was shown to meet. Its output tokens/s per GPU are its first seed's at that rate, and its
requests/s per dollar are that rate over the configuration's $/hour.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from sim.config.scenario import Scenario, validate_scenario
from sim.studies.plan_judge import Judge
from sim.studies.plan_space import Candidate
from sim.studies.plan_verdict import MEETS, tail_horizon
from sim.studies.points import apply_rate

DEFAULT_RATE_STEPS = 0  # off: each step is a verdict (3 runs, or a settling's 5 long ones) per configuration


def at_rate(
    base: Scenario, rate: float, source: str, rule: str, attainment: float, tail_samples: int
) -> tuple[dict[str, Any], Scenario, dict[str, Any]]:
    """The raw and validated scenario at `rate`, and the horizon override its judged tail needs (`{}`
    when the scenario's own horizon is long enough)."""
    raw = apply_rate(base.raw, base, rate, source)
    scenario = validate_scenario(raw, source)
    horizon = scenario.horizon.duration_s
    needed = tail_horizon(rule, attainment, rate, tail_samples)
    return (
        raw,
        scenario,
        ({"horizon.duration_s": float(needed)} if horizon is not None and horizon < needed else {}),
    )


def sustained_rate(
    judge: Judge,
    c: Candidate,
    setup: Callable[[float], tuple[dict[str, Any], Scenario, dict[str, Any]]],
    policy: str,
    rate: float,
    at_rate_figures: dict[str, Any],
    upper: float | None,
    steps: int,
) -> dict[str, Any]:
    """The bisection for one configuration that meets the SLO at `rate` (`at_rate_figures`: its first
    seed's figures there); `setup(r)` gives the scenario at r (`at_rate`)."""
    low, high = rate, upper if upper is not None and upper > rate else None
    first = at_rate_figures
    probes: list[dict[str, Any]] = []
    for _ in range(steps):
        probe = 2.0 * low if high is None else (low + high) / 2.0
        raw, scenario, run_set = setup(probe)
        overrides = {**c.overrides(scenario, policy), **run_set}
        figures, judged, _seeds, overrides = judge(raw, overrides, scenario.horizon.duration_s)
        probes.append({"rate_per_s": probe, "verdict": judged.verdict, "settled": judged.settled,
                       "replications": judged.replications})  # fmt: skip
        if judged.verdict == MEETS:
            low, first = probe, figures[0]
        else:
            high = probe
    tokens = first.get("output_tokens_per_s")
    return {
        "config": c.label(), "cost_per_hour": c.cost, "gpus": c.gpus, "sustained_rate_per_s": low,
        "not_met_rate_per_s": None if high is None or (upper is not None and high == upper) else high,
        "upper_bound_per_s": upper, "steps": len(probes), "probes": probes,
        "output_tokens_per_s_per_gpu": None if tokens is None else float(tokens) / c.gpus,
        "requests_per_s_per_dollar_hour": low / c.cost if c.cost > 0 else math.inf,
    }  # fmt: skip
