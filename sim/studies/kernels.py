"""`sim kernels`: the per-GPU kernel parameters fitted to the catalog's kernel tables, the transfer rule's
test (each profiled GPU left out of the pool), the all-reduce fits (NCCL and vLLM's custom all-reduce),
sim/catalog/kernel_gpus.toml, and the chunked-prefill overhead against Sarathi-Serve's measurement."""

from __future__ import annotations

from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np

from sim.catalog import kernel_gpus
from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.allreduce import aic_allreduce_table, allreduce_table
from sim.cost.attention_fit import fit_attention, leave_one_attention_gpu_out
from sim.cost.attention_fit import shipped as shipped_attention
from sim.cost.gemm_fit import (
    DATASETS,
    PROFILED,
    SHIPPED,
    fit_elementwise,
    fit_gemm,
    generation,
    leave_one_gpu_out,
    scaled_elementwise,
)
from sim.cost.graph_fit import STEPS_GPU, fit_graph_fixed, steps_table
from sim.cost.kernel_model import KernelCostModel
from sim.cost.mla_fit import mla_params, mla_table
from sim.cost.moe_fit import FORMATS, fit_moe, leave_one_moe_gpu_out, suffixed
from sim.cost.roofline import CostModel
from sim.cost.serving_ratios import serving_ratios, shipped_scales, stream_ratios
from sim.io.outputs import write_text
from sim.io.tomltext import toml_value


def _fits_by_degree(rows: list[dict[str, object]], kind: str) -> dict[str, dict[str, list[float]]]:
    nodes: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if row["kind"] == kind:
            n = nodes.setdefault(str(row["gpu"]), {"degrees": [], "latency_s": [], "bandwidth": []})
            for key, col in (("degrees", "degree"), ("latency_s", "latency_s"), ("bandwidth", "bandwidth")):
                n[key].append(row[col])  # type: ignore[arg-type]
    return nodes


def nvlinked() -> dict[str, bool]:
    """{profile folder: fully NVLinked} of the profiled GPUs (the custom all-reduce's algorithm switch)."""
    return {f: "pcie" not in get_gpu(name).interconnect.lower() for f, name in PROFILED.items()}


def fit_kernel_gpus(
    root: Path | None = None, ratio_rows: list[dict[str, object]] | None = None
) -> dict[str, object]:
    """{"gpus": {catalog name: params}, "generation": {major: params}, "pooled": params, "gemm_fixed_s":
    {catalog name: the fixed cost of a GEMM fit to aiconfigurator's (in a CUDA graph), not shipped}, "nccl",
    "custom_allreduce": {profile folder: fits per degree}}. GEMM parameters from each GPU's `SHIPPED` data
    set, element-wise from Vidur's profiles (a GPU's own fit, else the pooled fit at the GPU's or the pool's
    weight-streaming ratio, `sim.cost.gemm_fit.fit_elementwise`), attention from aiconfigurator's attention
    tables (`sim.cost.attention_fit`: the GPU's, its generation's, all of them)."""
    ratio_rows = ratio_rows or serving_ratios()
    scales = shipped_scales(ratio_rows)
    reference_elem = fit_elementwise(list(PROFILED), root, stream_ratios(ratio_rows))
    assert reference_elem is not None

    def elementwise(scale: object) -> dict[str, float]:
        assert isinstance(scale, dict) and reference_elem is not None
        return scaled_elementwise(reference_elem, float(scale["weights"]))

    def attention(folders: list[str]) -> dict[str, float]:
        """Attention parameters fitted to `folders`' aiconfigurator tables, the fixed cost an in-graph one."""
        return shipped_attention(fit_attention(folders, root))

    def moe(folders: list[str]) -> dict[str, float]:
        """Fused-MoE parameters per format over `folders`' tables, else their generation's, else all."""
        out: dict[str, float] = {}
        for fmt in FORMATS:
            gens = {generation(f) for f in folders}
            same = [f for f in PROFILED if generation(f) in gens]
            p = fit_moe(folders, fmt, root) or fit_moe(same, fmt, root) or fit_moe(list(PROFILED), fmt, root)
            assert p is not None
            out |= suffixed(p, fmt)
        return out

    gpus, fixed = {}, {}
    for folder, name in PROFILED.items():
        gemm = fit_gemm([folder], root)
        if SHIPPED[folder] == "aiconfigurator":  # timed in a CUDA graph: not the isolated kernel's fixed cost
            fixed[name] = gemm.pop("kernel_fixed_s")
        serving = scales["serving"]
        assert isinstance(serving, dict)
        own = fit_elementwise([folder], root) or elementwise(serving[name])
        gpus[name] = gemm | own | moe([folder]) | attention([folder]) | mla_params([folder], root)
    base = KernelCalibration.load()
    gpus[STEPS_GPU]["graph_kernel_fixed_s"] = fit_graph_fixed(replace(base, **gpus[STEPS_GPU]))

    def pool(folders: list[str], scale: object) -> dict[str, float]:
        gemm = fit_gemm(folders, root)
        del gemm["kernel_fixed_s"]
        return gemm | elementwise(scale) | moe(folders) | attention(folders) | mla_params(folders, root)

    gens = sorted({g for f in PROFILED if (g := generation(f)) is not None}, key=int)
    by_gen_scale = scales["serving_generation"]
    assert isinstance(by_gen_scale, dict)
    by_gen = {g: pool([f for f in PROFILED if generation(f) == g], by_gen_scale[g]) for g in gens}
    ar = aic_allreduce_table(nvlinked(), root)
    return {"gpus": gpus, "generation": by_gen, "pooled": pool(list(PROFILED), scales["serving_pooled"]),
            "gemm_fixed_s": fixed, "nccl": _fits_by_degree(ar, "nccl"),
            "custom_allreduce": _fits_by_degree(ar, "custom"), **scales}  # fmt: skip


