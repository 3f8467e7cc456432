"""One run: a scenario and one of its policies in, request and step records and a summary out."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sim import __version__
from sim.catalog.engines import DEFAULT_ENGINE
from sim.config.cluster import drop_default_placement
from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.cost.memory import KvBudget, replica_kv_memory
from sim.cost.replica import build_cost_and_memory
from sim.cost.roofline import CostModel
from sim.engine.closed_loop import ClosedLoopSource
from sim.engine.horizon import Horizon
from sim.engine.lora import LoraRun, setup_lora
from sim.engine.lora_records import lora_recorder, lora_summary
from sim.engine.replica import simulate
from sim.engine.sampling import sampled_step_time
from sim.engine.schedulers.registry import load_all
from sim.engine.slora import SLoraRun, setup_slora
from sim.engine.speculative import speculative_setup
from sim.io.errors import SimError
from sim.io.outputs import differences, path_component, replace_folder
from sim.records.recorder import Recorder
from sim.records.sinks import ParquetSink
from sim.records.summary import Records, Slo, summarize
from sim.workload.generator import Workload, rate_steps

RUN_FILES = ("requests.parquet", "steps.parquet", "summary.json")
MANIFEST = "manifest.json"
# Folder names a policy's records may not take: the sweep's folder and the report's own outputs.
RESERVED_NAMES = frozenset({"sweep", "charts", "index.html"})
MANIFEST_FORMAT = 1

# Progress of a run: (simulated seconds reached, requests arrived so far).
ProgressHook = Callable[[float, int], None]
PROGRESS_EVERY = 32  # arrivals between two progress calls


@dataclass(slots=True)
class RunResult:
    """A run's records (frames in memory, or scans of the Parquet files they were streamed to), its
    summary and its manifest."""

    scenario: str
    policy: str
    requests: pl.DataFrame | pl.LazyFrame
    steps: pl.DataFrame | pl.LazyFrame
    summary: dict[str, Any]
    manifest: dict[str, Any]


def compared_scenario(scenario: Scenario) -> dict[str, Any]:
    """The part of a scenario that runs compared side by side must share: everything but the policy
    tables, the sweep table and the description (validated, so `1` and `1.0` are the same rate)."""
    out = scenario.model_dump(mode="json", exclude={"policies", "sweep", "description"})
    for key in ("cluster", "prices"):  # absent unless given: single-replica records stay as they were
        if not out.get(key):
            out.pop(key, None)
    if "cluster" in out:  # placement keys at their defaults: plain-TP fleet records stay as they were
        out["cluster"]["groups"] = [drop_default_placement(g) for g in out["cluster"]["groups"]]
    if out["model"].get("weight_group_size") is None:  # likewise: 16-bit records stay as they were
        out["model"].pop("weight_group_size", None)
    if not out["model"].get("allow_long_max_model_len"):  # likewise: records within the positions stay
        out["model"].pop("allow_long_max_model_len", None)
    return out


def scenario_hash(scenario: Scenario) -> str:
    text = json.dumps(compared_scenario(scenario), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def run_manifest(
    scenario: Scenario, policy: str, seed: int | np.random.SeedSequence | None = None
) -> dict[str, Any]:
    """What a run's records came from: scenario (and its hash), policy, seed and servesim version.

    No clock time or host: two identical runs write identical manifests.
    """
    kind, config = scenario.policy(policy)
    if isinstance(seed, np.random.SeedSequence):
        seed_record: Any = {"entropy": str(seed.entropy), "spawn_key": list(seed.spawn_key)}
    else:
        seed_record = scenario.seed if seed is None else seed
    return {
        "format": MANIFEST_FORMAT,
        "servesim": __version__,
        "scenario": scenario.name,
        "scenario_hash": scenario_hash(scenario),
        "policy": policy,
        "scheduler": kind,
        "policy_config": config.model_dump(mode="json"),
        "seed": seed_record,
        "compared": compared_scenario(scenario),
        "as_run": scenario.raw,
    }


def manifest_differences(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """What differs between the runs of two manifests that must agree to be compared (dotted keys)."""
    keys = ("servesim", "scenario_hash", "seed")
    if all(a.get(k) == b.get(k) for k in keys):
        return []
    found = differences(a.get("compared") or {}, b.get("compared") or {})
    for key in ("servesim", "seed"):
        if a.get(key) != b.get(key) and not (key == "seed" and any(k == "seed" for k, _, _ in found)):
            found.append((key, a.get(key), b.get(key)))
    return found or [("scenario_hash", a.get("scenario_hash"), b.get("scenario_hash"))]


def policy_folder(out_dir: Path, policy: str) -> Path:
    """Where `sim run` writes a policy's records: one safe folder name under `out_dir`."""
    return out_dir / path_component(policy, RESERVED_NAMES)


def is_run_folder(path: Path) -> bool:
    """Whether `path` holds a run's records (so `sim run` may replace it)."""
    return any((path / name).is_file() for name in (MANIFEST, *RUN_FILES))


