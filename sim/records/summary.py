"""The run summary: latency statistics, throughput, SLO attainment and KV use, from the records (polars).

Rates (throughput, goodput, busy fraction) are per second of one measurement window (`measurement_window`):
from the first arrival to the last completion, or to the horizon while requests are still in flight.
Overload is a test of queue growth (`sim.records.overload.backlog_trend`), the same with or without drain.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from sim.records.columns import CHUNK_ROWS, FINISHED, IN_FLIGHT, LATENCY_METRICS, QUANTILES, REJECTED
from sim.records.overload import requests_backlog_trend


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


Records = pl.DataFrame | pl.LazyFrame  # in memory, or scanned from the written Parquet files


def _columns(records: Records, *names: str, finished: bool = False) -> pl.DataFrame:
    """Only `names` of `records` (of the finished requests when `finished`), as one contiguous frame: a
    summary over files never loads more than the columns one figure needs."""
    lazy = records.lazy()
    if finished:
        lazy = lazy.filter(pl.col("state").cast(pl.String) == FINISHED)
    return lazy.select(names).collect().rechunk()


def _sums(steps: Records, exprs: dict[str, pl.Expr]) -> dict[str, object]:
    """One row of exact step aggregates (counts, integer sums, maxima), streamed over files."""
    engine = "streaming" if isinstance(steps, pl.LazyFrame) else "auto"
    return steps.lazy().select(**exprs).collect(engine=engine).row(0, named=True)


def _float_agg(
    steps: Records, values: pl.Expr, names: tuple[str, ...], count: int, mean: bool = False
) -> float:
    """The sum (or mean) of the float `values` computed from the columns `names` of `count` steps.

    Up to `CHUNK_ROWS` steps (every shipped scenario), over the whole contiguous column, exactly as over a
    frame in memory; beyond, summed in slices of `CHUNK_ROWS` rows added in order, so that memory stays
    flat: the result may then differ from a one-piece sum in its last digits (summation order)."""
    agg = values.mean() if mean else values.sum()
    lazy = steps.lazy().select(names)
    if count <= CHUNK_ROWS:
        return float(lazy.collect().rechunk().select(agg).item())
    total = 0.0
    for offset in range(0, count, CHUNK_ROWS):
        total += float(lazy.slice(offset, CHUNK_ROWS).collect().rechunk().select(values.sum()).item())
    return total / count if mean else total


QUANTILE_BINS = 4096  # bins of the first pass of `_weighted_quantiles`


def _weighted_quantiles(steps: Records, gaps: Records | None = None) -> dict[str, float | None]:
    """Quantiles of the decode steps' durations, each weighted by its decode tokens, with the rows of `gaps`
    (`duration`, `decode_tokens`: the waits' corrections, `Recorder.itl_gaps`) pooled in: for quantile q,
    the shortest duration whose cumulative weight (sorted by duration) reaches q times the total. A
    correction's weight may be -1, always against a step of the same duration counted +1 or more, so every
    cumulative weight stays a count of gaps.

    Exact, in streamed passes that never hold every step: the weights summed in `QUANTILE_BINS` equal bins
    of duration (the bin of a duration never decreases with it, so the bins keep the steps' order); then,
    per quantile, only the steps of the bin it falls in, summed per distinct duration and sorted."""
    engine = "streaming" if isinstance(steps, pl.LazyFrame) else "auto"
    dec = steps.lazy().filter(pl.col("decode_tokens") > 0).select("duration", "decode_tokens")
    if gaps is not None and gaps.lazy().select(pl.len()).collect().item():
        weight = pl.col("decode_tokens").cast(pl.Int64)
        extra = gaps.lazy().select("duration", weight)
        dec = pl.concat([dec.with_columns(weight), extra], parallel=False)
    lo, hi, count = (
        dec.select(lo=pl.col("duration").min(), hi=pl.col("duration").max(), n=pl.len())
        .collect(engine=engine)
        .row(0)
    )
    if not count:
        return {k: None for k in QUANTILES}
    width = (hi - lo) / QUANTILE_BINS
    if width <= 0:
        return {k: float(lo) for k in QUANTILES}
    binned = ((pl.col("duration") - lo) / width).floor().cast(pl.Int64).clip(0, QUANTILE_BINS - 1)
    bins = (
        dec.group_by(binned.alias("bin"))
        .agg(pl.col("decode_tokens").sum())
        .sort("bin")
        .collect(engine=engine)
    )
    cum = bins["decode_tokens"].cum_sum().to_numpy()
    out: dict[str, float | None] = {}
    for key, q in QUANTILES.items():
        target = q * float(cum[-1])
        j = int(np.searchsorted(cum.astype(np.float64), target, side="left"))
        below = int(cum[j - 1]) if j else 0
        rows = (
            dec.filter(binned == int(bins["bin"][j]))
            .group_by("duration")
            .agg(pl.col("decode_tokens").sum())
            .sort("duration")
            .collect()
        )
        weights = (rows["decode_tokens"].cum_sum() + below).to_numpy().astype(np.float64)
        i = int(np.searchsorted(weights, target, side="left"))
        out[key] = float(rows["duration"][min(i, rows.height - 1)])
    return out


def _itl_stats(requests: Records, steps: Records, waits: Records | None = None) -> dict[str, float | None]:
    """ITL, each token's time since its request's previous token (vLLM's benchmark's `itls`, pooled): mean
    and max over the finished requests, from their exact figures; the quantiles over every emitted token,
    the step durations weighted by the decode tokens each step emitted, corrected by `waits` for the tokens
    that ended a wait of more than one step (`Recorder.itl_gaps`, sim/records/recorder.py).

    The weighted quantiles are exact (`_weighted_quantiles`)."""
    fin = _columns(requests, "generated_tokens", "n", "itl_mean", "itl_max", finished=True)
    num_steps = _step_count(steps)
    if fin.is_empty() or not num_steps:
        return _stats(pl.Series([], dtype=pl.Float64))
    gaps = (fin["generated_tokens"] - fin["n"]).sum()
    total = (fin["itl_mean"].fill_null(0.0) * (fin["generated_tokens"] - fin["n"])).sum()
    out: dict[str, float | None] = {"mean": float(total / gaps) if gaps else None}
    out.update(_weighted_quantiles(steps, waits))
    out["max"] = fin["itl_max"].max()  # type: ignore[assignment]
    return out


def _kv_used_held(steps: Records, busy: float, count: int) -> tuple[float, float]:
    cap = pl.col("kv_capacity").cast(pl.Float64)
    w = pl.col("duration") / busy
    used = _float_agg(steps, w * pl.col("kv_used") / cap, ("duration", "kv_used", "kv_capacity"), count)
    held = w * pl.col("kv_allocated") / cap
    return used, _float_agg(steps, held, ("duration", "kv_allocated", "kv_capacity"), count)


def _kv_shares(busy: float, used: float, held: float) -> dict[str, float]:
    if busy <= 0:
        return {"token_states": 0.0, "held_unused": 0.0, "free": 1.0}
    return {"token_states": used, "held_unused": held - used, "free": 1.0 - held}


def _step_count(steps: Records) -> int:
    return int(_sums(steps, {"n": pl.len()})["n"])  # type: ignore[call-overload]


def _busy(steps: Records, count: int) -> float:
    return _float_agg(steps, pl.col("duration"), ("duration",), count) if count else 0.0


def slo_figures(requests: Records, slo: Slo, window_s: float) -> dict[str, float | None]:
    """`goodput_per_s`, the finished requests within `slo` per second of the measurement window
    (`window_s`; none without one), and `slo_attainment`, their share of the finished requests (None
    without any): the figures a run's summary judges by its SLO."""
    good = _columns(requests, "ttft", "tpot", "e2e", finished=True)
    finished = good.height
    if slo.ttft_s is not None:
        good = good.filter(pl.col("ttft") <= slo.ttft_s)
    if slo.tpot_s is not None:
        good = good.filter(pl.col("tpot").fill_null(0.0) <= slo.tpot_s)
    if slo.e2e_s is not None:
        good = good.filter(pl.col("e2e") <= slo.e2e_s)
    span = window_s if window_s > 0 else math.inf  # no window: every rate is 0
    return {
        "goodput_per_s": good.height / span,
        "slo_attainment": good.height / finished if finished else None,
    }


def kv_breakdown(steps: Records) -> dict[str, float]:
    """Time-weighted shares of KV capacity while the engine runs: token states actually stored, slots held
    but unused (reserved-but-unused memory, or the paged allocator's internal fragmentation), and free."""
    count = _step_count(steps)
    busy = _busy(steps, count)
    return _kv_shares(busy, *(_kv_used_held(steps, busy, count) if busy > 0 else (0.0, 0.0)))


def summarize(
    requests: Records,
    steps: Records,
    horizon_s: float,
    slo: Slo,
    overloaded: bool,
    rate_steps: tuple[float, ...] = (),
    itl_gaps: Records | None = None,
) -> dict[str, object]:
    """The stable `summary.json` contract (times in seconds). Keys may be added, never renamed.

    `horizon_s` is where the run ended (its horizon, or the end of the drain); every rate is per second of
    `measurement_window`. `overloaded` is the engine's verdict (`RunOutput.overloaded`), from the same
    `backlog_trend` whose figures are `overload_test`. `itl_gaps`: the recorder's corrections of the
    pooled ITL for requests that sat out steps (`Recorder.itl_gaps`). The records may be frames or scans of
    the written files: each figure reads only its own columns, and quantiles are exact (numpy's linear
    method over the column's values).
    """
    base = _columns(requests, "state", "reject_reason", "arrival", "finished_at")
    state = base["state"].cast(pl.String)
    finished = int((state == FINISHED).sum())
    counts = {
        "arrived": base.height,
        "finished": finished,
        "rejected": int((state == REJECTED).sum()),
        "in_flight": int((state == IN_FLIGHT).sum()),
    }
    reasons = base.filter(state == REJECTED).group_by("reject_reason").len().sort("reject_reason").rows()
    window_start, window_end = measurement_window(base, horizon_s)
    trend = requests_backlog_trend(base, rate_steps)
    del base, state
    window = window_end - window_start
    span = window if window > 0 else math.inf  # no window: every rate is 0
    tokens = _columns(requests, "generated_tokens", "prompt_len", "prefix_hit_tokens", "prefix_query_tokens",
                      finished=True)  # fmt: skip
    out_tokens = float(tokens["generated_tokens"].sum())
    all_tokens = out_tokens + float(tokens["prompt_len"].sum())
    # vLLM's prefix-cache hit rate: tokens found / tokens looked up, over the same lookups (one per sequence,
    # at its first admission), so it lies in [0, 1]
    lookups = int(tokens["prefix_query_tokens"].sum()) if finished else 0
    hit_rate = float(tokens["prefix_hit_tokens"].sum() / lookups) if lookups else 0.0
    del tokens
    latency = {
        name: _stats(_columns(requests, name, finished=True)[name]) for name in ("ttft", "tpot", "e2e")
    }
    latency["queue_wait"] = _stats(_columns(requests, "queue_wait")["queue_wait"])
    latency["itl"] = _itl_stats(requests, steps, itl_gaps)
    s = _sums(steps, {
        "count": pl.len(),
        "mean_batch": pl.col("batch_size").mean(),
        "compute_bound": pl.col("compute_bound").mean(),
        "preemptions": pl.col("preempted").sum(),
        "max_batch": pl.col("batch_size").max(),
    })  # fmt: skip
    count = int(s["count"])  # type: ignore[call-overload]
    busy = _busy(steps, count)
    util = pl.col("kv_used") / pl.col("kv_capacity")
    kv_util = _float_agg(steps, util, ("kv_used", "kv_capacity"), count, mean=True) if count else 0.0
    used, held = _kv_used_held(steps, busy, count) if busy > 0 else (0.0, 0.0)
    return {
        "requests": counts,
        "rejected_reasons": {str(reason): n for reason, n in reasons},
        "overloaded": overloaded,
        "overload_test": None if trend is None else trend.as_dict(),
        "horizon_s": horizon_s,
        "window_s": window,
        "window": {"start_s": window_start, "end_s": window_end},
        "throughput": {
            "requests_per_s": finished / span,
            "output_tokens_per_s": out_tokens / span,
            "total_tokens_per_s": all_tokens / span,
        },
        "latency": {name: latency[name] for name in LATENCY_METRICS},
        **slo_figures(requests, slo, window),
        "steps": {
            "count": count,
            "busy_fraction": busy / span,
            "mean_batch_size": float(s["mean_batch"]) if count else 0.0,  # type: ignore[arg-type]
            "compute_bound_fraction": float(s["compute_bound"]) if count else 0.0,  # type: ignore[arg-type]
            "preemptions": int(s["preemptions"] or 0),  # type: ignore[call-overload]
            "mean_kv_utilization": kv_util,
            "max_batch_size": int(s["max_batch"]) if count else 0,  # type: ignore[call-overload]
        },
        "kv_memory": _kv_shares(busy, used, held),
        "prefix_cache_hit_rate": hit_rate,
    }


def latency_counts(requests: Records) -> dict[str, int]:
    """How many requests each latency of `summarize` covers (a figure's coverage, not part of the summary):
    queue wait, every request scheduled at least once (a request still queued at the end has none); TTFT,
    TPOT and E2E, the finished requests with a value (a one-token output has no TPOT); ITL, the finished
    requests with more than one token, whose gaps its mean and max are taken over."""
    done = pl.col("state").cast(pl.String) == FINISHED
    exprs = {
        "queue_wait": pl.col("queue_wait").is_not_null().sum(),
        **{name: (done & pl.col(name).is_not_null()).sum() for name in ("ttft", "tpot", "e2e")},
        "itl": (done & (pl.col("generated_tokens") > pl.col("n"))).sum(),
    }
    row = _columns(requests, "state", "queue_wait", "ttft", "tpot", "e2e", "generated_tokens", "n").select(
        **exprs
    )
    return {name: int(row[name][0]) for name in LATENCY_METRICS}


def measurement_window(requests: pl.DataFrame, end_time: float) -> tuple[float, float]:
    """`(start, end)` of the span every rate is measured over: from the first arrival to the last completion
    (or rejection), or to `end_time`, the horizon, while requests are still in flight at it."""
    if requests.is_empty():
        return 0.0, max(end_time, 0.0)
    start = float(requests["arrival"].min())  # type: ignore[arg-type]
    if (requests["state"].cast(pl.String) == IN_FLIGHT).any():
        return start, max(end_time, start)
    end = float(requests["arrival"].max())  # type: ignore[arg-type]
    last_finish = requests["finished_at"].max()
    if last_finish is not None and float(last_finish) > end:  # type: ignore[arg-type]
        end = float(last_finish)  # type: ignore[arg-type]
    return start, end
