"""The kernels of a step: time of one GEMM, attention or element-wise kernel, and the host's share; and the
step arithmetic both cost models share (the rows' attention sums, the max of compute and memory)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.config.calibration import KernelCalibration

ACT_BYTES = 2  # activations are 16-bit


# Per-layer sums of a step's rows: (pairs and KV tokens read on a full-attention layer, the same on a
# sliding-window layer, prefill query tokens).
LayerSums = tuple[float, float, float, float, float]


def step_arrays(new_tokens: np.ndarray, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A step's rows as ndarrays: given ones as they are (no copy), other sequences converted once."""
    c = new_tokens if isinstance(new_tokens, np.ndarray) else np.asarray(new_tokens)
    q = context if isinstance(context, np.ndarray) else np.asarray(context)
    if c.shape != q.shape:
        raise ValueError(f"new_tokens {c.shape} and context {q.shape} differ in shape")
    return c, q


def layer_sums(c: np.ndarray, q: np.ndarray, tokens: float, sliding: bool, window: float) -> LayerSums:
    """Per-layer attention sums of rows computing c new tokens on q cached ones (`tokens` = Σc). A row adds
    c·q + c(c+1)/2 (query, key) pairs, so full layers need only Σc·q and Σc²; a `sliding` layer of `window`
    tokens differs only where a row reaches past the window."""
    cq, cc = float(np.dot(c, q)), float(np.dot(c, c))
    pairs = cq + 0.5 * (cc + tokens)
    ctx = float(q.sum())
    queries = tokens - float(np.count_nonzero(c == 1))
    if not sliding or float((q + c).max()) <= window:
        return pairs, ctx, pairs, ctx, queries
    w = window
    end, start = (q + c).astype(np.float64), q.astype(np.float64)
    s_end = np.where(end <= w, end * (end + 1) * 0.5, w * (w + 1) * 0.5 + (end - w) * w)
    s_start = np.where(start <= w, start * (start + 1) * 0.5, w * (w + 1) * 0.5 + (start - w) * w)
    return pairs, ctx, float((s_end - s_start).sum()), float(np.minimum(start, w).sum()), queries


def totals_layer_sums(tokens: int, ones: int, cq: int, cc: int, ctx: int) -> LayerSums:
    """`layer_sums` from the rows' integer sums (no row reaching a sliding window): Σc, #(c == 1), Σc·q, Σc²
    and Σq."""
    pairs = float(cq) + 0.5 * (float(cc) + float(tokens))
    c = float(ctx)
    return pairs, c, pairs, c, float(tokens) - float(ones)


def kernel_seconds(flops, nbytes, flops_per_s, bytes_per_s, fixed_s):  # type: ignore[no-untyped-def]
    """max(compute, memory) + fixed cost of a kernel; floats or numpy arrays alike (the fit uses it)."""
    comp, mem = flops / flops_per_s, nbytes / bytes_per_s
    return 0.5 * (comp + mem + abs(comp - mem)) + fixed_s


def gemm_seconds(m, k, n, weight_bytes, flops_per_s, bytes_per_s, fixed_s, shape):  # type: ignore[no-untyped-def]
    """One GEMM of (m tokens x k x n) with `weight_bytes` per weight: max(compute, memory) plus the share
    `shape.gemm_overlap_loss` of the shorter that is not hidden behind the longer, plus the fixed cost.

    Compute runs at `flops_per_s` (large-M rate) slowed by partly filled tiles at small m and narrow n:
    × (1 + gemm_m_half_tokens / m)(1 + gemm_n_half_cols / n). Memory is the weights plus 16-bit activations
    in and out at `bytes_per_s`, slowed on narrow shards (few output tiles stream the weights) by
    × (1 + gemm_n_half_mem_cols / n). Floats or numpy arrays alike: the fit (`sim.cost.gemm_fit`) uses it
    too."""
    filled = m + shape.gemm_m_half_tokens * (m > 0)  # m (1 + m_half / m), and nothing at m = 0
    comp = 2.0 * filled * k * n / flops_per_s * (1.0 + shape.gemm_n_half_cols / n)
    narrow = 1.0 + shape.gemm_n_half_mem_cols / n
    mem = (k * n * weight_bytes + ACT_BYTES * m * (k + n)) / bytes_per_s * narrow
    longer = 0.5 * (comp + mem + abs(comp - mem))
    return longer + shape.gemm_overlap_loss * (comp + mem - longer) + fixed_s


