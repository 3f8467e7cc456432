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


def gemm_seconds(m, k, n, weight_bytes, flops_per_s, bytes_per_s, fixed_s, shape):  # type: ignore[no-untyped-def]
    """One GEMM of (m tokens x k x n) with `weight_bytes` per weight: max(compute, memory) plus the share
    `shape.gemm_overlap_loss` of the shorter that is not hidden behind the longer, plus the fixed cost.

    Compute runs at `flops_per_s` (large-M rate) slowed by partly filled tiles at small m and narrow n:
    × (1 + gemm_m_half_tokens / m)(1 + gemm_n_half_cols / n). Memory is the weights plus 16-bit activations
    in and out at `bytes_per_s`. Floats or numpy arrays alike: the fit (`sim.cost.gemm_fit`) uses it too."""
    filled = m + shape.gemm_m_half_tokens * (m > 0)  # m (1 + m_half / m), and nothing at m = 0
    comp = 2.0 * filled * k * n / flops_per_s * (1.0 + shape.gemm_n_half_cols / n)
    mem = (k * n * weight_bytes + ACT_BYTES * m * (k + n)) / bytes_per_s
    longer = 0.5 * (comp + mem + abs(comp - mem))
    return longer + shape.gemm_overlap_loss * (comp + mem - longer) + fixed_s


def elementwise_bytes(hidden, qk_width, inter_width, gated):  # type: ignore[no-untyped-def]
    """Bytes per token of one layer's element-wise kernels (16-bit), by kind: RMSNorm reads and writes the
    hidden state, the residual add reads two and writes one, rotary embedding reads and writes q and k, the
    MLP activation reads gate and up (one input when not gated) and writes one. Floats or arrays alike."""
    return {
        "norm": ACT_BYTES * 2 * hidden,
        "add": ACT_BYTES * 3 * hidden,
        "rope": ACT_BYTES * 2 * qk_width,
        "act": ACT_BYTES * (2 + gated) * inter_width,
    }


def elementwise_seconds(nbytes, bytes_per_s, fixed_s):  # type: ignore[no-untyped-def]
    """One memory-bound element-wise kernel: its bytes at `bytes_per_s` plus its fixed cost."""
    return nbytes / bytes_per_s + fixed_s


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
