"""The `[sweep.capacity]` table: the rule `--find-capacity` judges a rate by, as the paper being
reproduced states it. Without the table the rule is the scenario's `[slo]` on P99 TTFT, TPOT and E2E
(sim/studies/sweep.py).

    [sweep.capacity]
    rules = [
      { rule = "latency", metric = "itl", stat = "p99", bound_s = 0.1 },   # P99 of a latency ≤ bound
      { rule = "scheduling-delay", bound_s = 2.0 },                        # median scheduling delay ≤ bound
      { rule = "attainment", fraction = 0.9 },                             # share within [slo] ≥ fraction
    ]
    per_gpu = true          # per-GPU goodput: each capacity also divided by the GPUs a run uses

A rate passes when every rule does (means over replications), no run is overloaded and the rate is not above
the throughput plateau.

- Sarathi-Serve's rule (its artifact's `sarathi/benchmark/capacity_search/capacity_search.py`,
  `_is_under_sla`, lines 72-91): a quantile of the time between decode tokens (`itl` here) within its SLO
  and a quantile of the scheduling delay within its bound (the paper: P99 TBT, median delay ≤ 2 s).
- DistServe's (OSDI'24): at least 90% of requests within both the TTFT and the TPOT SLO (`attainment` with
  the `[slo]` giving ttft_s and tpot_s), the highest such rate divided by the GPUs used (`per_gpu`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Metric = Literal["queue_wait", "ttft", "itl", "tpot", "e2e"]  # sim.records.columns.LATENCY_METRICS
Stat = Literal["mean", "p50", "p90", "p95", "p99", "max"]


class _Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class LatencyRule(_Rule):
    """A statistic of one latency (seconds) at most `bound_s`."""

    rule: Literal["latency"]
    metric: Metric
    stat: Stat = "p99"
    bound_s: float = Field(gt=0)

    def describe(self) -> str:
        return f"{self.stat} {self.metric} ≤ {self.bound_s:g} s"


class SchedulingDelayRule(_Rule):
    """A statistic (the median by default) of the scheduling delay, arrival to first step (`queue_wait`)."""

    rule: Literal["scheduling-delay"]
    stat: Stat = "p50"
    bound_s: float = Field(gt=0)

    def describe(self) -> str:
        return f"{self.stat} scheduling delay (queue_wait) ≤ {self.bound_s:g} s"


class AttainmentRule(_Rule):
    """At least `fraction` of the finished requests within every bound of the scenario's `[slo]`."""

    rule: Literal["attainment"]
    fraction: float = Field(0.9, gt=0, le=1)

    def describe(self) -> str:
        return f"SLO attainment (every [slo] bound) ≥ {self.fraction:g}"


CapacityRule = Annotated[LatencyRule | SchedulingDelayRule | AttainmentRule, Field(discriminator="rule")]


class CapacityConfig(BaseModel):
    """The `[sweep.capacity]` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    rules: list[CapacityRule] = Field(min_length=1)
    per_gpu: bool = Field(False, description="Also give each capacity per GPU (per-GPU goodput).")

    def describe(self) -> str:
        return "; ".join(r.describe() for r in self.rules)
