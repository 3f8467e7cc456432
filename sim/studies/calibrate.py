"""Fit the cost model's calibration (`sim.config.calibration.Calibration`) to the steady-state ground-truth
rows.

A full simulation costs seconds to tens of seconds per row, so the fit re-costs recorded schedules instead of
re-simulating. Each row is simulated once with the current calibration, recording every step's roofline
terms (linear and attention FLOPs, prefill share, weight and KV bytes, tokens, rows) and, per request, the
steps it waited through, was scheduled in, and finished in. Step time is then a cheap vectorised function of
the calibration:

    max(linear FLOPs / (peak · eff(prefill share)), weight bytes / (HBM · bandwidth_eff))
    + max(attention FLOPs / (peak · eff(prefill share)), KV bytes / (HBM · kv_bandwidth_eff))
    + [TP > 1] allreduce_scale · (2L all-reduces of tokens · hidden · 2 bytes, as measured per GPU)
    + step_overhead_s + L · layer_overhead_s + rows · (per_row_overhead_s + vocabulary · sampler_s_per_entry)

and a request's TTFT / E2E are sums of its steps' re-costed durations (its wait before admission scaled with
the step it waited on). `scipy.optimize.least_squares` fits log-parameters to the measured E2E and TTFT
(mean and p90). The schedule itself depends on the step times (faster steps, smaller batches), so the rows
are re-simulated with the fitted values and refitted: a fixed-point iteration, two rounds in practice.

Cross-validation leaves out one model at a time (all its rows), fits on the rest by re-costing, and
re-simulates the held-out rows in full with that fold's values.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, fields
from importlib import resources
from pathlib import Path

import numpy as np
import polars as pl
from scipy.optimize import least_squares

from sim.config.calibration import Calibration, KernelCalibration
from sim.io.errors import SimError
from sim.io.outputs import write_text
from sim.records.stats import mean_ci
from sim.studies.calibration_trace import Params, Trace, latencies, recost, recost_prediction, trace_all
from sim.studies.validate import (
    FRONTEND_KEY,
    GroundTruthRow,
    Prediction,
    compare,
    default_csv,
    load_frontend,
    load_rows,
    median_errors,
    metrics_from_latencies,
    predict_all,
)


# Held, not fitted (`held`):
# - the compute efficiencies, at the 16-bit GEMM efficiency of the H200 kernel profile (`gemm_compute_eff`,
#   sim/cost/kernel_fit.py; H100 SXM has the same compute die and dense peak). The calibration rows' prompts
# come
#   mostly from the prefix cache (a pool of 100 prompts, cycling), so they cannot identify it: left free, it
#   sat on its 0.9 bound and ranged 0.34-0.9 across the folds;
# - the KV-cache bandwidth efficiency, at the profile's decode-attention efficiency (`kv_bandwidth_eff`): only
#   one model (Llama-2-7B, MHA) has KV traffic large enough to identify it, so the fold without it swung to
#   0.66 and its rows to +40%;
# - the per-row overhead, at zero: vLLM prepares a step's rows on the host while the previous step runs on
#   the GPU (asynchronous scheduling), so host work per row is not on the step's critical path; left free,
#   it traded against the KV term (0 to 13 µs a row across the folds);
# - the all-reduce scale, at one: the all-reduces are priced from each GPU's measured tables
#   (sim/cost/allreduce_pricing.py); left free, it absorbs what the TP rows miss elsewhere (docs/fidelity.md).
def held_values() -> dict[str, float]:
    """The HELD parameters' values: the kernel profile's efficiencies, no per-row host cost, the measured
    all-reduces as they are."""
    kernel = KernelCalibration.load()
    return {
        "compute_eff_prefill": kernel.gemm_compute_eff,
        "compute_eff_decode": kernel.gemm_compute_eff,
        "kv_bandwidth_eff": kernel.kv_bandwidth_eff,
        "per_row_overhead_s": 0.0,
        "allreduce_scale": 1.0,
    }


HELD = tuple(held_values())
# Free parameters and their physical bounds.
BOUNDS: dict[str, tuple[float, float]] = {
    "bandwidth_eff": (0.4, 0.95),
    "step_overhead_s": (1e-5, 1e-2),  # a GPU-side gap between steps (the host's work overlaps the step)
    "layer_overhead_s": (1e-7, 2e-4),
    "sampler_s_per_entry": (1e-12, 1e-8),  # per row and vocabulary entry: passes over the logits
    FRONTEND_KEY: (1e-4, 0.05),  # not a cost-model knob: added to every request's TTFT and E2E
}
# Residual weights: log(predicted / measured) of these metrics, per row. ITL mean (weight 1) and several
# starting points were tried and did not improve the cross-validated errors (docs/fidelity.md).
WEIGHTS = {"e2e_mean": 1.0, "ttft_mean": 1.0, "e2e_p90": 0.5, "ttft_p90": 0.5, "itl_mean": 0.0}
STARTS = 1  # least-squares starting points
STAGE_METRICS = ("e2e_mean", "e2e_p90", "ttft_mean", "ttft_p90")
StageFigures = tuple[tuple[float, ...], tuple[float, ...]]


def stage_measurements(path: Path | None = None) -> dict[str, StageFigures]:
    """Per-stage measurements (ms) of the two-stage runs, from calibration-runs-detail.csv: STAGE_METRICS of
    stage 0 and of stage 1, keyed by experiment. The fit uses them in place of the whole-run figures, so the
    high-rate stage is fitted on its own."""
    path = path or Path(
        str(resources.files("sim") / "catalog" / "ground_truth" / "calibration-runs-detail.csv")
    )
    stages: dict[str, dict[str, tuple[float, ...]]] = {}
    with path.open(newline="") as fh:
        for rec in csv.DictReader(fh):
            if rec["stage"] in ("stage_0", "stage_1"):
                figures = tuple(float(rec[f"{m}_ms"]) for m in STAGE_METRICS)
                stages.setdefault(rec["training_dir"], {})[rec["stage"]] = figures
    return {key: (s["stage_0"], s["stage_1"]) for key, s in stages.items() if len(s) == 2}


STAGE_MEASURED = stage_measurements()


def held(params: Params) -> Params:
    """`params` with the HELD parameters at their values (`held_values`)."""
    return params | held_values()


def params_of(cal: Calibration, overhead_s: float) -> Params:
    return asdict(cal) | {FRONTEND_KEY: overhead_s}


def _with(base: Params, names: Sequence[str], x: np.ndarray) -> Params:
    return base | {n: float(math.exp(v)) for n, v in zip(names, x, strict=True)}


def residuals(params: Params, traces: Sequence[Trace]) -> np.ndarray:
    """Weighted log(predicted / measured) per row and metric; per stage where STAGE_MEASURED has stages."""
    out = []
    for tr in traces:
        if tr.exp_key in STAGE_MEASURED:
            ttft, e2e = latencies(tr, params)
            first = tr.arrival < tr.stage0_end_s
            for mask, meas in zip((first, ~first), STAGE_MEASURED[tr.exp_key], strict=True):
                pred = metrics_from_latencies(ttft[mask], e2e[mask], tr.output_len)
                for metric, m in zip(STAGE_METRICS, meas, strict=True):
                    out.append(WEIGHTS[metric] * math.log(max(pred[metric], 1e-9) / m))
            continue
        pred = recost(tr, params)
        for metric, w in WEIGHTS.items():
            if w:
                out.append(w * math.log(max(pred[metric], 1e-9) / tr.measured[metric]))
    return np.asarray(out)


def fit(
    traces: Sequence[Trace], start: Params, names: Sequence[str] = tuple(BOUNDS), starts: int = STARTS
) -> Params:
    """Least-squares fit of the log-parameters `names` on re-costed traces (soft-L1 loss).

    Starts from `start` and from `starts - 1` further points drawn (fixed seed) in the log-bounds box;
    the lowest cost wins.
    """
    lo = np.log([BOUNDS[n][0] for n in names])
    hi = np.log([BOUNDS[n][1] for n in names])
    x0 = np.clip(np.log([max(start.get(n, 0.0), 1e-12) for n in names]), lo + 1e-9, hi - 1e-9)
    rng = np.random.default_rng(0)
    best = None
    for x in [x0, *(lo + (hi - lo) * rng.uniform(0.1, 0.9, len(names)) for _ in range(starts - 1))]:
        res = least_squares(
            lambda x: residuals(_with(start, names, x), traces),
            x,
            bounds=(lo, hi),
            loss="soft_l1",
            f_scale=0.1,
            diff_step=1e-3,
        )
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    return _with(start, names, best.x)


def calibrate(
    rows: Sequence[GroundTruthRow],
    scale: float = 0.25,
    rounds: int = 2,
    jobs: int = 1,
    start: Params | None = None,
    log: Callable[[str], None] = print,
    seed: int = 0,
) -> tuple[Params, list[Trace]]:
    """Fixed-point fit: simulate (workload seed `seed`), fit by re-costing, re-simulate with the fit;
    `rounds` times."""
    cal = start or held(params_of(Calibration.load(), load_frontend()))
    traces: list[Trace] = []
    for i in range(rounds):
        traces = trace_all(rows, scale, cal, jobs, seed)
        before = float(np.median(np.abs(residuals(cal, traces))))
        cal = fit(traces, cal)
        after = float(np.median(np.abs(residuals(cal, traces))))
        log(f"round {i + 1}: median |log error| {before:.3f} -> {after:.3f} (re-costed)")
    return cal, traces


def cross_validate(
    rows: Sequence[GroundTruthRow],
    traces: Sequence[Trace],
    start: Params,
    scale: float,
    jobs: int,
    seed: int = 0,
) -> tuple[dict[str, Params], list[Prediction]]:
    """Leave one model out: fit on the other models' traces, simulate the held-out rows in full."""
    folds: dict[str, Params] = {}
    for group in sorted({t.group for t in traces}):
        folds[group] = fit([t for t in traces if t.group != group], start)
    preds = predict_all(rows, scale, lambda r: folds[r.model], jobs, seed=seed)
    return folds, preds