@dataclass(frozen=True)
class FusedMoe:
    """One GPU's fused-MoE kernel parameters for one expert format (sim.cost.moe_fit)."""

    moe_compute_eff: float
    moe_bandwidth_eff: float
    moe_m_half_tokens: float
    moe_n_half_cols: float
    moe_overlap_loss: float
    moe_fixed_s: float


def fused_moe(params: Mapping[str, float], fmt: str) -> FusedMoe:
    """The parameters of format `fmt` ("bf16" or "fp8": names with `_fp8`) from a GPU's kernel parameters."""
    tail = "" if fmt == "bf16" else f"_{fmt}"
    return FusedMoe(**{name: params[f"{name}{tail}"] for name in FusedMoe.__dataclass_fields__})


def moe_format(model: ModelSpec, gpu: Gpu, weight_dtype: str, group_size: int | None) -> str | None:
    """The fused-MoE fit a model's routed experts run under: "bf16" for 16-bit experts, "fp8" for W8A8 FP8
    experts on a GPU with FP8 tensor cores (the fit is of 128 x 128-block scales; per-tensor and per-channel
    scales are taken to run alike), None for dense models and other formats."""
    if not model.num_experts:
        return None
    q = model.serving_quant(weight_dtype, group_size)
    if not q.dtype or q.kept_fraction("experts") >= 1.0:
        return "bf16" if model.param_bytes("experts", weight_dtype, group_size) == 2 else None
    dtype, activations, _ = q.format_of("experts")
    return "fp8" if dtype == "fp8" and activations and gpu.flops_fp8 > 0 else None


def moe_peak(gpu: Gpu, fmt: str) -> tuple[float, float]:
    """(peak FLOP/s, bytes a weight) the fused-MoE fit of format `fmt` is a fraction of: the 16-bit peak and
    2 bytes for "bf16", the FP8 peak and 1 byte for "fp8"."""
    return (gpu.flops_16bit, 2.0) if fmt == "bf16" else (gpu.flops_fp8, 1.0)


def fused_moe_flops(pairs, touched, hidden, inter, m_half, n_half):  # type: ignore[no-untyped-def]
    """FLOPs a fused-MoE layer is charged at its kernel's large-M rate: `pairs` (token, expert) pairs through
    the gated expert MLP (gate and up, H x 2I, then down, I x H: 6 H I FLOPs a pair) on `inter`-wide shards,
    each of the `touched` experts' GEMMs filling `m_half` more rows of its tiles, narrow shards slowed by
    (1 + n_half / inter): `gemm_seconds`' shape terms, per expert. Floats or numpy arrays alike."""
    return 6.0 * hidden * inter * (pairs + touched * m_half) * (1.0 + n_half / inter)


def fused_moe_seconds(pairs, touched, hidden, inter, weight_bytes, flops_per_s, bytes_per_s, shape):  # type: ignore[no-untyped-def]
    """One fused-MoE layer (vLLM's fused experts, every touched expert's gate/up and down GEMMs in one
    kernel): max(compute, memory) plus the share `shape.moe_overlap_loss` of the shorter, plus
    `shape.moe_fixed_s`. Compute is `fused_moe_flops` at `flops_per_s`; memory the touched experts' weights
    (3 H I each, `weight_bytes` a weight) and the pairs' 16-bit activations in and out at `bytes_per_s`.
    Floats or numpy arrays alike (the fit, sim.cost.moe_fit, uses it too)."""
    comp = fused_moe_flops(pairs, touched, hidden, inter, shape.moe_m_half_tokens, shape.moe_n_half_cols)
    comp = comp / flops_per_s
    mem = (touched * 3.0 * hidden * inter * weight_bytes + 2.0 * ACT_BYTES * pairs * hidden) / bytes_per_s
    longer = 0.5 * (comp + mem + abs(comp - mem))
    return longer + shape.moe_overlap_loss * (comp + mem - longer) + shape.moe_fixed_s


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


ELEMENTWISE_SETS = ("vllm", "torch")


