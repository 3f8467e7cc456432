"""A `ModelSpec` from a Hugging Face decoder config.json: each family's shape, checked key by key.

Head shapes no checkpoint can have are refused, naming the key (`_check_heads`):
- `num_key_value_heads` must divide `num_attention_heads` (more KV heads than query heads included): each KV
  head serves a whole group of query heads, and vLLM's attention layer asserts
  `num_heads % num_kv_heads == 0` (vllm/attention/layer.py, `Attention.__init__`).
- Without `head_dim`, `hidden_size` must be a multiple of `num_attention_heads`. transformers and vLLM both
  take the head width as `getattr(config, "head_dim", hidden_size // num_attention_heads)`; a remainder
  there floor-divides to a width no published checkpoint has (transformers refused it before head_dim was a
  config key, and OPT, which has no head_dim, still raises "embed_dim must be divisible by num_heads").
  A config that gives `head_dim` may make heads x head_dim differ from hidden_size, as Gemma-2, Qwen3 and
  Mistral-Nemo do.
"""

from __future__ import annotations

from typing import Any

from sim.catalog.checkpoint_quant import quantization, stored_weight_dtype
from sim.catalog.dtypes import normalize_dtype
from sim.catalog.model import ModelSpec
from sim.io.errors import SimError
from sim.io.limits import MAX_MODEL_DIM

# HF defaults for `tie_word_embeddings` when a config omits it.
_TIED_BY_DEFAULT = {"gemma2", "opt"}


SUPPORTED = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "yi",
    "phi3",
    "gemma2",
    "opt",
    "mixtral",
    "qwen3_moe",
    "llama4",
    "deepseek_v2",
    "deepseek_v3",
)


# Whole-number fields of a config.json and the smallest value each may take; none may exceed
# MAX_MODEL_DIM. Flags must be booleans and layer lists lists of layer indices.
_INT_FIELDS: dict[str, int] = {
    **dict.fromkeys(
        ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_key_value_heads",
         "head_dim", "intermediate_size", "sliding_window", "attention_chunk_size", "num_local_experts",
         "num_experts", "num_experts_per_tok", "decoder_sparse_step", "moe_intermediate_size",
         "intermediate_size_mlp", "ffn_dim", "word_embed_proj_dim", "kv_lora_rank", "v_head_dim",
         "q_lora_rank", "n_routed_experts", "moe_layer_freq", "n_group", "topk_group"),
        1,
    ),
    **dict.fromkeys(
        ("max_position_embeddings", "max_window_layers", "interleave_moe_layer_step", "qk_rope_head_dim",
         "qk_nope_head_dim", "first_k_dense_replace", "n_shared_experts"),
        0,
    ),
}  # fmt: skip


_BOOL_FIELDS = frozenset({"tie_word_embeddings", "attention_bias", "use_sliding_window", "enable_bias"})


_LIST_FIELDS = frozenset({"mlp_only_layers", "no_rope_layers", "moe_layers"})


