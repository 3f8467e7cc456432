"""The one step-time implementation both parameter sets share: a model's shapes per GPU under tensor
parallelism, a step's rows reduced to their per-layer sums, and `step_time` / `step_time_totals` from them.

A step is two arrays: row i computes `new_tokens[i]` tokens on top of `context[i]` cached tokens (prefill
chunks and decodes mixed). Everything is per GPU under tensor parallelism of degree `tp`. What a step of
`tokens` tokens, `rows` rows and those sums costs is the parameter set's pricing (`StepModel._seconds`): the
calibrated roofline (`sim.cost.roofline.CostModel`, the engine's: the linear layers and attention each as
one kernel at the calibrated efficiencies, the serving terms on top) or the kernel profiles
(`sim.cost.kernel_model.KernelCostModel`: each kernel at its own fitted efficiency and fixed cost, the host
overlapped).
"""

from __future__ import annotations

import numpy as np

from sim.catalog.dtypes import normalize_dtype
from sim.catalog.gpus import Gpu
from sim.catalog.model import ModelSpec
from sim.catalog.quantisation import matmul_rate
from sim.config.calibration import KernelCalibration, shipped_kernel_calibration
from sim.cost.allreduce_pricing import AllreducePricing
from sim.cost.kernels import ACT_BYTES, LayerSums, layer_sums, step_arrays, totals_layer_sums
from sim.io.errors import SimError


