"""The kernel model's attention (`sim.cost.kernels.attention_seconds`) fitted per GPU to aiconfigurator's
measured vLLM attention kernels (sim/catalog/profiles/<gpu>/aiconfigurator/attention.csv: each system's
default backend, FA3 on the Hoppers, FlashAttention 2 on the A100 and L40S, FlashInfer's TRT-LLM kernels on
the B200), and the transfer rule tested by leaving a GPU out, as for the GEMMs (`sim.cost.gemm_fit`).

Per kernel, as the model counts one layer's attention: causal prefill of `q_len` tokens per sequence
(q(q + 1)/2 (query, key) pairs, its K and V written), decode of one token over `kv_len` cached ones (K and V
read); 4 · heads · head_dim FLOPs a pair, 16-bit K and V. Fitted: the prefill's compute efficiency and work
per (query x head), the decode's KV streaming efficiency and work per (sequence x KV head) (`SHIPPED_KEYS`),
and a fixed cost per kernel. aiconfigurator's collector times vLLM's attention forward (the cache write and
the kernel) with its benchmark helper, which captures the call in a CUDA graph and replays it
(`collector/helper.py` `benchmark_with_power`, `use_cuda_graph` True unless a collector asks otherwise;
`collect_attn.py` does not), so that fixed cost is an in-graph one and is shipped as the served step's
(`attn_graph_fixed_s`).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np

from sim.catalog.gpus import get_gpu
from sim.config.calibration import KernelCalibration
from sim.cost.gemm_fit import POOL, PROFILED, TRANSFER, Params, rule_pool, solve
from sim.cost.kernel_fit import KERNEL_BOUNDS
from sim.cost.kernels import attention_seconds, attention_step_fixed

LONG_S = 1e-4
SHIPPED_KEYS = ("attn_compute_eff", "attn_query_head_s", "kv_bandwidth_eff", "attn_row_head_s")
FIT_KEYS = (*SHIPPED_KEYS, "attn_fixed_s")  # attn_fixed_s here: the table's in-graph fixed cost
GRAPH_FIXED = "attn_graph_fixed_s"  # the shipped name of the fitted fixed cost (`shipped`)


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


def predict_attention(
    cal: KernelCalibration, d: dict[str, np.ndarray], gpu: str, fixed_s: float | None = None
) -> np.ndarray:
    """The kernel model's time for each kernel of `d` on the catalog GPU of folder `gpu`, each paying
    `fixed_s` (default: the in-step fixed cost a served step charges)."""
    g = get_gpu(PROFILED[gpu])
    b, q, kv, pre = d["batch"], d["q_len"], d["kv_len"], d["prefill"]
    pairs = b * np.where(pre, q * (q + 1) / 2, kv)
    flops = 4 * d["heads"] * d["head_dim"] * pairs
    nbytes = 2 * 2 * d["kv_heads"] * d["head_dim"] * b * np.where(pre, q, kv)
    if fixed_s is None:
        fixed_s = attention_step_fixed(cal)
    query_heads = np.where(pre, b * q * d["heads"], 0.0)
    return attention_seconds(cal, flops, query_heads, nbytes, g.flops_16bit, g.hbm_bandwidth, fixed_s,
                             b * d["kv_heads"])  # fmt: skip


def _table_predict(p: Params, d: dict[str, np.ndarray], gpu: str) -> np.ndarray:
    """`predict_attention` at `p`'s parameters, each kernel paying the table's fitted fixed cost."""
    cal = replace(KernelCalibration(), **{k: p[k] for k in SHIPPED_KEYS})
    return predict_attention(cal, d, gpu, p["attn_fixed_s"])


def fit_attention(gpus: Sequence[str], root: Path | None = None) -> Params:
    """`FIT_KEYS` fitted to the attention tables of `gpus` (one: its own; several: pooled, each GPU weighing
    the same), from the H200 profile's values (kernel_calibration.toml)."""
    base = KernelCalibration.load()
    bounds = {k: KERNEL_BOUNDS[k] for k in FIT_KEYS}
    start = {k: float(getattr(base, k)) for k in FIT_KEYS}
    return solve(bounds, start, _table_predict, [(g, attention_data(g, root)) for g in gpus])


def shipped(p: Params) -> Params:
    """The parameters `fit_attention` fitted as sim/catalog/kernel_gpus.toml ships them: the fixed cost as the
    served step's in-graph one."""
    return {k: p[k] for k in SHIPPED_KEYS} | {GRAPH_FIXED: p["attn_fixed_s"]}


def attention_errors(p: Params, gpu: str, root: Path | None = None) -> dict[str, float]:
    """Median |error| % of `p` on `gpu`'s table per phase, over all kernels and those of at least `LONG_S`."""
    d = attention_data(gpu, root)
    err = np.abs(_table_predict(p, d, gpu) / d["seconds"] - 1.0) * 100.0
    out = {}
    for phase, keep in (("prefill", d["prefill"]), ("decode", ~d["prefill"])):
        out[phase] = float(np.median(err[keep]))
        out[f"{phase}_long"] = float(np.median(err[keep & (d["seconds"] >= LONG_S)]))
    return out


def leave_one_attention_gpu_out(root: Path | None = None) -> dict[str, dict[str, object]]:
    """Per GPU of `POOL`: its attention predicted by the transfer rule from the other two (`rule_pool`: the
    same generation's, else both) and by its own fit; each GPU of `TRANSFER` by the rule from the whole pool:
    {gpu: {"rule": [GPUs], "held_out": attention_errors, "own": attention_errors}}."""
    out: dict[str, dict[str, object]] = {}
    for gpu in (*POOL, *TRANSFER["aiconfigurator"]):
        rule = rule_pool(gpu, [g for g in POOL if g != gpu])
        out[gpu] = {"rule": rule, "held_out": attention_errors(fit_attention(rule, root), gpu, root),
                    "own": attention_errors(fit_attention([gpu], root), gpu, root)}  # fmt: skip
    return out
