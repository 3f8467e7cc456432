"""Fidelity against real vLLM runs: one scenario per ground-truth row, simulated and compared.

The ground truth (`sim/catalog/ground_truth/calibration-experiments.csv`, copied from the project's reference
set) holds one measured vLLM experiment per row: server knobs, a `shared_prefix` workload with staged
exact-count arrivals, and whole-run latency figures in milliseconds. `row_scenario` turns a row into a
scenario mapping (stating every fallback it used), `predict` simulates it, `compare` gives per-metric errors.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sim.config.scenario import validate_scenario
from sim.io.errors import SimError
from sim.studies.executor import open_executor
from sim.studies.run import run_policy

# Measured prompts run 25–35 tokens (reasoning: ~45) longer than configured: the load tool decodes random
# token ids to text, which the server re-tokenizes into more tokens (the runs used the completion API, no chat
# template). Added to the question, after the shared system prompt.
RETOKENIZED_PROMPT_TOKENS = 30
# The load tool gives up on a request after this long: the overloaded runs' E2E p99 sit at 289–298 s.
CLIENT_TIMEOUT_S = 300.0
# Simulated time after the last stage ends (requests still running then count as in flight).
TAIL_S = CLIENT_TIMEOUT_S
# A run whose measured mean TTFT exceeds this was overloaded (queueing, not steady-state latency).
OVERLOAD_TTFT_MS = 10_000.0
# vLLM defaults used when a row does not record a knob (v0.15.1 as run by the load scripts).
VLLM_DEFAULTS: dict[str, float] = {"max_num_seqs": 128, "max_model_len": 4096, "gpu_mem_util": 0.9}
GPU_NAMES = {"H100": "H100-SXM"}
# `cpu_offload = True`: vLLM's KV offloading connector copies computed KV blocks to host memory and loads them
# back on a later prefix-cache hit. Those host blocks never hold a running sequence, so they add no GPU KV
# capacity; the simulator has no host-memory prefix tier, so the feature is left out (`cpu_kv_blocks` unused).
CPU_OFFLOAD_NOTE = "cpu_offload: host-memory KV offloading (a second prefix-cache tier) not modelled"
# The load tool (inference-perf's shared_prefix dataset) sends a fixed pool of groups x prompts-per-group
# whole prompts, cycling. The version these runs used read neither `num_unique_system_prompts` /
# `num_users_per_system_prompt` nor `enable_multi_turn_chat`: the config.yaml it resolved, published with the
# runs' results, gives its defaults, 10 groups x 10 prompts, single-turn. Every row is simulated so.
POOL_AS_RUN = (10, 10)
# Fixed latency per request outside the engine's steps (API server: HTTP, tokenization, detokenization and
# streaming), seen by the client in TTFT and E2E. Read from the `[frontend]` table of calibration.toml.
FRONTEND_KEY = "request_overhead_s"
METRICS = ("e2e_mean", "e2e_p90", "e2e_p99", "ttft_mean", "ttft_p90", "ttft_p99", "itl_mean")
# `overloaded` is the measurement's verdict (the only reason a row leaves the steady-state medians);
# `sim_overloaded` says whether the simulation saturated, for information only.
CSV_COLUMNS = (
    "exp_key", "metric", "predicted_ms", "measured_ms", "ape_pct", "signed_pct",
    "overloaded", "sim_overloaded",
)  # fmt: skip
# The bar the README states: median absolute % error over the steady-state rows of the shipped set with its
# stages shortened by BAR_SCALE (the cross-validated medians of the calibration that set it). A run of the
# whole shipped set at that scale that misses it fails (`make validate` exits non-zero); at another scale the
# medians differ (shorter stages hold fewer requests), so they are shown but not judged.
MEDIAN_BAR_PCT = {"e2e_mean": 3.8, "ttft_mean": 4.6, "itl_mean": 3.7}
BAR_SCALE = 0.25


def load_frontend(path: str | Path | None = None) -> float:
    """`[frontend] request_overhead_s` of a calibration file (default: the shipped one); 0 when absent."""
    import tomllib

    try:
        text = (
            Path(path).read_text()
            if path
            else (resources.files("sim") / "catalog" / "calibration.toml").read_text()
        )
    except OSError as exc:
        raise SimError(f"cannot read calibration file {path}: {exc}") from None
    return float(tomllib.loads(text).get("frontend", {}).get(FRONTEND_KEY, 0.0))


def default_csv() -> Path:
    """The shipped calibration set."""
    return Path(str(resources.files("sim") / "catalog" / "ground_truth" / "calibration-experiments.csv"))


@dataclass(frozen=True)
class GroundTruthRow:
    """One measured experiment: its raw CSV fields and the measured metrics (ms)."""

    exp_key: str
    fields: dict[str, str]

    def get(self, name: str) -> str:
        return (self.fields.get(name) or "").strip()

    def num(self, name: str) -> float | None:
        """The field as a number, or None when empty."""
        text = self.get(name)
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            raise SimError(f"ground truth row {self.exp_key}: {name}={text!r} is not a number") from None
        if not math.isfinite(value):
            raise SimError(f"ground truth row {self.exp_key}: {name}={text!r} is not a finite number")
        return value

    def need(self, name: str) -> float:
        value = self.num(name)
        if value is None:
            raise SimError(f"ground truth row {self.exp_key}: {name} is required")
        return value

    @property
    def model(self) -> str:
        return self.get("model_hf")

    @property
    def output_len(self) -> int:
        return int(self.need("output_len"))

    @property
    def measured_overloaded(self) -> bool:
        return self.need("ttft_mean_ms") > OVERLOAD_TTFT_MS

    def measured(self) -> dict[str, float]:
        """Measured metrics (ms). ITL is recomputed as (E2E mean − TTFT mean) / (output_len − 1) with the
        generated length (ignore_eos), since the load tool's own output count is sometimes short."""
        out = {m: self.need(f"{m}_ms") for m in METRICS if m != "itl_mean"}
        for m, value in out.items():  # the errors are relative to these
            if value <= 0:
                raise SimError(f"ground truth row {self.exp_key}: {m}_ms must be > 0 (got {value:g})")
        out["itl_mean"] = itl_from(out["e2e_mean"], out["ttft_mean"], self.output_len)
        return out


