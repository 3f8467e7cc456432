"""GEMM and element-wise kernel parameters fitted per GPU to the catalog's kernel tables, pooled over GPUs,
and tested by leaving a GPU out.

Two GEMM data sets (`DATASETS`): `aiconfigurator` (sim/catalog/profiles/<gpu>/aiconfigurator/gemm.csv:
NVIDIA aiconfigurator's vLLM GEMMs, one method on every GPU, in a CUDA graph) and `profiles`
(profiles/<gpu>/gemm.csv: the H200 profile, L2 flushed, and Vidur's H100/A100, CUDA events). `SHIPPED`
names the one each GPU's shipped parameters are fitted to. Element-wise kernels only in Vidur's
(profiles/<gpu>/elementwise.csv).

The fit predicts with the cost model's own formulas (`gemm_seconds`, `elementwise_seconds`,
`elementwise_bytes` of sim/cost/kernels.py) at the profiled GPU's catalog peaks, so every efficiency is a
fraction of a peak and every fixed cost is seconds: both carry to a GPU without a profile (the transfer rule,
`sim.catalog.kernel_gpus`). Soft-L1 least squares on log(predicted / measured); in a pooled fit each GPU
weighs the same whatever its number of kernels.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.optimize import least_squares

from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import generation as gpu_generation
from sim.cost.kernels import elementwise_bytes, elementwise_seconds, gemm_seconds
from sim.io.errors import SimError

PROFILED = {"h200": "H200", "h100": "H100-SXM", "a100": "A100-80GB", "l40s": "L40S", "b200": "B200"}  # folder
# GEMM data sets: the sub-folder of profiles/<gpu>/ holding gemm.csv, the GPUs left out one at a time (POOL)
# and the GPUs with a table but no part in that test, predicted from the whole pool (TRANSFER)
DATASETS = {"aiconfigurator": "aiconfigurator", "profiles": ""}
POOL = ("h200", "h100", "a100")
TRANSFER = {"aiconfigurator": ("l40s", "b200"), "profiles": ()}
# the data set each GPU's shipped GEMM parameters (sim/catalog/kernel_gpus.toml) are fitted to: the H200's own
# profile, which its whole served steps (steps.csv) confirm and aiconfigurator's H200 table does not
SHIPPED = {"h200": "profiles", "h100": "aiconfigurator", "a100": "aiconfigurator", "l40s": "aiconfigurator",
           "b200": "aiconfigurator"}  # fmt: skip
GEMM_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_compute_eff": (0.3, 1.0),
    "gemm_bandwidth_eff": (0.3, 1.0),
    "kernel_fixed_s": (1e-6, 5e-5),
    "gemm_overlap_loss": (1e-4, 1.0),
    "gemm_m_half_tokens": (1e-2, 1e3),
    "gemm_n_half_cols": (1e-2, 1e4),
    "gemm_n_half_mem_cols": (1e-2, 1e4),
}
GEMM_START = {"gemm_compute_eff": 0.7, "gemm_bandwidth_eff": 0.85, "kernel_fixed_s": 5e-6,
              "gemm_overlap_loss": 0.3, "gemm_m_half_tokens": 16.0, "gemm_n_half_cols": 64.0,
              "gemm_n_half_mem_cols": 64.0}  # fmt: skip
ELEMENTWISE_OPS = ("norm", "add", "rope", "act")
ELEMENTWISE_BOUNDS: dict[str, tuple[float, float]] = {}
ELEMENTWISE_START: dict[str, float] = {}
for _op in ELEMENTWISE_OPS:  # each kind its own achieved bandwidth and fixed cost
    ELEMENTWISE_BOUNDS |= {
        f"elementwise_{_op}_bandwidth_eff": (0.05, 1.0),
        f"elementwise_{_op}_fixed_s": (1e-7, 5e-5),
    }
    ELEMENTWISE_START |= {f"elementwise_{_op}_bandwidth_eff": 0.6, f"elementwise_{_op}_fixed_s": 3e-6}
Data = dict[str, np.ndarray]
Params = dict[str, float]


def profiles_root() -> Path:
    return Path(str(resources.files("sim") / "catalog" / "profiles"))


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def generation(gpu: str) -> str | None:
    """A profiled GPU's generation (sim.catalog.kernel_gpus.generation: 8 Ampere and Ada, 9 Hopper, ...)."""
    return gpu_generation(get_gpu(PROFILED[gpu]))


