"""`sim sweep`: expand a scenario's `[sweep]` grid into points, run them in parallel, resume, aggregate.

    [sweep]
    rates = { start = 1, stop = 16, num = 5 }   # or [1, 2, 4] or { start, stop, step }
    policies = ["static", "continuous"]         # default: all of the scenario's
    replications = 3                            # seeds: SeedSequence(scenario.seed).spawn(3)
    params = { "horizon.duration_s" = [300] }   # any other dotted key; the grid is the cartesian product
    capacity_steps = 3                          # bisection runs per policy with --find-capacity
    capacity = { rules = [{ rule = "latency", metric = "itl", bound_s = 0.1 }] }  # its rule (default: [slo])
    variants = [{ "model.weight_dtype" = "fp8" }, { "model.kv_dtype" = "fp8" }]  # keys set together

The rate axis is `workload.arrival.rate` (poisson, gamma, deterministic). A `staged` arrival keeps its shape:
every stage rate is scaled so that the time-weighted mean rate is the swept value. A `closed_loop` arrival
sweeps `users` (whole numbers; the `rate` column then holds the user count). Trace arrivals have no rate:
sweep `workload.arrival.time_scale` through `params`.

A point is one (policy, rate, params, replication). Every policy and rate of a replication shares its seed
(common random numbers), so policies are compared on the same request stream. Each point becomes one row
(`point_row`) in its own Parquet file, `points/<point_key>.parquet`, written atomically; a re-run skips
points whose file exists and reads back whole unless `force` (a damaged file is redone). `manifest.json`
records a fingerprint of the scenario (without its `[sweep]` table) so that points of a changed scenario
are never mixed in silently.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sim.config.scenario import Scenario, apply_overrides, parse_override, read_toml, validate_scenario
from sim.config.sweep import SweepConfig, parse_sweep
from sim.cost.placement import group_placement
from sim.io.errors import SimError
from sim.io.fingerprint import simulator_fingerprint
from sim.io.outputs import atomic_write, path_component, remove_leftovers, writing
from sim.records import stats
from sim.records.capacity_rules import meets_rules
from sim.studies.executor import check_executor, execute, open_executor
from sim.studies.points import Task, point_frame, point_path, point_scenario, rate_key, read_point

# --- the [sweep] table --------------------------------------------------------------------------------


# --- points -------------------------------------------------------------------------------------------


# --- executors ----------------------------------------------------------------------------------------


# --- the sweep ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class SweepResult:
    scenario: Scenario
    sweep_dir: Path
    points: pl.DataFrame
    ran: int
    resumed: int
    capacity: dict[str, Any] | None


def fingerprint(raw: dict[str, Any]) -> str:
    """What a sweep's points depend on in the scenario: all of it but its `[sweep]` table."""
    body = {k: v for k, v in raw.items() if k != "sweep"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _check_manifest(sweep_dir: Path, points_dir: Path, raw: dict[str, Any], force: bool) -> str | None:
    """Keep the points of this scenario made by this simulator; refuse another scenario's; drop the points
    another version of the simulator (its code or data: a new calibration) made. Returns a note then."""
    manifest = sweep_dir / "manifest.json"
    fp, simulator = fingerprint(raw), simulator_fingerprint()
    note = None
    if not force and manifest.exists() and any(points_dir.glob("*.parquet")):
        old = json.loads(manifest.read_text())
        if old.get("fingerprint") != fp:
            raise SimError(
                f"{points_dir}: these points were made from a different scenario; "
                "re-run with --force to redo them (or give another --out)"
            )
        if old.get("simulator") != simulator:
            force = True
            note = (
                f"{points_dir}: the points there were made by another version of the simulator: redoing them"
            )
    if force:
        for old_point in points_dir.glob("*.parquet"):
            old_point.unlink()
    body = {"fingerprint": fp, "simulator": simulator, "scenario": raw}
    text = json.dumps(body, indent=2, sort_keys=True, default=str)
    atomic_write(manifest, lambda p: Path(p).write_text(text + "\n"))
    return note


class _Runner:
    """Runs tasks through one executor, skipping finished points, each stage with its own progress bar."""

    def __init__(self, executor: Executor | None, points_dir: Path, force: bool, progress: Progress) -> None:
        self.executor, self.points_dir, self.force, self.progress = executor, points_dir, force, progress
        self.rows: dict[str, dict[str, Any]] = {}
        self.ran = self.resumed = 0
        self.done: dict[TaskID, int] = {}

    def stage(self, description: str) -> TaskID:
        """A new bar for one stage of the sweep (the grid, the capacity search)."""
        bar = self.progress.add_task(description, total=0)
        self.done[bar] = 0
        return bar

    def run(self, tasks: list[Task], bar: TaskID, later: int = 0) -> None:
        """Run the tasks not yet done on `bar`, whose total is what it ran, these, and at most `later`
        more points this stage may still run."""
        todo = []
        for task in tasks:
            path = point_path(self.points_dir, task.key)
            if task.key in self.rows:
                continue
            row = read_point(path, task.key) if path.exists() and not self.force else None
            if row is not None:
                self.rows[task.key] = row
                self.resumed += 1
            else:  # not run yet, or its file is damaged: (re)do it
                todo.append(task)
        self.progress.update(bar, total=self.done[bar] + len(todo) + later)
        if todo and not self.progress.console.is_terminal:  # no live bar: say what is starting
            self.progress.console.print(f"running {len(todo)} points ({self.resumed} already done)…")

        def advance() -> None:
            self.done[bar] += 1
            self.progress.advance(bar)

        for row in execute(todo, self.executor, self.points_dir, advance):
            self.rows[row["point_key"]] = row
        self.ran += len(todo)

    def finish(self, bar: TaskID) -> None:
        """Close a stage that ran fewer points than its total allowed for."""
        self.progress.update(bar, total=self.done[bar])


def run_sweep(
    path: Path,
    overrides: Sequence[str] = (),
    jobs: int = 1,
    executor: str = "process",
    address: str | None = None,
    force: bool = False,
    find_capacity: bool = False,
    out: Path | None = None,
    console: Console | None = None,
) -> SweepResult:
    """Expand, run (resuming), aggregate and optionally search capacity; write under `<out>/sweep/`."""
    check_executor(executor, address)
    path = Path(path)
    source = str(path)
    raw = apply_overrides(read_toml(path), dict(parse_override(o) for o in overrides), source)
    base = validate_scenario(raw, source)
    cfg = parse_sweep(base.sweep, source)
    policies = cfg.policies or list(base.policies)
    for name in policies:
        if name not in base.policies:
            raise SimError(f"{source}: sweep.policies: no policy {name!r} (have: {', '.join(base.policies)})")
    rates = cfg.rate_values()
    if rates != [None] and rate_key(base) in cfg.params:
        raise SimError(f"{source}: sweep.params.{rate_key(base)}: this is the rates axis; use sweep.rates")
    grid = cfg.param_grid()
    for params in grid:  # fail fast, before any worker starts
        for rate in rates:
            try:
                point_scenario(raw, rate, params, source)
            except SimError as err:
                where = ", ".join(
                    f"{k} = {v!r}" for k, v in {**params, "rate": rate}.items() if v is not None
                )
                raise SimError(f"sweep point ({where}): {err}") from None
    gpus: list[int] = []
    if find_capacity:
        _check_capacity_inputs(base, cfg, rates, source)
        gpus = [gpu_count(point_scenario(raw, rates[0], params, source)) for params in grid]
    seeds = np.random.SeedSequence(base.seed).spawn(cfg.replications)

    def tasks_at(policy: str, rate: float | None, params: dict[str, Any]) -> list[Task]:
        return [
            Task(raw, source, str(path.resolve().parent), policy, rate, params, i, seeds[i])
            for i in range(cfg.replications)
        ]

    sweep_dir = (out or Path("reports") / path_component(base.name)) / "sweep"
    points_dir = sweep_dir / "points"
    with writing(points_dir):
        points_dir.mkdir(parents=True, exist_ok=True)
    remove_leftovers(points_dir)  # point files a killed sweep was writing
    note = _check_manifest(sweep_dir, points_dir, raw, force)
    console = console or Console()
    if note is not None:
        console.print(f"note: {note}")
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TextColumn("ETA"), TimeRemainingColumn(), console=console, disable=not console.is_terminal,
    )  # fmt: skip
    with open_executor(executor, jobs, address) as ex, progress:
        runner = _Runner(ex, points_dir, force, progress)
        grid_tasks = [
            t
            for policy in policies
            for params in grid
            for rate in rates
            for t in tasks_at(policy, rate, params)
        ]
        keys = [t.key for t in grid_tasks]
        runner.run(grid_tasks, runner.stage("grid points"))
        capacity = None
        if find_capacity:
            capacity = _search_capacity(base, policies, grid, rates, cfg, tasks_at, runner, gpus)
            keys += [k for k in runner.rows if k not in set(keys)]
    frame = point_frame([runner.rows[k] for k in keys])
    agg = stats.aggregate(frame)
    atomic_write(sweep_dir / "aggregate.parquet", lambda p: agg.write_parquet(p))
    if capacity is not None:
        text = json.dumps(capacity, indent=2, allow_nan=False)
        atomic_write(sweep_dir / "capacity.json", lambda p: Path(p).write_text(text + "\n"))
    return SweepResult(base, sweep_dir, frame, runner.ran, runner.resumed, capacity)


