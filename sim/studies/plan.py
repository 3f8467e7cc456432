"""`sim plan`: the cheapest fleet that serves a rate within the scenario's SLO.

The search space is GPU type x TP degree x knobs (the policy's `max_num_seqs`, `max_num_batched_tokens`,
`enable_chunked_prefill`; [model]'s `weight_dtype`, `kv_dtype`: each an axis only when given) x colocated
replica count, or x prefill/decode replica counts for a disaggregated split, within `max_gpus`; with
placement axes (`plan_placements`), each replica's pipeline stages and expert parallelism with
data-parallel attention too, within the nodes given.
A configuration meets the SLO when its runs at the rate are not overloaded and its goodput (the rate x the
share of its judged requests meeting every [slo] bound) is at least `attainment` x the rate (DistServe's
rule: 90% of requests meet the SLOs); with `rule="p99"`, when every p99 latency is within its [slo] bound
instead. Which requests are judged, the seeds each configuration runs, the interval its verdict (meets,
fails, too close to call) comes from and the horizon the judged tail needs: `plan_verdict`. Its cost is
GPUs x $/GPU-hour (`sim/catalog/prices.toml`, or the scenario's [prices]).

Pruning, before and during the search:
- theory: a replica is busy at least `prefill(mean prompt) + mean output x per-token decode time at its
  largest batch` seconds per request, so c replicas cannot keep up below c = rate x that (prefill and
  decode replicas likewise for their own part); counts under THEORY_SLACK x the bound are never run;
- single-replica capacity: one replica of each colocated plain-TP kind is run saturated (`single_capacity`);
  c such replicas serve at most c x that, so counts below CAPACITY_SLACK x rate / capacity are never run;
- dominance: more replicas of the same kind never hurt, so a count below (each count at or below) one that
  failed is not run (one too close to call prunes nothing);
- cost order: candidates are run cheapest first, one at a time (its replications `jobs` at a time on the
  sweep's executor: a process pool, or a dask cluster's workers with `executor="dask"`; so the plan is the
  same at any `jobs`), and the search stops at the first cost above the cheapest configuration that met the
  SLO (plus `explore` more, for the cost-latency front).
Prefill/decode candidates move KV over the scenario's `cluster.link`, else InfiniBand NDR (different nodes).
A row's figures come from its first replication, a full fleet run of the same scenario (its seed): `sim run`
with the chosen configuration's `--set` overrides reproduces it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sim.config.scenario import load_scenario
from sim.io.errors import SimError
from sim.records.summary import Slo
from sim.studies.executor import check_executor, open_executor
from sim.studies.plan_judge import Judge, PlanTask
from sim.studies.plan_placements import PLACEMENT_COLUMNS, PlacementAxes
from sim.studies.plan_rates import DEFAULT_RATE_STEPS, at_rate, sustained_rate
from sim.studies.plan_result import PlanResult, configured
from sim.studies.plan_routers import machine
from sim.studies.plan_runs import RunStore
from sim.studies.plan_space import DEFAULT_TPS, Candidate, candidates, tally
from sim.studies.plan_verdict import (
    DEFAULT_MAX_HORIZON_S,
    DEFAULT_MAX_REPLICATIONS,
    DEFAULT_REPLICATIONS,
    FAILS,
    JUDGED_FIGURES,
    MEETS,
    SETTLE_SEEDS,
    TAIL_SAMPLES,
    judged_figures,
    verdict,
)
from sim.studies.points import flatten_summary, rate_key
from sim.studies.run import run_policy

FIGURES = (
    "goodput_per_s", "slo_attainment", "ttft_p99", "tpot_p99", "ttft_mean", "tpot_mean", "requests_per_s",
    "overloaded", "arrived", "finished", "in_flight", "rejected", "e2e_p99", "output_tokens_per_s",
    "tpot_p50",
)  # fmt: skip


def evaluate(task: PlanTask) -> dict[str, Any]:
    """The figures of one configuration's run, its summary's and its judged requests' (`plan_verdict`;
    the worker function)."""
    scenario = configured(task.raw, task.overrides, task.source)
    result = run_policy(scenario, task.policy, Path(task.base_dir), source=task.source)
    row = flatten_summary(result.summary)
    slo = Slo(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.e2e_s)
    judged = judged_figures(result.requests, slo, float(result.summary["horizon_s"]), row["overloaded"])
    return {**{k: row[k] for k in FIGURES}, **judged}


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
    """One run's verdict (`plan_verdict.verdict` of one replication). `goodput`: not overloaded and the
    judged requests' attainment at least `attainment` (goodput, rate x that share, at least attainment x
    rate). `p99`: not overloaded and every judged p99 latency within its [slo] bound (`slo`: the [slo])."""
    return verdict([figures], rule, slo if slo is not None else Slo(), attainment).verdict == MEETS


def _dominated(c: Candidate, failed: dict[Any, list[tuple[int, ...]]]) -> bool:
    return any(all(a <= b for a, b in zip(c.counts, f, strict=True)) for f in failed.get(c.family, []))


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
    replications: int = DEFAULT_REPLICATIONS,
    max_replications: int = DEFAULT_MAX_REPLICATIONS,
    tail_samples: int = TAIL_SAMPLES,
    max_horizon_s: float = DEFAULT_MAX_HORIZON_S,
    executor: str = "process",
    address: str | None = None,
    runs_dir: Path | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
    settle_seeds: int = SETTLE_SEEDS,
    rate_steps: int = DEFAULT_RATE_STEPS,
    placements: PlacementAxes | None = None,
) -> PlanResult:
    """Search the grid (see the module docstring); `explore` more configurations past the answer. Each
    simulated configuration runs `replications` seeds, up to `max_replications` while too close to call,
    on a horizon with `tail_samples` judged requests past the judged quantile (`plan_verdict`); one at the
    boundary (seeds split on overload, or still too close) is settled on `settle_seeds` seeds at
    `max_horizon_s`, every one to pass (0: not settled). With `rate_steps`, each configuration meeting the
    SLO gets that many verdicts of a bisection for the highest rate it sustains (`plan_rates`). The runs
    go to `executor` (`studies.executor`: process, or dask at the scheduler `address`). Finished runs are
    kept in `runs_dir` and read back by a re-run (`plan_runs`; `force`: run them all again); `progress` is
    told of each stage and each configuration judged. `placements` adds pipeline, expert and data-parallel
    placements to the grid (`plan_placements`); they are pruned by memory per rank, theory from their step
    cost and dominance, not by a single-replica capacity run."""
    check_executor(executor, address)
    say = progress or (lambda _text: None)
    store = RunStore(runs_dir, force)
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
    setup = lambda r: at_rate(base, r, source, rule, attainment, tail_samples)  # noqa: E731
    raw, scenario, run_set = setup(rate)
    key = rate_key(base)
    node: Any = raw
    for part in key.split("."):
        node = node[part]
    rate_set = {key: node}
    horizon = scenario.horizon.duration_s
    base_dir = scenario_path.resolve().parent  # absolute: a dask worker may start in another folder
    if not 1 <= replications <= max_replications:
        raise SimError(f"--replications: 1 to --max-replications ({max_replications}) (got {replications})")
    removed: dict[str, dict[str, int]] = {}
    cands, total, unfit = candidates(
        scenario, policy, rate, base_dir, gpus or [scenario.model.gpu], tps, knobs or {}, max_gpus, modes,
        removed=removed, axes=placements,
    )  # fmt: skip
    result = PlanResult(
        rate,
        attainment,
        total,
        removed.get("theory", {}).get("configurations", 0),
        0,
        unfit=unfit,
        rate_set=rate_set,
        rule=rule,
        slo=scenario.slo.model_dump(),
        horizon_s=run_set.get("horizon.duration_s", horizon),
        replications=replications,
        max_replications=max_replications,
        tail_samples=tail_samples,
        max_horizon_s=max_horizon_s,
        settle_seeds=settle_seeds,
        rate_steps=rate_steps,
        raw=raw,
        source=source,
        policy=policy,
        removed=removed,
        placements=placements.as_dict() if placements is not None and placements.searched else {},
    )
    failed: dict[Any, list[tuple[int, ...]]] = {}
    met: list[tuple[Candidate, dict[str, Any]]] = []
    best: Candidate | None = None
    extra = explore
    with open_executor(executor, jobs, address) as pool:
        # Single-replica capacity: c replicas cannot serve CAPACITY_SLACK x rate above c x one's saturation.
        plain = lambda c: c.mode == "colocated" and not c.placement.beyond_tp  # noqa: E731
        families = sorted({machine(c) for c in cands if plain(c)})  # routers share one
        sat_tasks = [
            PlanTask(
                raw, source, str(base_dir), policy, Candidate(0, 0, *f[:4], (1,)).overrides(scenario, policy)
            )
            for f in families
        ]
        say(f"{len(sat_tasks)} single-replica capacity runs")
        sats = store.map("capacity", single_capacity, sat_tasks, pool)
        floor = {
            f: max(1, math.ceil(CAPACITY_SLACK * rate / mu)) if mu > 0 else 10**9
            for f, mu in zip(families, sats, strict=True)
        }
        result.capacity = {
            Candidate(0, 0, *f[:4], (1,)).label().split(" ", 1)[1]: mu
            for f, mu in zip(families, sats, strict=True)
        }
        kept = [c for c in cands if not plain(c) or c.counts[0] >= floor[machine(c)]]
        for c in cands:
            if plain(c) and c.counts[0] < floor[machine(c)]:
                tally(removed, "capacity", c)
        result.capacity_pruned = len(cands) - len(kept)
        cands = kept
        slo = Slo(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.e2e_s)
        judge = Judge(
            lambda ts: store.map("run", evaluate, ts, pool), source, str(base_dir), policy, scenario.seed,
            rule, slo, attainment, replications, max_replications, settle_seeds, max_horizon_s,
        )  # fmt: skip
        say(f"{len(cands)} configurations to judge, cheapest first")

        # One configuration at a time (its replications in parallel): the search is the same at any --jobs.
        for c in cands:
            if best is not None and c.cost > best.cost and extra <= 0:
                break
            if _dominated(c, failed):
                result.dominance_pruned += 1
                tally(removed, "dominance", c)
                continue
            if best is not None and c.cost > best.cost:
                extra -= 1
            overrides = {**c.overrides(scenario, policy), **run_set}
            figures, judged, seeds, overrides = judge(raw, overrides, horizon)
            ok = judged.verdict == MEETS
            result.rows.append(
                _row(c, overrides, figures, judged.as_row(), seeds, rate, bool(result.placements))
            )
            at = f" settled at {overrides['horizon.duration_s']:g} s" if judged.settled else ""
            say(f"{c.label()}: {judged.verdict} ({len(seeds)} seeds{at}; runs so far: {store.ran} run, "
                f"{store.resumed} read back)")  # fmt: skip
            if ok:
                met.append((c, figures[0]))
            if ok and (best is None or c < best):
                best = c
                result.best = result.rows[-1]
            elif judged.verdict == FAILS:
                failed.setdefault(c.family, []).append(c.counts)
        mus = dict(zip(families, sats, strict=True))
        for c, first in met if rate_steps > 0 else []:
            mu = mus.get(machine(c), 0.0) if plain(c) else 0.0
            upper = c.counts[0] * mu / CAPACITY_SLACK if 0 < mu < math.inf else None
            result.sustained.append(sustained_rate(judge, c, setup, policy, rate, first, upper, rate_steps))
            say(f"{c.label()}: sustains {result.sustained[-1]['sustained_rate_per_s']:.3g} req/s")
    result.ran, result.resumed = store.ran, store.resumed
    return result


def _row(
    c: Candidate,
    overrides: dict[str, Any],
    figures: list[dict[str, Any]],
    judged: dict[str, Any],
    seeds: list[int],
    rate: float,
    placed: bool = False,
) -> dict[str, Any]:
    """A simulated configuration: the first replication's figures (what `sim run` reproduces), its
    judged goodput, and the verdict and interval over every replication; with `placed` (a search with
    placement axes), each replica's pp, ep, dp and nodes."""
    first = figures[0]
    att = first["judged_attainment"]
    p = c.placement
    where = dict(zip(PLACEMENT_COLUMNS, (p.pp, p.ep, p.dp, p.node_count), strict=True)) if placed else {}
    return {
        "config": c.label(), "cost_per_hour": c.cost, "gpus": c.gpus, "mode": c.mode, "gpu": c.gpu,
        "tp": c.tp, "knobs": json.dumps(dict(c.knobs)), "counts": list(c.counts),
        "decode_gpu": c.decode_gpu or c.gpu, "decode_tp": c.decode_tp or c.tp,
        "meets_slo": judged["verdict"] == MEETS, "overrides": json.dumps(overrides, sort_keys=True),
        **{k: first[k] for k in (*FIGURES, *JUDGED_FIGURES)},
        "judged_goodput_per_s": None if att is None else rate * att,
        **judged, "seeds": seeds, **where,
    }  # fmt: skip
