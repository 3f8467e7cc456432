"""A plan's answer (`plan.search`): every simulated configuration's row, the one chosen, the cost-latency
front, and the scenario and `--set` arguments that reproduce a row with `sim run`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from sim.config.scenario import Scenario
from sim.io.tomltext import toml_value
from sim.studies.plan_rates import DEFAULT_RATE_STEPS
from sim.studies.plan_verdict import (
    DEFAULT_MAX_HORIZON_S,
    DEFAULT_MAX_REPLICATIONS,
    DEFAULT_REPLICATIONS,
    SETTLE_SEEDS,
    TAIL_SAMPLES,
)
from sim.studies.points import point_scenario


def configured(raw: dict[str, Any], overrides: dict[str, Any], source: str) -> Scenario:
    """The validated scenario of one configuration: the sweep's point without a rate axis."""
    return point_scenario(raw, None, overrides, source)


@dataclass(slots=True)
class PlanResult:
    rate: float
    attainment: float
    grid_size: int
    theory_pruned: int
    dominance_pruned: int
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per simulated configuration
    best: dict[str, Any] | None = None
    capacity_pruned: int = 0
    unfit: int = 0  # configurations whose GPU and TP cannot hold the model
    rate_set: dict[str, Any] = field(default_factory=dict)  # the override that sets the rate
    rule: str = "goodput"  # how a run is judged against the SLO (`meets`)
    slo: dict[str, float | None] = field(default_factory=dict)  # the scenario's [slo] bounds (s)
    horizon_s: float | None = None  # each run's arrival period (the scenario's, or the tail rule's)
    replications: int = DEFAULT_REPLICATIONS
    max_replications: int = DEFAULT_MAX_REPLICATIONS
    tail_samples: int = TAIL_SAMPLES
    max_horizon_s: float = DEFAULT_MAX_HORIZON_S
    settle_seeds: int = SETTLE_SEEDS
    rate_steps: int = DEFAULT_RATE_STEPS  # verdicts of each sustained-rate bisection (0: none)
    sustained: list[dict[str, Any]] = field(default_factory=list)  # `plan_rates.sustained_rate`, each
    raw: dict[str, Any] = field(default_factory=dict)  # the scenario at the rate, under each row's overrides
    source: str = ""
    policy: str = ""
    placements: dict[str, Any] = field(default_factory=dict)  # the placement axes searched (empty: none)

    def configured(self, row: dict[str, Any]) -> Scenario:
        """The validated scenario of a simulated configuration (its first replication's)."""
        return configured(self.raw, json.loads(row["overrides"]), self.source)

    def reproduce(self, row: dict[str, Any]) -> list[str]:
        """`--set` arguments that make `sim run` run `row`'s configuration at the planned rate."""
        return set_args({**self.rate_set, **json.loads(row["overrides"])})

    def ranked(self) -> list[dict[str, Any]]:
        """Rows meeting the SLO first, then in the search's order (cost, GPUs, mode, GPU, TP, ...)."""
        return sorted(
            self.rows,
            key=lambda r: (not r["meets_slo"], r["cost_per_hour"], r["gpus"], r["mode"], r["gpu"], r["tp"],
                           r["knobs"], r["counts"], r.get("decode_gpu", ""), r.get("decode_tp", 0)),
        )  # fmt: skip

    capacity: dict[str, float] = field(default_factory=dict)  # single-replica saturation, req/s, by family
    # what each pruning rule removed: in all ("configurations") and by each axis value (`plan_space.tally`)
    removed: dict[str, dict[str, int]] = field(default_factory=dict)
    ran: int = 0  # runs this invocation ran (not in plan.json: a resumed plan writes the same file)
    resumed: int = 0  # finished runs read back from the runs folder

    @property
    def simulated(self) -> int:
        return len(self.rows)


def pareto(rows: pl.DataFrame, metric: str = "ttft_p99") -> pl.DataFrame:
    """The configurations meeting the SLO that no cheaper (or equally cheap) one beats on `metric`."""
    ok = rows.filter(pl.col("meets_slo") & pl.col(metric).is_not_null()).sort(["cost_per_hour", metric])
    keep, best = [], math.inf
    for i, value in enumerate(ok[metric].to_list()):
        if value < best:
            keep.append(i)
            best = value
    return ok[keep]


def set_args(overrides: dict[str, Any]) -> list[str]:
    """`--set` arguments for `sim run` (values as TOML)."""
    return [f"{k}={toml_value(v)}" for k, v in sorted(overrides.items())]
