"""Whether the replications at one rate pass a `[sweep.capacity]` rule (sim/config/capacity.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sim.config.capacity import AttainmentRule, CapacityConfig, LatencyRule, SchedulingDelayRule


def rule_passes(
    rule: LatencyRule | SchedulingDelayRule | AttainmentRule, rows: Sequence[Mapping[str, Any]]
) -> bool:
    """One rule, judged by its figure's mean over the replications `rows` (flattened point rows)."""
    if isinstance(rule, AttainmentRule):
        values = [r["slo_attainment"] for r in rows]
        return None not in values and float(np.mean(values)) >= rule.fraction
    metric = "queue_wait" if isinstance(rule, SchedulingDelayRule) else rule.metric
    values = [r[f"{metric}_{rule.stat}"] for r in rows]
    if metric == "tpot":  # single-token outputs have no TPOT
        values = [v for v in values if v is not None]
        if not values:
            return True
    return None not in values and float(np.mean(values)) <= rule.bound_s


def meets_rules(rows: Sequence[Mapping[str, Any]], config: CapacityConfig) -> bool:
    """Every rule passes, and every replication finished requests without being overloaded."""
    if not rows or any(r["overloaded"] or not r["finished"] for r in rows):
        return False
    return all(rule_passes(rule, rows) for rule in config.rules)