def gemm_data(gpu: str, root: Path | None = None, dataset: str | None = None) -> Data:
    """A profiled GPU's 16-bit GEMMs of data set `dataset` (default: its `SHIPPED` one) as arrays: m, k, n,
    seconds, op."""
    path = (root or profiles_root()) / gpu / DATASETS[dataset or SHIPPED[gpu]] / "gemm.csv"
    if not path.is_file():
        raise SimError(f"{path}: no GEMM table (run `sim kernels --import-aiconfigurator DIR`)")
    rows = _read(path)
    out = {c: np.array([float(r[c]) for r in rows]) for c in ("m", "k", "n", "seconds")}
    out["op"] = np.array([r["op"] for r in rows])
    return out


def elementwise_data(gpu: str, root: Path | None = None) -> Data | None:
    """A profiled GPU's element-wise kernels as arrays (bytes per kernel, seconds, op), or None."""
    path = (root or profiles_root()) / gpu / "elementwise.csv"
    if not path.is_file():
        return None
    rows = _read(path)
    cols = {c: np.array([float(r[c]) for r in rows]) for c in ("m", "hidden", "qk_width", "inter_width",
                                                               "gated", "seconds")}  # fmt: skip
    op = np.array([r["op"] for r in rows])
    per_token = elementwise_bytes(cols["hidden"], cols["qk_width"], cols["inter_width"], cols["gated"])
    nbytes = np.select([op == k for k in per_token], [per_token[k] for k in per_token]) * cols["m"]
    return {"bytes": nbytes, "seconds": cols["seconds"], "op": op}


def predict_gemm(p: Params, d: Data, gpu: str) -> np.ndarray:
    g = get_gpu(PROFILED[gpu])
    shape = SimpleNamespace(**p)
    return gemm_seconds(d["m"], d["k"], d["n"], 2.0, g.flops_16bit * p["gemm_compute_eff"],
                        g.hbm_bandwidth * p["gemm_bandwidth_eff"], p["kernel_fixed_s"], shape)  # fmt: skip


def predict_elementwise(p: Params, d: Data, gpu: str, ratio: float = 1.0) -> np.ndarray:
    """`gpu`'s element-wise kernels at the bandwidths of `p` times `ratio` (`fit_elementwise`'s `ratios`)."""
    hbm = get_gpu(PROFILED[gpu]).hbm_bandwidth * ratio
    bw = np.select([d["op"] == op for op in ELEMENTWISE_OPS],
                   [hbm * p[f"elementwise_{op}_bandwidth_eff"] for op in ELEMENTWISE_OPS])  # fmt: skip
    fixed = np.select([d["op"] == op for op in ELEMENTWISE_OPS],
                      [p[f"elementwise_{op}_fixed_s"] for op in ELEMENTWISE_OPS])  # fmt: skip
    return elementwise_seconds(d["bytes"], bw, fixed)


Predictor = Callable[[Params, Data, str], np.ndarray]


def solve(bounds: dict[str, tuple[float, float]], start: Params, predict: Predictor,
          sets: Sequence[tuple[str, Data]]) -> Params:  # fmt: skip
    """Soft-L1 least squares on log(predicted / measured) within `bounds` from `start`, each GPU of `sets`
    weighing the same whatever its number of kernels."""
    names = list(bounds)
    lo, hi = np.log([bounds[n][0] for n in names]), np.log([bounds[n][1] for n in names])
    x0 = np.clip(np.log([start[n] for n in names]), lo + 1e-9, hi - 1e-9)

    def residuals(x: np.ndarray) -> np.ndarray:
        p = {n: float(math.exp(v)) for n, v in zip(names, x, strict=True)}
        return np.concatenate(
            [np.log(predict(p, d, gpu) / d["seconds"]) / math.sqrt(d["seconds"].size) for gpu, d in sets]
        )

    res = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05 / 30.0)
    return {n: float(math.exp(v)) for n, v in zip(names, res.x, strict=True)}


def fit_gemm(gpus: Sequence[str], root: Path | None = None, dataset: str | None = None) -> Params:
    """GEMM parameters fitted to the 16-bit GEMMs of `gpus` (one GPU: its own; several: pooled), of data set
    `dataset` (default: each GPU's `SHIPPED` one). `gemm_n_half_mem_cols` is fitted where aiconfigurator's
    GEMMs are in the fit (timed in a graph, they show it) and held at 0 on the isolated profiles alone."""
    names = [dataset or SHIPPED[g] for g in gpus]
    bounds, start = dict(GEMM_BOUNDS), dict(GEMM_START)
    if "aiconfigurator" not in names:
        del bounds["gemm_n_half_mem_cols"], start["gemm_n_half_mem_cols"]

    def predict(p: Params, d: Data, gpu: str) -> np.ndarray:
        return predict_gemm({"gemm_n_half_mem_cols": 0.0} | p, d, gpu)

    p = solve(bounds, start, predict, [(g, gemm_data(g, root, n)) for g, n in zip(gpus, names, strict=True)])
    return p | {"gemm_n_half_mem_cols": p.get("gemm_n_half_mem_cols", 0.0)}


