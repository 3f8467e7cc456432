"""The two cost models' parameters (`Calibration`: the engine's roofline; `KernelCalibration`: the
kernel-level model of `sim step`), read from the `[calibration]` table of a parameter file: the shipped one
by default, or a user's; a scenario's `[calibration]` overrides the first.

The roofline's efficiencies in such a table are the H100-SXM's (the GPU of the shipped fit's runs), a
scenario's values included: on another GPU the engine charges them as that GPU's measured kernels reach
them (`Calibration.on_gpu`)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path

from sim.catalog.gpus import Gpu
from sim.catalog.kernel_gpus import kernel_gpu_params, serving_scales
from sim.io.errors import SimError


def calibration_range(key: str) -> tuple[float, float]:
    """The values a calibration parameter may take: efficiencies (`*_eff*`, fractions of a peak) in
    [0.001, 1], overheads and latencies (seconds) in [0, 1], token and column counts in [0, 1e5], scales of a
    measured cost (`*_scale`) in [0.001, 100]."""
    if key.endswith(("_tokens", "_cols")):  # GEMM tile-fill constants, in tokens or output columns
        return (0.0, 1e5)
    if key.endswith("_scale"):
        return (1e-3, 100.0)
    return (1e-3, 1.0) if "_eff" in key else (0.0, 1.0)


def calibration_problem(key: str, value: object) -> str | None:
    """Why `value` cannot be calibration parameter `key`, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"expected a number (got {value!r})"
    low, high = calibration_range(key)
    if not low <= value <= high:  # also refuses nan
        return f"must be in [{low:g}, {high:g}] (got {value:g})"
    return None