class _Cfg:
    """Config dict with field access that checks each field's type and range and names the file."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def req(self, key: str) -> Any:
        val = self.data.get(key)
        if val is None:
            raise SimError(f"{self.source}: missing field {key!r}")
        return self._checked(key, val)

    def get(self, key: str, default: Any = None) -> Any:
        val = self.data.get(key)
        return default if val is None else self._checked(key, val)

    def _checked(self, key: str, val: Any) -> Any:
        where = f"{self.source}: {key}"
        if key in _INT_FIELDS:
            low = _INT_FIELDS[key]
            if isinstance(val, bool) or not isinstance(val, int):
                raise SimError(f"{where}: expected a whole number (got {_json_type(val)})")
            if not low <= val <= MAX_MODEL_DIM:
                raise SimError(f"{where}: expected a whole number in [{low}, {MAX_MODEL_DIM}] (got {val})")
        elif key in _BOOL_FIELDS and not isinstance(val, bool):
            raise SimError(f"{where}: expected true or false (got {_json_type(val)})")
        elif key in _LIST_FIELDS and not (
            isinstance(val, list)
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_MODEL_DIM for x in val)
        ):
            raise SimError(f"{where}: expected a list of layer indices")
        return val


def _json_type(val: Any) -> str:
    names = {bool: "a boolean", str: "a string", float: "a fraction", list: "a list", dict: "an object"}
    return names.get(type(val), type(val).__name__)


def from_config(raw: dict[str, Any], name: str, hf_id: str, source: str) -> ModelSpec:
    """Build a ModelSpec from a parsed HF config dict."""
    model_type = raw.get("model_type", "")
    if not isinstance(model_type, str):
        raise SimError(f"{source}: model_type: expected a string (got {_json_type(model_type)})")
    model_type = model_type.lower()
    model_type = "llama4" if model_type == "llama4_text" else model_type
    data = raw.get("text_config") if model_type == "llama4" and raw.get("text_config") else raw
    if not isinstance(data, dict):
        raise SimError(f"{source}: text_config: expected an object (got {_json_type(data)})")
    if model_type not in SUPPORTED:
        archs_field = raw.get("architectures")
        names = archs_field if isinstance(archs_field, list) else []
        archs = ", ".join(a for a in names if isinstance(a, str)) or "?"
        raise SimError(
            f"{source}: unsupported architecture {model_type or '?'} ({archs}); "
            f"supported model_type values: {', '.join(SUPPORTED)}"
        )
    c = _Cfg(data, source)
    td_field = raw.get("torch_dtype") or c.get("torch_dtype", "bfloat16")
    if not isinstance(td_field, str):
        raise SimError(f"{source}: torch_dtype: expected a string (got {_json_type(td_field)})")
    try:
        td = normalize_dtype(td_field)
    except SimError as err:
        raise SimError(f"{source}: torch_dtype: {err}") from None
    torch_dtype = td if td in ("bf16", "fp16") else "bf16"
    shape = _parse(model_type, c)
    tied = c.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
    H, V = shape["hidden_size"], shape["vocab_size"]
    if shape["head_dim"] < 1:
        raise SimError(f"{source}: head_dim: hidden_size / num_attention_heads is below 1; give head_dim")
    if shape["experts_per_token"] > shape["num_experts"]:
        raise SimError(f"{source}: num_experts_per_tok: more than the model's {shape['num_experts']} experts")
    lm_head = 0 if tied else V * shape.get("lm_head_in", H)
    quant = quantization(raw, model_type, shape, source)
    return ModelSpec(
        name=name,
        hf_id=hf_id,
        model_type=model_type,
        lm_head_params=lm_head,
        torch_dtype=torch_dtype,
        default_weight_dtype=stored_weight_dtype(quant, torch_dtype),
        quant=quant,
        position_limit=position_limit(shape["max_position_embeddings"], data.get("rope_scaling"), source),
        **{k: v for k, v in shape.items() if k != "lm_head_in"},
    )


def position_limit(max_positions: int, rope: Any, source: str) -> int:
    """The longest sequence a checkpoint serves, as vLLM derives it (`_get_and_verify_max_len`; 0 when the
    config gives no `max_position_embeddings`): its positions, times a RoPE scaling factor, except for the
    scaling types whose positions already include it (su, longrope, llama3); yarn scales its original
    positions."""
    if not max_positions or not isinstance(rope, dict):
        return max_positions
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("su", "longrope", "llama3"):
        return max_positions
    factor = rope.get("factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 1.0 <= factor <= 1e4:
        raise SimError(f"{source}: rope_scaling.factor: expected a number in [1, 10000] (got {factor!r})")
    base = rope.get("original_max_position_embeddings", max_positions) if kind == "yarn" else max_positions
    if isinstance(base, bool) or not isinstance(base, int) or base < 1:
        key = "rope_scaling.original_max_position_embeddings"
        raise SimError(f"{source}: {key}: expected a whole number >= 1 (got {base!r})")
    return int(base * factor)


def _attention_kind(nh: int, nkv: int) -> str:
    return "MHA" if nkv == nh else ("MQA" if nkv == 1 else "GQA")


def _parse(model_type: str, c: _Cfg) -> dict[str, Any]:
    if model_type == "opt":
        return _parse_opt(c)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        return _parse_deepseek(c)
    return _parse_llama_like(model_type, c)


def _base(c: _Cfg) -> dict[str, Any]:
    H, L, nh = c.req("hidden_size"), c.req("num_hidden_layers"), c.req("num_attention_heads")
    return {
        "hidden_size": H,
        "num_layers": L,
        "num_heads": nh,
        "vocab_size": c.req("vocab_size"),
        "max_position_embeddings": c.get("max_position_embeddings", 0),
    }


def _check_heads(c: _Cfg, hidden: int, heads: int, kv_heads: int, head_dim: int | None) -> None:
    """Refuse KV heads that do not divide the query heads, and a hidden size that is not a whole number of
    heads when the config gives no head_dim (see the module docstring for vLLM's and transformers' rules)."""
    if heads % kv_heads:
        raise SimError(
            f"{c.source}: num_key_value_heads: {kv_heads} does not divide num_attention_heads ({heads}); "
            "each KV head serves a whole group of query heads"
        )
    if head_dim is None and hidden % heads:
        raise SimError(
            f"{c.source}: hidden_size: {hidden} is not a multiple of num_attention_heads ({heads}), and the "
            "config gives no head_dim to set the head width"
        )


def _parse_llama_like(mt: str, c: _Cfg) -> dict[str, Any]:
    s = _base(c)
    H, L, nh = s["hidden_size"], s["num_layers"], s["num_heads"]
    nkv = c.get("num_key_value_heads", nh)
    _check_heads(c, H, nh, nkv, c.get("head_dim"))
    hd = c.get("head_dim", H // nh)
    q, kv = nh * hd, nkv * hd
    attn = H * q + 2 * H * kv + q * H
    if mt == "qwen2" or c.get("attention_bias", False):
        attn += q + 2 * kv
    if mt == "qwen3" or mt == "qwen3_moe":
        attn += 2 * hd  # q_norm, k_norm
    norms_per_layer = 4 if mt == "gemma2" else 2
    window, n_sliding = _sliding(mt, c, L)
    moe = _moe_layout(mt, c, H, L)
    s.update(
        num_kv_heads=nkv,
        head_dim=hd,
        v_head_dim=hd,
        attention=_attention_kind(nh, nkv),
        kv_lora_rank=0,
        qk_rope_head_dim=0,
        sliding_window=window,
        num_sliding_layers=n_sliding,
        embedding_params=s["vocab_size"] * H,
        attention_params=L * attn,
        norm_params=L * norms_per_layer * H + H,
        **moe,
    )
    return s


def _sliding(mt: str, c: _Cfg, L: int) -> tuple[int | None, int]:
    window = c.get("sliding_window")
    if mt == "gemma2" and window:
        return int(window), (L + 1) // 2  # even layers are sliding
    if mt in ("mistral", "phi3", "mixtral") and window:
        return int(window), L
    if mt in ("qwen2", "qwen3", "qwen3_moe") and window and c.get("use_sliding_window", False):
        return int(window), max(0, L - int(c.get("max_window_layers", L)))
    if mt == "llama4" and c.get("attention_chunk_size"):
        # Chunked local attention on RoPE layers (3 of every 4), approximated as a sliding window.
        nope = c.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(L)]
        return int(c.req("attention_chunk_size")), int(sum(1 for x in nope if x))
    return None, 0


def _moe_layout(mt: str, c: _Cfg, H: int, L: int) -> dict[str, int]:
    """Dense MLP, shared experts, routers and routed experts for the llama-like families."""
    inter = c.req("intermediate_size")
    if mt == "mixtral":
        n, k, moe_layers = c.req("num_local_experts"), c.req("num_experts_per_tok"), L
        expert, dense_layer_mlp, shared = 3 * H * inter, 0, 0
    elif mt == "qwen3_moe":
        n, k = c.req("num_experts"), c.req("num_experts_per_tok")
        step, only = c.get("decoder_sparse_step", 1), set(c.get("mlp_only_layers", []))
        moe_layers = sum(1 for i in range(L) if i not in only and (i + 1) % step == 0)
        expert, dense_layer_mlp, shared = 3 * H * c.req("moe_intermediate_size"), 3 * H * inter, 0
    elif mt == "llama4":
        n, k = c.req("num_local_experts"), c.req("num_experts_per_tok")
        step = c.get("interleave_moe_layer_step", 1)
        moe_layers = len(c.get("moe_layers") or range(step - 1, L, step)) if step else 0
        expert = 3 * H * inter  # intermediate_size is per expert; the shared expert has the same width
        dense_layer_mlp, shared = 3 * H * c.req("intermediate_size_mlp"), expert
    else:
        return {
            "num_experts": 0,
            "experts_per_token": 0,
            "num_moe_layers": 0,
            "expert_params": 0,
            "routed_expert_params": 0,
            "dense_params": L * 3 * H * inter,
        }
    dense = (L - moe_layers) * dense_layer_mlp + moe_layers * (shared + H * n)
    return {
        "num_experts": n,
        "experts_per_token": k,
        "num_moe_layers": moe_layers,
        "expert_params": expert,
        "routed_expert_params": moe_layers * n * expert,
        "dense_params": dense,
    }


def _parse_opt(c: _Cfg) -> dict[str, Any]:
    s = _base(c)
    H, L, nh, V = s["hidden_size"], s["num_layers"], s["num_heads"], s["vocab_size"]
    _check_heads(c, H, nh, nh, None)
    ffn = c.req("ffn_dim")
    proj = c.get("word_embed_proj_dim", H)
    bias = c.get("enable_bias", True)
    attn = 4 * H * H + (4 * H if bias else 0)
    mlp = 2 * H * ffn + ((ffn + H) if bias else 0)
    project = 2 * H * proj if proj != H else 0
    s.update(
        num_kv_heads=nh,
        head_dim=H // nh,
        v_head_dim=H // nh,
        attention="MHA",
        kv_lora_rank=0,
        qk_rope_head_dim=0,
        sliding_window=None,
        num_sliding_layers=0,
        num_experts=0,
        experts_per_token=0,
        num_moe_layers=0,
        expert_params=0,
        routed_expert_params=0,
        embedding_params=V * proj + (s["max_position_embeddings"] + 2) * H,
        attention_params=L * attn,
        dense_params=L * mlp + project,
        norm_params=L * 4 * H + 2 * H,  # layer norms carry a bias
        lm_head_in=proj,
    )
    return s


def _parse_deepseek(c: _Cfg) -> dict[str, Any]:
    s = _base(c)
    H, L, nh = s["hidden_size"], s["num_layers"], s["num_heads"]
    kvl, rope = c.req("kv_lora_rank"), c.req("qk_rope_head_dim")
    nope, vd = c.req("qk_nope_head_dim"), c.req("v_head_dim")
    qlr = c.get("q_lora_rank")
    qk = nope + rope
    q_proj = (H * qlr + qlr + qlr * nh * qk) if qlr else H * nh * qk
    attn = q_proj + H * (kvl + rope) + kvl + kvl * nh * (nope + vd) + nh * vd * H
    n, k = c.req("n_routed_experts"), c.req("num_experts_per_tok")
    groups, per_token = c.get("n_group", 1), c.get("topk_group", 1)
    if n % groups:
        raise SimError(f"{c.source}: n_group: {groups} groups must divide the {n} routed experts")
    if per_token > groups:
        raise SimError(f"{c.source}: topk_group: {per_token} exceeds the {groups} groups of n_group")
    first_dense, freq = c.get("first_k_dense_replace", 0), c.get("moe_layer_freq", 1)
    moe_layers = sum(1 for i in range(L) if i >= first_dense and i % freq == 0)
    expert = 3 * H * c.req("moe_intermediate_size")
    shared = c.get("n_shared_experts", 0) * expert
    router = H * n + (n if c.get("topk_method") == "noaux_tc" else 0)
    dense = (L - moe_layers) * 3 * H * c.req("intermediate_size") + moe_layers * (shared + router)
    s.update(
        num_kv_heads=1,
        head_dim=qk,
        v_head_dim=vd,
        attention="MLA",
        kv_lora_rank=kvl,
        qk_rope_head_dim=rope,
        sliding_window=None,
        num_sliding_layers=0,
        num_experts=n,
        experts_per_token=k,
        expert_groups=groups if per_token < groups else 0,
        expert_groups_per_token=per_token if per_token < groups else 0,
        num_moe_layers=moe_layers,
        expert_params=expert,
        routed_expert_params=moe_layers * n * expert,
        embedding_params=s["vocab_size"] * H,
        attention_params=L * attn,
        replicated_attention_params=L * ((H * qlr + qlr if qlr else 0) + H * (kvl + rope) + kvl),
        dense_params=dense,
        norm_params=L * 2 * H + H,
    )
    return s
