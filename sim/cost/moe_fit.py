"""Fused-MoE kernel parameters fitted per GPU and weight format to aiconfigurator's vLLM MoE tables
(sim/catalog/profiles/<gpu>/aiconfigurator/moe.csv: every expert on the GPU, the intermediate width split over
TP 1/2/4/8, a balanced gate), and tested by leaving a GPU out.

The fit predicts with the cost model's own formula (`sim.cost.kernels.fused_moe_seconds`) at the profiled
GPU's catalog peaks: the touched experts are the uniform gate's expectation
(`sim.cost.step_model.expected_distinct_experts`), as the engine counts them. Formats (`FORMATS`): `bf16` and
`fp8` (the tables' FP8 with 128 x 128 weight blocks, W8A8 at the FP8 peak); the parameter names of `fp8` carry
the suffix `_fp8`. Soft-L1 least squares on log(predicted / measured), each GPU weighing the same in a pool.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from sim.catalog.gpus import get_gpu
from sim.cost.gemm_fit import PROFILED, Data, Params, errors_by_op, generation, profiles_root, solve
from sim.cost.kernels import fused_moe_seconds, moe_peak
from sim.cost.step_model import expected_distinct_experts

FORMATS = {"bf16": "bf16", "fp8": "fp8_block"}  # parameter suffix's format -> moe.csv's dtype
MOE_BOUNDS: dict[str, tuple[float, float]] = {
    "moe_compute_eff": (0.05, 1.0),
    "moe_bandwidth_eff": (0.2, 1.0),
    "moe_m_half_tokens": (1e-2, 1e4),
    "moe_n_half_cols": (1e-2, 1e5),
    "moe_overlap_loss": (1e-4, 1.0),
    "moe_fixed_s": (1e-6, 2e-4),
}
MOE_START = {"moe_compute_eff": 0.5, "moe_bandwidth_eff": 0.8, "moe_m_half_tokens": 32.0,
             "moe_n_half_cols": 64.0, "moe_overlap_loss": 0.2, "moe_fixed_s": 2e-5}  # fmt: skip


def suffixed(params: Params, fmt: str) -> Params:
    """A fit's parameters under the names of format `fmt` (`_fp8` appended for fp8)."""
    tail = "" if fmt == "bf16" else f"_{fmt}"
    return {f"{k}{tail}": v for k, v in params.items()}


def moe_data(gpu: str, fmt: str, root: Path | None = None) -> Data | None:
    """A profiled GPU's fused-MoE layers of format `fmt` as arrays (pairs, touched experts, hidden, inter
    shard, seconds, op: the shape), or None without a table."""
    path = (root or profiles_root()) / gpu / "aiconfigurator" / "moe.csv"
    if not path.is_file():
        return None
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["dtype"] == FORMATS[fmt]]
    if not rows:
        return None
    col = {c: np.array([float(r[c]) for r in rows]) for c in ("hidden", "inter", "topk", "experts", "tp",
                                                              "tokens", "seconds")}  # fmt: skip
    e, k, t = col["experts"], col["topk"], col["tokens"]
    draws = zip(e, k, t, strict=True)
    touched = np.array([expected_distinct_experts(int(a), int(b), c) for a, b, c in draws], dtype=np.float64)
    cols = zip(col["hidden"], col["inter"], k, e, strict=True)
    shape = [f"{int(h)}x{int(i)} top{int(kk)}/{int(ee)}" for h, i, kk, ee in cols]
    return {"pairs": t * k, "touched": touched, "hidden": col["hidden"], "inter": col["inter"] / col["tp"],
            "tokens": t, "seconds": col["seconds"], "op": np.array(shape)}  # fmt: skip


def predict_moe(p: Params, d: Data, gpu: str, fmt: str) -> np.ndarray:
    g = get_gpu(PROFILED[gpu])
    peak, weight_bytes = moe_peak(g, fmt)
    shape = SimpleNamespace(**p)
    flops_per_s, bytes_per_s = peak * p["moe_compute_eff"], g.hbm_bandwidth * p["moe_bandwidth_eff"]
    return fused_moe_seconds(d["pairs"], d["touched"], d["hidden"], d["inter"], weight_bytes, flops_per_s,
                             bytes_per_s, shape)  # fmt: skip


def fit_moe(gpus: Sequence[str], fmt: str, root: Path | None = None) -> Params | None:
    """Fused-MoE parameters (unsuffixed names) fitted to the tables of `gpus` that have format `fmt`, pooled;
    None when none has."""
    sets = [(g, d) for g in gpus if (d := moe_data(g, fmt, root)) is not None]
    if not sets:
        return None

    def predict(p: Params, d: Data, gpu: str) -> np.ndarray:
        return predict_moe(p, d, gpu, fmt)

    return solve(MOE_BOUNDS, MOE_START, predict, sets)


def moe_gpus(root: Path | None = None) -> list[str]:
    """The profiled GPUs with a fused-MoE table."""
    return [g for g in PROFILED if any(moe_data(g, f, root) is not None for f in FORMATS)]


def leave_one_moe_gpu_out(root: Path | None = None) -> dict[str, dict[str, object]]:
    """Per GPU with a table and format: its fused-MoE layers predicted from the other GPUs of its generation
    that have the format (else all the others), and from its own fit; median |error| % per shape and over
    all ("all"). {"<gpu> <fmt>": {"rule": [GPUs], "held_out": {...}, "own": {...}}}."""
    out: dict[str, dict[str, object]] = {}
    gpus = moe_gpus(root)
    for fmt in FORMATS:
        have = [g for g in gpus if moe_data(g, fmt, root) is not None]
        for gpu in have:
            d = moe_data(gpu, fmt, root)
            assert d is not None
            others = [g for g in have if g != gpu]
            rule = [g for g in others if generation(g) == generation(gpu)] or others
            own = fit_moe([gpu], fmt, root)
            held = fit_moe(rule, fmt, root) if rule else None
            assert own is not None
            report: dict[str, object] = {"rule": rule, "own": errors_by_op(predict_moe(own, d, gpu, fmt), d)}
            if held is not None:
                report["held_out"] = errors_by_op(predict_moe(held, d, gpu, fmt), d)
            out[f"{gpu} {fmt}"] = report
    return out
