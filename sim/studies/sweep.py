"""`sim sweep`: expand a scenario's `[sweep]` grid into points, run them in parallel, resume, aggregate.

    [sweep]
    rates = { start = 1, stop = 16, num = 5 }   # or [1, 2, 4] or { start, stop, step }
    policies = ["static", "continuous"]         # default: all of the scenario's
    replications = 3                            # seeds: SeedSequence(scenario.seed).spawn(3)
    params = { "horizon.duration_s" = [300] }   # any other dotted key; the grid is the cartesian product
    capacity_steps = 3                          # bisection runs per policy with --find-capacity
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
import itertools
import json
import math
import multiprocessing
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from sim.config.scenario import Scenario, apply_overrides, parse_override, read_toml, validate_scenario
from sim.io.errors import SimError
from sim.io.outputs import atomic_write, path_component
from sim.records import stats
from sim.records.recorder import LATENCY_METRICS
from sim.studies.run import run_policy
from sim.workload.generator import format_validation_error

LATENCY_STATS = ("mean", "p50", "p90", "p95", "p99", "max")

# The point-file contract (one row per file); the report reads exactly these columns.
POINT_SCHEMA: dict[str, Any] = {
    "point_key": pl.String, "policy": pl.String, "scheduler": pl.String, "rate": pl.Float64,
    "replication": pl.Int64, "seed_entropy": pl.String, "spawn_key": pl.List(pl.Int64), "params": pl.String,
    "arrived": pl.Int64, "finished": pl.Int64, "rejected": pl.Int64, "in_flight": pl.Int64,
    "overloaded": pl.Boolean, "requests_per_s": pl.Float64, "output_tokens_per_s": pl.Float64,
    "total_tokens_per_s": pl.Float64, "goodput_per_s": pl.Float64, "slo_attainment": pl.Float64,
    **{f"{m}_{s}": pl.Float64 for m in LATENCY_METRICS for s in LATENCY_STATS},
    "mean_batch_size": pl.Float64, "mean_kv_utilization": pl.Float64, "preemptions": pl.Int64,
    "prefix_cache_hit_rate": pl.Float64,
}  # fmt: skip


# --- the [sweep] table --------------------------------------------------------------------------------


class RateRange(BaseModel):
    """`{start, stop, num}` (evenly spaced, both ends included) or `{start, stop, step}`."""

    model_config = ConfigDict(extra="forbid")
    start: float = Field(gt=0)
    stop: float = Field(gt=0)
    num: int | None = Field(None, ge=1)
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_spacing(self) -> RateRange:
        if (self.num is None) == (self.step is None):
            raise ValueError("give exactly one of num and step")
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop:g}) is below start ({self.start:g})")
        return self

    def values(self) -> list[float]:
        if self.num is not None:
            return [float(x) for x in np.linspace(self.start, self.stop, self.num)]
        assert self.step is not None
        count = math.floor((self.stop - self.start) / self.step + 1e-9) + 1
        return [round(self.start + i * self.step, 12) for i in range(count)]


class SweepConfig(BaseModel):
    """The `[sweep]` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    rates: list[float] | RateRange | None = None
    policies: list[str] | None = Field(None, min_length=1)
    replications: int = Field(1, ge=1, le=1000)
    params: dict[str, list[Any]] = Field(default_factory=dict)
    capacity_steps: int = Field(3, ge=0, le=30, description="Bisection runs per policy (--find-capacity).")
    variants: list[dict[str, Any]] = Field(
        default_factory=list, description="Sets of dotted keys set together; one more grid axis."
    )

    def rate_values(self) -> list[float | None]:
        if self.rates is None:
            return [None]
        values = self.rates.values() if isinstance(self.rates, RateRange) else [float(r) for r in self.rates]
        return sorted(set(values))

    def param_grid(self) -> list[dict[str, Any]]:
        keys = sorted(self.params)
        grid = [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.params[k] for k in keys))
        ]
        if self.variants:  # each variant's keys over each params point
            grid = [{**point, **variant} for point in grid for variant in self.variants]
        return grid


def parse_sweep(raw: dict[str, Any] | None, source: str) -> SweepConfig:
    try:
        cfg = SweepConfig.model_validate(raw or {})
    except ValidationError as err:
        raise SimError(format_validation_error(err, raw or {}, source, root="sweep")) from None
    if isinstance(cfg.rates, list) and (not cfg.rates or any(r <= 0 for r in cfg.rates)):
        raise SimError(f"{source}: sweep.rates: give positive rates (got {cfg.rates})")
    for key, values in cfg.params.items():
        if not values:
            raise SimError(f"{source}: sweep.params.{key}: give at least one value")
        if key == "sweep" or key.startswith("sweep."):
            raise SimError(f"{source}: sweep.params.{key}: the sweep cannot sweep itself")
    for i, variant in enumerate(cfg.variants):
        clash = sorted(k for k in variant if k in cfg.params or k == "sweep" or k.startswith("sweep."))
        if not variant or clash:
            what = (
                f"{clash[0]} is a sweep.params key or the sweep itself" if clash else "give at least one key"
            )
            raise SimError(f"{source}: sweep.variants[{i}]: {what}")
    return cfg


