"""One run: a scenario and one of its policies in, request and step records and a summary out."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sim.capacity import kv_memory
from sim.cost import Calibration, CostModel
from sim.engine import ClosedLoopSource, Horizon, simulate
from sim.errors import SimError
from sim.hardware import get_gpu
from sim.metrics import Slo, summarize
from sim.model import load_model
from sim.scenario import Scenario
from sim.schedulers.registry import KvBudget, load_all
from sim.workload import Workload


@dataclass(slots=True)
class RunResult:
    scenario: str
    policy: str
    requests: pl.DataFrame
    steps: pl.DataFrame
    summary: dict[str, Any]


def calibration_for(scenario: Scenario) -> Calibration:
    base = Calibration.load()
    known = {f.name for f in fields(Calibration)}
    unknown = sorted(set(scenario.calibration) - known)
    if unknown:
        raise SimError(f"calibration: unknown keys {unknown}; known: {sorted(known)}")
    return replace(base, **scenario.calibration)


def build_cost_and_memory(
    scenario: Scenario, source: str = "scenario"
) -> tuple[CostModel, KvBudget, dict[str, Any]]:
    """The replica's cost model and KV budget, and the memory figures for the summary."""
    m = scenario.model
    try:
        model = load_model(m.name)
    except SimError as err:
        raise SimError(f"{source}: model.name: {err}") from None
    try:
        gpu = get_gpu(m.gpu)
    except SimError as err:
        raise SimError(f"{source}: model.gpu: {err}") from None
    cost = CostModel(model, gpu, m.tp, m.weight_dtype, m.kv_dtype, calibration_for(scenario))
    try:
        mem = kv_memory(model, gpu, m.tp, m.gpu_memory_utilization, m.weight_dtype, m.kv_dtype, m.block_size)
    except SimError as err:
        raise SimError(f"{source}: model: {err}") from None
    blocks = (m.num_kv_blocks if m.num_kv_blocks is not None else mem.num_blocks) + m.cpu_offload_blocks
    info = {
        "model": m.name,
        "gpu": gpu.name,
        "tp": m.tp,
        "kv_blocks": blocks,
        "block_size": m.block_size,
        "kv_tokens": blocks * m.block_size,
        "kv_bytes_per_token": mem.kv_bytes_per_token,
    }
    return cost, KvBudget(blocks, m.block_size, m.max_model_len), info


def run_policy(
    scenario: Scenario,
    policy: str,
    base_dir: Path,
    seed: int | np.random.SeedSequence | None = None,
    source: str = "scenario",
) -> RunResult:
    """Simulate `policy` of `scenario`. Every policy of a scenario sees the same request stream."""
    kind, config = scenario.policy(policy)
    cost, budget, info = build_cost_and_memory(scenario, source)
    scheduler = load_all()[kind].build(config, budget)
    workload = Workload(scenario.workload, scenario.seed if seed is None else seed, base_dir)
    h = scenario.horizon
    horizon = Horizon(h.duration_s, h.max_requests, h.drain, h.max_waiting)
    if workload.closed_loop is not None:
        cl = workload.closed_loop
        source = ClosedLoopSource(cl.users, cl.think_time, cl.new_request, cl.ramp_s)
        out = simulate(scheduler, cost.step_time, horizon, closed_loop=source)
    else:
        requests = workload.open_loop(h.max_requests, h.duration_s)
        out = simulate(scheduler, cost.step_time, horizon, open_loop=requests)
    req_frame = out.recorder.requests_frame()
    step_frame = out.recorder.steps_frame()
    slo = Slo(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.e2e_s)
    summary = summarize(req_frame, step_frame, out.end_time, slo, out.overloaded)
    summary = {"scenario": scenario.name, "policy": policy, "scheduler": kind, **summary, "replica": info}
    return RunResult(scenario.name, policy, req_frame, step_frame, summary)


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_result(result: RunResult, out_dir: Path) -> Path:
    """Write `requests.parquet`, `steps.parquet` and `summary.json` atomically under `out_dir/<policy>/`."""
    target = out_dir / result.policy
    _atomic_write(target / "requests.parquet", lambda p: result.requests.write_parquet(p, statistics=False))
    _atomic_write(target / "steps.parquet", lambda p: result.steps.write_parquet(p, statistics=False))
    text = json.dumps(result.summary, indent=2, sort_keys=True, allow_nan=False, default=float)
    _atomic_write(target / "summary.json", lambda p: Path(p).write_text(text + "\n"))
    return target


def write_scenario(scenario: Scenario, out_dir: Path) -> Path:
    """Record the scenario as run (overrides applied) as `out_dir/scenario.json`."""
    path = out_dir / "scenario.json"
    text = json.dumps(scenario.raw, indent=2, sort_keys=True)
    _atomic_write(path, lambda p: Path(p).write_text(text + "\n"))
    return path
