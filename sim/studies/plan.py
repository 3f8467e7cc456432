"""`sim plan`: the cheapest fleet that serves a rate within the scenario's SLO.

The search space is GPU type x TP degree x policy knobs (`max_num_seqs`, `max_num_batched_tokens`) x
colocated replica count, or x prefill/decode replica counts for a disaggregated split, within `max_gpus`.
A configuration meets the SLO when its run at the rate is not overloaded and its goodput (requests per
second meeting every [slo] bound) is at least `attainment` x the rate (DistServe's rule: 90% of requests
meet the SLOs); with `rule="p99"`, when every p99 latency is within its [slo] bound instead. Its cost is
GPUs x $/GPU-hour (`sim/catalog/prices.toml`, or the scenario's [prices]).

Pruning, before and during the search:
- theory: a replica is busy at least `prefill(mean prompt) + mean output x per-token decode time at its
  largest batch` seconds per request, so c replicas cannot keep up below c = rate x that (prefill and
  decode replicas likewise for their own part); counts under THEORY_SLACK x the bound are never run;
- single-replica capacity: one replica of each colocated kind is run saturated (`single_capacity`); c such
  replicas serve at most c x that, so counts below CAPACITY_SLACK x rate / capacity are never run;
- dominance: more replicas of the same kind never hurt, so a count below (each count at or below) one that
  failed is not run;
- cost order: candidates are run cheapest first, `jobs` at a time on the sweep's executor (a process pool,
  or a dask cluster's workers with `executor="dask"`), and the
  search stops at the first cost above the cheapest configuration that met the SLO (plus `explore` more,
  for the cost-latency front).
Prefill/decode candidates move KV over the scenario's `cluster.link`, else InfiniBand NDR (different nodes).
Every figure comes from a full fleet run of the same scenario (its seed): `sim run` with the chosen
configuration's `--set` overrides reproduces it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from sim.config.scenario import Scenario, load_scenario, validate_scenario
from sim.io.errors import SimError
from sim.io.tomltext import toml_value
from sim.studies.executor import check_executor, open_executor
from sim.studies.plan_space import DEFAULT_TPS, Candidate, candidates
from sim.studies.points import apply_rate, flatten_summary, point_scenario, rate_key
from sim.studies.run import run_policy

FIGURES = (
    "goodput_per_s", "slo_attainment", "ttft_p99", "tpot_p99", "ttft_mean", "tpot_mean", "requests_per_s",
    "overloaded", "arrived", "finished", "e2e_p99",
)  # fmt: skip


# --- prices -------------------------------------------------------------------------------------------


# --- candidates ---------------------------------------------------------------------------------------


# --- runs ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PlanTask:
    """One configuration's run (picklable: the sweep pool's workers run it)."""

    raw: dict[str, Any]
    source: str
    base_dir: str
    policy: str
    overrides: dict[str, Any]


def configured(raw: dict[str, Any], overrides: dict[str, Any], source: str) -> Scenario:
    """The validated scenario of one configuration: the sweep's point without a rate axis."""
    return point_scenario(raw, None, overrides, source)


def evaluate(task: PlanTask) -> dict[str, Any]:
    """The figures of one configuration's run (the worker function)."""
    scenario = configured(task.raw, task.overrides, task.source)
    result = run_policy(scenario, task.policy, Path(task.base_dir), source=task.source)
    row = flatten_summary(result.summary)
    return {k: row[k] for k in FIGURES}


RULES = ("goodput", "p99")


SATURATION_SEQS = 2  # a single-replica capacity run offers this many x max_num_seqs requests at once
CAPACITY_SLACK = 0.9  # c replicas serve at most c x one replica's saturated throughput


