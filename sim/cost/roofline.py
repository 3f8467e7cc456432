"""Roofline cost of one engine step: max(linear compute, weight reads) + max(attention compute, KV reads) +
all-reduce + overheads; the pricing of `sim.cost.step_model.StepModel` under the calibrated parameter set
(`Calibration`). The linear layers and attention are separate kernels, so neither hides behind the other: a
step mixing a prompt chunk (compute-bound GEMMs) with decodes (attention streaming the KV cache) pays both.
The all-reduces are the measured ones the kernel model charges (sim/cost/allreduce_pricing.py).

Memory time is weight bytes at `bandwidth_eff` plus KV-cache bytes at `kv_bandwidth_eff` of HBM bandwidth
(GEMMs and paged attention are separate kernels with different achieved bandwidth). The efficiencies are
fitted on H100-SXM runs and charged on each GPU as its measured kernels reach them against the H100's
(`Calibration.on_gpu`: the A100-80GB streams weights at 0.83 and KV at 0.80 of the H100's fraction of HBM).

Compute time is the FLOPs at `compute_eff_*` of the peak, the linear layers' as the GPU's measured GEMMs
fill their tiles: a step's 16-bit GEMMs over M tokens cost as M + `gemm_m_half_tokens` (the GPU's kernel
fit, sim/catalog/kernel_gpus.toml, its own or by the transfer rule; the kernel model's `gemm_seconds` form).
On the A100 that is 93 tokens, so a 512-token chunk computes 18% slower per token than a long prompt; the
Hoppers' tiles fill at once. Routed experts compute as vLLM's fused-MoE kernel (the GPU's fit,
sim/cost/moe_fit.py): per (token, expert) pair and per touched expert's tile fill, at the fitted rate.

A step is two arrays: row i computes `new_tokens[i]` tokens on top of `context[i]` cached tokens
(prefill chunks and decodes mixed). Everything is per GPU under tensor parallelism of degree `tp`. The rows'
attention sums, the all-reduce pricing and each group's max of compute and memory are the kernel model's own
definitions (`sim.cost.kernels`, `sim.cost.allreduce_pricing`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.catalog.gpus import Gpu
from sim.catalog.kernel_gpus import kernel_gpu_params
from sim.catalog.model import ModelSpec
from sim.catalog.quantisation import flop_costs
from sim.config.calibration import Calibration
from sim.core.sampling import SamplingParams
from sim.cost.kernels import (
    LayerSums,
    fused_moe,
    fused_moe_flops,
    kernel_seconds,
    mla_fp8,
    mla_rest_seconds,
    mla_rest_terms,
    moe_format,
    moe_peak,
    step_arrays,
)
from sim.cost.sampler import RowSampler
from sim.cost.step_model import StepModel, expected_distinct_experts


@dataclass(frozen=True)
class StepCost:
    """Breakdown of one step (per GPU)."""

    seconds: float
    bound: str  # "compute" or "memory"
    compute_s: float
    memory_s: float
    allreduce_s: float
    overhead_s: float
    flops_linear: float
    flops_attention: float
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float
    tokens: int
    rows: int
    experts_touched: float  # expected distinct routed experts per MoE layer
    # the FLOPs as charged at the peak (dequantization, 16-bit work under W8A8, the GEMMs' tile fill)
    flops_charged: float = 0.0
    attn_flops_charged: float = 0.0  # attention's share of them
    # each group's roofline, max(its compute, its memory): seconds = linear_s + attention_s + allreduce_s +
    # overhead_s
    linear_s: float = 0.0
    attention_s: float = 0.0


def roofline_seconds(  # type: ignore[no-untyped-def]
    cal, peak, hbm, layers, sort_entries, allreduce_s, flops, attn_flops, share, weight_bytes, kv_bytes,
    rows, row_stream_s=0.0, token_stream_s=0.0,
):  # fmt: skip
    """(seconds, compute_bound) of steps: the one definition behind `CostModel.step`, `step_time`,
    `step_time_totals` and the calibration's re-costing. Floats or numpy arrays alike.

    `flops` are the linear layers' FLOPs as charged (routed experts and the LM head included),
    `attn_flops` attention's; the linear layers are priced against the weight reads, attention against the
    KV-cache reads and writes, and the two added. `share` is the prefill share of the tokens,
    `allreduce_s` the step's all-reduces as measured (`StepModel.allreduce_seconds`), charged times
    `allreduce_scale`; the sampler's terms as `overhead_seconds` takes them. Compute-bound: the step's
    compute is longer than its memory traffic."""
    speed = peak * (share * cal.compute_eff_prefill + (1.0 - share) * cal.compute_eff_decode)
    linear, attention = flops / speed, attn_flops / speed
    weights, kv = weight_bytes / (hbm * cal.bandwidth_eff), kv_bytes / (hbm * cal.kv_bandwidth_eff)
    base = allreduce_s * cal.allreduce_scale
    extra = overhead_seconds(cal, layers, sort_entries, rows, base, row_stream_s, token_stream_s)
    seconds = kernel_seconds(linear, weights, 1.0, 1.0, 0.0) + kernel_seconds(attention, kv, 1.0, 1.0, extra)
    return seconds, linear + attention > weights + kv


def overhead_seconds(  # type: ignore[no-untyped-def]
    cal, layers, sort_entries, rows, base=0.0, row_stream_s=0.0, token_stream_s=0.0
):
    """`base` plus the step's fixed and per-row costs: per step, per layer, and per row its host work and the
    sampler (`sort_entries` vocabulary entries under the fitted sort term, and `row_stream_s` of bytes per
    HBM rate), plus `token_stream_s` of the step's sampler bytes per HBM rate (the penalties' history). The
    streams are charged at `bandwidth_eff`. Floats or numpy arrays alike."""
    bw = cal.bandwidth_eff
    per_row = cal.per_row_overhead_s + sort_entries * cal.sampler_s_per_entry + row_stream_s / bw
    fixed = base + cal.step_overhead_s + layers * cal.layer_overhead_s
    return fixed + rows * per_row + token_stream_s / bw


class CostModel(StepModel):
    """Roofline step cost for one model on one GPU type with tensor parallelism `tp`: the linear layers and
    attention each priced as max(compute, memory) at the calibrated efficiencies, with the all-reduces and
    serving terms."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: Gpu,
        tp: int = 1,
        weight_dtype: str | None = None,
        kv_dtype: str | None = None,
        calibration: Calibration | None = None,
        weight_group_size: int | None = None,
    ) -> None:
        super().__init__(model, gpu, tp, weight_dtype, kv_dtype, weight_group_size)
        # the efficiencies as fitted (on H100-SXM runs), and as this GPU's kernels reach them
        self.calibration = calibration or Calibration()
        self.cal = self.calibration.on_gpu(gpu)
        m = model
        # Weights read every step, in the bytes they are stored in (quantization_config or online
        # quantization, group scales and modules kept in 16-bit included): all but the routed experts and a
        # gathered (untied) input embedding.
        wd, gs = self.weight_dtype, weight_group_size
        groups = ("attention", "dense", "lm_head", "norm") + (("embedding",) if m.lm_head_params == 0 else ())
        static = sum(m.group_params(g) * m.param_bytes(g, wd, gs) for g in groups)
        self.static_weight_bytes = m.shard_bytes(static, tp, wd, gs)  # MLA's down-projections whole
        self.lin_flops_tok = m.linear_flops_per_token_per_gpu(tp)
        self.head_flops_row = m.lm_head_flops / tp
        # The same FLOPs as charged at peak_flops (equal to the above for unquantized weights).
        self.lin_cost_tok = self.lin_flops_tok
        self.head_cost_row = self.head_flops_row
        self.attn_cost_pair = self.attn_flops_pair
        lin_k, head_k, attn_k = flop_costs(m, gpu, wd, gs, self.rate)
        if (lin_k, head_k, attn_k) != (1.0, 1.0, 1.0):
            self.lin_cost_tok *= lin_k
            self.head_cost_row *= head_k
            self.attn_cost_pair *= attn_k
        # The tiles the 16-bit GEMMs fill: every step's token GEMMs and its LM head charged
        # `tile_fill_tokens` more rows (compute = 2 (M + m_half) K N / peak, the kernel model's GEMM). The fit
        # is of 16-bit GEMMs; quantized formats run other kernels (Marlin's tiles are 16 rows), charged none.
        # Charged in whole rows: a fit on its 0.01 floor (the Hoppers, the L40S) fills none.
        params = kernel_gpu_params(gpu)[0]
        fitted = round(params.get("gemm_m_half_tokens", 0.0))
        self.tile_fill_tokens = 0.0 if m.serving_quant(wd, gs).dtype else float(fitted)
        # Routed experts run vLLM's fused-MoE kernel (the GPU's fit, sim.cost.kernels.fused_moe_flops): per
        # (token, expert) pair at the kernel's large-M rate, narrow shards slowed, and each touched expert
        # filling `moe_m_half_tokens` more rows. Charged at the roofline's rate, so scaled by the prefill
        # efficiency over the kernel's. Formats with no fused-MoE fit keep the experts in the linear FLOPs.
        self.moe_cost_tok = self.moe_fill_expert = 0.0
        self.moe_n_half_cols = 0.0
        fmt = moe_format(m, gpu, self.weight_dtype, gs)
        if fmt is not None:
            fit = fused_moe(params, fmt)
            fit_peak = moe_peak(gpu, fmt)[0]
            rate = self.peak_flops / fit_peak  # the experts' FLOPs as charged at this model's peak
            inter = m.expert_params / (3 * m.hidden_size) / tp
            one = fused_moe_flops(1.0, 0.0, m.hidden_size, inter, 0.0, fit.moe_n_half_cols)
            pair = m.num_moe_layers * one * rate
            scale = self.cal.compute_eff_prefill / fit.moe_compute_eff
            chosen = 2.0 * m.num_moe_layers * m.experts_per_token * m.expert_params / tp
            self.lin_cost_tok -= chosen * rate
            self.moe_cost_tok = pair * scale * m.experts_per_token
            self.moe_fill_expert = pair * scale * fit.moe_m_half_tokens
            self.moe_n_half_cols = fit.moe_n_half_cols
        self.fill_cost = (self.lin_cost_tok + self.head_cost_row) * self.tile_fill_tokens
        # MLA's attention module beyond its projections and attention kernel, as vLLM's measured module takes
        # it on this GPU (sim.cost.mla_fit; the kernel model charges the same).
        self.mla_terms = mla_rest_terms(params, mla_fp8(m, wd, gs)) if self.mla else ()
        self.heads_per_gpu = max(1.0, m.num_heads / tp)
        # The sampler: every row under the fitted sort term (the calibration's flat term) until `sample_as`.
        self.sample_as(None)

    def sample_as(self, params: SamplingParams | None) -> None:
        """Price every row's sampler as rows resolved to `params` sample (a checkpoint's generation defaults,
        sim/cost/sampler.py `RowSampler`); None: the fitted sort term over the vocabulary on every row."""
        vocab = self.model.vocab_size
        self.sampler = RowSampler(float(vocab), 0.0, 0.0) if params is None else RowSampler.of(params, vocab)
        self.row_stream_s = self.sampler.row_bytes / self.hbm
        self.token_stream_s = self.sampler.token_bytes / self.hbm  # per prompt or output token of every row

    def mla_rest(self, tokens: float, prefill: float) -> float:
        """Seconds of MLA's module beyond its listed kernels over the layers of a step of `tokens` tokens,
        `prefill` of them a prompt's (`sim.cost.kernels.mla_rest_seconds`); 0 for other attention."""
        if not self.mla_terms:
            return 0.0
        rest = mla_rest_seconds(self.mla_terms, prefill, tokens - prefill, self.heads_per_gpu)
        return self.model.num_layers * rest

    def _weights(self, tokens: float) -> tuple[float, float]:
        m = self.model
        touched = expected_distinct_experts(m.num_experts, m.experts_per_token, tokens)
        return self.static_weight_bytes + m.num_moe_layers * touched * self.expert_bytes_per_layer, touched

    def _over_layers(self, sums: LayerSums) -> tuple[float, float, float]:
        """(pairs, KV tokens read, prefill tokens) over the layers, from the per-layer sums."""
        pairs, ctx, s_pairs, s_ctx, queries = sums
        pairs_all, kv_tokens = self.full_layers * pairs, self.full_layers * ctx
        ns = self.sliding_layers
        if ns:
            pairs_all += ns * s_pairs
            kv_tokens += ns * s_ctx
        return pairs_all, kv_tokens, queries

    def _linear_charged(self, tokens: float, rows: int, touched: float = 0.0) -> float:
        """A step's linear-layer FLOPs as charged at the peak, its GEMMs' tile fill and the fused-MoE kernel's
        (over `touched` experts a layer) included (the timers below inline the same sum, in the same
        order); attention's are `attn_cost_pair` per (query, key) pair."""
        linear = self.lin_cost_tok * tokens + self.head_cost_row * rows + self.fill_cost
        if self.moe_cost_tok:
            linear += self.moe_cost_tok * tokens + self.moe_fill_expert * touched
        return linear

    def _seconds(self, tokens: int, rows: int, sums: LayerSums) -> tuple[float, bool]:
        """The roofline's pricing of a step (`StepModel.step_time` and `step_time_totals` call it)."""
        pairs, kv_tokens, prefill = self._over_layers(sums)
        t = float(tokens)
        m = self.model
        weight_bytes, touched = self._weights(t) if m.num_experts else (self.static_weight_bytes, 0.0)
        linear = self._linear_charged(t, rows, touched)
        kv_bytes = self.kv_layer_bytes * kv_tokens + self.kv_token_bytes * t
        seconds, compute_bound = roofline_seconds(
            self.cal, self.peak_flops, self.hbm, m.num_layers, self.sampler.sort_entries,
            self.allreduce_seconds(t), linear, self.attn_cost_pair * pairs, prefill / t, weight_bytes,
            kv_bytes, rows, self.row_stream_s, self.token_stream_s * (sums[1] + t),
        )  # fmt: skip
        if self.mla_terms:
            seconds += self.mla_rest(t, prefill)
        return seconds, bool(compute_bound)

    def step(self, new_tokens: np.ndarray, context: np.ndarray) -> StepCost:
        """Full breakdown of one step."""
        c, q = step_arrays(new_tokens, context)
        rows = int(c.size)
        tokens = float(c.sum()) if rows else 0.0
        if tokens <= 0:
            return StepCost(0.0, "memory", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, rows, 0.0)
        sums = self._sums(c, q)
        pairs, kv_tokens, prefill = self._over_layers(sums)
        cal = self.cal
        flops_lin = self.lin_flops_tok * tokens + self.head_flops_row * rows
        flops_attn = self.attn_flops_pair * pairs
        weight_bytes, touched = self._weights(tokens)
        kv_read = self.kv_layer_bytes * kv_tokens
        kv_write = self.kv_token_bytes * tokens
        share = prefill / tokens
        eff = share * cal.compute_eff_prefill + (1.0 - share) * cal.compute_eff_decode
        linear_cost, attn_cost = self._linear_charged(tokens, rows, touched), self.attn_cost_pair * pairs
        flops_cost = linear_cost + attn_cost
        speed = self.peak_flops * eff
        weights_s = weight_bytes / (self.hbm * cal.bandwidth_eff)
        kv_s = (kv_read + kv_write) / (self.hbm * cal.kv_bandwidth_eff)
        compute_s, memory_s = flops_cost / speed, weights_s + kv_s
        allreduce_s = self.allreduce_seconds(tokens) * cal.allreduce_scale
        history = self.token_stream_s * (float(q.sum()) + tokens)
        overhead_s = overhead_seconds(
            cal, self.model.num_layers, self.sampler.sort_entries, rows, 0.0, self.row_stream_s, history
        )
        overhead_s += self.mla_rest(tokens, prefill)
        seconds, compute_bound = self._seconds(int(tokens), rows, sums)
        return StepCost(
            seconds=seconds,
            bound="compute" if compute_bound else "memory",
            compute_s=compute_s,
            memory_s=memory_s,
            allreduce_s=allreduce_s,
            overhead_s=overhead_s,
            flops_linear=flops_lin,
            flops_attention=flops_attn,
            weight_bytes=weight_bytes,
            kv_read_bytes=kv_read,
            kv_write_bytes=kv_write,
            tokens=int(tokens),
            rows=rows,
            experts_touched=touched,
            flops_charged=flops_cost,
            attn_flops_charged=attn_cost,
            linear_s=kernel_seconds(linear_cost, weights_s, speed, 1.0, 0.0),
            attention_s=kernel_seconds(attn_cost, kv_s, speed, 1.0, 0.0),
        )

    def sampler_seconds(self, positions: int) -> float:
        """The sampler at `positions` more sampled positions (a row's own is in the step)."""
        cal = self.cal
        sort_s = positions * self.sampler.sort_entries * cal.sampler_s_per_entry
        return sort_s + positions * self.row_stream_s / cal.bandwidth_eff

    def decode_timer(self, rows: int) -> tuple[Callable[[int], tuple[float, bool]], float]:
        """`step_time_totals(rows, rows, rows, ctx, rows, ctx, max_end)` (rows > 0 decode rows, one token
        each on Σq = ctx) as a function of `ctx` alone, every term that does not depend on it computed once:
        the same operations in the same order, so the same seconds. Valid while `max_end` is at most the
        second value (the sliding window, or infinity). For the engine's runs of decode-only steps."""
        m, cal = self.model, self.cal
        t = float(rows)
        half = 0.5 * (float(rows) + t)
        full, ns = self.full_layers, self.sliding_layers
        share = (t - float(rows)) / t
        weight_bytes, touched = self._weights(t) if m.num_experts else (self.static_weight_bytes, 0.0)
        head = self.lin_cost_tok * t + self.head_cost_row * rows + self.fill_cost
        if self.moe_cost_tok:
            head += self.moe_cost_tok * t + self.moe_fill_expert * touched
        attn = self.attn_cost_pair
        absorbed = self.decode_pair_weight - 1.0 if self.mla else 0.0  # `weighted_sums`' decode term
        kv_layer, kv_new = self.kv_layer_bytes, self.kv_token_bytes * t
        speed = self.peak_flops * (share * cal.compute_eff_prefill + (1.0 - share) * cal.compute_eff_decode)
        weights_s = weight_bytes / (self.hbm * cal.bandwidth_eff)
        linear_s = head / speed
        linear_group = kernel_seconds(linear_s, weights_s, 1.0, 1.0, 0.0)
        kv_speed = self.hbm * cal.kv_bandwidth_eff
        allreduce_s = self.allreduce_seconds(t) * cal.allreduce_scale
        entries, row_s = self.sampler.sort_entries, self.row_stream_s
        extra = overhead_seconds(cal, m.num_layers, entries, rows, allreduce_s, row_s)
        rest = self.mla_rest(t, 0.0)
        token_s, bw = self.token_stream_s, cal.bandwidth_eff

        def seconds(ctx: int) -> tuple[float, bool]:
            q = float(ctx) + half
            if absorbed:
                q = q + absorbed * (float(ctx) + t)
            pairs = full * q
            kv_tokens = full * float(ctx)
            if ns:
                pairs += ns * q
                kv_tokens += ns * float(ctx)
            attention = attn * pairs / speed
            kv = (kv_layer * kv_tokens + kv_new) / kv_speed
            fixed = extra + token_s * (float(ctx) + t) / bw
            seconds = linear_group + (0.5 * (attention + kv + abs(attention - kv)) + fixed)
            return seconds + rest, bool(linear_s + attention > weights_s + kv)

        return seconds, self.window if ns else math.inf

    def totals_timer(self) -> Callable[[int, int, int, int, int, int, int], tuple[float, bool] | None]:
        """`step_time_totals` with every term that does not depend on the step computed once: the same
        operations in the same order, so the same seconds. For a model with routed experts or sliding
        layers or MLA, or a subclass that prices steps its own way (an engine profile), `step_time_totals`
        itself. The engine's step time from a plan's integer sums."""
        m, cal = self.model, self.cal
        kind = type(self)
        own = kind.step_time_totals is StepModel.step_time_totals and kind._seconds is CostModel._seconds
        if m.num_experts or self.sliding_layers or self.mla or not own:
            return self.step_time_totals
        full = self.full_layers
        lin, head, attn, fill = self.lin_cost_tok, self.head_cost_row, self.attn_cost_pair, self.fill_cost
        peak, eff_p, eff_d = self.peak_flops, cal.compute_eff_prefill, cal.compute_eff_decode
        weights_s = self.static_weight_bytes / (self.hbm * cal.bandwidth_eff)
        kv_speed = self.hbm * cal.kv_bandwidth_eff
        kv_layer, kv_token = self.kv_layer_bytes, self.kv_token_bytes
        step_s, layers_s = cal.step_overhead_s, m.num_layers * cal.layer_overhead_s
        bw, entries = cal.bandwidth_eff, self.sampler.sort_entries
        per_row = cal.per_row_overhead_s + entries * cal.sampler_s_per_entry + self.row_stream_s / bw
        token_s = self.token_stream_s
        scale, allreduce = cal.allreduce_scale, (self.allreduce_seconds if self.allreduces else None)

        def seconds(
            rows: int, tokens: int, ones: int, cq: int, cc: int, ctx: int, max_end: int
        ) -> tuple[float, bool]:
            if rows <= 0 or tokens <= 0:
                return 0.0, False
            t = float(tokens)
            pairs = full * (float(cq) + 0.5 * (float(cc) + t))
            share = (t - float(ones)) / t
            eff = share * eff_p + (1.0 - share) * eff_d
            speed = peak * eff
            linear, attention = (lin * t + head * rows + fill) / speed, attn * pairs / speed
            kv = (kv_layer * (full * float(ctx)) + kv_token * t) / kv_speed
            extra = (allreduce(t) * scale if allreduce else 0.0) + step_s + layers_s + rows * per_row
            extra += token_s * (float(ctx) + t) / bw
            seconds = 0.5 * (linear + weights_s + abs(linear - weights_s))
            seconds += 0.5 * (attention + kv + abs(attention - kv)) + extra
            return seconds, linear + attention > weights_s + kv

        return seconds
