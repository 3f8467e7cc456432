"""vLLM's MLA attention module of DeepSeek-V3 against the kernel model's, and the module's kernels the model
does not list, fitted per GPU.

aiconfigurator times vLLM 0.24.0's whole MLA attention layer of DeepSeek-V3 (its projections, norms, rotary
embedding, latent KV cache and attention kernel: FLASH_ATTN / FLASH_ATTN_MLA with bf16 GEMMs and KV,
FlashMLA with FP8 block GEMMs and FP8 KV; sim/catalog/profiles/<gpu>/aiconfigurator/mla.csv) in a CUDA
graph. The kernel model lists a layer's share of the step's `qkv_a` (replicated), `qkv` and `o_proj` GEMMs
(MLA's projections, their weight bytes as stored) and its attention kernel (absorbed for decode, the latents
up-projected for a prompt), as `sim step` gives them. Heads per GPU are 128 / TP.

What the measured module takes beyond those (the q and KV latents' RMSNorms, the rotary embedding, the
latent cache write, the activations' FP8 quantization, decode's absorbed up-projections, the prompt's K and
V assembly) is fitted per phase and weight format as a fixed cost per layer, a cost per (token x head on the
GPU) and one per token (`MLA_TERMS`: `mla_<phase>_<term>`, `_fp8` for FP8 weights), by non-negative least
squares on the relative error, each GPU weighing the same. Both step models charge it
(`sim.cost.kernels.mla_rest_seconds`).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.gemm_fit import PROFILED, Params, generation
from sim.cost.kernel_model import KernelCostModel
from sim.cost.kernels import MLA_PHASES, MLA_TERMS, mla_key

HEADS = 128  # DeepSeek-V3's attention heads
LONG_S = 3e-4  # modules at least this long: past the launch floor of a module's dozen kernels
DTYPES = {
    "bf16": ("bf16", "bf16"),
    "fp8": (None, "fp8"),
}  # mla.csv's config -> (weights, KV); None: as stored
MODULE = ("qkv_a", "qkv", "o_proj", "attention")  # the step's kernels the model's module is


def mla_data(gpu: str, root: Path | None = None) -> list[dict[str, str]]:
    """A profiled GPU's measured MLA modules (mla.csv rows), or [] when its table has none."""
    base = root or Path(str(resources.files("sim") / "catalog" / "profiles"))
    path = base / gpu / "aiconfigurator" / "mla.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _step(phase: str, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    if phase == "prefill":
        return np.full(batch, length), np.zeros(batch, dtype=np.int64)
    return np.ones(batch, dtype=np.int64), np.full(batch, length)


def module_seconds(cost: KernelCostModel, phase: str, batch: int, length: int, rest: bool = True) -> float:
    """One layer's MLA module in the kernel model: `batch` prompts of `length` tokens, or `batch` decodes
    over `length` cached tokens; with `rest`, the fitted kernels beyond the listed ones (`mla_rest`)."""
    kernels = {k.name: k.seconds for k in cost.step(*_step(phase, batch, length)).kernels}
    names = (*MODULE, "mla_rest") if rest else MODULE
    return sum(kernels.get(name, 0.0) for name in names) / cost.model.num_layers


def _rows(gpu: str, root: Path | None) -> dict[tuple[str, str], np.ndarray]:
    """{(phase, config): rows of (measured s, listed kernels s, tokens, heads)} of `gpu`'s table."""
    spec, g = load_model("deepseek-v3"), get_gpu(PROFILED[gpu])
    cal = KernelCalibration.load(gpu=g)
    costs: dict[tuple[int, str], KernelCostModel] = {}
    out: dict[tuple[str, str], list[tuple[float, float, float, float]]] = {}
    for r in mla_data(gpu, root):
        heads, config, phase = int(r["heads"]), r["config"], r["phase"]
        tp = HEADS // heads
        if (tp, config) not in costs:
            costs[(tp, config)] = KernelCostModel(spec, g, tp, *DTYPES[config], calibration=cal)
        b, length = int(r["batch"]), int(r["length"])
        listed = module_seconds(costs[(tp, config)], phase, b, length, rest=False)
        tokens = b * length if phase == "prefill" else b
        out.setdefault((phase, config), []).append((float(r["seconds"]), listed, tokens, heads))
    return {k: np.array(v) for k, v in out.items()}


