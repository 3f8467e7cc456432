"""Model specs read from Hugging Face decoder config.json files: parameters, KV bytes per token, FLOPs.

Parameter groups are kept apart because the cost model treats them differently:
`embedding_params` are gathered (a few rows read per token), `lm_head_params` are 0 when tied to the
embedding (the logits matmul still costs 2·vocab·hidden FLOPs per row), `routed_expert_params` are
read only for the experts a batch touches.
"""

from __future__ import annotations

import difflib
import json
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from sim.io.errors import SimError
from sim.io.limits import MAX_MODEL_DIM

DTYPE_BYTES: dict[str, float] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
_DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
}
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


def normalize_dtype(dtype: str) -> str:
    """Canonical dtype name (fp32, bf16, fp16, fp8, int8, int4); SimError if unknown."""
    d = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
    if d not in DTYPE_BYTES:
        raise SimError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    return d


def dtype_bytes(dtype: str) -> float:
    """Bytes per value of a dtype (int4 is 0.5)."""
    return DTYPE_BYTES[normalize_dtype(dtype)]


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
# Weight dtypes a 16-bit checkpoint can be served in by online quantization (see `ModelSpec.serving_quant`).
ONLINE_QUANT_DTYPES = ("fp8", "int8", "int4")
# KV-cache dtypes: the 16-bit activation dtypes and the 8-bit caches (vLLM's kv_cache_dtype fp8 / int8).
KV_DTYPES = ("bf16", "fp16", "fp8", "int8")


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


# ----------------------------------------------------------------------------- loading


def _catalog() -> dict[str, str]:
    text = (resources.files("sim") / "catalog" / "models.toml").read_text()
    return dict(tomllib.loads(text)["models"])


def catalog_names() -> list[str]:
    """Short names of the shipped model configs."""
    return sorted(_catalog())


def resolve(name_or_path: str) -> tuple[str, str, Any]:
    """(short name, HF id, config file) for a catalog short name, HF id, or path."""
    cat = _catalog()
    key = name_or_path.strip()
    by_id = {hf.lower(): short for short, hf in cat.items()}
    short = key.lower() if key.lower() in cat else by_id.get(key.lower())
    if short is not None:
        ref = resources.files("sim") / "catalog" / "models" / f"{short}.json"
        return short, cat[short], ref
    path = Path(key)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return path.parent.name or path.stem, str(path), path
    choices = list(cat) + list(cat.values())
    close = difflib.get_close_matches(key, choices, n=4, cutoff=0.4)
    hint = f"; closest: {', '.join(close)}" if close else f"; known: {', '.join(sorted(cat))}"
    raise SimError(f"unknown model {name_or_path!r} (not a catalog name, HF id or config.json path){hint}")


