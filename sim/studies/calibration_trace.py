"""The calibration's data: each ground-truth row simulated once with its steps' roofline terms kept, and
re-costed
under new parameters without simulating again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.catalog.gpus import Gpu
from sim.config.calibration import Calibration
from sim.config.scenario import validate_scenario
from sim.cost.replica import build_cost_and_memory
from sim.cost.roofline import roofline_seconds
from sim.engine.replica import Horizon, simulate
from sim.engine.sampling import sampled_step_time
from sim.engine.schedulers.registry import load_all
from sim.studies.executor import open_executor
from sim.studies.validate import (
    FRONTEND_KEY,
    GroundTruthRow,
    Prediction,
    metrics_from_latencies,
    row_scenario,
    stages,
    successful,
)
from sim.workload.generator import Workload


@dataclass
class Trace:
    """One simulated row: per-step roofline terms and per-request step indices."""

    exp_key: str
    group: str
    output_len: int
    measured: dict[str, float]
    flops: np.ndarray  # the linear layers' FLOPs as charged
    attn_flops: np.ndarray  # attention's
    share: np.ndarray  # prefill share of the step's tokens
    weight_bytes: np.ndarray
    kv_bytes: np.ndarray  # KV-cache bytes read and written
    tokens: np.ndarray
    rows: np.ndarray
    duration: np.ndarray  # as simulated
    peak_flops: float
    hbm_bandwidth: float
    layers: int
    sort_entries: float  # vocabulary entries per row under the sampler's fitted sort term
    row_stream_s: float  # the sampler's other bytes per row, over the HBM rate
    history_stream_s: np.ndarray  # per step: the penalties' reads of every row's tokens, over the HBM rate
    allreduce_s: np.ndarray  # the step's all-reduces as measured (allreduce_scale = 1; 0 without TP)
    wait_step: np.ndarray  # step in flight at arrival (-1: none)
    wait_frac: np.ndarray  # its remaining fraction at arrival
    first_step: np.ndarray
    token_step: np.ndarray  # step that emitted the first token
    last_step: np.ndarray
    arrival: np.ndarray  # request arrival times (s)
    stage0_end_s: float  # end of the first arrival stage (simulated, shortened)
    gpu: Gpu  # the efficiencies re-costed are charged as this GPU reaches them (`Calibration.on_gpu`)


def trace_row(row: GroundTruthRow, scale: float, calibration: dict[str, float], seed: int = 0) -> Trace:
    """Simulate a row with the vllm policy (workload seed `seed`), recording what re-costing needs."""
    source = f"ground truth row {row.exp_key}"
    data, _ = row_scenario(row, scale, calibration, seed)
    scenario = validate_scenario(data, source)
    kind, config = scenario.policy("vllm")
    cost, budget, _ = build_cost_and_memory(scenario)
    scheduler = load_all()[kind].build(config, budget)
    workload = Workload(scenario.workload, scenario.seed, Path.cwd())
    terms: list[tuple[float, float, float, float, float, int, int, float, float]] = []

    def step_time(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        s = cost.step(new_tokens, context)
        prefill = s.tokens - int(np.count_nonzero(np.asarray(new_tokens) == 1))
        share = prefill / s.tokens if s.tokens else 0.0
        attn = s.attn_flops_charged
        ar = cost.allreduce_seconds(s.tokens)
        history = float(np.sum(context)) + s.tokens  # every row's prompt and output tokens
        kv = s.kv_read_bytes + s.kv_write_bytes
        terms.append((s.flops_charged - attn, attn, share, s.weight_bytes, kv, s.tokens, s.rows, ar, history))
        return s.seconds, s.compute_s > s.memory_s

    # the run's sampler as `sim run` prices it (a checkpoint's generation defaults; the workload has none)
    timed = sampled_step_time(scenario, workload, cost, step_time, kind, None, "vllm", source)
    h = scenario.horizon
    out = simulate(scheduler, timed, Horizon(h.duration_s), open_loop=workload.open_loop(None, h.duration_s))
    steps = out.recorder.steps_frame()
    t = np.asarray(terms[: steps.height], dtype=np.float64).reshape(-1, 9)
    start = steps["start"].to_numpy()
    dur = steps["duration"].to_numpy()
    end = start + dur
    ok = successful(out.recorder.requests_frame())
    arrival = ok["arrival"].to_numpy()
    first = np.searchsorted(start, ok["scheduled_at"].to_numpy() - 1e-12)
    wait = np.searchsorted(end, arrival, side="right")
    busy = wait < first
    w = wait.clip(0, len(dur) - 1)
    frac = np.where(busy, (end[w] - arrival) / np.maximum(dur[w], 1e-30), 0.0)
    return Trace(
        exp_key=row.exp_key,
        group=row.model,
        output_len=row.output_len,
        measured=row.measured(),
        flops=t[:, 0],
        attn_flops=t[:, 1],
        share=t[:, 2],
        weight_bytes=t[:, 3],
        kv_bytes=t[:, 4],
        tokens=t[:, 5],
        rows=t[:, 6],
        duration=dur,
        peak_flops=cost.peak_flops,
        hbm_bandwidth=cost.gpu.hbm_bandwidth,
        layers=cost.model.num_layers,
        sort_entries=cost.sampler.sort_entries,
        row_stream_s=cost.row_stream_s,
        history_stream_s=cost.token_stream_s * t[:, 8],
        allreduce_s=t[:, 7],
        wait_step=np.where(busy, wait, -1),
        wait_frac=frac,
        first_step=first,
        token_step=np.searchsorted(end, ok["first_token_at"].to_numpy() - 1e-9),
        last_step=np.searchsorted(end, ok["finished_at"].to_numpy() - 1e-9),
        arrival=arrival,
        stage0_end_s=stages(row, scale)[0][1],
        gpu=cost.gpu,
    )


def step_seconds(tr: Trace, cal: Calibration) -> np.ndarray:
    """Re-cost every step of a trace under `cal` (the cost model's own `roofline_seconds`, at the
    efficiencies as the trace's GPU reaches them)."""
    seconds, _ = roofline_seconds(
        cal.on_gpu(tr.gpu), tr.peak_flops, tr.hbm_bandwidth, tr.layers, tr.sort_entries, tr.allreduce_s,
        tr.flops, tr.attn_flops, tr.share, tr.weight_bytes, tr.kv_bytes, tr.rows, tr.row_stream_s,
        tr.history_stream_s,
    )  # fmt: skip
    return np.where(tr.tokens > 0, seconds, 0.0)


Params = dict[str, float]  # every Calibration field and the front-end overhead


def split(params: Params) -> tuple[Calibration, float]:
    cal = Calibration(**{k: v for k, v in params.items() if k != FRONTEND_KEY})
    return cal, params.get(FRONTEND_KEY, 0.0)


def latencies(tr: Trace, params: Params | Calibration) -> tuple[np.ndarray, np.ndarray]:
    """Per-request TTFT and E2E (s) of a trace with its steps re-costed under `params`."""
    cal, extra = split(params) if isinstance(params, dict) else (params, 0.0)
    d = step_seconds(tr, cal)
    csum = np.concatenate([[0.0], np.cumsum(d)])
    ws = np.maximum(tr.wait_step, 0)
    wait = np.where(tr.wait_step >= 0, tr.wait_frac * d[ws] + csum[tr.first_step] - csum[ws + 1], 0.0)
    ttft = extra + wait + csum[tr.token_step + 1] - csum[tr.first_step]
    e2e = extra + wait + csum[tr.last_step + 1] - csum[tr.first_step]
    return ttft, e2e


def recost(tr: Trace, params: Params | Calibration) -> dict[str, float]:
    """Whole-run metrics (ms) of a trace with its steps re-costed under `params`."""
    return metrics_from_latencies(*latencies(tr, params), tr.output_len)


def _trace_task(args: tuple[GroundTruthRow, float, dict[str, float], int]) -> Trace:
    return trace_row(*args)


def trace_all(
    rows: Sequence[GroundTruthRow], scale: float, params: Params, jobs: int, seed: int = 0
) -> list[Trace]:
    tasks = [(r, scale, params, seed) for r in rows]
    with open_executor("process", jobs, None) as executor:
        if executor is None:
            return [_trace_task(t) for t in tasks]
        return list(executor.map(_trace_task, tasks))


def recost_prediction(tr: Trace, cal: Params) -> Prediction:
    return Prediction(tr.exp_key, recost(tr, cal), overloaded=False)
