"""Kernel-level cost of one engine step (`sim step`), per GPU under tensor parallelism of degree `tp`.

The pricing of the one step-time implementation (`sim.cost.step_model.StepModel`: shapes, the rows'
per-layer sums, `step_time` / `step_time_totals`) under the kernel profiles' parameter set; the engine,
`sim calibrate` and `sim validate` price it as the calibrated roofline (`sim.cost.roofline`). This pricing
gives `sim step`'s per-kernel breakdown (beside the engine's step time) and the checks against measured
kernels; docs/fidelity.md gives both parameter sets' figures and why the roofline's stays the engine's. The
kernels' arithmetic (the ring bytes, the max of compute and memory) has one definition, in `sim.cost.kernels`.

Each linear layer is a GEMM of (M tokens x K x N per GPU), `sim.cost.kernels.gemm_seconds`:

    time = max(compute, memory) + gemm_overlap_loss · min(compute, memory) + fixed cost
    compute = 2 (M + gemm_m_half_tokens) K N / (peak · gemm_compute_eff) · (1 + gemm_n_half_cols / N)

with memory = bytes / (HBM · gemm_bandwidth_eff) · (1 + gemm_n_half_mem_cols / N), bytes = weights (in their
stored dtype, group scales included) + 16-bit activations in and out; FP8 W8A8 runs at the FP8 peak,
weight-only INT4/INT8 at a share of the 16-bit rate (dequantisation), as sim/catalog/quantisation.py defines
for both cost models. Attention per layer is one kernel over every row: max(FLOPs / (16-bit peak ·
attn_compute_eff) + attn_query_head_s per (prefill query x head), KV bytes read and written / (HBM ·
kv_bandwidth_eff) + attn_row_head_s per (sequence x KV head)) + fixed cost. MoE layers run vLLM's fused-MoE
kernel (fitted per GPU, sim.cost.moe_fit) over the experts the step touches, and each its router's GEMM.
Norms, rotary embedding and activations are memory-bound element-wise kernels, each the longer of the
in-graph fixed cost and its bytes at its kind's bandwidth (`sim.cost.kernels.layer_elementwise`: vLLM's fused
kernels, or a plain PyTorch decoder's for the H200 profile's steps). Under TP, two all-reduces per layer:
NCCL as measured above vLLM's custom all-reduce size, the custom all-reduce as measured below it
(sim/cost/allreduce_pricing.py, the roofline's pricing too).

Inside a step (replayed as a graph) a GEMM pays graph_kernel_fixed_s instead of the isolated kernel's
kernel_fixed_s, and attention its fixed cost as measured in a graph (attn_graph_fixed_s, vLLM's kernels),
else graph_kernel_fixed_s plus the rest of its larger isolated fixed cost (attn_fixed_s - kernel_fixed_s:
its prologue; `sim.cost.kernels.attention_step_fixed`). The host's time per step and per row (scheduling,
input preparation, sampling) overlaps the GPU's (asynchronous scheduling): a step takes the longer of the two.

Parameters: sim/catalog/kernel_calibration.toml (attention, FP8, host and in-step terms, fitted to the H200
profile and end to end), with each GPU's GEMM and element-wise parameters from sim/catalog/kernel_gpus.toml
(`KernelCalibration.load(gpu=...)`: fitted to the GPU's kernel profile, or pooled over the profiled GPUs for
any other; `sim kernels`). docs/fidelity.md lists every parameter with its source.

A step is two arrays: row i computes `new_tokens[i]` tokens on top of `context[i]` cached tokens (prefill
chunks and decodes mixed). GEMM time depends only on the step's token count (and the LM head on its row
count), so it is computed once per distinct count and reused.
"""

from __future__ import annotations

import numpy as np

from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.config.calibration import KernelCalibration
from sim.cost.kernels import (
    ACT_BYTES,
    ELEMENTWISE_SETS,
    Gemm,
    Kernel,
    LayerSums,
    StepCost,
    attention_seconds,
    attention_step_fixed,
    elementwise_seconds,
    fused_moe,
    fused_moe_seconds,
    gemm_seconds,
    host_seconds,
    kernel_seconds,
    layer_elementwise,
    mla_fp8,
    mla_rest_seconds,
    mla_rest_terms,
    moe_format,
    moe_peak,
    overlapped,
    step_arrays,
)
from sim.cost.step_model import StepModel
from sim.io.errors import SimError


