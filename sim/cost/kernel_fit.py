"""Kernel parameters of `sim.cost.kernel_model` fitted to a GPU's measured kernels
(sim/catalog/profiles/h200).

Each kernel kind is fitted on its own by soft-L1 least squares on log(predicted / measured), with the cost
model's own formulas (`kernel_seconds`, `attention_seconds`) and the catalog's peaks of the profiled GPU, so
the efficiencies are fractions of peak that carry to any GPU of the catalog.

Every fit is to the middle of the measurements (over- and under-prediction weigh the same): a step is a sum
of many kernels and its error is their mean error. Two regimes, fitted one after the other on the kernels
each governs:
- memory-bound: weight streaming runs at the GPU's measured HBM read rate (peaks.csv; the largest GEMVs reach
  it), and the fixed cost per GEMM kernel (launch, ramp, tail) is fitted to the GEMMs of at most `MEMORY_M`
  tokens; decode attention: KV streaming efficiency, fixed cost, and cost per (sequence x KV head) work item;
- compute-bound, with the memory-side parameters held: the GEMM efficiencies over every GEMM, prefill
  attention's efficiency and per-(query token x head) cost over the prefill kernels.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.kernels import attention_seconds, kernel_seconds

Params = dict[str, float]


def _with(base: Params, names: Sequence[str], x: np.ndarray) -> Params:
    return base | {n: float(math.exp(v)) for n, v in zip(names, x, strict=True)}


MEMORY_M = 64  # GEMMs of at most this many tokens stream their weights (below the ridge point on every GPU)
PROFILE_GPU = "H200"
KERNEL_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_compute_eff": (0.3, 1.0),
    "gemm_bandwidth_eff": (0.3, 1.0),
    "kernel_fixed_s": (1e-6, 5e-5),
    "gemm_compute_eff_fp8": (0.2, 1.0),
    "attn_compute_eff": (0.1, 1.0),
    "attn_query_head_s": (1e-12, 1e-8),
    "kv_bandwidth_eff": (0.3, 1.0),
    "attn_fixed_s": (1e-6, 5e-5),
    "attn_row_head_s": (1e-10, 1e-7),
}


def profile_dir(gpu: str = "h200") -> Path:
    return Path(str(resources.files("sim") / "catalog" / "profiles" / gpu))


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _profile_models() -> dict[str, tuple[int, int, int]]:
    """(query heads, KV heads, head dim) of the profiled models, from the catalog configs."""
    out = {}
    for name in ("llama-3.1-8b", "qwen3-14b", "llama-3.1-70b"):
        m = load_model(name)
        out[name] = (m.num_heads, m.num_kv_heads, m.head_dim)
    return out


def kernel_data(directory: Path | None = None) -> dict[str, dict[str, np.ndarray]]:
    """The profile as arrays per kernel kind: FLOPs, bytes, query heads and measured seconds."""
    d = directory or profile_dir()
    gemm = _read(d / "gemm.csv")
    m, k, n = (np.array([float(r[c]) for r in gemm]) for c in ("m", "k", "n"))
    out = {
        "gemm": {
            "flops": 2 * m * k * n,
            "bytes": 2.0 * (k * n + m * k + m * n),
            "seconds": np.array([float(r["seconds"]) for r in gemm]),
            "m": m,
        }
    }
    fp8 = _read(d / "gemm_fp8.csv")
    m, k, n = (np.array([float(r[c]) for r in fp8]) for c in ("m", "k", "n"))
    out["gemm_fp8"] = {
        "flops": 2 * m * k * n,
        "bytes": k * n + m * k + 2.0 * m * n,  # FP8 weights and inputs, 16-bit outputs
        "seconds": np.array([float(r["seconds"]) for r in fp8]),
        "m": m,
    }
    shapes = _profile_models()
    attn = [r for r in _read(d / "attention.csv") if r["model"] in shapes]
    nh, nkv, hd = (np.array([float(shapes[r["model"]][i]) for r in attn]) for i in range(3))
    b, ql, kvl = (np.array([float(r[c]) for r in attn]) for c in ("batch", "q_len", "kv_len"))
    prefill = np.array([r["phase"] == "prefill" for r in attn])
    pairs = np.where(prefill, ql * (ql + 1) / 2, b * kvl)
    out["attention"] = {
        "items": b * nkv,  # (sequence x KV head) work items
        "flops": 4 * nh * hd * pairs,
        "query_heads": np.where(prefill, ql * nh, 0.0),
        # prefill writes its K and V; decode reads one cache tensor (the benchmark passes it as K and V)
        "bytes": np.where(prefill, 2 * 2 * nkv * hd * ql, 2 * nkv * hd * b * kvl),
        "seconds": np.array([float(r["seconds"]) for r in attn]),
        "prefill": prefill,
    }
    return out


def hbm_read_eff(directory: Path | None = None) -> float:
    """Measured HBM read rate (peaks.csv, 4 GiB read) as a fraction of the catalog's HBM bandwidth."""
    peaks = {r["what"]: float(r["per_second"]) for r in _read((directory or profile_dir()) / "peaks.csv")}
    return peaks["read_4GiB"] / get_gpu(PROFILE_GPU).hbm_bandwidth