def fit_elementwise(
    gpus: Sequence[str], root: Path | None = None, ratios: Mapping[str, float] | None = None
) -> Params | None:
    """Element-wise parameters fitted to the GPUs of `gpus` that have element-wise profiles, or None. With
    `ratios` ({folder: its weight-streaming efficiency over the reference GPU's, `sim.cost.serving_ratios`})
    the bandwidths are the reference GPU's: each GPU's kernels are predicted at its ratio times them, so a
    GPU's memory system carries over as its measured GEMMs stream weights (`scaled_elementwise`)."""
    sets = [(g, d) for g in gpus if (d := elementwise_data(g, root)) is not None]
    if not sets:
        return None

    def predict(p: Params, d: Data, gpu: str) -> np.ndarray:
        return predict_elementwise(p, d, gpu, ratios[gpu] if ratios else 1.0)

    return solve(ELEMENTWISE_BOUNDS, ELEMENTWISE_START, predict, sets)


def scaled_elementwise(p: Params, ratio: float) -> Params:
    """Element-wise parameters of the reference GPU (`fit_elementwise` with `ratios`) on a GPU whose
    weight-streaming ratio is `ratio`: each bandwidth times it (at most the peak), fixed costs as they are."""
    return {k: min(1.0, v * ratio) if k.endswith("_bandwidth_eff") else v for k, v in p.items()}


def errors_by_op(predicted: np.ndarray, d: Data) -> dict[str, float]:
    """Median |predicted / measured - 1| in percent, per op kind and over all ("all")."""
    err = np.abs(predicted / d["seconds"] - 1.0) * 100.0
    out = {str(op): float(np.median(err[d["op"] == op])) for op in sorted(set(d["op"].tolist()))}
    out["all"] = float(np.median(err))
    return out


def rule_pool(gpu: str, pool: Sequence[str]) -> list[str]:
    """The transfer rule's GPUs for `gpu`: those of `pool` of its generation, else all of `pool`."""
    same = [g for g in pool if g != gpu and generation(g) == generation(gpu)]
    return same or [g for g in pool if g != gpu]


def leave_one_gpu_out(
    root: Path | None = None, dataset: str = "aiconfigurator", ratios: Mapping[str, float] | None = None
) -> dict[str, dict[str, object]]:
    """For each GPU of `POOL`: its GEMMs predicted by the transfer rule from the other two (`rule_pool`:
    the same generation's, else both), from a pooled fit of both, and from its own fit; each GPU of
    `TRANSFER[dataset]` predicted by the rule from the whole pool. Median |error| % per op kind:
    {gpu: {"rule": [GPUs], "gemm_held_out": ..., "gemm_pooled": ..., "gemm_own": ..., and where profiled
    "elementwise_held_out", "elementwise_own"}}. Element-wise kernels held out are predicted from the
    other profiled GPUs at the weight-streaming `ratios` (`fit_elementwise`, `scaled_elementwise`), as
    shipped; without them, at the other GPUs' fractions of peak."""
    out: dict[str, dict[str, object]] = {}
    for gpu in (*POOL, *TRANSFER[dataset]):
        others = [g for g in POOL if g != gpu]
        rule = rule_pool(gpu, others)
        d = gemm_data(gpu, root, dataset)
        report: dict[str, object] = {
            "rule": rule,
            "gemm_held_out": errors_by_op(predict_gemm(fit_gemm(rule, root, dataset), d, gpu), d),
            "gemm_pooled": errors_by_op(predict_gemm(fit_gemm(others, root, dataset), d, gpu), d),
            "gemm_own": errors_by_op(predict_gemm(fit_gemm([gpu], root, dataset), d, gpu), d),
        }
        e = elementwise_data(gpu, root)
        held = fit_elementwise(others, root, ratios)
        if e is not None and held is not None:
            as_shipped = scaled_elementwise(held, ratios[gpu]) if ratios else held
            report["elementwise_held_out"] = errors_by_op(predict_elementwise(as_shipped, e, gpu), e)
            own = fit_elementwise([gpu], root)
            assert own is not None
            report["elementwise_own"] = errors_by_op(predict_elementwise(own, e, gpu), e)
        out[gpu] = report
    return out
