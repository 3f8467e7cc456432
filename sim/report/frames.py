"""Aggregations for the per-run charts: polars in, small long-format frames out (ready for altair)."""

from __future__ import annotations

import numpy as np
import polars as pl

from sim.report.inputs import PolicyRun

SEGMENTS = ("queued", "prefill", "decode", "padding")
CDF_POINTS = 201


def last_token_at(requests: pl.DataFrame) -> pl.Expr:
    """When a request emitted its own last token (the records keep its mean gap, not the time itself).

    `itl_mean` is (last token - first token) / (tokens per sequence - 1), so this is exact up to rounding.
    Under static batching `finished_at` is later: the slot is held as padding until the batch ends.
    """
    gaps = pl.col("generated_tokens") // pl.max_horizontal(pl.col("n"), pl.lit(1)) - 1
    return (pl.col("first_token_at") + pl.col("itl_mean").fill_null(0.0) * gaps.clip(lower_bound=0)).alias(
        "last_token_at"
    )


def run_end(run: PolicyRun) -> float:
    """The end of a run: its horizon, else its last step's end."""
    horizon = run.summary.get("horizon_s")
    if isinstance(horizon, int | float) and horizon > 0:
        return float(horizon)
    if run.steps.height:
        return float((run.steps["start"] + run.steps["duration"]).max())  # type: ignore[arg-type]
    return 0.0