# --- points -------------------------------------------------------------------------------------------


def _params_json(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)


def point_key(policy: str, rate: float | None, params: dict[str, Any], replication: int) -> str:
    """The file-name rule: `<policy>[__rate=<repr>][__params=<hash>]__rep=<n>` (points/<key>.parquet)."""
    parts = ["".join(c if c.isalnum() or c in "_.-" else "-" for c in policy)]
    if rate is not None:
        parts.append(f"rate={float(rate)!r}")
    if params:
        parts.append("params=" + hashlib.sha256(_params_json(params).encode()).hexdigest()[:12])
    parts.append(f"rep={replication}")
    return "__".join(parts)


def point_path(points_dir: Path, key: str) -> Path:
    return points_dir / f"{key}.parquet"


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """The metric columns of a point row, from a run's `summary.json` mapping."""
    req, thr, lat, steps = summary["requests"], summary["throughput"], summary["latency"], summary["steps"]
    out: dict[str, Any] = {k: req[k] for k in ("arrived", "finished", "rejected", "in_flight")}
    out["overloaded"] = bool(summary["overloaded"])
    out.update({k: thr[k] for k in ("requests_per_s", "output_tokens_per_s", "total_tokens_per_s")})
    out["goodput_per_s"] = summary["goodput_per_s"]
    out["slo_attainment"] = summary["slo_attainment"]
    for metric in LATENCY_METRICS:
        for stat in LATENCY_STATS:
            out[f"{metric}_{stat}"] = lat[metric][stat]
    out["mean_batch_size"] = steps["mean_batch_size"]
    out["mean_kv_utilization"] = steps["mean_kv_utilization"]
    out["preemptions"] = steps["preemptions"]
    out["prefix_cache_hit_rate"] = summary["prefix_cache_hit_rate"]
    return out


def apply_rate(raw: dict[str, Any], scenario: Scenario, rate: float, source: str) -> dict[str, Any]:
    """Set the swept rate on a raw scenario mapping (see the module docstring for each arrival kind)."""
    arrival = scenario.workload.arrival
    kind = arrival.kind
    if kind in ("poisson", "gamma", "deterministic"):
        return apply_overrides(raw, {"workload.arrival.rate": rate}, source)
    if kind == "staged":
        stages = [list(s) for s in raw["workload"]["arrival"]["stages"]]
        total = sum(d for _, d in stages)
        mean = sum(r * d for r, d in stages) / total
        if mean <= 0:
            raise SimError(
                f"{source}: sweep.rates: the staged arrival has a zero mean rate; nothing to scale"
            )
        scaled = [[r * rate / mean, d] for r, d in stages]
        return apply_overrides(raw, {"workload.arrival.stages": scaled}, source)
    if kind == "closed_loop":
        if rate != int(rate):
            raise SimError(f"{source}: sweep.rates: closed_loop sweeps users; {rate:g} is not a whole number")
        return apply_overrides(raw, {"workload.arrival.users": int(rate)}, source)
    raise SimError(
        f"{source}: sweep.rates: a {kind} arrival has no rate; sweep its parameters via sweep.params"
    )


def rate_key(scenario: Scenario) -> str:
    """The dotted key the rate axis writes (for clash checks and messages)."""
    kind = scenario.workload.arrival.kind
    return {"staged": "workload.arrival.stages", "closed_loop": "workload.arrival.users"}.get(
        kind, "workload.arrival.rate"
    )


def point_scenario(raw: dict[str, Any], rate: float | None, params: dict[str, Any], source: str) -> Scenario:
    """The validated scenario of one grid point: `params` first, then the rate."""
    data = apply_overrides(raw, params, source)
    scenario = validate_scenario(data, source)
    if rate is None:
        return scenario
    return validate_scenario(apply_rate(data, scenario, rate, source), source)


@dataclass(frozen=True, slots=True)
class Task:
    """Everything a worker needs to run one point (picklable)."""

    raw: dict[str, Any]
    source: str
    base_dir: str
    policy: str
    rate: float | None
    params: dict[str, Any]
    replication: int
    seed: np.random.SeedSequence

    @property
    def key(self) -> str:
        return point_key(self.policy, self.rate, self.params, self.replication)