def _params(p: dict[str, float]) -> str:
    return "".join(f"{k} = {float(f'{v:.4g}')!r}\n" for k, v in p.items())


def kernel_gpus_toml(fits: dict[str, object], command: str) -> str:
    """The text of sim/catalog/kernel_gpus.toml, provenance first."""
    fixed = fits.get("gemm_fixed_s", {})
    assert isinstance(fixed, dict)
    fixed_text = ", ".join(f"{k} {v * 1e6:.2f}" for k, v in fixed.items())
    head = f"""# Per-GPU kernel parameters of the kernel-level cost model (sim/cost/kernel_model.py), read by
# sim.catalog.kernel_gpus. Written by `{command}` on {date.today().isoformat()}.
#
# [gpus.<name>]: GEMM parameters fitted (sim.cost.gemm_fit, the model's formula) to that GPU's bf16 GEMMs:
#   H100-SXM, A100-80GB, L40S, B200: NVIDIA aiconfigurator's tables
#     (sim/catalog/profiles/<gpu>/aiconfigurator/gemm.csv, converted by `sim kernels
#     --import-aiconfigurator` from the PyPI package aiconfigurator-core 0.12.0, Apache-2.0; vLLM 0.24.0,
#     A100 vLLM 0.14.0; each folder's SOURCES.md names the files). Those
#     GEMMs were timed in a CUDA graph: their fitted fixed cost (µs: {fixed_text})
#     is an in-graph one, not shipped as kernel_fixed_s (a served GEMM pays graph_kernel_fixed_s;
#     kernel_fixed_s stays the H200 profile's isolated kernel, kernel_calibration.toml).
#   H200: its own profile (sim/catalog/profiles/h200/gemm.csv, measured 2026-11-30, PyTorch 2.11, L2 flushed),
#     which its whole served steps confirm (steps.csv; aiconfigurator's H200 table predicts prefill 16% fast).
#   Element-wise parameters: fitted to Vidur's profiles (sim/catalog/profiles/{{h100,a100}}/elementwise.csv,
#   microsoft/vidur, MIT, commit 7d47513; `sim kernels --import-vidur`); for the other GPUs the H100 + A100
#   fit in the H100's terms (each GPU at its weight-streaming ratio, [serving.*]) times their own ratio or
#   their pool's (aiconfigurator has no element-wise tables). Each kernel is the longer of its fixed cost and
#   its bytes; a served step charges graph_kernel_fixed_s as the floor.
#   Attention parameters (attn_compute_eff, attn_query_head_s, kv_bandwidth_eff, attn_row_head_s;
#   sim.cost.attention_fit): fitted to aiconfigurator's vLLM attention kernels (profiles/<gpu>/aiconfigurator/
#   attention.csv: FA3 on the Hoppers, FlashAttention 2 on the A100 and L40S, FlashInfer on the B200), each
#   GPU's own, the pools over theirs; the fit's fixed cost, timed in a CUDA graph, as the served step's
#   (attn_graph_fixed_s). The H200 steps check keeps the H200 profile's SDPA attention
#   (kernel_calibration.toml), which its decoder runs.
#   Fused-MoE parameters (moe_*, sim.cost.moe_fit; `_fp8` for FP8 experts): fitted to aiconfigurator's vLLM
#   fused-MoE tables (profiles/<gpu>/aiconfigurator/moe.csv: H200, H100-SXM, L40S, B200; every expert on the
#   GPU, a balanced gate); the A100-80GB, with no such table, takes its generation's (the L40S's).
#   MLA parameters (mla_<phase>_<term>, `_fp8` for FP8 weights; sim.cost.mla_fit): what vLLM's measured MLA
#   module of DeepSeek-V3 (profiles/<gpu>/aiconfigurator/mla.csv: H200, H100-SXM, L40S, B200, in a CUDA
#   graph) takes beyond its projections and attention kernel, per layer, per (token x head) and per token;
#   a GPU without a table (or a configuration) takes its generation's, else all of them.
#   H200 graph_kernel_fixed_s: fitted to the graphed decode steps of sim/catalog/profiles/h200/steps.csv
#     (batch <= 128) with its other parameters (sim.cost.graph_fit); other GPUs keep
#     kernel_calibration.toml's (fitted end to end on H100 vLLM runs).
# [generation."<major>"]: pooled over the profiled GPUs of that CUDA compute capability, [pooled]: over all
#   (each GPU weighing the same, each on its data set above): the transfer rule for a GPU without a profile
#   and without a profiled GPU of its exact compute capability, whose table it takes first.
#   Efficiencies are fractions of that GPU's catalog peaks, fixed costs seconds.
# [serving.<name>]: the engine's weight-streaming, compute and KV-streaming efficiencies (fitted on H100-SXM
#   runs, sim/catalog/calibration.toml) are multiplied on that GPU by these: its aiconfigurator GEMMs' and
#   decode attention's efficiencies over the H100-SXM's, on the shapes every GPU's tables have
#   (sim.cost.serving_ratios). [serving_generation."<major>"], [serving_pooled]: the means over that
#   generation's profiled GPUs, over all: the transfer rule for a GPU without tables (after the profiled GPU
#   of its exact compute capability).
# [nccl.<node>], [custom_allreduce.<node>]: all-reduce latency and bandwidth per degree (sim.cost.allreduce)
#   fitted to aiconfigurator's NCCL tables above 8 MiB and vLLM's custom all-reduce in a CUDA graph up to
#   8 MiB (profiles/<gpu>/aiconfigurator/{{nccl,custom}}_allreduce.csv).
"""
    out = [head]
    gpus = fits["gpus"]
    assert isinstance(gpus, dict)
    for name, p in gpus.items():
        out.append(f'\n[gpus."{name}"]\n{_params(p)}')
    gens = fits.get("generation", {})
    assert isinstance(gens, dict)
    for gen, p in gens.items():
        out.append(f'\n[generation."{gen}"]\n{_params(p)}')
    pooled = fits["pooled"]
    assert isinstance(pooled, dict)
    out.append(f"\n[pooled]\n{_params(pooled)}")
    for kind in ("serving", "serving_generation"):
        scales = fits.get(kind, {})
        assert isinstance(scales, dict)
        for name, p in scales.items():
            out.append(f'\n[{kind}."{name}"]\n{_params(p)}')
    if isinstance(every := fits.get("serving_pooled"), dict):
        out.append(f"\n[serving_pooled]\n{_params(every)}")
    for kind in ("nccl", "custom_allreduce"):
        nodes = fits.get(kind, {})
        assert isinstance(nodes, dict)
        for node, f in nodes.items():
            out.append(f"\n[{kind}.{node}]\n")
            out.append(f"degrees = {toml_value(f['degrees'])}\n")
            out.append(f"latency_s = {toml_value([float(f'{v:.4g}') for v in f['latency_s']])}\n")
            out.append(f"bandwidth = {toml_value([float(f'{v:.4g}') for v in f['bandwidth']])}\n")
    return "".join(out)