def layer_elementwise(hidden, qk_width, q_width, inter_width, gated, kernels="vllm"):  # type: ignore[no-untyped-def]
    """(fitted kind whose bandwidth it streams at, kernels a layer, bytes per token each) of a decoder
    layer's element-wise kernels, as `kernels` runs them. vLLM ("vllm") fuses the residual add into RMSNorm
    (charged as RMSNorm) and SiLU into the multiply. A plain PyTorch decoder ("torch": the H200 profile's
    whole steps, sim/catalog/profiles/h200/steps.csv) runs torch.nn.RMSNorm and the two residual adds
    apart, SiLU (at the activation's bandwidth, over its one input and output) apart from the multiply, and
    the attention output's copy back to (tokens, heads x dim) (the multiply and the copy at the residual
    add's bandwidth: binary and copying element-wise kernels), and no rotary embedding. The KV-cache write
    is not listed (its bytes are attention's)."""
    b = elementwise_bytes(hidden, qk_width, inter_width, gated)
    if kernels == "vllm":
        return (("norm", 2, b["norm"]), ("rope", 1, b["rope"]), ("act", 1, b["act"]))
    return (("norm", 2, b["norm"]), ("add", 2, b["add"]), ("act", 1, ACT_BYTES * 2 * inter_width),
            ("add", 1, ACT_BYTES * 3 * inter_width), ("add", 1, ACT_BYTES * 2 * q_width))  # fmt: skip


def elementwise_seconds(nbytes, bytes_per_s, fixed_s):  # type: ignore[no-untyped-def]
    """One memory-bound element-wise kernel: the longer of its fixed cost and its bytes at `bytes_per_s`. A
    small kernel takes its fixed cost whatever its size (Vidur's RMSNorm at hidden 4,096 on an A100: 4-5 µs
    from 1 to 192 tokens), a large one its bytes. Floats or arrays alike."""
    return np.maximum(nbytes / bytes_per_s, fixed_s)


def attention_step_fixed(cal) -> float:  # type: ignore[no-untyped-def]
    """An attention kernel's fixed cost inside a replayed step: as measured in a CUDA graph where the GPU's
    parameters have it (`attn_graph_fixed_s`), else a GEMM's in-graph cost plus the rest of attention's larger
    isolated fixed cost (its prologue: scheduling metadata, split-KV reduction)."""
    if cal.attn_graph_fixed_s > 0.0:
        return float(cal.attn_graph_fixed_s)
    return float(cal.graph_kernel_fixed_s + max(cal.attn_fixed_s - cal.kernel_fixed_s, 0.0))


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
    # the fitted shape terms apply (`gemm_seconds`); False for a GEMM far narrower than any fitted one (a MoE
    # router, N = experts, against N >= 768 in the tables): max(compute, memory) + fixed cost
    shaped: bool = True


# MLA's attention module beyond the projections and the attention kernel (sim.cost.mla_fit): per phase, a
# fixed cost per layer, a cost per (token x head on the GPU) and one per token; `_fp8` for FP8 weights.
MLA_PHASES = ("prefill", "decode")
MLA_TERMS = ("fixed_s", "token_head_s", "token_s")


def mla_key(phase: str, term: str, fp8: bool) -> str:
    """The KernelCalibration field of one MLA term."""
    return f"mla_{phase}_{term}" + ("_fp8" if fp8 else "")


def mla_rest_terms(params: Mapping[str, float], fp8: bool) -> tuple[float, ...]:
    """The six MLA terms of a GPU's kernel parameters (prefill's three, then decode's; absent: 0) for 16-bit
    or FP8 weights."""
    return tuple(float(params.get(mla_key(p, t, fp8), 0.0)) for p in MLA_PHASES for t in MLA_TERMS)


def mla_rest_seconds(
    terms: tuple[float, ...], prefill_tokens: float, decode_tokens: float, heads: float
) -> float:
    """One layer's MLA module beyond its listed kernels (`mla_rest_terms`): vLLM runs a step's prompt tokens
    and its one-token rows down separate paths, each paying its own fixed cost when it has tokens."""
    pf, ph, pt, df, dh, dt = terms
    seconds = 0.0
    if prefill_tokens > 0.0:
        seconds += pf + prefill_tokens * (ph * heads + pt)
    if decode_tokens > 0.0:
        seconds += df + decode_tokens * (dh * heads + dt)
    return seconds


def mla_fp8(model: ModelSpec, weight_dtype: str, group_size: int | None) -> bool:
    """Whether an MLA model's attention projections run as W8A8 FP8 (the `_fp8` MLA terms)."""
    q = model.serving_quant(weight_dtype, group_size)
    if not q.dtype:
        return False
    dtype, activations, _ = q.format_of("attention")
    return dtype == "fp8" and bool(activations)