def calibration_toml(params: Params, header: Sequence[str]) -> str:
    """`[calibration]` and `[frontend]` tables with a provenance header (comment lines)."""
    lines = [f"# {h}" if h else "#" for h in header]
    lines += ["", "[calibration]"]
    for f in fields(Calibration):
        lines.append(f"{f.name} = {params[f.name]:.4g}")
    lines += [
        "",
        "# Client-seen latency outside engine steps (API server); used by `sim validate` only.",
        "[frontend]",
    ]
    lines.append(f"{FRONTEND_KEY} = {params[FRONTEND_KEY]:.4g}")
    return "\n".join(lines) + "\n"


def error_summary(
    rows: Sequence[GroundTruthRow], preds: Sequence[Prediction]
) -> dict[str, tuple[float, float, float]]:
    """Per metric over the given (steady-state) rows: (median APE, median signed error, 90th percentile of
    the rows' APEs), a failed prediction counting as an infinite error."""
    frame = compare(rows, preds)
    med = median_errors(frame).filter(~pl.col("overloaded"))
    p90 = dict(
        frame.filter(~pl.col("overloaded"))
        .group_by("metric")
        .agg(pl.col("ape_pct").fill_nan(math.inf).quantile(0.9, interpolation="linear"))
        .rows()
    )
    cols = med.select("metric", "median_ape_pct", "median_signed_pct").rows()
    return {m: (a, s, p90[m]) for m, a, s in cols}