class KernelCostModel(StepModel):
    """Kernel-level step cost for one model on one GPU type with tensor parallelism `tp`: the pricing of
    `sim.cost.step_model.StepModel` under the kernel profiles' parameter set (`KernelCalibration`)."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: Gpu,
        tp: int = 1,
        weight_dtype: str | None = None,
        kv_dtype: str | None = None,
        calibration: KernelCalibration | None = None,
        weight_group_size: int | None = None,
        elementwise: str = "vllm",
    ) -> None:
        cal = calibration or KernelCalibration()
        super().__init__(model, gpu, tp, weight_dtype, kv_dtype, weight_group_size, cal)
        self.cal = cal
        self.quant = model.serving_quant(self.weight_dtype, weight_group_size)
        fmt = moe_format(model, gpu, self.weight_dtype, weight_group_size)
        self.moe = (fused_moe(vars(cal), fmt), moe_peak(gpu, fmt)[0]) if fmt is not None else None
        m = model
        L = m.num_layers
        self.gemm_bw = gpu.hbm_bandwidth * cal.gemm_bandwidth_eff
        self.kv_bw = gpu.hbm_bandwidth * cal.kv_bandwidth_eff
        self.peak16 = gpu.flops_16bit
        self.gemms = self._gemm_shapes()
        head_bytes = m.param_bytes("lm_head", weight_dtype, weight_group_size)
        self.head = Gemm("lm_head", 1, m.hidden_size, m.vocab_size / tp, head_bytes, "lm_head")
        self.weight_bytes_static = sum(g.count * g.k * g.n * g.weight_bytes_per_param for g in self.gemms)
        self.weight_bytes_static += self.head.k * self.head.n * self.head.weight_bytes_per_param
        self.heads = max(1.0, m.num_heads / tp)
        self.kv_heads = float(max(1, m.num_kv_heads // tp))  # attention work items per sequence
        # Element-wise kernels per layer (16-bit), as `elementwise` runs them (`layer_elementwise`: vLLM's
        # two fused residual-add + RMSNorm, rotary embedding of q and k, the fused MLP activation), each the
        # longer of the in-graph fixed cost and its bytes at its kind's fitted bandwidth; and the KV-cache
        # write (its bytes are attention's), a fixed cost.
        if elementwise not in ELEMENTWISE_SETS:
            raise SimError(f"elementwise: expected one of {', '.join(ELEMENTWISE_SETS)}, got {elementwise!r}")
        inter = (m.dense_params / max(L, 1)) / (3 * m.hidden_size) / tp if m.dense_params else 0.0
        qk = (m.num_heads + m.num_kv_heads) * m.head_dim / tp
        q = m.num_heads * m.head_dim / tp
        kinds = layer_elementwise(m.hidden_size, qk, q, inter, 1, elementwise)
        # MLA's measured module carries its rotary embedding with its other kernels beyond the projections and
        # attention (`mla_rest`, fitted per GPU: sim.cost.mla_fit).
        self.mla_terms: tuple[float, ...] = ()
        if self.mla:
            self.mla_terms = mla_rest_terms(vars(cal), mla_fp8(m, self.weight_dtype, weight_group_size))
            kinds = tuple(k for k in kinds if k[0] != "rope")
        self.elem_bytes_token = L * sum(n * b for _, n, b in kinds)
        # (kernels a layer, bytes per token, bytes per second, in-graph fixed seconds) of each kernel kind
        self.elem_kinds = tuple(
            (n, b, self.hbm * getattr(cal, f"elementwise_{k}_bandwidth_eff"), cal.graph_kernel_fixed_s)
            for k, n, b in kinds
        )
        self.elem_other_fixed = L * cal.elementwise_fixed_s  # the KV-cache write
        self.elem_kernels = L * (1 + sum(n for _, n, _ in kinds))
        self._linear_memo: dict[int, float] = {}
        self._head_memo: dict[int, float] = {}

    # ----------------------------------------------------------------------------------------- shapes

    def _gemm_shapes(self) -> list[Gemm]:
        """The layers' GEMMs per GPU: q/k/v (MLA: its replicated down-projections apart, `qkv_a`), output
        projection, MLP up (gated: gate and up) and down."""
        m, tp, wd, gs = self.model, self.tp, self.weight_dtype, self.group_size
        L, H = m.num_layers, m.hidden_size
        attn = m.attention_params / L
        o = m.num_heads * m.v_head_dim * H
        whole = m.replicated_attention_params / L  # MLA's down-projections, on every GPU whole
        qkv = max(attn - o - whole, 0.0)
        ab = m.param_bytes("attention", wd, gs)
        out = [Gemm("qkv_a", L, H, whole / H, ab, "attention")] if whole else []
        out += [
            Gemm("qkv", L, H, qkv / H / tp, ab, "attention"),
            Gemm("o_proj", L, o / H / tp, H, ab, "attention"),
        ]
        # An MoE layer's router (hidden x experts, replicated on every GPU) is a GEMM of its own; the rest of
        # the dense parameters (dense layers' MLPs, shared experts) spread over the layers as one MLP.
        router = m.num_moe_layers * H * m.num_experts
        wb = m.param_bytes("dense", wd, gs)
        if router:
            out.append(Gemm("router", m.num_moe_layers, H, m.num_experts, wb, "dense", shaped=False))
        if m.dense_params > router:
            dense = (m.dense_params - router) / L
            gated = m.model_type != "opt"
            up = dense * (2 / 3 if gated else 1 / 2)
            out.append(Gemm("mlp_up", L, H, up / H / tp, wb, "dense"))
            out.append(Gemm("mlp_down", L, (dense - up) / H / tp, H, wb, "dense"))
        return out

    def _peak(self, group: str) -> float:
        """Large-M GEMM FLOP/s for a weight group (its format's rate, sim/catalog/quantisation.py)."""
        cal, q = self.cal, self.quant
        if not q.dtype or q.kept_fraction(group) >= 1.0:
            return self.peak16 * cal.gemm_compute_eff
        dtype, activations, _ = q.format_of(group)
        if not activations:
            return self.peak16 * cal.gemm_compute_eff * cal.dequant_compute_eff
        peak8 = self.gpu.peak_flops(dtype)[0]
        if peak8 > self.peak16:
            return peak8 * cal.gemm_compute_eff_fp8
        return self.peak16 * cal.gemm_compute_eff

    # ----------------------------------------------------------------------------------------- kernels

    def _gemm(self, g: Gemm, m: float) -> Kernel:
        flops = 2.0 * m * g.k * g.n
        nbytes = g.k * g.n * g.weight_bytes_per_param + ACT_BYTES * m * (g.k + g.n)
        peak = self._peak(g.group)
        fixed = self.cal.graph_kernel_fixed_s
        if g.shaped:
            t = gemm_seconds(m, g.k, g.n, g.weight_bytes_per_param, peak, self.gemm_bw, fixed, self.cal)
        else:
            t = kernel_seconds(flops, nbytes, peak, self.gemm_bw, fixed)
        bound = "compute" if flops / peak > nbytes / self.gemm_bw else "memory"
        return Kernel(g.name, g.count, g.count * t, bound, g.count * flops, g.count * nbytes)

    def _experts(self, tokens: float) -> Kernel | None:
        """Routed experts of the MoE layers: vLLM's fused-MoE kernel, one a layer, over the experts the step
        touches (`sim.cost.kernels.fused_moe_seconds` at the GPU's fit for 16-bit or FP8 experts,
        `moe_format`); other formats as two GEMMs per touched expert at the format's rate."""
        m = self.model
        if not m.num_moe_layers:
            return None
        touched = self.touched(tokens)
        pairs = tokens * m.experts_per_token
        inter = m.expert_params / (3 * m.hidden_size) / self.tp
        wb, h, layers = m.param_bytes("experts", self.weight_dtype), m.hidden_size, m.num_moe_layers
        nbytes = touched * 3.0 * h * inter * wb + 2.0 * ACT_BYTES * pairs * h
        flops = 6.0 * h * inter * pairs
        if self.moe is not None:
            p, peak = self.moe
            t = fused_moe_seconds(pairs, touched, h, inter, wb, peak * p.moe_compute_eff,
                                  self.hbm * p.moe_bandwidth_eff, p)  # fmt: skip
            compute_bound = flops / (peak * p.moe_compute_eff) > nbytes / (self.hbm * p.moe_bandwidth_eff)
            bound = "compute" if compute_bound else "memory"
            return Kernel("moe_experts", layers, layers * t, bound, layers * flops, layers * nbytes)
        per_expert = pairs / touched
        peak, fixed = self._peak("experts"), self.cal.graph_kernel_fixed_s
        t = compute = 0.0
        for k, n in ((h, 2 * inter), (inter, h)):
            f = 2.0 * per_expert * k * n
            b = k * n * wb + ACT_BYTES * per_expert * (k + n)
            t += kernel_seconds(f, b, peak, self.gemm_bw, fixed)
            compute += f / peak - b / self.gemm_bw
        bound = "compute" if compute > 0 else "memory"
        count = int(round(2 * touched * layers))
        return Kernel("moe_experts", count, layers * touched * t, bound, layers * flops, layers * nbytes)

    def linear_kernels(self, tokens: int, rows: int) -> list[Kernel]:
        """GEMMs, MoE experts, element-wise kernels, LM head and all-reduces of a step of `tokens` tokens."""
        out = [self._gemm(g, tokens) for g in self.gemms]
        experts = self._experts(tokens)
        if experts is not None:
            out.append(experts)
        eb = self.elem_bytes_token * tokens
        t_elem = self.elementwise_time(tokens)
        out.append(Kernel("elementwise", self.elem_kernels, t_elem, "memory", 0.0, eb))
        out.append(self._gemm(self.head, rows))
        if self.allreduces:
            ar = self.allreduce_seconds(tokens)
            out.append(Kernel("allreduce", self.allreduces, ar, "latency", 0.0, 0.0))
        return out

    def elementwise_time(self, tokens: float) -> float:
        """Seconds of a step's element-wise kernels over `tokens` tokens, each kind the longer of its fixed
        cost and its bytes (`sim.cost.kernels.elementwise_seconds`)."""
        L = self.model.num_layers
        t = sum(n * float(elementwise_seconds(b * tokens, bw, f)) for n, b, bw, f in self.elem_kinds)
        return L * t + self.elem_other_fixed

    def _linear_time(self, tokens: int) -> float:
        """Seconds of everything but attention and the LM head for `tokens` tokens (memoised)."""
        t = self._linear_memo.get(tokens)
        if t is None:
            t = sum(k.seconds for k in self.linear_kernels(tokens, 0) if k.name != "lm_head")
            self._linear_memo[tokens] = t
        return t

    def _head_time(self, rows: int) -> float:
        t = self._head_memo.get(rows)
        if t is None:
            t = self._head_memo[rows] = self._gemm(self.head, rows).seconds
        return t

    def attention(
        self, pairs: float, kv_tokens: float, query_tokens: float, tokens: float, layers: int, rows: int = 0
    ) -> Kernel:
        """Attention kernels of `layers` layers: `pairs` (query, key) pairs and `kv_tokens` cached tokens read
        per layer, `query_tokens` prefill queries, `tokens` new KV entries written, `rows` sequences."""
        cal = self.cal
        flops = self.attn_flops_pair * pairs
        nbytes = self.kv_layer_bytes * (kv_tokens + tokens)
        t = self._attention_time(pairs, kv_tokens, query_tokens, tokens, rows)
        comp = (
            flops / (self.peak16 * cal.attn_compute_eff) + cal.attn_query_head_s * query_tokens * self.heads
        )
        mem = nbytes / self.kv_bw + cal.attn_row_head_s * rows * self.kv_heads
        bound = "compute" if comp > mem else "memory"
        return Kernel("attention", layers, layers * t, bound, layers * flops, layers * nbytes)

    def _attention_time(
        self, pairs: float, kv_tokens: float, query_tokens: float, tokens: float, rows: int
    ) -> float:
        flops = self.attn_flops_pair * pairs
        nbytes = self.kv_layer_bytes * (kv_tokens + tokens)
        cal = self.cal
        fixed = attention_step_fixed(cal)
        items = rows * self.kv_heads
        return attention_seconds(
            cal, flops, query_tokens * self.heads, nbytes, self.peak16, self.hbm, fixed, items
        )

    # ----------------------------------------------------------------------------------------- steps

    def _seconds(self, tokens: int, rows: int, sums: LayerSums) -> tuple[float, bool]:
        """The kernel profiles' pricing of a step (`StepModel.step_time` and `step_time_totals` call it)."""
        return self._wall(tokens, rows, sums), self._compute_bound(tokens)

    def _wall(self, tokens: int, rows: int, sums: LayerSums) -> float:
        """GPU and host seconds of a step: max(the GPU's kernels, the host's work)."""
        pairs, ctx, s_pairs, s_ctx, queries = sums
        t = self._linear_time(tokens) + self._head_time(rows)
        if self.full_layers:
            t += self.full_layers * self._attention_time(pairs, ctx, queries, tokens, rows)
        ns = self.model.num_sliding_layers
        if ns:
            t += ns * self._attention_time(s_pairs, s_ctx, queries, tokens, rows)
        if self.mla_terms:
            t += self._mla_rest(tokens, queries)
        return float(overlapped(t, host_seconds(self.cal, rows)))

    def _mla_rest(self, tokens: float, queries: float) -> float:
        """MLA's module beyond its projections and attention kernel, over the layers (`mla_rest_seconds`)."""
        rest = mla_rest_seconds(self.mla_terms, queries, tokens - queries, self.heads)
        return self.model.num_layers * rest

    def step(self, new_tokens: np.ndarray, context: np.ndarray) -> StepCost:
        """Full breakdown of one step, kernel by kernel."""
        c, q = step_arrays(new_tokens, context)
        rows = int(c.size)
        tokens = int(c.sum()) if rows else 0
        if tokens <= 0:
            return StepCost(0.0, "memory", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, rows, 0.0, ())
        sums = self._sums(c, q)
        pairs, ctx, s_pairs, s_ctx, queries = sums
        kernels = self.linear_kernels(tokens, rows)
        if self.full_layers:
            kernels.append(self.attention(pairs, ctx, queries, tokens, self.full_layers, rows))
        if self.model.num_sliding_layers:
            k = self.attention(s_pairs, s_ctx, queries, tokens, self.model.num_sliding_layers, rows)
            kernels.append(Kernel("attention_sliding", k.count, k.seconds, k.bound, k.flops, k.bytes))
        if self.mla_terms:
            L = self.model.num_layers
            kernels.append(Kernel("mla_rest", L, self._mla_rest(tokens, queries), "memory", 0.0, 0.0))
        host = float(host_seconds(self.cal, rows))
        seconds = self._wall(tokens, rows, sums)  # max(GPU kernels, host): asynchronous scheduling
        compute = sum(k.seconds for k in kernels if k.bound == "compute")
        gpu = sum(k.seconds for k in kernels)
        ar = sum(k.seconds for k in kernels if k.name == "allreduce")
        m = self.model
        touched = self.touched(tokens)
        weights = self.weight_bytes_static + m.num_moe_layers * touched * self.expert_bytes_per_layer
        kv_read = self.kv_layer_bytes * (self.full_layers * ctx + m.num_sliding_layers * s_ctx)
        return StepCost(
            seconds=seconds,
            bound="compute" if compute > (gpu - compute) else "memory",
            gpu_s=gpu,
            host_s=host,
            allreduce_s=ar,
            compute_s=compute,
            memory_s=gpu - compute,
            flops=sum(k.flops for k in kernels),
            weight_bytes=weights,
            kv_read_bytes=kv_read,
            kv_write_bytes=self.kv_token_bytes * tokens,
            tokens=tokens,
            rows=rows,
            experts_touched=touched,
            kernels=tuple(kernels),
        )

    def _compute_bound(self, tokens: int) -> bool:
        """The step's large GEMMs run at the compute roofline (tokens past the ridge point)."""
        g = self.gemms[0] if self.gemms else self.head
        return (
            2.0 * tokens * g.k * g.n / self._peak(g.group)
            > g.k * g.n * g.weight_bytes_per_param / self.gemm_bw
        )
