"""The model spec: a decoder's shape and what follows from it: parameters, KV bytes per token, FLOPs (read
from a Hugging Face config.json by sim/catalog/hf_config.py).

Parameter groups are kept apart because the cost model treats them differently:
`embedding_params` are gathered (a few rows read per token), `lm_head_params` are 0 when tied to the
embedding (the logits matmul still costs 2·vocab·hidden FLOPs per row), `routed_expert_params` are
read only for the experts a batch touches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.catalog.dtypes import ONLINE_QUANT_DTYPES, dtype_bytes, normalize_dtype
from sim.io.errors import SimError


def causal_pairs(new: np.ndarray | int, cached: np.ndarray | int, window: int | None = None) -> np.ndarray:
    """(query, key) pairs attended by `new` tokens placed after `cached` ones, keys capped at `window`.

    Token j (1-based position) sees min(j, window) keys, so pairs = S(cached+new) - S(cached),
    with S(n) = sum_{j<=n} min(j, W).
    """
    c = np.asarray(new, dtype=np.float64)
    q = np.asarray(cached, dtype=np.float64)
    return _cum_keys(q + c, window) - _cum_keys(q, window)


def _cum_keys(n: np.ndarray, window: int | None) -> np.ndarray:
    full = n * (n + 1) / 2
    if window is None:
        return full
    w = float(window)
    return np.where(n <= w, full, w * (w + 1) / 2 + (n - w) * w)


# Matmul weights, grouped by how the cost model uses them.
LINEAR_GROUPS = ("attention", "dense", "experts", "lm_head")


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint stores its linear weights (its `quantization_config`).

    `dtype` is the stored dtype of the quantized matmul weights ("" when none); `activations` says W8A8
    (matmuls run at the low-precision tensor peak) rather than weight-only (weights dequantized to 16-bit in
    the kernel); `group_size` > 0 adds one 16-bit scale per group; `sixteen_bit` lists the LINEAR_GROUPS kept
    in 16-bit (`ignore` / `modules_to_not_convert`, and the LM head unless the scheme quantizes it), with the
    fraction of each group's parameters kept. `per_group` gives (group, dtype, activations, group_size) for
    the LINEAR_GROUPS a mixed-precision checkpoint stores in another format than `dtype`'s.
    """

    method: str = "none"
    dtype: str = ""
    activations: bool = False
    group_size: int = 0
    sixteen_bit: tuple[tuple[str, float], ...] = ()
    per_group: tuple[tuple[str, str, bool, int], ...] = ()

    def format_of(self, group: str) -> tuple[str, bool, int]:
        """(dtype, activations, group_size) of a group's quantized parameters."""
        for name, dtype, activations, group_size in self.per_group:
            if name == group:
                return dtype, activations, group_size
        return self.dtype, self.activations, self.group_size

    def group_bytes(self, group: str) -> float:
        """Stored bytes per quantized weight of a group, group scales included."""
        dtype, _, group_size = self.format_of(group)
        return dtype_bytes(dtype) + (2.0 / group_size if group_size > 0 else 0.0)

    def kept_fraction(self, group: str) -> float:
        """Fraction of a group's parameters kept in 16-bit (1 for every group when unquantized)."""
        if not self.dtype:
            return 1.0
        return dict(self.sixteen_bit).get(group, 0.0)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, with parameter counts grouped by how they are used."""

    name: str
    hf_id: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int  # 1 for MLA (one shared latent)
    head_dim: int  # query/key width per head (qk_nope + qk_rope for MLA)
    v_head_dim: int
    vocab_size: int
    max_position_embeddings: int
    attention: str  # "MHA", "GQA", "MQA" or "MLA"
    kv_lora_rank: int  # MLA only, else 0
    qk_rope_head_dim: int  # MLA only, else 0
    sliding_window: int | None
    num_sliding_layers: int
    num_experts: int  # routed experts per MoE layer; 0 for dense models
    experts_per_token: int
    num_moe_layers: int
    expert_params: int  # one routed expert in one layer
    embedding_params: int  # token (and learned position) embeddings
    lm_head_params: int  # 0 when tied to the embedding
    attention_params: int  # all layers
    dense_params: int  # dense MLPs, shared experts, routers, projections: all layers
    routed_expert_params: int  # all routed experts of all layers
    norm_params: int
    torch_dtype: str  # 16-bit dtype the weights are served in by default
    default_weight_dtype: str
    quant: Quantization = Quantization()  # the checkpoint's own quantization (quantization_config)
    position_limit: int = 0  # the longest sequence it serves (`position_limit`); 0: its config does not say
    # Group-limited routing (DeepSeek's config.json n_group / topk_group): the routed experts fall in
    # `expert_groups` contiguous groups, a token's top-k in `expert_groups_per_token` of them; 0: no limit.
    expert_groups: int = 0
    expert_groups_per_token: int = 0
    # Attention weights every tensor-parallel rank holds whole and runs for every token: MLA's
    # down-projections (q_a_proj and kv_a_proj_with_mqa with their norms, `ReplicatedLinear` in vLLM's
    # deepseek_v2.py); all layers, part of attention_params.
    replicated_attention_params: int = 0

    def check_length(self, length: int, what: str = "") -> None:
        """Refuse a sequence of `length` positions (`what` describes it) past `position_limit`, as vLLM
        refuses a max_model_len past it: the one check behind `sim run`, `sim step` and `sim capacity`."""
        limit = self.position_limit
        if limit and length > limit:
            raise SimError(
                f"{length}{what} is longer than {self.name} serves ({limit} positions, from its config's "
                "max_position_embeddings and rope_scaling; vLLM refuses it too)"
            )

    @property
    def is_moe(self) -> bool:
        """True for mixture-of-experts models."""
        return self.num_experts > 0

    @property
    def params_total(self) -> int:
        """All parameters of the language model."""
        return (
            self.embedding_params
            + self.lm_head_params
            + self.attention_params
            + self.dense_params
            + self.routed_expert_params
            + self.norm_params
        )

    @property
    def params_active(self) -> int:
        """Parameters used per token: everything except the routed experts not chosen."""
        chosen = self.num_moe_layers * self.experts_per_token * self.expert_params
        return self.params_total - self.routed_expert_params + chosen

    def group_params(self, group: str) -> int:
        """Parameters of one LINEAR_GROUPS group, or of "embedding" / "norm"."""
        return {
            "attention": self.attention_params,
            "dense": self.dense_params,
            "experts": self.routed_expert_params,
            "lm_head": self.lm_head_params,
            "embedding": self.embedding_params,
            "norm": self.norm_params,
        }[group]

    def serving_quant(self, dtype: str | None = None, group_size: int | None = None) -> Quantization:
        """How the matmul weights are stored when served with weight dtype `dtype` (default: the model's).

        The checkpoint's own dtype keeps its quantization_config (group size, modules kept in 16-bit).
        Another dtype is online quantization of the layers' matmul weights, the LM head kept 16-bit as vLLM
        keeps it: fp8 is W8A8 (vLLM's `--quantization fp8`), int8 and int4 are weight-only (GPTQ/AWQ-style,
        W8A16/W4A16) with one 16-bit scale per `group_size` weights (None or 0: per-channel scales, whose
        bytes are negligible). 16-bit and fp32 weights are not quantized.
        """
        d = normalize_dtype(dtype or self.default_weight_dtype)
        if self.quant.dtype and d == self.default_weight_dtype:
            return self.quant
        if d not in ONLINE_QUANT_DTYPES or dtype_bytes(d) >= dtype_bytes(self.torch_dtype):
            return Quantization()
        return Quantization("online", d, d == "fp8", max(group_size or 0, 0), (("lm_head", 1.0),))

    def param_bytes(self, group: str, dtype: str | None = None, group_size: int | None = None) -> float:
        """Mean stored bytes per parameter of a group served with weight dtype `dtype` (default: the model's).

        Quantized groups follow `serving_quant` (group scales included); embeddings and norms stay 16-bit.
        """
        sixteen = dtype_bytes(self.torch_dtype)
        d = normalize_dtype(dtype or self.default_weight_dtype)
        if group in ("embedding", "norm"):
            return sixteen if d != "fp32" else 4.0
        q = self.serving_quant(d, group_size)
        if q.dtype:
            kept = q.kept_fraction(group)
            return kept * sixteen + (1.0 - kept) * q.group_bytes(group)
        return dtype_bytes(d)

    def replicated_weight_bytes(self, dtype: str | None = None, group_size: int | None = None) -> float:
        """Bytes of the weights each tensor-parallel rank holds whole (`replicated_attention_params`)."""
        return self.replicated_attention_params * self.param_bytes("attention", dtype, group_size)

    def shard_bytes(
        self, nbytes: float, tp: int, dtype: str | None = None, group_size: int | None = None
    ) -> float:
        """One of `tp` tensor-parallel GPUs' part of `nbytes` of weights that include the replicated ones: a
        1/tp shard of the rest, the replicated whole."""
        replicated = self.replicated_weight_bytes(dtype, group_size)
        return (nbytes - replicated) / tp + replicated

    def weight_bytes_per_gpu(self, tp: int, dtype: str | None = None, group_size: int | None = None) -> float:
        """Bytes of weights one of `tp` tensor-parallel GPUs holds (`shard_bytes` of all of them)."""
        return self.shard_bytes(self.weight_bytes(dtype, group_size), tp, dtype, group_size)

    def weight_bytes(self, dtype: str | None = None, group_size: int | None = None) -> float:
        """Bytes of all weights served with weight dtype `dtype` (default: the model's own, as quantized)."""
        groups = (*LINEAR_GROUPS, "embedding", "norm")
        return float(sum(self.group_params(g) * self.param_bytes(g, dtype, group_size) for g in groups))

    @property
    def kv_values_per_token_layer(self) -> int:
        """Values cached per token per layer: K and V heads, or the MLA latent plus its rope key."""
        if self.attention == "MLA":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_dtype: str | None = None) -> float:
        """KV-cache bytes per token over all layers (sliding layers counted at full size)."""
        return self.num_layers * self.kv_values_per_token_layer * dtype_bytes(kv_dtype or self.torch_dtype)

    def kv_layer_bytes_per_gpu(self, tp: int, kv_dtype: str | None = None) -> float:
        """KV bytes per token per layer on one GPU of `tp`: the KV heads sharded (one head at least), the MLA
        latent replicated on every GPU."""
        kvb = dtype_bytes(kv_dtype or self.torch_dtype)
        if self.attention == "MLA":
            return self.kv_values_per_token_layer * kvb
        return 2 * max(1, self.num_kv_heads // tp) * self.head_dim * kvb

    def linear_flops_per_token_per_gpu(self, tp: int) -> float:
        """`linear_flops_per_token` on one of `tp` GPUs: a 1/tp shard, the replicated weights' whole."""
        replicated = 2.0 * self.replicated_attention_params
        return (self.linear_flops_per_token - replicated) / tp + replicated

    @property
    def linear_flops_per_token(self) -> float:
        """Matmul FLOPs per token in the layers (no embedding gather, no logits)."""
        chosen = self.num_moe_layers * self.experts_per_token * self.expert_params
        return 2.0 * (self.attention_params + self.dense_params + chosen)

    @property
    def lm_head_flops(self) -> float:
        """FLOPs of the logits for one position (one per row and step)."""
        return 2.0 * self.vocab_size * self.hidden_size

    @property
    def attn_flops_per_pair(self) -> float:
        """Score and value FLOPs per (query, key) pair in one layer, all heads."""
        return 2.0 * self.num_heads * (self.head_dim + self.v_head_dim)

    @property
    def decode_attn_flops_per_pair(self) -> float:
        """`attn_flops_per_pair` for a one-token (decode) row: MLA decodes in its absorbed form, every head
        scoring the cached latent and rope key and summing latents (vLLM's `_forward_decode`: query heads over
        kv_lora_rank + qk_rope_head_dim keys, kv_lora_rank values); other attention as for prefill."""
        if self.attention == "MLA":
            return 2.0 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return self.attn_flops_per_pair

    @property
    def context_upproj_flops_per_token(self) -> float:
        """FLOPs per cached token of a prefill row in one layer: MLA prefills in the uncompressed form, so
        each step up-projects its prefill rows' cached latents to per-head keys and values (vLLM's
        `_compute_prefill_context`, kv_b_proj over the context); 0 for other attention."""
        if self.attention == "MLA":
            nope = self.head_dim - self.qk_rope_head_dim
            return 2.0 * self.kv_lora_rank * self.num_heads * (nope + self.v_head_dim)
        return 0.0

    def attention_pairs(self, new: np.ndarray | int, cached: np.ndarray | int) -> np.ndarray:
        """(query, key) pairs summed over layers, sliding layers capped at the window."""
        full = self.num_layers - self.num_sliding_layers
        out = full * causal_pairs(new, cached)
        if self.num_sliding_layers:
            out = out + self.num_sliding_layers * causal_pairs(new, cached, self.sliding_window)
        return out

    def prefill_flops(self, c: np.ndarray | int, q: np.ndarray | int) -> np.ndarray:
        """FLOPs of a chunk of `c` new tokens after `q` cached ones (logits for one position)."""
        c_arr = np.asarray(c, dtype=np.float64)
        lin = self.linear_flops_per_token * c_arr + self.lm_head_flops * (c_arr > 0)
        return lin + self.attn_flops_per_pair * self.attention_pairs(c_arr, q)

    def decode_flops(self, q: np.ndarray | int) -> np.ndarray:
        """FLOPs of one decode token at context `q`."""
        return self.prefill_flops(np.ones_like(np.asarray(q)), q)
