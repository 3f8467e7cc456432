"""The kernel model's MLA attention module of DeepSeek-V3 against vLLM's measured one: a check, not a fit.

aiconfigurator times vLLM 0.24.0's whole MLA attention layer of DeepSeek-V3 (its projections, the latent KV
cache and the attention kernel: FLASH_ATTN / FLASH_ATTN_MLA with bf16 GEMMs and KV, FlashMLA with FP8 block
GEMMs and FP8 KV; sim/catalog/profiles/<gpu>/aiconfigurator/mla.csv). The kernel model's module is a layer's
share of the step's `qkv_a` (replicated), `qkv` and `o_proj` GEMMs (MLA's projections, their weight bytes as
stored) and its attention kernel (absorbed for decode, the latents up-projected for a prompt), as `sim step`
gives them; the layer norms and rotary embedding inside the module are not in it. Heads per GPU are 128 / TP.
"""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

import numpy as np

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.gemm_fit import PROFILED
from sim.cost.kernel_model import KernelCostModel

HEADS = 128  # DeepSeek-V3's attention heads
LONG_S = 3e-4  # modules at least this long: past the launch floor of a module's dozen kernels
DTYPES = {
    "bf16": ("bf16", "bf16"),
    "fp8": (None, "fp8"),
}  # mla.csv's config -> (weights, KV); None: as stored


def mla_data(gpu: str, root: Path | None = None) -> list[dict[str, str]]:
    """A profiled GPU's measured MLA modules (mla.csv rows), or [] when its table has none."""
    base = root or Path(str(resources.files("sim") / "catalog" / "profiles"))
    path = base / gpu / "aiconfigurator" / "mla.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def module_seconds(cost: KernelCostModel, phase: str, batch: int, length: int) -> float:
    """One layer's MLA module in the kernel model: `batch` prompts of `length` tokens, or `batch` decodes
    over `length` cached tokens."""
    if phase == "prefill":
        new, ctx = np.full(batch, length), np.zeros(batch, dtype=np.int64)
    else:
        new, ctx = np.ones(batch, dtype=np.int64), np.full(batch, length)
    kernels = {k.name: k.seconds for k in cost.step(new, ctx).kernels}
    module = ("qkv_a", "qkv", "o_proj", "attention")
    return sum(kernels.get(name, 0.0) for name in module) / cost.model.num_layers


def mla_table(root: Path | None = None) -> list[dict[str, object]]:
    """Per GPU with a table, phase and config: modules, and the kernel model's median signed error % over
    all and over those of at least `LONG_S`."""
    spec = load_model("deepseek-v3")
    out: list[dict[str, object]] = []
    for folder, name in PROFILED.items():
        rows = mla_data(folder, root)
        if not rows:
            continue
        gpu = get_gpu(name)
        cal = KernelCalibration.load(gpu=gpu)
        costs: dict[tuple[int, str], KernelCostModel] = {}
        err: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for r in rows:
            tp, config = HEADS // int(r["heads"]), r["config"]
            if (tp, config) not in costs:
                costs[(tp, config)] = KernelCostModel(spec, gpu, tp, *DTYPES[config], calibration=cal)
            model = module_seconds(costs[(tp, config)], r["phase"], int(r["batch"]), int(r["length"]))
            measured = float(r["seconds"])
            err.setdefault((r["phase"], config), []).append((model / measured - 1.0, measured))
        for (phase, config), pairs in sorted(err.items()):
            e = np.array([p[0] for p in pairs]) * 100.0
            long = np.array([p[1] >= LONG_S for p in pairs])
            out.append({
                "gpu": folder, "phase": phase, "config": config, "modules": int(e.size),
                "median_pct": float(np.median(e)), "long_modules": int(long.sum()),
                "long_median_pct": float(np.median(e[long])) if long.any() else float("nan"),
            })  # fmt: skip
    return out