def calibration_table(shipped: str, path: str | Path | None, known: set[str]) -> dict[str, float]:
    """`[calibration]` of `path`, or of `sim/catalog/<shipped>` when `path` is None; keys outside `known`,
    malformed TOML and values that are no number in range are errors naming the file."""
    if path is None:
        text = (resources.files("sim") / "catalog" / shipped).read_text()
    else:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SimError(f"cannot read calibration file {path}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise SimError(f"{path}: not a UTF-8 text file (bad byte at offset {exc.start})") from None
    try:
        table = tomllib.loads(text).get("calibration", {})
    except tomllib.TOMLDecodeError as exc:
        raise SimError(f"{path or shipped}: not valid TOML: {exc}") from None
    if not isinstance(table, dict):
        raise SimError(f"{path or shipped}: calibration: expected a table of parameters")
    unknown = set(table) - known
    if unknown:
        raise SimError(
            f"{path or shipped}: calibration: unknown keys {sorted(unknown)}; known: {sorted(known)}"
        )
    for key, value in table.items():
        why = calibration_problem(key, value)
        if why is not None:
            raise SimError(f"{path or shipped}: calibration.{key}: {why}")
    return {k: float(v) for k, v in table.items()}


@dataclass(frozen=True)
class Calibration:
    """Efficiencies and overheads; defaults are the fitted values of sim/catalog/calibration.toml."""

    compute_eff_prefill: float = 0.7483  # held: the H200 profile's 16-bit GEMM efficiency
    compute_eff_decode: float = 0.7483
    bandwidth_eff: float = 0.8195  # weight reads (GEMM/GEMV)
    kv_bandwidth_eff: float = 0.8558  # held: the H200 profile's decode-attention (KV-cache) efficiency
    step_overhead_s: float = 1e-05
    layer_overhead_s: float = 2.703e-05
    per_row_overhead_s: float = 0.0  # held: host work per row overlaps the previous step (async scheduling)
    sampler_s_per_entry: float = 3.648e-10  # logits processing and sampling, per row and vocabulary entry
    allreduce_scale: float = 1.0  # held: the measured all-reduces (sim/cost/allreduce_pricing.py) as they are

    @classmethod
    def load(cls, path: str | Path | None = None) -> Calibration:
        """Read a `[calibration]` table (default: the shipped calibration.toml); unknown keys are errors."""
        return cls(**calibration_table("calibration.toml", path, {f.name for f in fields(cls)}))

    def on_gpu(self, gpu: Gpu) -> Calibration:
        """The efficiencies as `gpu` reaches them: these (fitted on H100-SXM runs) times the GPU's kernels'
        weight-streaming, compute and KV-streaming efficiencies over the H100's (`serving_scales`; 1 on
        the H100-SXM), each at most 1."""
        s = serving_scales(gpu)[0]
        compute = s["compute"]
        return replace(
            self,
            compute_eff_prefill=min(1.0, self.compute_eff_prefill * compute),
            compute_eff_decode=min(1.0, self.compute_eff_decode * compute),
            bandwidth_eff=min(1.0, self.bandwidth_eff * s["weights"]),
            kv_bandwidth_eff=min(1.0, self.kv_bandwidth_eff * s["kv"]),
        )


@dataclass(frozen=True)
class KernelCalibration:
    """Kernel efficiencies, fixed costs and host overheads; defaults: sim/catalog/kernel_calibration.toml."""

    gemm_compute_eff: float = 0.7483  # large-M 16-bit GEMM, fraction of dense peak (H200 profile)
    gemm_compute_eff_fp8: float = 0.7372  # large-M FP8 W8A8 GEMM, fraction of the FP8 peak (H200 profile)
    gemm_bandwidth_eff: float = 0.8688  # small-M GEMM weight streaming, fraction of HBM peak (H200 profile)
    kernel_fixed_s: float = 1.117e-05  # per GEMM kernel: launch, ramp and tail (H200 profile)
    dequant_compute_eff: float = 0.9  # weight-only INT4/INT8: share of 16-bit rate left (prior; Marlin)
    attn_compute_eff: float = 0.6395  # causal flash-attention prefill, fraction of 16-bit peak (H200 profile)
    attn_query_head_s: float = 1.952e-10  # prefill attention time per (query token x head) (H200 profile)
    kv_bandwidth_eff: float = 0.8558  # decode attention KV reads, fraction of HBM peak (H200 profile)
    attn_fixed_s: float = 1.191e-05  # per attention kernel (H200 profile)
    attn_row_head_s: float = 8.218e-09  # per (sequence x KV head) decode work item (H200 profile)
    # attention's fixed cost in a replayed step as measured in a CUDA graph (vLLM's kernels, aiconfigurator);
    # 0: graph_kernel_fixed_s plus the isolated prologue, attn_fixed_s - kernel_fixed_s (the H200 profile)
    attn_graph_fixed_s: float = 0.0
    graph_kernel_fixed_s: float = 3.068e-06  # per kernel in a replayed serving step (end-to-end fit)
    elementwise_fixed_s: float = 3e-06  # per element-wise kernel (prior: aiconfigurator's 3 µs latency)
    allreduce_latency_s: float = 2e-06  # per all-reduce over NVLink (end-to-end fit)
    allreduce_latency_pcie_s: float = 3e-05  # per all-reduce over PCIe (prior)
    allreduce_bandwidth_eff: float = 0.7  # ring all-reduce, fraction of link bandwidth (prior)
    step_overhead_s: float = 0.0001034  # host per step: scheduling, inputs, sampling (end-to-end fit)
    per_row_overhead_s: float = 1.008e-07  # host: per sequence in the step (end-to-end fit)
    # GEMM shape terms (sim.cost.kernels.gemm_seconds) and element-wise kernels per kind; these defaults
    # keep the H200 fit above, the per-GPU fits are in kernel_gpus.toml (`load(gpu=...)`).
    gemm_overlap_loss: float = 0.0  # share of the shorter of compute and memory time not hidden
    gemm_m_half_tokens: float = 0.0  # tile fill: compute × (1 + this / M)
    gemm_n_half_cols: float = 0.0  # narrow shards: compute × (1 + this / N)
    gemm_n_half_mem_cols: float = 0.0  # narrow shards: weight streaming × (1 + this / N)
    elementwise_norm_bandwidth_eff: float = 0.8688
    elementwise_norm_fixed_s: float = 3e-06
    elementwise_add_bandwidth_eff: float = 0.8688
    elementwise_add_fixed_s: float = 3e-06
    elementwise_rope_bandwidth_eff: float = 0.8688
    elementwise_rope_fixed_s: float = 3e-06
    elementwise_act_bandwidth_eff: float = 0.8688
    elementwise_act_fixed_s: float = 3e-06
    # vLLM's fused-MoE kernel (sim.cost.kernels.fused_moe_seconds) for 16-bit and FP8 (W8A8) experts; these
    # defaults are the H200's fit to aiconfigurator's table (sim.cost.moe_fit), each GPU's in
    # kernel_gpus.toml.
    moe_compute_eff: float = 0.7761  # large-M expert GEMMs, fraction of the 16-bit peak
    moe_bandwidth_eff: float = 0.9351  # expert weight streaming, fraction of HBM peak
    moe_m_half_tokens: float = 48.15  # tile fill per touched expert: rows charged beyond its tokens
    moe_n_half_cols: float = 254.3  # narrow shards of the intermediate width: compute x (1 + this / I)
    moe_overlap_loss: float = 0.2637  # share of the shorter of compute and memory not hidden
    moe_fixed_s: float = 2.912e-05  # per MoE layer's kernel
    moe_compute_eff_fp8: float = 0.357  # the same for FP8 experts, fraction of the FP8 peak
    moe_bandwidth_eff_fp8: float = 0.7855
    moe_m_half_tokens_fp8: float = 37.96
    moe_n_half_cols_fp8: float = 284.5
    moe_overlap_loss_fp8: float = 0.07762
    moe_fixed_s_fp8: float = 3.637e-05
    # vLLM's MLA attention module beyond its projections and attention kernel (sim.cost.mla_fit), per phase:
    # fixed per layer, per (token x head on the GPU), per token; `_fp8` for FP8 weights. 0: not charged (the
    # fits are per GPU in kernel_gpus.toml).
    mla_prefill_fixed_s: float = 0.0
    mla_prefill_token_head_s: float = 0.0
    mla_prefill_token_s: float = 0.0
    mla_prefill_fixed_s_fp8: float = 0.0
    mla_prefill_token_head_s_fp8: float = 0.0
    mla_prefill_token_s_fp8: float = 0.0
    mla_decode_fixed_s: float = 0.0
    mla_decode_token_head_s: float = 0.0
    mla_decode_token_s: float = 0.0
    mla_decode_fixed_s_fp8: float = 0.0
    mla_decode_token_head_s_fp8: float = 0.0
    mla_decode_token_s_fp8: float = 0.0

    @classmethod
    def load(cls, path: str | Path | None = None, gpu: Gpu | None = None) -> KernelCalibration:
        """Read a `[calibration]` table (default: kernel_calibration.toml); unknown keys are errors. With
        `gpu` and no `path`, the GPU's fitted kernel parameters (sim/catalog/kernel_gpus.toml, its own or
        by the transfer rule) replace the defaults they cover."""
        table = calibration_table("kernel_calibration.toml", path, {f.name for f in fields(cls)})
        if gpu is not None and path is None:
            table |= kernel_gpu_params(gpu)[0]
        return cls(**table)


@cache
def shipped_kernel_calibration() -> KernelCalibration:
    """`KernelCalibration.load()`, read once: sim/catalog/kernel_calibration.toml as shipped."""
    return KernelCalibration.load()