def _features(a: np.ndarray) -> np.ndarray:
    return np.c_[np.ones(len(a)), a[:, 2] * a[:, 3], a[:, 2]]  # fixed, token x head, token


def fit_mla(gpus: Sequence[str], root: Path | None = None) -> Params | None:
    """`MLA_TERMS` per phase and format fitted to the MLA tables of `gpus`, pooled (each GPU weighing the
    same), for the configurations they have; None when none has a table."""
    sets = [d for g in gpus if (d := _rows(g, root))]
    if not sets:
        return None
    out: Params = {}
    for phase in MLA_PHASES:
        for config in DTYPES:
            xs, ys = [], []
            for d in sets:
                a = d.get((phase, config))
                if a is None:
                    continue
                w = 1.0 / (a[:, 0] * np.sqrt(len(a)))
                xs.append(_features(a) * w[:, None])
                ys.append((a[:, 0] - a[:, 1]) * w)
            if not xs:  # no table of these GPUs has the configuration
                continue
            coef = nnls(np.vstack(xs), np.concatenate(ys))[0]
            for term, value in zip(MLA_TERMS, coef, strict=True):
                out[mla_key(phase, term, config == "fp8")] = float(value)
    return out


def mla_gpus(root: Path | None = None) -> list[str]:
    """The profiled GPUs with an MLA table."""
    return [g for g in PROFILED if mla_data(g, root)]


def mla_params(folders: Sequence[str], root: Path | None = None) -> Params:
    """The MLA terms a GPU of `folders` ships, per configuration: fitted to their tables, else to their
    generation's, else to all."""
    have = mla_gpus(root)
    gens = {generation(f) for f in folders}
    out: Params = {}
    for pool in ([f for f in folders if f in have], [f for f in have if generation(f) in gens], have):
        for key, value in ((fit_mla(pool, root) or {}) if pool else {}).items():
            out.setdefault(key, value)
    return out


def _errors(p: Params, d: dict[tuple[str, str], np.ndarray]) -> dict[tuple[str, str], dict[str, float]]:
    """Signed % of the listed kernels alone and with `p`'s terms, per (phase, config): medians over all
    modules and the long ones."""
    out = {}
    for (phase, config), a in d.items():
        keys = [mla_key(phase, t, config == "fp8") for t in MLA_TERMS]
        rest = _features(a) @ np.array([p.get(k, 0.0) for k in keys])
        long = a[:, 0] >= LONG_S
        row = {"modules": float(len(a)), "long_modules": float(long.sum())}
        for name, model in (("listed", a[:, 1]), ("fitted", a[:, 1] + rest)):
            e = (model / a[:, 0] - 1.0) * 100.0
            row[f"{name}_median_pct"] = float(np.median(e))
            row[f"{name}_median_abs_pct"] = float(np.median(np.abs(e)))
            row[f"{name}_long_median_pct"] = float(np.median(e[long])) if long.any() else float("nan")
        out[(phase, config)] = row
    return out


def mla_table(root: Path | None = None) -> list[dict[str, object]]:
    """Per GPU with a table, phase and config: the kernel model's signed error % with the listed kernels
    alone, with the GPU's own fitted terms, and with the terms of the other GPUs of its generation (else
    all the others: held out)."""
    have = mla_gpus(root)
    out: list[dict[str, object]] = []
    for gpu in have:
        d = _rows(gpu, root)
        others = [g for g in have if g != gpu]
        rule = [g for g in others if generation(g) == generation(gpu)] or others
        own, held = _errors(fit_mla([gpu], root) or {}, d), _errors(fit_mla(rule, root) or {}, d)
        for key in sorted(d):
            o, h = own[key], held[key]
            out.append({
                "gpu": gpu, "phase": key[0], "config": key[1], "from": "+".join(rule),
                "modules": int(o["modules"]), "long_modules": int(o["long_modules"]),
                "median_pct": o["listed_median_pct"], "long_median_pct": o["listed_long_median_pct"],
                "own_abs_pct": o["fitted_median_abs_pct"], "held_out_abs_pct": h["fitted_median_abs_pct"],
            })  # fmt: skip
    return out
