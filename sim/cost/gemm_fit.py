"""GEMM and element-wise kernel parameters fitted per GPU to the catalog's kernel tables
(sim/catalog/profiles/<gpu>/gemm.csv, elementwise.csv), pooled over GPUs, and tested by leaving a GPU out.

The fit predicts with the cost model's own formulas (`gemm_seconds`, `elementwise_seconds`,
`elementwise_bytes` of sim/cost/kernels.py) at the profiled GPU's catalog peaks, so every efficiency is a
fraction of a peak and every fixed cost is seconds: both carry to a GPU without a profile (the transfer rule,
`sim.catalog.kernel_gpus`). Soft-L1 least squares on log(predicted / measured); in a pooled fit each GPU
weighs the same whatever its number of kernels.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.optimize import least_squares

from sim.catalog.gpus import get_gpu
from sim.cost.kernels import elementwise_bytes, elementwise_seconds, gemm_seconds

PROFILED = {"h200": "H200", "h100": "H100-SXM", "a100": "A100-80GB"}  # profile folder -> catalog GPU
GEMM_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_compute_eff": (0.3, 1.0),
    "gemm_bandwidth_eff": (0.3, 1.0),
    "kernel_fixed_s": (1e-6, 5e-5),
    "gemm_overlap_loss": (1e-4, 1.0),
    "gemm_m_half_tokens": (1e-2, 1e3),
    "gemm_n_half_cols": (1e-2, 1e4),
}
GEMM_START = {"gemm_compute_eff": 0.7, "gemm_bandwidth_eff": 0.85, "kernel_fixed_s": 5e-6,
              "gemm_overlap_loss": 0.3, "gemm_m_half_tokens": 16.0, "gemm_n_half_cols": 64.0}  # fmt: skip
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


def gemm_data(gpu: str, root: Path | None = None) -> Data:
    """A profiled GPU's 16-bit GEMMs as arrays: m, k, n, seconds, op."""
    rows = _read((root or profiles_root()) / gpu / "gemm.csv")
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


def predict_elementwise(p: Params, d: Data, gpu: str) -> np.ndarray:
    hbm = get_gpu(PROFILED[gpu]).hbm_bandwidth
    bw = np.select([d["op"] == op for op in ELEMENTWISE_OPS],
                   [hbm * p[f"elementwise_{op}_bandwidth_eff"] for op in ELEMENTWISE_OPS])  # fmt: skip
    fixed = np.select([d["op"] == op for op in ELEMENTWISE_OPS],
                      [p[f"elementwise_{op}_fixed_s"] for op in ELEMENTWISE_OPS])  # fmt: skip
    return elementwise_seconds(d["bytes"], bw, fixed)


Predictor = Callable[[Params, Data, str], np.ndarray]


def _solve(bounds: dict[str, tuple[float, float]], start: Params, predict: Predictor,
           sets: Sequence[tuple[str, Data]]) -> Params:  # fmt: skip
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


def fit_gemm(gpus: Sequence[str], root: Path | None = None) -> Params:
    """GEMM parameters fitted to the 16-bit GEMMs of `gpus` (one GPU: its own; several: pooled)."""
    return _solve(GEMM_BOUNDS, GEMM_START, predict_gemm, [(g, gemm_data(g, root)) for g in gpus])


def fit_elementwise(gpus: Sequence[str], root: Path | None = None) -> Params | None:
    """Element-wise parameters fitted to the GPUs of `gpus` that have element-wise profiles, or None."""
    sets = [(g, d) for g in gpus if (d := elementwise_data(g, root)) is not None]
    return _solve(ELEMENTWISE_BOUNDS, ELEMENTWISE_START, predict_elementwise, sets) if sets else None


def errors_by_op(predicted: np.ndarray, d: Data) -> dict[str, float]:
    """Median |predicted / measured - 1| in percent, per op kind and over all ("all")."""
    err = np.abs(predicted / d["seconds"] - 1.0) * 100.0
    out = {str(op): float(np.median(err[d["op"] == op])) for op in sorted(set(d["op"].tolist()))}
    out["all"] = float(np.median(err))
    return out


def leave_one_gpu_out(root: Path | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """For each profiled GPU: its kernels predicted from a pooled fit of the other GPUs (the transfer rule)
    and from its own fit, as median |error| % per op kind: {gpu: {"gemm_held_out": ..., "gemm_own": ...,
    "elementwise_held_out": ..., "elementwise_own": ...}} (element-wise only where profiled)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for gpu in PROFILED:
        others = [g for g in PROFILED if g != gpu]
        d = gemm_data(gpu, root)
        report = {
            "gemm_held_out": errors_by_op(predict_gemm(fit_gemm(others, root), d, gpu), d),
            "gemm_own": errors_by_op(predict_gemm(fit_gemm([gpu], root), d, gpu), d),
        }
        e = elementwise_data(gpu, root)
        held = fit_elementwise(others, root)
        if e is not None and held is not None:
            report["elementwise_held_out"] = errors_by_op(predict_elementwise(held, e, gpu), e)
            own = fit_elementwise([gpu], root)
            assert own is not None
            report["elementwise_own"] = errors_by_op(predict_elementwise(own, e, gpu), e)
        out[gpu] = report
    return out
