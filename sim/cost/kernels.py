"""The kernels of a step: time of one GEMM, attention or element-wise kernel, and the host's share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config.calibration import KernelCalibration

ACT_BYTES = 2  # activations are 16-bit


# Element-wise kernels per layer: two fused residual-add + RMSNorm, rotary embedding, the MLP activation, and
# the KV-cache write.
ELEMENTWISE_KERNELS = 5


def kernel_seconds(flops, nbytes, flops_per_s, bytes_per_s, fixed_s):  # type: ignore[no-untyped-def]
    """max(compute, memory) + fixed cost of a kernel; floats or numpy arrays alike (the fit uses it)."""
    comp, mem = flops / flops_per_s, nbytes / bytes_per_s
    return 0.5 * (comp + mem + abs(comp - mem)) + fixed_s


def attention_seconds(cal, flops, query_heads, nbytes, peak16, hbm, fixed_s, items=0.0):  # type: ignore[no-untyped-def]
    """One attention kernel: FLOPs at the 16-bit peak plus per-(query token x head) work, against KV bytes
    streamed plus the per-(sequence x KV head) work items of a decode kernel (each loads its queries,
    combines its split-KV partial results and writes its output)."""
    comp = flops / (peak16 * cal.attn_compute_eff) + cal.attn_query_head_s * query_heads
    mem = nbytes / (hbm * cal.kv_bandwidth_eff) + cal.attn_row_head_s * items
    return kernel_seconds(comp, mem, 1.0, 1.0, fixed_s)


def host_seconds(cal: KernelCalibration, rows: float | np.ndarray) -> float | np.ndarray:
    """Host-side time of a step with `rows` sequences."""
    return cal.step_overhead_s + cal.per_row_overhead_s * rows


def overlapped(gpu_s, host_s):  # type: ignore[no-untyped-def]
    """A step's wall time: vLLM's asynchronous scheduling prepares step n + 1 on the host while the GPU runs
    step n, so the slower of the two sets the pace. Floats or numpy arrays alike."""
    return 0.5 * (gpu_s + host_s + abs(gpu_s - host_s))


@dataclass(frozen=True)
class Kernel:
    """One kernel kind of a step: how many run, their total time, and what bounds them."""

    name: str
    count: int
    seconds: float
    bound: str  # "compute", "memory" or "latency"
    flops: float
    bytes: float


@dataclass(frozen=True)
class StepCost:
    """Breakdown of one step (per GPU)."""

    seconds: float
    bound: str  # of the kernels: "compute" when compute-bound kernels take most of the GPU time
    gpu_s: float  # kernels and all-reduces
    host_s: float
    allreduce_s: float
    compute_s: float  # time of compute-bound kernels
    memory_s: float  # time of memory- and latency-bound kernels
    flops: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    tokens: int
    rows: int
    experts_touched: float  # expected distinct routed experts per MoE layer
    kernels: tuple[Kernel, ...]


@dataclass(frozen=True)
class Gemm:
    name: str
    count: int  # per step (layers)
    k: float
    n: float
    weight_bytes_per_param: float
    group: str
