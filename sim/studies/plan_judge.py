"""How `sim plan` runs one configuration to its verdict: the screening seeds, more while its interval is too
close, and the boundary's settling runs at the longest horizon (the rule: `plan_verdict`'s Escalation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.records.summary import Slo
from sim.studies.plan_verdict import (
    REPLICATION_STEP,
    TOO_CLOSE,
    Verdict,
    replication_seed,
    settled,
    split_on_overload,
    verdict,
)


@dataclass(frozen=True, slots=True)
class PlanTask:
    """One configuration's run (picklable: the sweep pool's workers run it)."""

    raw: dict[str, Any]
    source: str
    base_dir: str
    policy: str
    overrides: dict[str, Any]


def plan_task(
    raw: dict[str, Any], source: str, base_dir: Path | str, policy: str, overrides: dict[str, Any], seed: int
) -> PlanTask:
    """The run of one replication (the scenario's own seed is not overridden: `sim run` reproduces it)."""
    seed_set = {} if seed == raw.get("seed", 0) else {"seed": seed}
    return PlanTask(raw, source, str(base_dir), policy, {**overrides, **seed_set})


Judged = tuple[list[dict[str, Any]], Verdict, list[int], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Judge:
    """Runs configurations to their verdicts (`run`: a list of tasks to their figures, in order)."""

    run: Callable[[list[PlanTask]], list[dict[str, Any]]]
    source: str
    base_dir: str
    policy: str
    base_seed: int
    rule: str
    slo: Slo
    attainment: float
    replications: int
    max_replications: int
    settle_seeds: int
    max_horizon_s: float

    def _seeds(
        self, raw: dict[str, Any], overrides: dict[str, Any], ks: range
    ) -> tuple[list[int], list[Any]]:
        seeds = [replication_seed(self.base_seed, k) for k in ks]
        tasks = [plan_task(raw, self.source, self.base_dir, self.policy, overrides, s) for s in seeds]
        return seeds, self.run(tasks)

    def __call__(self, raw: dict[str, Any], overrides: dict[str, Any], horizon: float | None) -> Judged:
        """A configuration's figures, verdict, seeds and overrides (its settling horizon included when it
        was settled at the boundary); `horizon`: its screening horizon when the overrides do not set one."""
        seeds, figures = self._seeds(raw, overrides, range(self.replications))
        judged = verdict(figures, self.rule, self.slo, self.attainment)
        while (
            judged.verdict == TOO_CLOSE
            and not split_on_overload(judged)
            and len(seeds) < self.max_replications
        ):
            top = min(self.max_replications, len(seeds) + REPLICATION_STEP)
            more, extra = self._seeds(raw, overrides, range(len(seeds), top))
            seeds, figures = seeds + more, figures + extra
            judged = verdict(figures, self.rule, self.slo, self.attainment)
        if judged.verdict != TOO_CLOSE or self.settle_seeds <= 0:
            return figures, judged, seeds, overrides
        span = overrides.get("horizon.duration_s", horizon)
        longest = max(self.max_horizon_s, float(span)) if span else self.max_horizon_s
        overrides = {**overrides, "horizon.duration_s": float(longest)}
        seeds, figures = self._seeds(raw, overrides, range(max(self.settle_seeds, self.replications)))
        return figures, settled(figures, self.rule, self.slo, self.attainment), seeds, overrides