def itl_from(e2e_mean: float, ttft_mean: float, output_len: float) -> float:
    """The measurements' ITL: (E2E mean − TTFT mean) / (mean output length − 1)."""
    if output_len <= 1:
        return math.nan
    return (e2e_mean - ttft_mean) / (output_len - 1)


def load_rows(path: str | Path | None = None) -> list[GroundTruthRow]:
    """Read a ground-truth CSV (default: the shipped calibration set)."""
    path = Path(path) if path is not None else default_csv()
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            rows = [GroundTruthRow(r.get("exp_key", "").strip(), dict(r)) for r in reader]
    except OSError as exc:
        raise SimError(f"cannot read ground truth {path}: {exc}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise SimError(f"{path}: not a UTF-8 CSV file ({exc})") from None
    if not rows:
        raise SimError(f"{path}: no rows")
    required = ("exp_key", "model_hf", "gpu", "output_len", "e2e_mean_ms")
    missing = [c for c in required if c not in rows[0].fields]
    if missing:
        raise SimError(f"{path}: missing columns {missing}")
    return rows


def stages(row: GroundTruthRow, scale: float = 1.0) -> list[list[float]]:
    """[[rate, duration_s], ...]; `scale` shortens every stage alike (the stage mix is kept)."""
    out = [[row.need("stage0_rate_rps"), row.need("stage0_duration_s") * scale]]
    r1, d1 = row.num("stage1_rate_rps"), row.num("stage1_duration_s")
    if r1 is not None and d1 is not None:
        out.append([r1, d1 * scale])
    return out


def row_scenario(
    row: GroundTruthRow, scale: float = 1.0, calibration: dict[str, float] | None = None, seed: int = 0
) -> tuple[dict[str, Any], list[str]]:
    """The scenario mapping of a row and the fallbacks it used (one sentence each); `seed` the workload's."""
    notes: list[str] = []
    gpu = GPU_NAMES.get(row.get("gpu"), row.get("gpu"))
    tp = row.num("tp")  # 0 or a fraction is left for the scenario check to refuse
    tp_value = 1 if tp is None else int(tp) if tp.is_integer() else tp
    model: dict[str, Any] = {"name": row.model, "gpu": gpu, "tp": tp_value}
    precision = row.get("precision").upper()
    if precision == "FP8":
        model["weight_dtype"] = "fp8"
    elif precision not in ("", "FP16"):
        raise SimError(f"ground truth row {row.exp_key}: unknown precision {precision!r}")
    max_len = row.num("max_model_len")
    if max_len is None:
        max_len = VLLM_DEFAULTS["max_model_len"]
        notes.append(f"max_model_len {max_len:g} (vLLM default as run)")
    model["max_model_len"] = int(max_len)
    blocks = row.num("total_kv_blocks_gpu")
    util = row.num("gpu_mem_util")
    if util is None:
        util = VLLM_DEFAULTS["gpu_mem_util"]
        if blocks is None:
            notes.append(f"KV blocks from memory at gpu_mem_util {util:g} (vLLM default)")
    model["gpu_memory_utilization"] = util
    if blocks is not None:
        model["num_kv_blocks"] = int(blocks)
    if row.get("cpu_offload").lower() == "true":
        notes.append(CPU_OFFLOAD_NOTE)
    seqs = row.num("max_num_seqs")
    if seqs is None:
        seqs = VLLM_DEFAULTS["max_num_seqs"]
        notes.append(f"max_num_seqs {seqs:g} (as in these runs)")
    policy = {
        "scheduler": "vllm",
        "max_num_seqs": int(seqs),
        "max_num_batched_tokens": int(row.need("max_num_batched_tokens")),
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
    }
    st = stages(row, scale)
    stated = (
        int(row.num("num_unique_system_prompts") or 0),
        int(row.num("num_users_per_system_prompt") or 1),
    )
    multi_turn = row.get("enable_multi_turn_chat").lower() == "true"
    if stated != POOL_AS_RUN or multi_turn:
        notes.append(
            f"prompt pool {POOL_AS_RUN[0]} x {POOL_AS_RUN[1]}, single-turn, as the load tool ran it (the row "
            f"states {stated[0]} x {stated[1]}{', multi-turn' if multi_turn else ''})"
        )
    workload = {
        "shared_prefix": {
            "system_prompt_len": int(row.need("system_prompt_len")),
            "question_len": int(row.need("question_len")) + RETOKENIZED_PROMPT_TOKENS,
            "output_len": row.output_len,
            "num_unique_system_prompts": POOL_AS_RUN[0],
            "num_users_per_system_prompt": POOL_AS_RUN[1],
        },
        "ignore_eos": True,
        "arrival": {"kind": "staged", "stages": st, "exact_count": True},
    }
    data = {
        "name": "gt-" + "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in row.exp_key)[:80],
        "seed": seed,
        "model": model,
        "workload": workload,
        "policies": {"vllm": policy},
        "horizon": {"duration_s": sum(d for _, d in st) + TAIL_S},
        "calibration": {k: v for k, v in (calibration or {}).items() if k != FRONTEND_KEY},
    }
    return data, notes


@dataclass
class Prediction:
    exp_key: str
    predicted: dict[str, float]
    overloaded: bool
    notes: list[str] = field(default_factory=list)
    finished: int = 0
    arrived: int = 0


def metrics_from_latencies(ttft_s: np.ndarray, e2e_s: np.ndarray, output_len: float) -> dict[str, float]:
    """Whole-run metrics (ms) from per-request TTFT and E2E (s) of successful requests."""
    if e2e_s.size == 0:
        return {m: math.nan for m in METRICS}
    out: dict[str, float] = {}
    for name, arr in (("e2e", e2e_s), ("ttft", ttft_s)):
        out[f"{name}_mean"] = float(arr.mean()) * 1e3
        p90, p99 = np.quantile(arr, (0.9, 0.99))
        out[f"{name}_p90"], out[f"{name}_p99"] = float(p90) * 1e3, float(p99) * 1e3
    out["itl_mean"] = itl_from(out["e2e_mean"], out["ttft_mean"], output_len)
    return out


def successful(requests: pl.DataFrame) -> pl.DataFrame:
    """Finished requests within the client timeout (the load tool counts the rest as failures)."""
    finished = pl.col("state").cast(pl.String) == "finished"
    return requests.filter(finished & (pl.col("e2e") <= CLIENT_TIMEOUT_S))


def predict(
    row: GroundTruthRow, scale: float = 1.0, calibration: dict[str, float] | None = None, seed: int = 0
) -> Prediction:
    """Simulate one row with the vllm policy (workload seed `seed`)."""
    data, notes = row_scenario(row, scale, calibration, seed)
    scenario = validate_scenario(data, f"ground truth row {row.exp_key}")
    result = run_policy(scenario, "vllm", Path.cwd(), source=f"ground truth row {row.exp_key}")
    ok = successful(result.requests)
    out_len = float(ok["generated_tokens"].mean()) if ok.height else float(row.output_len)  # type: ignore[arg-type]
    extra = (calibration or {}).get(FRONTEND_KEY, load_frontend())
    predicted = metrics_from_latencies(ok["ttft"].to_numpy() + extra, ok["e2e"].to_numpy() + extra, out_len)
    overloaded = bool(result.summary["overloaded"]) or predicted["ttft_mean"] > OVERLOAD_TTFT_MS
    return Prediction(row.exp_key, predicted, overloaded, notes, ok.height, result.requests.height)


def errors(predicted: float, measured: float) -> tuple[float, float]:
    """(absolute percentage error, signed percentage error) of a prediction."""
    if not measured or math.isnan(predicted):
        return math.nan, math.nan
    signed = (predicted - measured) / measured * 100.0
    return abs(signed), signed


def compare(rows: Sequence[GroundTruthRow], preds: Sequence[Prediction]) -> pl.DataFrame:
    """One line per (row, metric): the `--out` fidelity.csv columns."""
    by_key = {p.exp_key: p for p in preds}
    lines = []
    for row in rows:
        p = by_key[row.exp_key]
        for metric, measured in row.measured().items():
            ape, signed = errors(p.predicted[metric], measured)
            lines.append(
                (row.exp_key, metric, p.predicted[metric], measured, ape, signed, row.measured_overloaded,
                 p.overloaded)
            )  # fmt: skip
    return pl.DataFrame(lines, schema=list(CSV_COLUMNS), orient="row")


def median_errors(frame: pl.DataFrame) -> pl.DataFrame:
    """Median APE and signed error per metric, steady-state rows and measured-overloaded rows apart.

    A prediction that saturates (or fails: NaN, counted as an infinite error) stays in its row's group."""
    return (
        frame.group_by("overloaded", "metric")
        .agg(
            pl.col("ape_pct").fill_nan(math.inf).median().alias("median_ape_pct"),
            pl.col("signed_pct").median().alias("median_signed_pct"),
            pl.len().alias("rows"),
        )
        .with_columns(pl.col("metric").replace_strict({m: i for i, m in enumerate(METRICS)}).alias("_o"))
        .sort("overloaded", "_o")
        .drop("_o")
    )


def _predict_task(args: tuple[GroundTruthRow, float, dict[str, float] | None, int]) -> Prediction:
    return predict(*args)


def predict_all(
    rows: Sequence[GroundTruthRow],
    scale: float = 1.0,
    calibration: dict[str, float] | Callable[[GroundTruthRow], dict[str, float]] | None = None,
    jobs: int = 1,
    done: Callable[[int], None] | None = None,
    seed: int = 0,
) -> list[Prediction]:
    """Simulate every row over `jobs` processes (the sweep's executor). `calibration` may depend on the
    row (cross-validation folds). `done(rows finished)`, if given, is called as rows finish."""
    tasks = [(r, scale, calibration(r) if callable(calibration) else calibration, seed) for r in rows]
    with open_executor("process", jobs, None) as executor:
        results = map(_predict_task, tasks) if executor is None else executor.map(_predict_task, tasks)
        preds = []
        for pred in results:
            preds.append(pred)
            if done is not None:
                done(len(preds))
        return preds


def select(rows: Iterable[GroundTruthRow], keys: Sequence[str]) -> list[GroundTruthRow]:
    """Rows whose exp_key contains any of `keys` (all when empty)."""
    rows = list(rows)
    if not keys:
        return rows
    chosen = [r for r in rows if any(k in r.exp_key for k in keys)]
    if not chosen:
        raise SimError(f"no ground-truth row matches {list(keys)}")
    return chosen
