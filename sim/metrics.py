"""Per-request and per-step records, and the run summary.

Records are kept in flat typed columns (`array.array`), never as per-token objects, so a run of millions of
requests stays within a few hundred MB. They become polars frames at the end.

Inter-token latency: a request's gaps are the durations of the steps that emitted its tokens. For static and
continuous batching every step between a request's first and last token emits one of its tokens, so its gap
distribution is exactly the step durations over that range; under preemption (vLLM policy) the mean and max
are still exact (tracked by `Request.emit`), and p50/p99 come from the steps of the range.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np
import polars as pl

from sim.request import Request
from sim.schedulers.base import StepPlan

FINISHED, REJECTED, IN_FLIGHT = "finished", "rejected", "in_flight"
LATENCY_METRICS = ("queue_wait", "ttft", "itl", "tpot", "e2e")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}

_REQUEST_FLOAT_COLUMNS = (
    "arrival", "scheduled_at", "first_token_at", "finished_at", "queue_wait", "ttft", "e2e", "tpot",
    "itl_mean", "itl_p50", "itl_p99", "itl_max", "normalized_latency",
)  # fmt: skip
_REQUEST_INT_COLUMNS = (
    "id", "prompt_len", "output_len", "max_tokens", "n", "generated_tokens", "preemptions", "prefix_group",
    "prefix_hit_tokens",
)  # fmt: skip
_STEP_FLOAT_COLUMNS = ("start", "duration")
_STEP_INT_COLUMNS = (
    "batch_size", "prefill_tokens", "decode_tokens", "kv_used", "kv_allocated", "kv_capacity", "preempted",
    "compute_bound",
)  # fmt: skip


class _GrowingFloats:
    """A float64 buffer that doubles when full, so searches over past values stay in numpy."""

    def __init__(self) -> None:
        self.data = np.empty(1024)
        self.size = 0

    def append(self, value: float) -> None:
        if self.size == len(self.data):
            self.data = np.concatenate([self.data, np.empty(len(self.data))])
        self.data[self.size] = value
        self.size += 1

    @property
    def view(self) -> np.ndarray:
        return self.data[: self.size]


class Recorder:
    """Collects request and step records during a run."""

    def __init__(self) -> None:
        self.req_f = {name: array("d") for name in _REQUEST_FLOAT_COLUMNS}
        self.req_i = {name: array("q") for name in _REQUEST_INT_COLUMNS}
        self.state: list[str] = []
        self.reason: list[str | None] = []
        self.step_f = {name: array("d") for name in _STEP_FLOAT_COLUMNS}
        self.step_i = {name: array("q") for name in _STEP_INT_COLUMNS}
        self.step_ends = _GrowingFloats()
        self.step_waiting = array("q")
        self.arrived = 0

    # --- steps -------------------------------------------------------------------------------------------
    def step(self, start: float, duration: float, plan: StepPlan, compute_bound: bool, waiting: int) -> None:
        f, i = self.step_f, self.step_i
        f["start"].append(start)
        f["duration"].append(duration)
        i["batch_size"].append(plan.batch_size)
        i["prefill_tokens"].append(plan.num_prefill_tokens)
        i["decode_tokens"].append(plan.num_decode_tokens)
        i["kv_used"].append(plan.kv.used)
        i["kv_allocated"].append(plan.kv.allocated)
        i["kv_capacity"].append(plan.kv.capacity)
        i["preempted"].append(plan.preempted)
        i["compute_bound"].append(int(compute_bound))
        self.step_waiting.append(waiting)
        self.step_ends.append(start + duration)

    # --- requests ----------------------------------------------------------------------------------------
    def request(self, req: Request, state: str) -> None:
        """Record a request once, when it finishes, is rejected, or is still in flight at the horizon."""
        nan = math.nan
        ttft = req.first_token_at - req.arrival
        e2e = req.finished_at - req.arrival if state == FINISHED else nan
        gaps = req.num_generated - 1
        itl_mean = (req.last_token_at - req.first_token_at) / gaps if gaps > 0 else nan
        tpot = (e2e - ttft) / gaps if gaps > 0 and state == FINISHED else nan
        itl_p50 = itl_p99 = nan
        itl_max = req.itl_max if gaps > 0 else nan
        if gaps > 0:
            ends = self.step_ends.view
            lo = int(np.searchsorted(ends, req.first_token_at, side="right"))
            hi = int(np.searchsorted(ends, req.last_token_at, side="right"))
            window = np.asarray(self.step_f["duration"][lo:hi]) if hi > lo else None
            if window is not None and len(window):
                itl_p50, itl_p99 = np.quantile(window, (0.5, 0.99)).tolist()
                itl_max = max(itl_max, float(window.max()))
        values = {
            "arrival": req.arrival,
            "scheduled_at": req.scheduled_at,
            "first_token_at": req.first_token_at,
            "finished_at": req.finished_at if state == FINISHED else nan,
            "queue_wait": req.scheduled_at - req.arrival,
            "ttft": ttft,
            "e2e": e2e,
            "tpot": tpot,
            "itl_mean": itl_mean,
            "itl_p50": itl_p50,
            "itl_p99": itl_p99,
            "itl_max": itl_max,
            "normalized_latency": e2e / (req.num_generated * req.n) if req.num_generated else nan,
        }
        for name, col in self.req_f.items():
            col.append(values[name])
        ints = {
            "id": req.id,
            "prompt_len": req.prompt_len,
            "output_len": req.output_len,
            "max_tokens": req.max_tokens,
            "n": req.n,
            "generated_tokens": req.num_generated * req.n,
            "preemptions": req.preemptions,
            "prefix_group": req.prefix_group,
            "prefix_hit_tokens": req.prefix_hit_tokens,
        }
        for name, col in self.req_i.items():
            col.append(ints[name])
        self.state.append(state)
        self.reason.append(req.reject_reason)

    # --- frames ------------------------------------------------------------------------------------------
    def requests_frame(self) -> pl.DataFrame:
        cols: dict[str, object] = {
            name: np.frombuffer(col, dtype=np.int64) for name, col in self.req_i.items()
        }
        cols.update({name: np.frombuffer(col, dtype=np.float64) for name, col in self.req_f.items()})
        cols["state"] = pl.Series(self.state, dtype=pl.Categorical)
        cols["reject_reason"] = pl.Series(self.reason, dtype=pl.String)
        frame = pl.DataFrame(cols).sort("id")
        return frame.with_columns(pl.col(pl.Float64).fill_nan(None))

    def steps_frame(self) -> pl.DataFrame:
        cols: dict[str, object] = {
            name: np.frombuffer(col, dtype=np.float64) for name, col in self.step_f.items()
        }
        cols.update({name: np.frombuffer(col, dtype=np.int64) for name, col in self.step_i.items()})
        cols["waiting"] = np.frombuffer(self.step_waiting, dtype=np.int64)
        frame = pl.DataFrame(cols).with_columns(pl.col("compute_bound").cast(pl.Boolean))
        return frame.with_row_index("step")


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None


def _stats(values: pl.Series) -> dict[str, float | None]:
    values = values.drop_nulls()
    if values.is_empty():
        return {"mean": None, **{k: None for k in QUANTILES}, "max": None}
    arr = values.to_numpy()
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for key, q in zip(QUANTILES, np.quantile(arr, list(QUANTILES.values())), strict=True):
        out[key] = float(q)
    out["max"] = float(arr.max())
    return out


def _itl_stats(requests: pl.DataFrame, steps: pl.DataFrame) -> dict[str, float | None]:
    """ITL over every gap of every finished request: the step durations weighted by the decode tokens
    each step emitted (see the module docstring); mean and max from the exact per-request figures."""
    fin = requests.filter(pl.col("state") == FINISHED)
    if fin.is_empty() or steps.is_empty():
        return _stats(pl.Series([], dtype=pl.Float64))
    gaps = (fin["generated_tokens"] - fin["n"]).sum()
    total = (fin["itl_mean"].fill_null(0.0) * (fin["generated_tokens"] - fin["n"])).sum()
    dec = steps.filter(pl.col("decode_tokens") > 0).sort("duration")
    out: dict[str, float | None] = {"mean": float(total / gaps) if gaps else None}
    if dec.is_empty():
        out.update({k: None for k in QUANTILES})
    else:
        weights = dec["decode_tokens"].cum_sum().to_numpy().astype(np.float64)
        durations = dec["duration"].to_numpy()
        for key, q in QUANTILES.items():
            idx = int(np.searchsorted(weights, q * weights[-1], side="left"))
            out[key] = float(durations[min(idx, len(durations) - 1)])
    out["max"] = fin["itl_max"].max()  # type: ignore[assignment]
    return out


def summarize(
    requests: pl.DataFrame, steps: pl.DataFrame, horizon_s: float, slo: Slo, overloaded: bool
) -> dict[str, object]:
    """The stable `summary.json` contract (times in seconds). Keys may be added, never renamed."""
    state = requests["state"].cast(pl.String)
    fin = requests.filter(state == FINISHED)
    counts = {
        "arrived": requests.height,
        "finished": fin.height,
        "rejected": int((state == REJECTED).sum()),
        "in_flight": int((state == IN_FLIGHT).sum()),
    }
    reasons = requests.filter(state == REJECTED).group_by("reject_reason").len().sort("reject_reason").rows()
    span = horizon_s if horizon_s > 0 else 1.0
    out_tokens = float(fin["generated_tokens"].sum())
    all_tokens = out_tokens + float(fin["prompt_len"].sum())
    latency = {name: _stats(fin[name]) for name in ("queue_wait", "ttft", "tpot", "e2e")}
    latency["queue_wait"] = _stats(requests["queue_wait"])
    latency["itl"] = _itl_stats(requests, steps)
    good = fin
    if slo.ttft_s is not None:
        good = good.filter(pl.col("ttft") <= slo.ttft_s)
    if slo.tpot_s is not None:
        good = good.filter(pl.col("tpot").fill_null(0.0) <= slo.tpot_s)
    if slo.e2e_s is not None:
        good = good.filter(pl.col("e2e") <= slo.e2e_s)
    busy = float(steps["duration"].sum()) if steps.height else 0.0
    kv_util = (
        float((steps["kv_used"] / steps["kv_capacity"]).mean()) if steps.height else 0.0  # type: ignore[arg-type]
    )
    return {
        "requests": counts,
        "rejected_reasons": {str(reason): n for reason, n in reasons},
        "overloaded": overloaded,
        "horizon_s": horizon_s,
        "throughput": {
            "requests_per_s": fin.height / span,
            "output_tokens_per_s": out_tokens / span,
            "total_tokens_per_s": all_tokens / span,
        },
        "latency": {name: latency[name] for name in LATENCY_METRICS},
        "goodput_per_s": good.height / span,
        "slo_attainment": good.height / fin.height if fin.height else None,
        "steps": {
            "count": steps.height,
            "busy_fraction": busy / span,
            "mean_batch_size": float(steps["batch_size"].mean()) if steps.height else 0.0,  # type: ignore[arg-type]
            "compute_bound_fraction": float(steps["compute_bound"].mean()) if steps.height else 0.0,  # type: ignore[arg-type]
            "preemptions": int(steps["preempted"].sum()),
            "mean_kv_utilization": kv_util,
        },
        "prefix_cache_hit_rate": (
            float(fin["prefix_hit_tokens"].sum() / fin["prompt_len"].sum()) if fin.height else 0.0
        ),
    }