def run_kernels(write: Path | None, command: str) -> dict[str, object]:
    """Fit, test by leaving each GPU out (both GEMM data sets), and optionally write the parameter file."""
    ratio_rows = serving_ratios()
    fits = fit_kernel_gpus(ratio_rows=ratio_rows)
    if write is not None:
        write_text(write, kernel_gpus_toml(fits, command))
        kernel_gpus.reload()
    steps_cal = KernelCalibration.load(gpu=get_gpu(STEPS_GPU))
    held = {ds: leave_one_gpu_out(dataset=ds, ratios=stream_ratios(ratio_rows)) for ds in DATASETS}
    return {"fits": fits, "held_out": held, "allreduce": aic_allreduce_table(nvlinked()),
            "allreduce_vidur": allreduce_table(), "attention": leave_one_attention_gpu_out(),
            "chunking": chunking_table(), "steps": steps_table(steps_cal),
            "moe_held_out": leave_one_moe_gpu_out(), "serving_ratios": ratio_rows,
            "mla": mla_table()}  # fmt: skip


# Sarathi-Serve's artifact (microsoft/sarathi-serve, branch osdi-sarathi-serve,
# osdi-experiments/figure-9/chunking-overhead.csv): Yi-34B, TP 2, A100-80GB PCIe GPUs NVLinked in pairs; a
# prompt's prefill time in ms (`prefill_execution_time`) by prompt length and chunk size, 16,384 being
# unchunked. Every row of the file.
SARATHI_CHUNK, SARATHI_WIDE, SARATHI_WHOLE = 512, 2048, 16384
SARATHI_CHUNKS = (512, 1024, 2048, 16384)
SARATHI_MS = {  # prompt: ms at each of SARATHI_CHUNKS
    2047: (435.6786895543335, 444.16782539337873, 377.7101621031761, 378.13440579921007),
    4095: (921.9583958387371, 932.2625610977409, 793.903593160212, 775.4438968375325),
    8191: (1958.530533500015, 1946.2371833622456, 1643.3718785643578, 1754.1642995551229),
    16383: (4512.830304540692, 4357.553739473224, 3651.589503698051, 4535.00157520175),
}