def run_point(task: Task) -> dict[str, Any]:
    """Run one point and return its row (the worker function; writes nothing)."""
    scenario = point_scenario(task.raw, task.rate, task.params, task.source)
    result = run_policy(scenario, task.policy, Path(task.base_dir), seed=task.seed)
    return {
        "point_key": task.key,
        "policy": task.policy,
        "scheduler": result.summary["scheduler"],
        "rate": task.rate,
        "replication": task.replication,
        "seed_entropy": str(task.seed.entropy),
        "spawn_key": list(task.seed.spawn_key),
        "params": _params_json(task.params),
        **flatten_summary(result.summary),
    }


def point_frame(rows: Sequence[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=POINT_SCHEMA)


def write_point(points_dir: Path, row: dict[str, Any]) -> Path:
    path = point_path(points_dir, row["point_key"])
    atomic_write(path, lambda p: point_frame([row]).write_parquet(p))
    return path


def read_point(path: Path, key: str | None = None) -> dict[str, Any] | None:
    """A point file's row, or None when the file is damaged (torn, truncated) or is not point `key`."""
    try:
        frame = pl.read_parquet(path)
    except Exception:  # polars raises several error types for a damaged file
        return None
    if frame.height != 1 or set(POINT_SCHEMA) - set(frame.columns):
        return None
    row = frame.row(0, named=True)
    return row if key is None or row["point_key"] == key else None


# --- executors ----------------------------------------------------------------------------------------


@contextmanager
def open_executor(kind: str, jobs: int, address: str | None) -> Iterator[Executor | None]:
    """A `concurrent.futures.Executor` for the points; None means run them in-process, one by one."""
    if kind == "dask":
        if address is None:
            raise SimError("--executor dask needs --address tcp://HOST:PORT (a dask scheduler)")
        try:
            from dask.distributed import Client
        except ImportError:
            raise SimError(
                "--executor dask needs dask.distributed: pip install 'servesim[cluster]'"
            ) from None
        try:
            client = Client(address, timeout="10s")
        except (OSError, TimeoutError) as err:
            raise SimError(f"--address {address}: cannot reach a dask scheduler ({err})") from None
        try:
            yield client.get_executor()
        finally:
            client.close()
    elif kind == "process":
        if jobs < 1:
            raise SimError(f"--jobs: give at least 1 (got {jobs})")
        if jobs == 1:
            yield None
            return
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["sim.studies.sweep"])
        with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
            yield pool
    else:
        raise SimError(f"--executor: unknown executor {kind!r} (process or dask)")


