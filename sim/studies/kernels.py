"""`sim kernels`: the per-GPU kernel parameters fitted to the catalog's kernel tables, the transfer rule's
test (each profiled GPU left out of the pool), the NCCL all-reduce fits, sim/catalog/kernel_gpus.toml, and the
chunked-prefill overhead against Sarathi-Serve's measurement."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np

from sim.catalog import kernel_gpus
from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.allreduce import allreduce_table
from sim.cost.gemm_fit import PROFILED, fit_elementwise, fit_gemm, leave_one_gpu_out
from sim.cost.graph_fit import STEPS_GPU, fit_graph_fixed, steps_table
from sim.cost.kernel_model import KernelCostModel
from sim.cost.roofline import CostModel
from sim.io.outputs import write_text
from sim.io.tomltext import toml_value


def fit_kernel_gpus(root: Path | None = None) -> dict[str, object]:
    """{"gpus": {catalog name: params}, "pooled": params, "allreduce": {node: fits}}."""
    pooled_elem = fit_elementwise(list(PROFILED), root)
    assert pooled_elem is not None
    gpus = {}
    for folder, name in PROFILED.items():
        gpus[name] = fit_gemm([folder], root) | (fit_elementwise([folder], root) or pooled_elem)
    base = KernelCalibration.load()
    gpus[STEPS_GPU]["graph_kernel_fixed_s"] = fit_graph_fixed(replace(base, **gpus[STEPS_GPU]))
    nodes: dict[str, dict[str, list[float]]] = {}
    for row in allreduce_table():
        n = nodes.setdefault(str(row["node"]), {"degrees": [], "latency_s": [], "bus_bandwidth": []})
        n["degrees"].append(row["degree"])  # type: ignore[arg-type]
        n["latency_s"].append(row["latency_s"])  # type: ignore[arg-type]
        n["bus_bandwidth"].append(row["bus_bandwidth"])  # type: ignore[arg-type]
    return {"gpus": gpus, "pooled": fit_gemm(list(PROFILED), root) | pooled_elem, "allreduce": nodes}


def _params(p: dict[str, float]) -> str:
    return "".join(f"{k} = {float(f'{v:.4g}')!r}\n" for k, v in p.items())


def kernel_gpus_toml(fits: dict[str, object], command: str) -> str:
    """The text of sim/catalog/kernel_gpus.toml, provenance first."""
    head = f"""# Per-GPU kernel parameters of the kernel-level cost model (sim/cost/kernel_model.py), read by
# sim.catalog.kernel_gpus. Written by `{command}` on {date.today().isoformat()}.
#
# [gpus.<name>]: GEMM and element-wise parameters fitted to that GPU's kernel table (sim.cost.gemm_fit):
#   H200: sim/catalog/profiles/h200/gemm.csv (measured 2026-11-30, PyTorch 2.11); it has no element-wise
#     profile, so its element-wise parameters are the pooled H100 + A100 fit.
#   H200 graph_kernel_fixed_s: fitted to the graphed decode steps of sim/catalog/profiles/h200/steps.csv
#     (batch <= 128) with its other parameters (sim.cost.graph_fit); other GPUs keep
#     kernel_calibration.toml's (fitted end to end on H100 vLLM runs).
#   H100-SXM, A100-80GB: sim/catalog/profiles/{{h100,a100}}/, converted from Vidur's published profiles
#     (microsoft/vidur, MIT, commit 7d47513, data/profiling/compute; sarathi-serve kernels, 2024) by
#     `sim kernels --import-vidur`.
# [pooled]: one fit over all three (each GPU weighing the same): the transfer rule for any GPU without a
#   profile. Efficiencies are fractions of that GPU's catalog peaks, fixed costs seconds.
# [allreduce.<node>]: NCCL all-reduce latency and bus bandwidth per degree (sim.cost.allreduce), single-node
#   groups of sim/catalog/profiles/allreduce.csv (Vidur, data/profiling/network).
"""
    out = [head]
    gpus = fits["gpus"]
    assert isinstance(gpus, dict)
    for name, p in gpus.items():
        out.append(f'\n[gpus."{name}"]\n{_params(p)}')
    pooled = fits["pooled"]
    assert isinstance(pooled, dict)
    out.append(f"\n[pooled]\n{_params(pooled)}")
    nodes = fits["allreduce"]
    assert isinstance(nodes, dict)
    for node, f in nodes.items():
        out.append(f"\n[allreduce.{node}]\n")
        out.append(f"degrees = {toml_value(f['degrees'])}\n")
        out.append(f"latency_s = {toml_value([float(f'{v:.4g}') for v in f['latency_s']])}\n")
        out.append(f"bus_bandwidth = {toml_value([float(f'{v:.4g}') for v in f['bus_bandwidth']])}\n")
    return "".join(out)


def run_kernels(write: Path | None, command: str) -> dict[str, object]:
    """Fit, test by leaving each GPU out, and optionally write the parameter file."""
    fits = fit_kernel_gpus()
    if write is not None:
        write_text(write, kernel_gpus_toml(fits, command))
        kernel_gpus.reload()
    steps_cal = KernelCalibration.load(gpu=get_gpu(STEPS_GPU))
    return {"fits": fits, "held_out": leave_one_gpu_out(), "allreduce": allreduce_table(),
            "chunking": chunking_table(), "steps": steps_table(steps_cal)}  # fmt: skip


# Sarathi-Serve's artifact (microsoft/sarathi-serve, branch osdi-sarathi-serve,
# osdi-experiments/figure-9/chunking-overhead.csv): Yi-34B, TP 2, A100-80GB PCIe GPUs NVLinked in pairs; a
# prompt's prefill time chunked by 512 over unchunked (chunk 16,384), by prompt length.
SARATHI_CHUNK = 512
SARATHI_OVERHEAD = {2047: 1.152179444326152, 4095: 1.1889427456953752, 8191: 1.1165034734755017}


def chunked_prefill_seconds(cost: object, prompt: int, chunk: int) -> float:
    """A prompt prefilled in chunks of `chunk` tokens, one step each: every chunk reads the KV of the chunks
    before it (its context) and pays the step's weights and fixed costs."""
    step_time = cost.step_time  # type: ignore[attr-defined]
    return sum(
        step_time(np.array([min(chunk, prompt - start)]), np.array([start]))[0]
        for start in range(0, prompt, chunk)
    )


def chunking_table(gpu: str = "A100-80GB") -> list[dict[str, float]]:
    """Per Sarathi prompt length: measured and modelled overhead of 512-token chunks (kernel model with the
    GPU's fitted parameters; the engine's roofline beside it), in percent."""
    g, spec = get_gpu(gpu), load_model("yi-34b")
    kernel = KernelCostModel(spec, g, 2, calibration=KernelCalibration.load(gpu=g))
    roof = CostModel(spec, g, 2)
    out = []
    for prompt, measured in SARATHI_OVERHEAD.items():
        row = {"prompt": float(prompt), "measured_pct": (measured - 1) * 100}
        for name, cost in (("kernel", kernel), ("roofline", roof)):
            whole = cost.step_time(np.array([prompt]), np.array([0]))[0]
            row[f"{name}_pct"] = (chunked_prefill_seconds(cost, prompt, SARATHI_CHUNK) / whole - 1) * 100
        out.append(row)
    return out