def single_capacity(task: PlanTask) -> float:
    """One replica's saturated throughput (requests/s): `SATURATION_SEQS` x max_num_seqs requests arrive at
    once and the completion rate is read between the 10th and 90th percentile finish times (the worker)."""
    raw = {k: v for k, v in task.raw.items() if k not in ("cluster", "sweep")}
    scenario = configured(
        raw, {k: v for k, v in task.overrides.items() if not k.startswith("cluster")}, task.source
    )
    seqs = int(getattr(scenario.policy(task.policy)[1], "max_num_seqs", 256))
    n = max(40, SATURATION_SEQS * seqs)
    scenario = configured(
        scenario.raw,
        {
            "workload.arrival": {"kind": "deterministic", "rate": 1e6},
            "horizon": {"max_requests": n, "drain": True},
        },
        task.source,
    )
    req = run_policy(scenario, task.policy, Path(task.base_dir), source=task.source).requests
    done = req["finished_at"].drop_nulls().sort()
    if done.len() < 10:
        return 0.0
    lo, hi = done.quantile(0.1), done.quantile(0.9)
    assert lo is not None and hi is not None
    between = int(((done >= lo) & (done <= hi)).sum())
    return between / (hi - lo) if hi > lo else math.inf


def meets(
    figures: dict[str, Any], rate: float, attainment: float, rule: str = "goodput", slo: Any = None
) -> bool:
    """`goodput`: not overloaded and goodput >= attainment x rate. `p99`: not overloaded and every p99
    latency within its [slo] bound (`slo` is the scenario's [slo] table)."""
    if figures["overloaded"] or not figures["finished"]:
        return False
    if rule == "goodput":
        return bool(figures["goodput_per_s"] >= attainment * rate)
    bounds = (("ttft_p99", slo.ttft_s), ("tpot_p99", slo.tpot_s), ("e2e_p99", slo.e2e_s))
    return all(bound is None or (figures.get(k) or 0.0) <= bound for k, bound in bounds)


def _dominated(c: Candidate, failed: dict[Any, list[tuple[int, ...]]]) -> bool:
    return any(all(a <= b for a, b in zip(c.counts, f, strict=True)) for f in failed.get(c.family, []))


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

    def reproduce(self, row: dict[str, Any]) -> list[str]:
        """`--set` arguments that make `sim run` run `row`'s configuration at the planned rate."""
        return set_args({**self.rate_set, **json.loads(row["overrides"])})

    def ranked(self) -> list[dict[str, Any]]:
        """Rows meeting the SLO first, then in the search's order (cost, GPUs, mode, GPU, TP, ...)."""
        return sorted(
            self.rows,
            key=lambda r: (not r["meets_slo"], r["cost_per_hour"], r["gpus"], r["mode"], r["gpu"], r["tp"],
                           r["knobs"], r["counts"]),
        )  # fmt: skip

    capacity: dict[str, float] = field(default_factory=dict)  # single-replica saturation, req/s, by family

    @property
    def simulated(self) -> int:
        return len(self.rows)