def load_model(name_or_path: str) -> ModelSpec:
    """Load a ModelSpec from a catalog short name, an HF id (any case) or a config.json path."""
    short, hf_id, ref = resolve(name_or_path)
    try:
        cfg = json.loads(ref.read_bytes())
    except OSError as exc:
        raise SimError(f"{ref}: cannot read: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise SimError(f"{ref}: not a UTF-8 text file") from None
    except RecursionError:
        raise SimError(f"{ref}: not a model config (JSON nested too deeply)") from None
    except json.JSONDecodeError as exc:
        raise SimError(f"{ref}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(cfg, dict):
        raise SimError(f"{ref}: a model config is a JSON object")
    return from_config(cfg, name=short, hf_id=hf_id, source=str(ref))


# Whole-number fields of a config.json and the smallest value each may take; none may exceed
# MAX_MODEL_DIM. Flags must be booleans and layer lists lists of layer indices.
_INT_FIELDS: dict[str, int] = {
    **dict.fromkeys(
        ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "num_key_value_heads",
         "head_dim", "intermediate_size", "sliding_window", "attention_chunk_size", "num_local_experts",
         "num_experts", "num_experts_per_tok", "decoder_sparse_step", "moe_intermediate_size",
         "intermediate_size_mlp", "ffn_dim", "word_embed_proj_dim", "kv_lora_rank", "v_head_dim",
         "q_lora_rank", "n_routed_experts", "moe_layer_freq"),
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


# Module-name fragments of `ignore` / `modules_to_not_convert` entries, and the group each belongs to.
_IGNORE_GROUPS = (
    ("lm_head", "lm_head"),
    ("router", "router"),  # H x n_experts: negligible, tracked apart from the MLPs
    ("mlp.gate.", "router"),
    ("shared_expert", "dense"),
    ("experts", "experts"),
    ("self_attn", "attention"),
    ("attention", "attention"),
    ("mlp", "dense"),
    ("feed_forward", "dense"),
)


def _kept_groups(ignore: list[str], num_layers: int, lm_head_q: bool) -> tuple[tuple[str, float], ...]:
    """Fraction of each linear group kept in 16-bit, from a list of ignored module names.

    A whole-layer group (attention, dense) counts by the layers named; vision-tower and projector modules
    are outside the language model and do not count.
    """
    layers: dict[str, set[str]] = {}
    whole: set[str] = set()
    for name in ignore:
        text = str(name)
        if text.startswith(("re:", "vision", "multi_modal")) or "vision" in text:
            continue
        for fragment, group in _IGNORE_GROUPS:
            if fragment in text:
                layer = next((part for part in text.split(".") if part.isdigit()), None)
                if layer is None:
                    whole.add(group)
                else:
                    layers.setdefault(group, set()).add(layer)
                break
    kept = {g: min(1.0, len(ls) / max(num_layers, 1)) for g, ls in layers.items()}
    kept.update(dict.fromkeys(whole, 1.0))
    if not lm_head_q:
        kept["lm_head"] = 1.0
    return tuple(sorted(kept.items()))


def quantization(cfg: dict[str, Any], num_layers: int, source: str) -> Quantization:
    """The checkpoint's quantization from its `quantization_config` (none when absent).

    FP8 (`quant_method: fp8`, compressed-tensors float-quantized) is W8A8 when activations are 8-bit;
    GPTQ, AWQ and compressed-tensors `pack-quantized` / `int-quantized` are INT4/INT8, weight-only unless
    the activations are quantized too. Unknown methods are errors rather than silently 16-bit.
    """
    q = cfg.get("quantization_config") or {}
    if not q:
        return Quantization()
    if not isinstance(q, dict):
        raise SimError(f"{source}: quantization_config: expected an object")
    method = str(q.get("quant_method", "")).lower()
    ignore = list(q.get("ignore") or q.get("modules_to_not_convert") or [])
    if method == "fp8":
        return Quantization("fp8", "fp8", True, 0, _kept_groups(ignore, num_layers, False))
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        bits = int(q.get("bits") or q.get("w_bit") or 4)
        if bits not in (4, 8):
            raise SimError(f"{source}: quantization_config.bits: expected 4 or 8, got {bits}")
        group = int(q.get("group_size") or q.get("q_group_size") or 0)
        return Quantization(
            method,
            f"int{bits}",
            False,
            max(group, 0),
            _kept_groups(ignore, num_layers, bool(q.get("lm_head"))),
        )
    if method == "compressed-tensors" or q.get("format") or q.get("config_groups"):
        groups = [g for g in (q.get("config_groups") or {}).values() if isinstance(g, dict)]
        formats = [
            (_ct_format(g, source), _target_groups(g.get("targets"))) for g in groups if g.get("weights")
        ]
        if not formats:
            raise SimError(f"{source}: quantization_config.config_groups: expected a group with weights")
        # Mixed precision: the group covering most module kinds sets the format; the others override theirs.
        formats.sort(key=lambda f: -len(f[1]))
        (dtype, acts, group), _ = formats[0]
        per_group: dict[str, tuple[str, bool, int]] = {}
        for fmt, targets in formats[1:]:
            for target in targets:
                if fmt != formats[0][0]:
                    per_group.setdefault(target, fmt)
        lm_quantized = any("lm_head" in str(g.get("targets")) for g in groups) and "lm_head" not in str(
            ignore
        )
        kept = _kept_groups(ignore, num_layers, lm_quantized)
        mixed = tuple(sorted((name, *fmt) for name, fmt in per_group.items()))
        return Quantization("compressed-tensors", dtype, acts, group, kept, mixed)
    raise SimError(
        f"{source}: quantization_config.quant_method: expected fp8, gptq, awq or compressed-tensors, "
        f"got {method or '?'}"
    )


def _ct_format(group: dict[str, Any], source: str) -> tuple[str, bool, int]:
    """(dtype, activations, group_size) of one compressed-tensors config group."""
    w = group.get("weights") or {}
    bits, kind = int(w.get("num_bits") or 16), str(w.get("type") or "int")
    acts = (group.get("input_activations") or {}).get("num_bits") == 8
    if kind == "float" and bits == 8:
        return "fp8", acts, 0
    if kind == "int" and bits in (4, 8):
        return f"int{bits}", acts and bits == 8, max(int(w.get("group_size") or 0), 0)
    raise SimError(f"{source}: quantization_config: unsupported {kind} {bits}-bit weights")


def _target_groups(targets: Any) -> tuple[str, ...]:
    """The LINEAR_GROUPS a compressed-tensors group's `targets` (module classes or name patterns) cover."""
    out: set[str] = set()
    for target in targets if isinstance(targets, list) else [targets]:
        text = str(target).lower()
        if text.endswith("linear") and not text.startswith("re:"):
            out |= {"attention", "dense", "experts"}
        elif "lm_head" in text:
            out.add("lm_head")
        elif "expert" in text:
            out.add("experts")
        elif any(k in text for k in ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj")):
            out.add("attention")
        elif any(k in text for k in ("mlp", "feed_forward", "gate_proj", "up_proj", "down_proj")):
            out |= {"dense", "experts"}
    return tuple(sorted(out))


def _weight_dtype(quant: Quantization, torch_dtype: str) -> str:
    return quant.dtype or torch_dtype


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
    quant = quantization(raw, shape["num_layers"], source)
    return ModelSpec(
        name=name,
        hf_id=hf_id,
        model_type=model_type,
        lm_head_params=lm_head,
        torch_dtype=torch_dtype,
        default_weight_dtype=_weight_dtype(quant, torch_dtype),
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


def _parse_llama_like(mt: str, c: _Cfg) -> dict[str, Any]:
    s = _base(c)
    H, L, nh = s["hidden_size"], s["num_layers"], s["num_heads"]
    nkv = c.get("num_key_value_heads", nh)
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
        num_moe_layers=moe_layers,
        expert_params=expert,
        routed_expert_params=moe_layers * n * expert,
        embedding_params=s["vocab_size"] * H,
        attention_params=L * attn,
        dense_params=dense,
        norm_params=L * 2 * H + H,
    )
    return s