def middle_window(runs: list[PolicyRun], size: int) -> list[int]:
    """`size` consecutive request ids from the middle of the stream (the same ids for every policy)."""
    ids = sorted(set.intersection(*(set(r.requests["id"].to_list()) for r in runs))) if runs else []
    if not ids:
        return []
    start = max(0, len(ids) // 2 - size // 2)
    return ids[start : start + size]


def timeline(runs: list[PolicyRun], size: int = 60) -> pl.DataFrame:
    """Gantt segments (policy, id, segment, start, end) for a middle window of requests.

    queued: arrival to scheduled; prefill: scheduled to first token; decode: first to own last token;
    padding: own last token to the response (static batching holds the slot until the batch ends).
    Unfinished requests run their open segment up to the end of the run.
    """
    ids = middle_window(runs, size)
    frames = []
    for run in runs:
        end = run_end(run)
        req = (
            run.requests.filter(pl.col("id").is_in(ids) & (pl.col("state").cast(pl.String) != "rejected"))
            .with_columns(last_token_at(run.requests))
            .with_columns(
                t1=pl.col("scheduled_at").fill_null(end),
                t2=pl.when(pl.col("scheduled_at").is_null())
                .then(None)
                .otherwise(pl.col("first_token_at").fill_null(end)),
                t3=pl.when(pl.col("first_token_at").is_null())
                .then(None)
                .when(pl.col("finished_at").is_null())
                .then(pl.lit(end))
                .otherwise(pl.col("last_token_at")),
            )
        )
        bounds = {
            "queued": ("arrival", "t1"),
            "prefill": ("scheduled_at", "t2"),
            "decode": ("first_token_at", "t3"),
            "padding": ("last_token_at", "finished_at"),
        }
        for segment, (lo, hi) in bounds.items():
            frames.append(
                req.select(
                    pl.lit(run.policy).alias("policy"),
                    "id",
                    "output_len",
                    pl.lit(segment).alias("segment"),
                    pl.col(lo).alias("start"),
                    pl.col(hi).alias("end"),
                ).filter(pl.col("start").is_not_null() & pl.col("end").is_not_null())
            )
    if not frames:
        return pl.DataFrame(
            schema={"policy": pl.String, "id": pl.Int64, "output_len": pl.Int64, "segment": pl.String,
                    "start": pl.Float64, "end": pl.Float64}
        )  # fmt: skip
    out = pl.concat(frames)
    # Padding shorter than a microsecond is rounding, not a held slot.
    return out.filter(pl.col("end") - pl.col("start") > 1e-6).sort("policy", "id", "start")


def cdfs(runs: list[PolicyRun], metrics: tuple[str, ...] = ("ttft", "e2e")) -> pl.DataFrame:
    """Empirical CDFs of finished requests' latencies: policy, metric, value, fraction."""
    fractions = np.linspace(0.0, 1.0, CDF_POINTS)
    rows: list[pl.DataFrame] = []
    for run in runs:
        fin = run.requests.filter(pl.col("state").cast(pl.String) == "finished")
        for metric in metrics:
            values = fin[metric].drop_nulls().to_numpy()
            if not len(values):
                continue
            rows.append(
                pl.DataFrame(
                    {
                        "policy": run.policy,
                        "metric": metric,
                        "value": np.quantile(values, fractions),
                        "fraction": fractions,
                    }
                )
            )
    if not rows:
        return pl.DataFrame(
            schema={"policy": pl.String, "metric": pl.String, "value": pl.Float64, "fraction": pl.Float64}
        )
    return pl.concat(rows)


MEASURES = {
    "batch size": pl.col("batch_size"),
    "waiting requests": pl.col("waiting"),
    "KV used (share)": pl.col("kv_used") / pl.col("kv_capacity"),
    "KV allocated (share)": pl.col("kv_allocated") / pl.col("kv_capacity"),
}


def bin_averages(start: np.ndarray, duration: np.ndarray, value: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Exact wall-time average of a per-step value over each bin (idle time counts as zero).

    The running integral of the value is piecewise linear in time (flat between steps), so evaluating
    it at the bin edges splits a step that spans several bins in proportion.
    """
    total = np.cumsum(value * duration)
    times = np.column_stack([start, start + duration]).ravel()
    integral = np.column_stack([total - value * duration, total]).ravel()
    at_edges = np.interp(edges, times, integral, left=0.0, right=float(total[-1]))
    return np.diff(at_edges) / np.diff(edges)


def timeseries(runs: list[PolicyRun], bins: int = 200) -> pl.DataFrame:
    """Wall-time averages per time bin: policy, time, measure, value (see `bin_averages`)."""
    frames = []
    for run in runs:
        end = run_end(run)
        if run.steps.is_empty() or end <= 0:
            continue
        edges = np.linspace(0.0, end, bins + 1)
        columns = _fleet_averages(run.steps, edges) if "replica" in run.steps.columns else None
        if columns is None:
            steps = run.steps.sort("start").select("start", "duration", **MEASURES)
            start, duration = steps["start"].to_numpy(), steps["duration"].to_numpy()
            columns = {
                name: bin_averages(start, duration, steps[name].cast(pl.Float64).to_numpy(), edges)
                for name in MEASURES
            }
        frames.append(
            pl.DataFrame({"policy": run.policy, "time": (edges[:-1] + edges[1:]) / 2, **columns}).unpivot(
                index=["policy", "time"], on=list(MEASURES), variable_name="measure", value_name="value"
            )
        )
    if not frames:
        return pl.DataFrame(
            schema={"policy": pl.String, "time": pl.Float64, "measure": pl.String, "value": pl.Float64}
        )
    return pl.concat(frames)


def replica_averages(steps: pl.DataFrame, edges: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """`bin_averages` of each measure, replica by replica (a replica's steps never overlap)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for (name,), part in steps.sort("replica", "start").group_by("replica", maintain_order=True):
        sel = part.select("start", "duration", **MEASURES)
        start, duration = sel["start"].to_numpy(), sel["duration"].to_numpy()
        out[str(name)] = {
            m: bin_averages(start, duration, sel[m].cast(pl.Float64).to_numpy(), edges) for m in MEASURES
        }
    return out


def _fleet_averages(steps: pl.DataFrame, edges: np.ndarray) -> dict[str, np.ndarray]:
    """A fleet's bin averages: batch size and waiting summed over replicas, KV shares averaged."""
    per = list(replica_averages(steps, edges).values())
    return {
        m: (np.mean if "share" in m else np.sum)([p[m] for p in per], axis=0)  # type: ignore[operator]
        for m in MEASURES
    }


KV_PARTS = ("token states", "reserved, unused", "free")


def kv_shares(runs: list[PolicyRun]) -> pl.DataFrame:
    """Time-averaged KV memory split over busy time: policy, part, share (the parts sum to 1)."""
    rows = []
    for run in runs:
        s = run.steps
        if s.is_empty():
            continue
        total = float((s["kv_capacity"] * s["duration"]).sum())
        if total <= 0:
            continue
        used = float((s["kv_used"] * s["duration"]).sum()) / total
        allocated = float((s["kv_allocated"] * s["duration"]).sum()) / total
        for part, share in zip(KV_PARTS, (used, allocated - used, 1.0 - allocated), strict=True):
            rows.append({"policy": run.policy, "part": part, "share": share, "order": KV_PARTS.index(part)})
    if not rows:
        return pl.DataFrame(
            schema={"policy": pl.String, "part": pl.String, "share": pl.Float64, "order": pl.Int64}
        )
    return pl.DataFrame(rows)
