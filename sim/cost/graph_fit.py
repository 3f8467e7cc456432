"""Whole steps on the H200 (sim/catalog/profiles/h200/steps.csv: a Llama-3.1-8B-shaped model, decode replayed
as a CUDA graph as served engines run it, prefill eager): the in-graph fixed cost per kernel fitted to the
graphed decode steps, and every step against the kernel model's GPU time.

A replayed graph launches no kernel from the host, but each kernel still pays its ramp and tail inside the
graph: `graph_kernel_fixed_s` is fitted (soft-L1 least squares on log(predicted / measured), in log space)
to the graphed decode steps of at most `GRAPH_MAX_BATCH` sequences with every other parameter the GPU's
fitted one. The eager steps of the profile are host-bound where the GPU's work is short (PyTorch launching
each kernel: the eager decode steps take 14-16 ms whatever the batch), so only prefill steps of at least
`PREFILL_MIN_TOKENS` tokens are compared with the GPU time. The profile's decoder is plain PyTorch, so its
steps are costed with the element-wise kernels it runs (`sim.cost.kernels.layer_elementwise`, "torch"), not
vLLM's fused ones, and with the H200 profile's SDPA attention, not vLLM's (`harness`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration, shipped_kernel_calibration
from sim.cost.attention_fit import GRAPH_FIXED
from sim.cost.attention_fit import SHIPPED_KEYS as ATTENTION_KEYS
from sim.cost.kernel_model import KernelCostModel

GRAPH_MAX_BATCH = 128
PREFILL_MIN_TOKENS = 2048
STEPS_GPU = "H200"


def steps_rows(path: Path | None = None) -> list[dict[str, str]]:
    path = path or Path(str(resources.files("sim") / "catalog" / "profiles" / "h200" / "steps.csv"))
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def harness(cal: KernelCalibration) -> KernelCalibration:
    """`cal` with the attention the profile's decoder runs: PyTorch's SDPA, whose parameters are the H200
    profile's (kernel_calibration.toml), not vLLM's kernels' (kernel_gpus.toml, `sim step`'s)."""
    profile = shipped_kernel_calibration()
    return replace(cal, **{k: getattr(profile, k) for k in (*ATTENTION_KEYS, GRAPH_FIXED)})


def _gpu_seconds(cal: KernelCalibration, row: dict[str, str]) -> float:
    model, gpu = load_model(row["model"]), get_gpu(STEPS_GPU)
    cost = KernelCostModel(model, gpu, 1, calibration=harness(cal), elementwise="torch")
    b, each, ctx = int(row["batch"]), int(row["tokens_each"]), int(row["context"])
    return cost.step(np.full(b, each), np.full(b, ctx)).gpu_s


def _graphed(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [r for r in rows if r["graph"] == "1" and int(r["batch"]) <= GRAPH_MAX_BATCH]


def fit_graph_fixed(cal: KernelCalibration, path: Path | None = None) -> float:
    """graph_kernel_fixed_s fitted to the graphed decode steps, `cal` supplying every other parameter."""
    rows = _graphed(steps_rows(path))
    measured = np.array([float(r["seconds"]) for r in rows])

    def residuals(x: np.ndarray) -> np.ndarray:
        c = replace(cal, graph_kernel_fixed_s=math.exp(float(x[0])))
        return np.log(np.array([_gpu_seconds(c, r) for r in rows]) / measured)

    lo, hi = math.log(1e-7), math.log(2e-5)
    x0 = min(max(math.log(cal.graph_kernel_fixed_s), lo + 1e-9), hi - 1e-9)
    res = least_squares(residuals, [x0], bounds=([lo], [hi]), loss="soft_l1", f_scale=0.05)
    return float(math.exp(res.x[0]))


def steps_table(cal: KernelCalibration, path: Path | None = None) -> list[dict[str, object]]:
    """The graphed decode steps (batch <= GRAPH_MAX_BATCH) and the long eager prefills: measured seconds,
    the kernel model's GPU seconds and the error in percent."""
    out: list[dict[str, object]] = []
    for r in steps_rows(path):
        decode = r["phase"] == "decode"
        if (decode and r not in _graphed([r])) or (not decode and int(r["tokens_each"]) < PREFILL_MIN_TOKENS):
            continue
        measured, model = float(r["seconds"]), _gpu_seconds(cal, r)
        out.append({
            "phase": r["phase"], "graph": r["graph"] == "1", "batch": int(r["batch"]),
            "tokens_each": int(r["tokens_each"]), "context": int(r["context"]),
            "measured_s": measured, "model_s": model, "error_pct": (model / measured - 1) * 100,
        })  # fmt: skip
    return out