def run_policy(
    scenario: Scenario,
    policy: str,
    base_dir: Path,
    seed: int | np.random.SeedSequence | None = None,
    source: str = "scenario",
    progress: ProgressHook | None = None,
    records: Path | None = None,
) -> RunResult:
    """Simulate `policy` of `scenario`. Every policy of a scenario sees the same request stream.

    `progress`, when given, is called every `PROGRESS_EVERY` arrivals and once at the end; without it the
    engine runs untouched. `records`: a folder to stream `requests.parquet` and `steps.parquet` into as the
    run goes (memory then stays flat however long the run; the result scans those files); without it the
    records are kept in memory as frames."""
    kind, config = scenario.policy(policy)
    if scenario.cluster is not None:
        return _run_fleet(scenario, policy, base_dir, seed, source, progress, records)
    engine = getattr(config, "engine", DEFAULT_ENGINE)
    cost, budget, info = build_cost_and_memory(scenario, source, engine=engine)
    run_seed = scenario.seed if seed is None else seed
    spec = speculative_setup(scenario, config, cost, budget, run_seed, base_dir, source)
    if spec is not None and spec.budget is not None:
        budget, info = spec.budget, {**info, **spec.replica_info()}
    lora: LoraRun | SLoraRun | None = None
    if getattr(config, "lora", None) is not None:
        lora = _lora_run(scenario, config, cost, source)
    if isinstance(lora, LoraRun) and scenario.model.num_kv_blocks is None:  # the LoRA slots take KV memory
        budget = KvBudget(lora.blocks_with, budget.block_size, budget.max_model_len)
        info.update(kv_blocks=budget.num_blocks, kv_tokens=budget.num_tokens)
    scheduler = load_all()[kind].build(config, budget)
    if kind == "slora":  # S-LoRA's adapters share the KV pool (sim/engine/slora.py)
        lora = _slora_run(scenario, policy, config, cost, scheduler, budget, source)
    sink = ParquetSink(records) if records is not None else None
    step_time, recorder = cost.step_time, Recorder(sink)
    if spec is not None:
        step_time = spec.step_time(cost, scheduler)
        recorder = spec.recorder(sink)
    elif lora is not None:
        step_time, recorder = lora.step_time, lora_recorder(lora, sink)
    workload = Workload(scenario.workload, scenario.seed if seed is None else seed, base_dir)
    drafts = scheduler.drafts_scheduled if spec is not None else None
    step_time = sampled_step_time(scenario, workload, cost, step_time, kind, drafts, policy, source)
    changes = rate_steps(scenario.workload.arrival)  # for the overload test, in the engine and the summary
    h = scenario.horizon
    horizon = Horizon(h.duration_s, h.max_requests, h.drain, h.max_waiting)
    loop, requests = None, None
    if workload.closed_loop is not None:
        cl = workload.closed_loop
        new_request = cl.new_request if progress is None else _counting(cl.new_request, progress)
        loop = ClosedLoopSource(cl.users, cl.think_time, new_request, cl.ramp_s)
    else:
        requests = workload.open_loop(h.max_requests, h.duration_s)
        if progress is not None:
            requests = _reporting(requests, progress)
    out = simulate(scheduler, step_time, horizon, requests, loop, recorder, changes)
    if progress is not None:
        progress(out.end_time, out.recorder.arrived)
    if records is None:
        req_frame: pl.DataFrame | pl.LazyFrame = out.recorder.requests_frame()
        step_frame: pl.DataFrame | pl.LazyFrame = out.recorder.steps_frame()
    else:
        req_frame, step_frame = out.recorder.requests_lazy(), out.recorder.steps_lazy()
    slo = Slo(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.e2e_s)
    gaps = out.recorder.itl_gaps()
    summary = summarize(req_frame, step_frame, out.end_time, slo, out.overloaded, changes, gaps)
    summary = {"scenario": scenario.name, "policy": policy, "scheduler": kind, **summary, "replica": info}
    if spec is not None:
        summary["speculative"] = spec.summary()
    if lora is not None:
        summary["lora"] = lora_summary(lora, step_frame)
    manifest = run_manifest(scenario, policy, seed)
    return RunResult(scenario.name, policy, req_frame, step_frame, summary, manifest)


def _lora_run(scenario: Scenario, config: Any, cost: CostModel, source: str) -> LoraRun:
    """The LoRA parts of a run whose policy serves adapters (sim/engine/lora.py)."""
    m = scenario.model
    kv = replica_kv_memory(m, cost.model, cost.gpu, source)
    try:
        return setup_lora(cost.model, cost.gpu, m.tp, cost, kv, config.lora, scenario.workload.lora)[0]
    except SimError as err:
        raise SimError(f"{source}: model: {err}") from None


def _slora_run(
    scenario: Scenario, policy: str, config: Any, cost: CostModel, scheduler: Any, budget: KvBudget,
    source: str,
) -> SLoraRun:  # fmt: skip
    """The LoRA parts of an `slora` run: its pool within the replica's KV memory, its adapters' cells."""
    kv = replica_kv_memory(scenario.model, cost.model, cost.gpu, source)
    if scheduler.pool.capacity > budget.num_tokens:
        raise SimError(
            f"{source}: policies.{policy}.max_total_token_num: {scheduler.pool.capacity:,} cells, more "
            f"than the {budget.num_tokens:,} tokens of KV this replica has (raise "
            f"model.gpu_memory_utilization or lower it)"
        )
    try:
        return setup_slora(cost.model, cost.gpu, scenario.model.tp, cost, kv.kv_bytes_per_token, config,
                           scenario.workload.lora, scheduler, budget.num_blocks)  # fmt: skip
    except SimError as err:
        raise SimError(f"{source}: {err}") from None