def error_lines(summary: dict[str, tuple[float, float, float]]) -> list[str]:
    """An `error_summary` as one line per metric."""
    return [f"{m}: {a:.1f}% (signed {s:+.1f}%), p90 {p:.1f}%" for m, (a, s, p) in summary.items()]


def replication_lines(summaries: Sequence[dict[str, tuple[float, float, float]]]) -> list[str]:
    """Per metric, the median and 90th-percentile errors of `error_summary` over replications: their means
    with Student-t 95% intervals, then each replication's 90th percentile."""
    lines = []
    for metric in summaries[0]:
        med = mean_ci([s[metric][0] for s in summaries])
        p90s = [s[metric][2] for s in summaries]
        top = mean_ci(p90s)
        lines.append(
            f"{metric}: median {med[0]:.1f}% [{med[1]:.1f}, {med[2]:.1f}], p90 {top[0]:.1f}% [{top[1]:.1f}, "
            f"{top[2]:.1f}] (each seed's p90: {', '.join(f'{p:.1f}' for p in p90s)})"
        )
    return lines


def today() -> str:
    return dt.date.today().isoformat()


def check_rows(rows: Sequence[GroundTruthRow]) -> list[GroundTruthRow]:
    steady = [r for r in rows if not r.measured_overloaded]
    if len({r.model for r in steady}) < 2:
        raise SimError("calibration needs steady-state rows of at least two models (for cross-validation)")
    return steady