def expected_distinct_experts(n_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts hit by `tokens` tokens each routing to `top_k` of `n_experts` uniformly."""
    if n_experts <= 0 or tokens <= 0:
        return 0.0
    return n_experts * (1.0 - ((n_experts - top_k) / n_experts) ** tokens)


class StepModel:
    """A model's per-GPU shapes and the step-time path; subclasses give `_seconds`, the pricing."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: Gpu,
        tp: int = 1,
        weight_dtype: str | None = None,
        kv_dtype: str | None = None,
        weight_group_size: int | None = None,
        allreduce_prior: KernelCalibration | None = None,
    ) -> None:
        if tp < 1:
            raise SimError(f"tensor parallel degree must be >= 1, got {tp}")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.weight_dtype = normalize_dtype(weight_dtype or model.default_weight_dtype)
        self.kv_dtype = normalize_dtype(kv_dtype or model.torch_dtype)
        self.group_size = weight_group_size
        # Matmul rate of the weight format (sim/catalog/quantisation.py): 8-bit peak for W8A8, 16-bit peak
        # with dequantization for weight-only INT4/INT8.
        self.rate = matmul_rate(model, gpu, self.weight_dtype, weight_group_size)
        self.peak_flops, self.note = self.rate.peak_flops, self.rate.note
        m = model
        self.hbm = gpu.hbm_bandwidth
        wd, gs = self.weight_dtype, weight_group_size
        self.expert_bytes_per_layer = m.expert_params * m.param_bytes("experts", wd, gs) / tp
        self.kv_layer_bytes = m.kv_layer_bytes_per_gpu(tp, self.kv_dtype)
        self.kv_token_bytes = self.kv_layer_bytes * m.num_layers
        self.full_layers = m.num_layers - m.num_sliding_layers
        self.sliding_layers = m.num_sliding_layers
        self.window = float(m.sliding_window or 0)
        self.attn_flops_pair = m.attn_flops_per_pair / tp
        # MLA runs its decode rows absorbed and up-projects its prefill rows' cached latents: both charged as
        # attention pairs of the uncompressed form, a decode row's pair weighing `decode_pair_weight` and a
        # prefill row's cached token `context_pair_weight` (`weighted_sums`).
        self.mla = m.attention == "MLA"
        self.decode_pair_weight = m.decode_attn_flops_per_pair / m.attn_flops_per_pair
        self.context_pair_weight = m.context_upproj_flops_per_token / m.attn_flops_per_pair
        self.allreduces = 2 * m.num_layers if tp > 1 else 0
        self.ar_bytes_token = m.hidden_size * ACT_BYTES  # one token's activations, reduced twice a layer
        # The all-reduces' pricing (sim.cost.allreduce_pricing), with the prior of `allreduce_prior` (default:
        # the shipped kernel_calibration.toml) where no measured fit covers the GPU's node and degree.
        prior = allreduce_prior or shipped_kernel_calibration()
        self.allreduce = AllreducePricing(
            gpu, tp, prior.allreduce_latency_s, prior.allreduce_latency_pcie_s, prior.allreduce_bandwidth_eff
        )

    def allreduce_seconds(self, tokens: float) -> float:
        """The all-reduces of a step of `tokens` tokens: `allreduces` messages of tokens x hidden x 2 bytes
        each."""
        if not self.allreduces:
            return 0.0
        return self.allreduces * self.allreduce.seconds(self.ar_bytes_token * tokens)

    def touched(self, tokens: float) -> float:
        """Expected distinct routed experts per MoE layer in a step of `tokens` tokens."""
        m = self.model
        return expected_distinct_experts(m.num_experts, m.experts_per_token, tokens)

    def _sums(self, c: np.ndarray, q: np.ndarray) -> LayerSums:
        """Per-layer sums of the step's rows (`sim.cost.kernels.layer_sums`), MLA's pairs weighted."""
        sums = layer_sums(c, q, float(c.sum()), bool(self.sliding_layers), self.window)
        if not self.mla:
            return sums
        one = c == 1
        return self.weighted_sums(sums, float(np.count_nonzero(one)), float(q[one].sum()))

    def weighted_sums(self, sums: LayerSums, ones: float, decode_ctx: float) -> LayerSums:
        """MLA's per-layer sums with its pairs as charged: the `ones` one-token rows' pairs (Σ(q + 1) over
        them, `decode_ctx` = their Σq) at `decode_pair_weight`, and the other rows' cached tokens (Σq − their
        `decode_ctx`) up-projected at `context_pair_weight` pairs each (MLA has no sliding layers)."""
        pairs, ctx, _, _, queries = sums
        decode_pairs = decode_ctx + ones
        charged = pairs + (self.decode_pair_weight - 1.0) * decode_pairs
        charged += self.context_pair_weight * (ctx - decode_ctx)
        return charged, ctx, charged, ctx, queries

    def _seconds(self, tokens: int, rows: int, sums: LayerSums) -> tuple[float, bool]:
        """(seconds, compute_bound) of a step of `tokens` > 0 tokens over `rows` rows, per-layer `sums`."""
        raise NotImplementedError

    def step_time(self, new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        """(seconds, compute_bound) of one step: the engine's fast path, same seconds as `step`."""
        c, q = step_arrays(new_tokens, context)
        if c.size == 0:
            return 0.0, False
        tokens = int(c.sum())
        if tokens <= 0:
            return 0.0, False
        return self._seconds(tokens, int(c.size), self._sums(c, q))

    def step_time_totals(
        self, rows: int, tokens: int, ones: int, cq: int, cc: int, ctx: int, max_end: int
    ) -> tuple[float, bool] | None:
        """`step_time` from the rows' integer sums, for schedulers that keep them up to date.

        `tokens` = Σc, `ones` = #(c == 1), `cq` = Σc·q, `cc` = Σc², `ctx` = Σq and `max_end` ≥ max(q + c)
        over rows (c new tokens on q cached ones). Exactly `step_time`'s result, or None where only the
        per-row arrays give the answer: a sliding window may be reached, or an MLA step mixes one-token rows
        with longer ones.
        """
        if self.sliding_layers and max_end > self.window:
            return None
        if rows <= 0 or tokens <= 0:
            return 0.0, False
        sums = totals_layer_sums(tokens, ones, cq, cc, ctx)
        if self.mla:  # the one-token rows' Σq is in the totals only when they are all or none of the rows
            if 0 < ones < rows:
                return None
            sums = self.weighted_sums(sums, float(ones), float(ctx) if ones else 0.0)
        return self._seconds(tokens, rows, sums)
