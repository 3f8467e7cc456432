"""The kernel model's attention (`sim.cost.kernels.attention_seconds` with the parameters `sim step` gives a
GPU) against aiconfigurator's measured vLLM attention kernels (sim/catalog/profiles/<gpu>/aiconfigurator/
attention.csv): a check per GPU and phase, not a fit. The attention parameters are the H200 profile's for
every GPU (sim/cost/kernel_fit.py); this says how far that carries.

Per kernel, as the model counts one layer's attention: causal prefill of `q_len` tokens per sequence
(q(q + 1)/2 (query, key) pairs, its K and V written), decode of one token over `kv_len` cached ones (K and V
read); 4 · heads · head_dim FLOPs a pair, 16-bit K and V; the in-step fixed cost (graph_kernel_fixed_s plus
the attention prologue attn_fixed_s - kernel_fixed_s), aiconfigurator timing its kernels in a CUDA graph.
"""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

import numpy as np

from sim.catalog.gpus import get_gpu
from sim.config.calibration import KernelCalibration
from sim.cost.kernels import attention_seconds

LONG_S = 1e-4
CATALOG = {"h200": "H200", "h100": "H100-SXM", "a100": "A100-80GB", "l40s": "L40S", "b200": "B200"}


def attention_data(gpu: str, root: Path | None = None) -> dict[str, np.ndarray]:
    """A GPU's aiconfigurator attention kernels as arrays (phase, batch, q_len, kv_len, heads, kv_heads,
    head_dim, seconds)."""
    base = root or Path(str(resources.files("sim") / "catalog" / "profiles"))
    with (base / gpu / "aiconfigurator" / "attention.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cols = ("batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "seconds")
    out = {c: np.array([float(r[c]) for r in rows]) for c in cols}
    out["prefill"] = np.array([r["phase"] == "prefill" for r in rows])
    return out


def predict_attention(cal: KernelCalibration, d: dict[str, np.ndarray], gpu: str) -> np.ndarray:
    """The kernel model's time for each kernel of `d` on the catalog GPU of folder `gpu`."""
    g = get_gpu(CATALOG[gpu])
    b, q, kv, pre = d["batch"], d["q_len"], d["kv_len"], d["prefill"]
    pairs = b * np.where(pre, q * (q + 1) / 2, kv)
    flops = 4 * d["heads"] * d["head_dim"] * pairs
    nbytes = 2 * 2 * d["kv_heads"] * d["head_dim"] * b * np.where(pre, q, kv)
    fixed = cal.graph_kernel_fixed_s + max(cal.attn_fixed_s - cal.kernel_fixed_s, 0.0)
    query_heads = np.where(pre, b * q * d["heads"], 0.0)
    return attention_seconds(cal, flops, query_heads, nbytes, g.flops_16bit, g.hbm_bandwidth, fixed,
                             b * d["kv_heads"])  # fmt: skip


def attention_table(root: Path | None = None) -> list[dict[str, object]]:
    """Per GPU and phase: kernels, and the model's median signed and median |error| % against the table,
    over all and over the kernels of at least `LONG_S` (where the fixed cost does not decide)."""
    out = []
    for gpu, name in CATALOG.items():
        d = attention_data(gpu, root)
        err = (predict_attention(KernelCalibration.load(gpu=get_gpu(name)), d, gpu) / d["seconds"] - 1) * 100
        for phase, keep in (("prefill", d["prefill"]), ("decode", ~d["prefill"])):
            long = keep & (d["seconds"] >= LONG_S)
            out.append({
                "gpu": gpu, "phase": phase, "kernels": int(keep.sum()),
                "median_pct": float(np.median(err[keep])),
                "median_abs_pct": float(np.median(np.abs(err[keep]))),
                "long_kernels": int(long.sum()),
                "long_median_pct": float(np.median(err[long])),
                "long_median_abs_pct": float(np.median(np.abs(err[long]))),
            })  # fmt: skip
    return out