def run_calibration(
    csv_path: Path | None,
    scale: float,
    rounds: int,
    cv_scale: float,
    jobs: int,
    write: Path | None,
    command: str,
    seeds: int = 1,
) -> Params:
    """`sim calibrate`: fit on the steady-state rows, cross-validate by model, write the TOML (seed 0's fit).
    With `seeds` > 1 the whole procedure is replicated on workload seeds 1 to seeds - 1 as well, and the
    cross-validated figures are given as means with 95% intervals over the seeds."""
    if not (0 < scale <= 1 and 0 < cv_scale <= 1) or rounds < 1 or seeds < 1:
        raise SimError("--scale and --cv-scale must be in (0, 1], --rounds >= 1, --seeds >= 1")
    rows = check_rows(load_rows(csv_path))
    start = held(params_of(Calibration.load(), load_frontend()))
    cal, traces = calibrate(rows, scale, rounds, jobs, start)
    in_fit = [recost_prediction(t, cal) for t in traces]
    folds, cv_preds = cross_validate(rows, traces, cal, cv_scale, jobs)
    insample = error_lines(error_summary(rows, in_fit))
    cv_summary = error_summary(rows, cv_preds)
    cv = error_lines(cv_summary)
    print("in-sample (re-costed, last round):", *insample, sep="\n  ")
    print(f"leave-one-model-out (simulated, stages x{cv_scale:g}):", *cv, sep="\n  ")
    replicated: list[str] = []
    if seeds > 1:
        summaries = [cv_summary]
        for seed in range(1, seeds):
            cal_s, traces_s = calibrate(
                rows, scale, rounds, jobs, start, lambda m, s=seed: print(f"seed {s}: {m}"), seed
            )
            summaries.append(
                error_summary(rows, cross_validate(rows, traces_s, cal_s, cv_scale, jobs, seed)[1])
            )
        replicated = replication_lines(summaries)
        print(
            f"leave-one-model-out over workload seeds 0-{seeds - 1}, mean [95% interval]:",
            *replicated,
            sep="\n  ",
        )
    header = [
        "Calibration of the roofline cost model (sim/cost/roofline.py), fitted by `sim calibrate` "
        "(sim/studies/calibrate.py,",
        "docs/fidelity.md) on the steady-state rows of the real vLLM measurements:",
        f"  data: {csv_path or default_csv().name}",
        f"  ({len(rows)} steady-state rows of {len(folds)} models on H100; overloaded rows left out)",
        f"  date: {today()}",
        f"  command: {command}",
        "  fit: soft-L1 least squares on log(predicted/measured) of E2E and TTFT mean (w 1) and p90 (w 0.5),",
        f"  per stage for the {len(STAGE_MEASURED)} two-stage rows of calibration-runs-detail.csv,",
        f"  re-costing recorded schedules, {rounds} fixed-point rounds, stages x{scale:g}.",
        "Median absolute error over the steady-state rows (signed), in-sample (re-costed):",
        *[f"  {line}" for line in insample],
        f"Leave-one-model-out cross-validation (held-out rows simulated, stages x{cv_scale:g}):",
        *[f"  {line}" for line in cv],
        *(
            [f"The same, fitted and cross-validated on workload seeds 0-{seeds - 1}, mean [95% interval]:"]
            if replicated
            else []
        ),
        *[f"  {line}" for line in replicated],
        "Fold values (model left out):",
        *[f"  {g}: " + ", ".join(f"{n}={c[n]:.3g}" for n in BOUNDS) for g, c in folds.items()],
        "Bounds of the fit: " + ", ".join(f"{n} [{lo:g}, {hi:g}]" for n, (lo, hi) in BOUNDS.items()),
        "Held, not fitted: "
        + ", ".join(f"{n} = {cal[n]:.4g}" for n in HELD)
        + " (compute: the H200 kernel profile's 16-bit GEMM efficiency; KV: its decode-attention efficiency,"
        " kernel_calibration.toml; per row: host work overlapped by asynchronous scheduling; all-reduce: the"
        " measured tables, sim/cost/allreduce_pricing.py)",
    ]
    text = calibration_toml(cal, header)
    if write is None:
        print(text)
    else:
        write_text(write, text)
        print(f"wrote {write}")
    return cal