def execute(
    tasks: Sequence[Task],
    executor: Executor | None,
    points_dir: Path,
    advance: Callable[[], None] = lambda: None,
) -> list[dict[str, Any]]:
    """Run `tasks`, writing each row as soon as it is back; on a failure, cancel the rest and re-raise."""
    rows: list[dict[str, Any]] = []
    if executor is None:
        for task in tasks:
            rows.append(run_point(task))
            write_point(points_dir, rows[-1])
            advance()
        return rows
    futures = [executor.submit(run_point, task) for task in tasks]
    try:
        for fut in as_completed(futures):
            rows.append(fut.result())
            write_point(points_dir, rows[-1])
            advance()
    except BaseException:
        for fut in futures:
            fut.cancel()
        raise
    return rows


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
    body = {k: v for k, v in raw.items() if k != "sweep"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _check_manifest(sweep_dir: Path, points_dir: Path, raw: dict[str, Any], force: bool) -> None:
    manifest = sweep_dir / "manifest.json"
    fp = fingerprint(raw)
    if force:
        for old in points_dir.glob("*.parquet"):
            old.unlink()
    elif manifest.exists() and any(points_dir.glob("*.parquet")):
        old_fp = json.loads(manifest.read_text()).get("fingerprint")
        if old_fp != fp:
            raise SimError(
                f"{points_dir}: these points were made from a different scenario; "
                "re-run with --force to redo them (or give another --out)"
            )
    text = json.dumps({"fingerprint": fp, "scenario": raw}, indent=2, sort_keys=True, default=str)
    atomic_write(manifest, lambda p: Path(p).write_text(text + "\n"))


class _Runner:
    """Runs tasks through one executor, skipping finished points, with a progress bar."""

    def __init__(self, executor: Executor | None, points_dir: Path, force: bool, progress: Progress) -> None:
        self.executor, self.points_dir, self.force, self.progress = executor, points_dir, force, progress
        self.rows: dict[str, dict[str, Any]] = {}
        self.ran = self.resumed = 0
        self.bar = progress.add_task("runs", total=0)

    def run(self, tasks: list[Task]) -> None:
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
        self.progress.update(self.bar, total=self.ran + len(todo))
        if todo and not self.progress.console.is_terminal:  # no live bar: say what is starting
            self.progress.console.print(f"running {len(todo)} points ({self.resumed} already done)…")
        for row in execute(todo, self.executor, self.points_dir, lambda: self.progress.advance(self.bar)):
            self.rows[row["point_key"]] = row
        self.ran += len(todo)


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
    if find_capacity:
        _check_capacity_inputs(base, rates, source)
    seeds = np.random.SeedSequence(base.seed).spawn(cfg.replications)

    def tasks_at(policy: str, rate: float | None, params: dict[str, Any]) -> list[Task]:
        return [
            Task(raw, source, str(path.parent), policy, rate, params, i, seeds[i])
            for i in range(cfg.replications)
        ]

    sweep_dir = (out or Path("reports") / path_component(base.name)) / "sweep"
    points_dir = sweep_dir / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    _check_manifest(sweep_dir, points_dir, raw, force)
    console = console or Console()
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=not console.is_terminal,
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
        runner.run(grid_tasks)
        capacity = None
        if find_capacity:
            capacity = _search_capacity(base, policies, grid, rates, cfg, tasks_at, runner)
            keys += [k for k in runner.rows if k not in set(keys)]
    frame = point_frame([runner.rows[k] for k in keys])
    agg = stats.aggregate(frame)
    atomic_write(sweep_dir / "aggregate.parquet", lambda p: agg.write_parquet(p))
    if capacity is not None:
        text = json.dumps(capacity, indent=2, allow_nan=False)
        atomic_write(sweep_dir / "capacity.json", lambda p: Path(p).write_text(text + "\n"))
    return SweepResult(base, sweep_dir, frame, runner.ran, runner.resumed, capacity)


def _check_capacity_inputs(base: Scenario, rates: list[float | None], source: str) -> None:
    if rates == [None]:
        raise SimError(f"{source}: --find-capacity needs sweep.rates")
    slo = base.slo
    if slo.ttft_s is None and slo.tpot_s is None and slo.e2e_s is None:
        raise SimError(f"{source}: --find-capacity needs an [slo] (ttft_s, tpot_s or e2e_s)")


def _search_capacity(
    base: Scenario,
    policies: list[str],
    grid: list[dict[str, Any]],
    rates: list[float | None],
    cfg: SweepConfig,
    tasks_at: Callable[[str, float | None, dict[str, Any]], list[Task]],
    runner: _Runner,
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

    def passes(policy: str, i: int, rate: float) -> bool:
        return stats.sustainable(rate, rows(policy, rate, grid[i]), slo, plateaus[(policy, i)])

    caps = {
        (policy, i): stats.grid_capacity({r: passes(policy, i, r) for r in rates if r is not None})
        for policy in policies
        for i, params in enumerate(grid)
    }
    for _ in range(cfg.capacity_steps):
        mids = {k: m for k, cap in caps.items() if (m := stats.bisect_midpoint(cap, integer)) is not None}
        if not mids:
            break
        runner.run([t for (policy, i), mid in mids.items() for t in tasks_at(policy, mid, grid[i])])
        for (policy, i), mid in mids.items():
            stats.record(caps[(policy, i)], mid, passes(policy, i, mid))
    return {
        "scenario": base.name,
        "slo": base.slo.model_dump(),
        "unit": unit,
        "criterion": (
            "mean over replications of p99 TTFT / TPOT / E2E within the SLO, no run overloaded, and the rate "
            "not above the throughput plateau (the lowest mean throughput among grid rates where every run "
            "is overloaded)"
        ),
        "replications": cfg.replications,
        "capacities": [
            {"policy": policy, "params": grid[i], **cap.as_dict(unit), "plateau_per_s": plateaus[(policy, i)]}
            for (policy, i), cap in caps.items()
        ],
    }


def print_sweep(result: SweepResult, console: Console | None = None) -> None:
    """What ran, where it is, and the capacities found."""
    from rich.table import Table

    console = console or Console()
    console.print(
        f"{result.scenario.name}: {result.points.height} points "
        f"({result.ran} run, {result.resumed} already done) in {result.sweep_dir}/"
    )
    if result.capacity is None:
        return
    table = Table(title=f"capacity under the SLO ({result.capacity['unit']})")
    table.add_column("policy")
    table.add_column("params")
    table.add_column("capacity", justify="right")
    for cap in result.capacity["capacities"]:
        table.add_row(cap["policy"], json.dumps(cap["params"]) if cap["params"] else "", cap["label"])
    console.print(table)