def gpu_count(scenario: Scenario) -> int:
    """GPUs one run uses: the model's tensor-parallel degree, or every `[cluster]` replica's placement
    (tp x pp x dp GPUs each)."""
    if scenario.cluster is None:
        return scenario.model.tp
    return sum(g.count * group_placement(g, g.tp or scenario.model.tp).gpus for g in scenario.cluster.groups)


def _check_capacity_inputs(base: Scenario, cfg: SweepConfig, rates: list[float | None], source: str) -> None:
    if rates == [None]:
        raise SimError(f"{source}: --find-capacity needs sweep.rates")
    slo = base.slo
    no_slo = slo.ttft_s is None and slo.tpot_s is None and slo.e2e_s is None
    if cfg.capacity is None and no_slo:
        raise SimError(f"{source}: --find-capacity needs an [slo] (ttft_s, tpot_s or e2e_s)")
    if cfg.capacity is not None and no_slo and any(r.rule == "attainment" for r in cfg.capacity.rules):
        raise SimError(
            f"{source}: sweep.capacity.rules: the attainment rule needs an [slo] (ttft_s, tpot_s or e2e_s)"
        )


def _search_capacity(
    base: Scenario,
    policies: list[str],
    grid: list[dict[str, Any]],
    rates: list[float | None],
    cfg: SweepConfig,
    tasks_at: Callable[[str, float | None, dict[str, Any]], list[Task]],
    runner: _Runner,
    gpus: list[int],
) -> dict[str, Any]:
    """Per policy (and params): grid bracket, then bisection rounds run in parallel across policies."""
    slo = stats.SloBounds(base.slo.ttft_s, base.slo.tpot_s, base.slo.e2e_s)
    integer = base.workload.arrival.kind == "closed_loop"
    unit = "users" if integer else "req/s"

    def rows(policy: str, rate: float | None, params: dict[str, Any]) -> list[dict[str, Any]]:
        return [runner.rows[t.key] for t in tasks_at(policy, rate, params)]

    # The throughput plateau of each series, from its grid (users are no rate: no plateau in that unit).
    plateaus = {
        (policy, i): None
        if integer
        else stats.plateau({r: rows(policy, r, params) for r in rates if r is not None})
        for policy in policies
        for i, params in enumerate(grid)
    }

    rule = cfg.capacity

    def passes(policy: str, i: int, rate: float) -> bool:
        got, ceiling = rows(policy, rate, grid[i]), plateaus[(policy, i)]
        if rule is None:
            return stats.sustainable(rate, got, slo, ceiling)
        return meets_rules(got, rule) and (ceiling is None or rate <= ceiling)

    caps = {
        (policy, i): stats.grid_capacity({r: passes(policy, i, r) for r in rates if r is not None})
        for policy in policies
        for i, params in enumerate(grid)
    }
    bar = None
    for step in range(cfg.capacity_steps):
        mids = {k: m for k, cap in caps.items() if (m := stats.bisect_midpoint(cap, integer)) is not None}
        if not mids:
            break
        tasks = [t for (policy, i), mid in mids.items() for t in tasks_at(policy, mid, grid[i])]
        label = f"capacity search, round {step + 1} of {cfg.capacity_steps}"
        if bar is None:
            bar = runner.stage(label)
        runner.progress.update(bar, description=label)
        # later rounds bisect at most the series this one does
        runner.run(tasks, bar, later=len(tasks) * (cfg.capacity_steps - step - 1))
        for (policy, i), mid in mids.items():
            stats.record(caps[(policy, i)], mid, passes(policy, i, mid))
    if bar is not None:
        runner.finish(bar)
    ceiling = (
        "no run overloaded, and the rate not above the throughput plateau (the mean throughput at the lowest "
        "grid rate where every run is overloaded)"
    )
    capacities = [
        {"policy": policy, "params": grid[i], **cap.as_dict(unit), "plateau_per_s": plateaus[(policy, i)]}
        for (policy, i), cap in caps.items()
    ]
    if rule is None:
        criterion = f"mean over replications of p99 TTFT / TPOT / E2E within the SLO, {ceiling}"
    else:
        criterion = f"mean over replications of: {rule.describe()}; {ceiling}"
        if rule.per_gpu:  # per-GPU goodput
            for entry, (_, i) in zip(capacities, caps, strict=True):
                found = entry["capacity"]
                entry["gpus"] = gpus[i]
                entry["capacity_per_gpu"] = None if found is None else found / gpus[i]
    out = {
        "scenario": base.name,
        "slo": base.slo.model_dump(),
        "unit": unit,
        "criterion": criterion,
        "replications": cfg.replications,
        "capacities": capacities,
    }
    if rule is not None:
        out["rules"] = [r.model_dump() for r in rule.rules]
        out["per_gpu"] = rule.per_gpu
    return out