def _subset(d: dict[str, np.ndarray], keep: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[keep] for k, v in d.items()}


def fit_kernels(directory: Path | None = None) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Kernel parameters fitted to a GPU profile (soft-L1 least squares on log(predicted / measured)),
    and per kernel kind the median and 90th-percentile |error| and the share predicted below measurement."""
    gpu = get_gpu(PROFILE_GPU)
    data = kernel_data(directory)
    base = asdict(KernelCalibration())

    def solve(names: tuple[str, ...], predict: Callable[[Params], np.ndarray], seconds: np.ndarray) -> Params:
        lo = np.log([KERNEL_BOUNDS[n][0] for n in names])
        hi = np.log([KERNEL_BOUNDS[n][1] for n in names])
        x0 = np.clip(np.log([base[n] for n in names]), lo + 1e-9, hi - 1e-9)
        res = least_squares(
            lambda x: np.log(predict(_with(base, names, x)) / seconds),
            x0,
            bounds=(lo, hi),
            loss="soft_l1",
            f_scale=0.05,
        )  # fmt: skip
        return _with(base, names, res.x)

    g = data["gemm"]

    def gemm(
        p: Params, d: dict[str, np.ndarray] = g, peak: float = gpu.flops_16bit, eff: str = "gemm_compute_eff"
    ):  # type: ignore[no-untyped-def]
        bw = gpu.hbm_bandwidth * p["gemm_bandwidth_eff"]
        return kernel_seconds(d["flops"], d["bytes"], peak * p[eff], bw,
                              p["kernel_fixed_s"])  # fmt: skip

    base["gemm_bandwidth_eff"] = hbm_read_eff(directory)
    small = _subset(g, g["m"] <= MEMORY_M)
    base = solve(("kernel_fixed_s",), lambda p: gemm(p, small), small["seconds"])
    base = solve(("gemm_compute_eff",), gemm, g["seconds"])
    f8 = data["gemm_fp8"]

    def gemm8(p: Params):  # type: ignore[no-untyped-def]
        return gemm(p, f8, gpu.flops_fp8, "gemm_compute_eff_fp8")

    base = solve(("gemm_compute_eff_fp8",), gemm8, f8["seconds"])
    a = data["attention"]

    def attention(p: Params, d: dict[str, np.ndarray] = a):  # type: ignore[no-untyped-def]
        cal = KernelCalibration(**p)
        hbm = gpu.hbm_bandwidth
        return attention_seconds(cal, d["flops"], d["query_heads"], d["bytes"], gpu.flops_16bit, hbm,
                                 p["attn_fixed_s"], d["items"])  # fmt: skip

    dec, pre = _subset(a, ~a["prefill"]), _subset(a, a["prefill"])
    names = ("kv_bandwidth_eff", "attn_fixed_s", "attn_row_head_s")
    base = solve(names, lambda p: attention(p, dec), dec["seconds"])
    names = ("attn_compute_eff", "attn_query_head_s")
    base = solve(names, lambda p: attention(p, pre), pre["seconds"])
    stats = {}
    for kind, pred, d in (("gemm", gemm, g), ("gemm_fp8", gemm8, f8), ("attention", attention, a)):
        err = np.log(pred(base) / d["seconds"])
        stats[kind] = {
            "median_abs_pct": float(np.median(np.abs(np.expm1(err)))) * 100,
            "p90_abs_pct": float(np.quantile(np.abs(np.expm1(err)), 0.9)) * 100,
            "below_share": float(np.mean(err < 0)),
            "kernels": float(err.size),
        }
    return {n: base[n] for n in KERNEL_BOUNDS}, stats