def _run_fleet(
    scenario: Scenario,
    policy: str,
    base_dir: Path,
    seed: int | np.random.SeedSequence | None,
    source: str,
    progress: ProgressHook | None,
    records: Path | None,
) -> RunResult:
    """`run_policy` of a scenario with `[cluster]` (see sim/fleet/run.py). With `records`, each replica
    streams its records under it, and they are merged into its `requests.parquet` and `steps.parquet`."""
    # imported here: a one-replica run does not load the fleet (its routers, its loop)
    from sim.fleet import run as fleet

    assert scenario.cluster is not None
    out, _, groups = fleet.simulate_fleet(scenario, policy, base_dir, seed, source, records)
    req_frame: Records
    step_frame: Records
    if records is None:
        req_frame, step_frame = fleet.fleet_frames(out, scenario.cluster.disaggregated)
    else:
        fleet.write_fleet_records(out, scenario.cluster.disaggregated, records)
        shutil.rmtree(records / fleet.REPLICA_RECORDS)
        req_frame, step_frame = (pl.scan_parquet(records / f) for f in ("requests.parquet", "steps.parquet"))
    if progress is not None:
        progress(out.end_time, sum(m.recorder.arrived for m in out.members if m.spec.role != "decode"))
    kind, _ = scenario.policy(policy)
    summary = fleet.fleet_summary(scenario, req_frame, step_frame, out, groups)
    summary = {"scenario": scenario.name, "policy": policy, "scheduler": kind, **summary}
    summary["replica"] = next(iter(groups.values()))
    manifest = run_manifest(scenario, policy, seed)
    return RunResult(scenario.name, policy, req_frame, step_frame, summary, manifest)


def _reporting(requests: Iterator[Request], progress: ProgressHook) -> Iterator[Request]:
    """The arrival stream, calling `progress(arrival time, count)` every `PROGRESS_EVERY` requests."""
    for count, req in enumerate(requests, 1):
        if count % PROGRESS_EVERY == 0:
            progress(req.arrival, count)
        yield req


def _counting(
    new_request: Callable[[float, int], Request], progress: ProgressHook
) -> Callable[[float, int], Request]:
    """A closed-loop request factory calling `progress(now, count)` every `PROGRESS_EVERY` requests."""
    count = 0

    def counted(now: float, user: int) -> Request:
        nonlocal count
        count += 1
        if count % PROGRESS_EVERY == 0:
            progress(now, count)
        return new_request(now, user)

    return counted


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False, default=float) + "\n"


def _write_records(frame: pl.DataFrame | pl.LazyFrame, path: Path) -> None:
    if isinstance(frame, pl.LazyFrame):
        frame.sink_parquet(path, statistics=False)
    else:
        frame.write_parquet(path, statistics=False)


def _write_meta(result: RunResult, folder: Path) -> None:
    (folder / "summary.json").write_text(_json(result.summary), encoding="utf-8")
    (folder / MANIFEST).write_text(_json(result.manifest), encoding="utf-8")


def write_result(result: RunResult, out_dir: Path) -> Path:
    """Write `manifest.json`, `requests.parquet`, `steps.parquet` and `summary.json` as one unit under
    `out_dir/<policy>/`: all four replace the previous run's at once, or nothing changes."""
    target = policy_folder(out_dir, result.policy)
    with replace_folder(target, is_run_folder) as tmp:
        _write_records(result.requests, tmp / "requests.parquet")
        _write_records(result.steps, tmp / "steps.parquet")
        _write_meta(result, tmp)
    return target


def run_to_folder(
    scenario: Scenario,
    policy: str,
    out_dir: Path,
    base_dir: Path,
    source: str = "scenario",
    progress: ProgressHook | None = None,
) -> RunResult:
    """`run_policy` with its records streamed to Parquet as the run goes, into a temporary folder that
    becomes `out_dir/<policy>/` (with `summary.json` and `manifest.json`) only when the run succeeds, as
    `write_result` does: the previous run's files are replaced at once, or nothing changes. The result scans
    the written files."""
    target = policy_folder(out_dir, policy)
    made = [p for p in (out_dir, *out_dir.parents) if not p.exists()]  # folders a failed run must not leave
    try:
        with replace_folder(target, is_run_folder) as tmp:
            result = run_policy(scenario, policy, base_dir, source=source, progress=progress, records=tmp)
            _write_meta(result, tmp)
    except BaseException:
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only while empty
        raise
    result.requests = pl.scan_parquet(target / "requests.parquet")
    result.steps = pl.scan_parquet(target / "steps.parquet")
    return result


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """A run folder's manifest, or None when it has none or it cannot be read."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