def chunked_prefill_seconds(cost: object, prompt: int, chunk: int) -> float:
    """A prompt prefilled in chunks of `chunk` tokens, one step each: every chunk reads the KV of the chunks
    before it (its context) and pays the step's weights and fixed costs."""
    step_time = cost.step_time  # type: ignore[attr-defined]
    return sum(
        step_time(np.array([min(chunk, prompt - start)]), np.array([start]))[0]
        for start in range(0, prompt, chunk)
    )


def chunking_table(gpu: str = "A100-80GB") -> list[dict[str, float]]:
    """Per Sarathi prompt length: the overhead of 512-token chunks in percent, measured and modelled (kernel
    model with the GPU's fitted parameters; the engine's roofline beside it), over the unchunked prompt
    (`<name>_pct`) and over chunks of 2,048 (`<name>_wide_pct`); and the kernel model's error in percent on
    the unchunked prompt and on chunks of 2,048 (`kernel_whole_err_pct`, `kernel_wide_err_pct`)."""
    g, spec = get_gpu(gpu), load_model("yi-34b")
    kernel = KernelCostModel(spec, g, 2, calibration=KernelCalibration.load(gpu=g))
    roof = CostModel(spec, g, 2)
    out = []
    for prompt, times in SARATHI_MS.items():
        ms = dict(zip(SARATHI_CHUNKS, times, strict=True))
        small, wide, whole = ms[SARATHI_CHUNK], ms[SARATHI_WIDE], ms[SARATHI_WHOLE]
        row = {"prompt": float(prompt), "measured_pct": (small / whole - 1) * 100,
               "measured_wide_pct": (small / wide - 1) * 100}  # fmt: skip
        for name, cost in (("kernel", kernel), ("roofline", roof)):
            t = {c: chunked_prefill_seconds(cost, prompt, c) * 1e3 for c in (SARATHI_CHUNK, SARATHI_WIDE)}
            t[SARATHI_WHOLE] = cost.step_time(np.array([prompt]), np.array([0]))[0] * 1e3
            row[f"{name}_pct"] = (t[SARATHI_CHUNK] / t[SARATHI_WHOLE] - 1) * 100
            row[f"{name}_wide_pct"] = (t[SARATHI_CHUNK] / t[SARATHI_WIDE] - 1) * 100
            if name == "kernel":
                row["kernel_whole_err_pct"] = (t[SARATHI_WHOLE] / whole - 1) * 100
                row["kernel_wide_err_pct"] = (t[SARATHI_WIDE] / wide - 1) * 100
        out.append(row)
    return out