def search(
    scenario_path: Path,
    set_: Sequence[str],
    rate: float,
    gpus: Sequence[str] | None = None,
    max_gpus: int = 16,
    jobs: int = 2,
    policy: str | None = None,
    tps: Sequence[int] = DEFAULT_TPS,
    knobs: dict[str, Sequence[int]] | None = None,
    modes: Sequence[str] = ("colocated", "pd"),
    attainment: float = 0.9,
    explore: int = 0,
    rule: str = "goodput",
    executor: str = "process",
    address: str | None = None,
) -> PlanResult:
    """Search the grid (see the module docstring); `explore` more configurations past the answer. The runs
    go to `executor` (`studies.executor`: process, or dask at the scheduler `address`)."""
    check_executor(executor, address)
    source = str(scenario_path)
    base = load_scenario(scenario_path, list(set_))
    if base.workload.arrival.kind not in ("poisson", "gamma", "deterministic", "staged"):
        raise SimError(f"{source}: workload.arrival: plan needs an arrival rate (poisson, gamma, ...)")
    if rule not in RULES:
        raise SimError(f"--rule: {rule!r} is not one of {', '.join(RULES)}")
    if rule == "goodput" and base.slo.ttft_s is None and base.slo.tpot_s is None and base.slo.e2e_s is None:
        raise SimError(f"{source}: slo: plan needs at least one bound (ttft_s, tpot_s or e2e_s)")
    policy = policy or next(iter(base.policies))
    if policy not in base.policies:
        raise SimError(f"{source}: no policy {policy!r} (have: {', '.join(base.policies)})")
    raw = apply_rate(base.raw, base, rate, source)
    key = rate_key(base)
    node: Any = raw
    for part in key.split("."):
        node = node[part]
    rate_set = {key: node}
    scenario = validate_scenario(raw, source)
    base_dir = scenario_path.resolve().parent  # absolute: a dask worker may start in another folder
    cands, total, unfit = candidates(
        scenario, policy, rate, base_dir, gpus or [scenario.model.gpu], tps, knobs or {}, max_gpus, modes
    )
    result = PlanResult(
        rate,
        attainment,
        total,
        total - unfit - len(cands),
        0,
        unfit=unfit,
        rate_set=rate_set,
        rule=rule,
        slo=scenario.slo.model_dump(),
    )
    failed: dict[Any, list[tuple[int, ...]]] = {}
    best: Candidate | None = None
    extra = explore
    i = 0
    with open_executor(executor, jobs, address) as pool:
        # Single-replica capacity: c replicas cannot serve CAPACITY_SLACK x rate above c x one's saturation.
        families = sorted({c.family for c in cands if c.mode == "colocated"})
        sat_tasks = [
            PlanTask(
                raw, source, str(base_dir), policy, Candidate(0, 0, *f, (1,)).overrides(scenario, policy)
            )
            for f in families
        ]
        sats = (
            list(pool.map(single_capacity, sat_tasks))
            if pool is not None
            else [single_capacity(t) for t in sat_tasks]
        )
        floor = {
            f: max(1, math.ceil(CAPACITY_SLACK * rate / mu)) if mu > 0 else 10**9
            for f, mu in zip(families, sats, strict=True)
        }
        result.capacity = {
            Candidate(0, 0, *f, (1,)).label().split(" ", 1)[1]: mu
            for f, mu in zip(families, sats, strict=True)
        }
        kept = [c for c in cands if c.mode != "colocated" or c.counts[0] >= floor[c.family]]
        result.capacity_pruned = len(cands) - len(kept)
        cands = kept
        while i < len(cands):
            batch: list[Candidate] = []
            while i < len(cands) and len(batch) < jobs:
                c = cands[i]
                if best is not None and c.cost > best.cost and extra <= 0:
                    break
                i += 1
                if _dominated(c, failed):
                    result.dominance_pruned += 1
                    continue
                if best is not None and c.cost > best.cost:
                    extra -= 1
                batch.append(c)
            if not batch:
                break
            tasks = [
                PlanTask(raw, source, str(base_dir), policy, c.overrides(scenario, policy)) for c in batch
            ]
            figures = list(pool.map(evaluate, tasks)) if pool is not None else [evaluate(t) for t in tasks]
            for c, task, fig in zip(batch, tasks, figures, strict=True):
                ok = meets(fig, rate, attainment, rule, scenario.slo)
                result.rows.append(_row(c, task, fig, ok))
                if ok and (best is None or c < best):
                    best = c
                    result.best = result.rows[-1]
                elif not ok:
                    failed.setdefault(c.family, []).append(c.counts)
    return result


def _row(c: Candidate, task: PlanTask, fig: dict[str, Any], ok: bool) -> dict[str, Any]:
    return {
        "config": c.label(), "cost_per_hour": c.cost, "gpus": c.gpus, "mode": c.mode, "gpu": c.gpu,
        "tp": c.tp, "knobs": json.dumps(dict(c.knobs)), "counts": list(c.counts), "meets_slo": ok,
        "overrides": json.dumps(task.overrides, sort_keys=True), **fig,
    }  # fmt: skip


# --- outputs ------------------------------------------------------------------------------------------


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
