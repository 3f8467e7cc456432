"""A checkpoint's stored formats, from its config's `quantization_config` (GPTQ, AWQ, FP8, ...).

Every value is checked, naming the file and key: GPTQ / AWQ `bits` must be 4 or 8 (vLLM's GPTQConfig also
takes 2 and 3, its AWQConfig only 4; AWQ-Marlin 4 and 8), and `group_size` -1 (vLLM's per-channel scales;
0 is read the same) or a whole number that divides `hidden_size`, as vLLM's GPTQ/AWQ linear methods require
("The input size is not aligned with the quantized weight shape").
"""

from __future__ import annotations

from typing import Any

from sim.catalog.model import Quantization
from sim.catalog.quant_ignore import kept_groups, module_table
from sim.io.errors import SimError

_GPTQ_AWQ = ("gptq", "awq", "gptq_marlin", "awq_marlin")


def _shown(value: Any) -> str:
    return repr(value)[:40]


def _whole(table: dict[str, Any], keys: tuple[str, ...], where: str) -> tuple[int | None, str]:
    """The first of `keys` present in `table` as a whole number (None when none is), and its key."""
    for key in keys:
        value = table.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise SimError(f"{where}.{key}: expected a whole number (got {_shown(value)})")
        return value, key
    return None, keys[0]


def _object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise SimError(f"{where}: expected an object (got {_shown(value)})")
    return value


def _ignore_list(q: dict[str, Any], source: str) -> list[str]:
    key = "ignore" if q.get("ignore") is not None else "modules_to_not_convert"
    value = q.get(key) or []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise SimError(f"{source}: quantization_config.{key}: expected a list of module names")
    return value


def quantization(cfg: dict[str, Any], model_type: str, shape: dict[str, Any], source: str) -> Quantization:
    """The checkpoint's quantization from its `quantization_config` (none when absent).

    FP8 (`quant_method: fp8`, compressed-tensors float-quantized) is W8A8 when activations are 8-bit;
    GPTQ, AWQ and compressed-tensors `pack-quantized` / `int-quantized` are INT4/INT8, weight-only unless
    the activations are quantized too. Unknown methods are errors rather than silently 16-bit.
    """
    q = cfg.get("quantization_config") or {}
    if not q:
        return Quantization()
    where = f"{source}: quantization_config"
    q = _object(q, where)
    method_field = q.get("quant_method", "")
    if not isinstance(method_field, str):
        raise SimError(f"{where}.quant_method: expected a string (got {_shown(method_field)})")
    method = method_field.lower()
    ignore = _ignore_list(q, source)
    table = module_table(model_type, shape)
    params = {"attention": shape["attention_params"], "dense": shape["dense_params"]}

    def kept(lm_head_quantized: bool) -> tuple[tuple[str, float], ...]:
        return kept_groups(ignore, method, table, params, shape["num_layers"], lm_head_quantized, source)

    if method == "fp8":
        return Quantization("fp8", "fp8", True, 0, kept(False))
    if method in _GPTQ_AWQ:
        bits, bits_key = _whole(q, ("bits", "w_bit"), where)
        bits = 4 if bits is None else bits
        if bits not in (4, 8):
            raise SimError(f"{where}.{bits_key}: expected 4 or 8 (got {bits})")
        group, group_key = _whole(q, ("group_size", "q_group_size"), where)
        group = _group_size(group or 0, shape["hidden_size"], f"{where}.{group_key}")
        lm_head = q.get("lm_head", False)
        if not isinstance(lm_head, bool):
            raise SimError(f"{where}.lm_head: expected true or false (got {_shown(lm_head)})")
        return Quantization(method, f"int{bits}", False, group, kept(lm_head))
    if method == "compressed-tensors" or q.get("format") or q.get("config_groups"):
        config_groups = _object(q.get("config_groups"), f"{where}.config_groups")
        groups = {k: _object(g, f"{where}.config_groups.{k}") for k, g in config_groups.items()}
        formats = [
            (
                _ct_format(g, shape["hidden_size"], f"{where}.config_groups.{k}"),
                _target_groups(g.get("targets")),
            )
            for k, g in groups.items()
            if g.get("weights") is not None
        ]
        if not formats:
            raise SimError(f"{where}.config_groups: expected a group with weights")
        # Mixed precision: the group covering most module kinds sets the format; the others override theirs.
        formats.sort(key=lambda f: -len(f[1]))
        (dtype, acts, group), _ = formats[0]
        per_group: dict[str, tuple[str, bool, int]] = {}
        for fmt, targets in formats[1:]:
            for target in targets:
                if fmt != formats[0][0]:
                    per_group.setdefault(target, fmt)
        lm_quantized = any(
            "lm_head" in str(g.get("targets")) for g in groups.values()
        ) and "lm_head" not in str(ignore)
        mixed = tuple(sorted((name, *fmt) for name, fmt in per_group.items()))
        return Quantization("compressed-tensors", dtype, acts, group, kept(lm_quantized), mixed)
    raise SimError(
        f"{where}.quant_method: expected fp8, gptq, awq or compressed-tensors, got {method or '?'}"
    )


def _group_size(group: int, hidden: int, where: str) -> int:
    """A GPTQ/AWQ/compressed-tensors group size: 0 for per-channel (-1 or 0), else one dividing `hidden`."""
    if group in (-1, 0):
        return 0
    if group < 1 or hidden % group:
        raise SimError(
            f"{where}: expected -1 (per-channel scales) or a whole number dividing hidden_size ({hidden}), "
            f"as vLLM's quantized linear layers require (got {group})"
        )
    return group


def _ct_format(group: dict[str, Any], hidden: int, where: str) -> tuple[str, bool, int]:
    """(dtype, activations, group_size) of one compressed-tensors config group."""
    w = _object(group.get("weights"), f"{where}.weights")
    bits = _whole(w, ("num_bits",), f"{where}.weights")[0] or 16
    kind = w.get("type") or "int"
    if not isinstance(kind, str):
        raise SimError(f'{where}.weights.type: expected "int" or "float" (got {_shown(kind)})')
    inputs = _object(group.get("input_activations"), f"{where}.input_activations")
    acts = _whole(inputs, ("num_bits",), f"{where}.input_activations")[0] == 8
    if kind == "float" and bits == 8:
        return "fp8", acts, 0
    if kind == "int" and bits in (4, 8):
        size = _whole(w, ("group_size",), f"{where}.weights")[0] or 0
        return f"int{bits}", acts and bits == 8, _group_size(size, hidden, f"{where}.weights.group_size")
    raise SimError(
        f"{where}.weights: unsupported {kind[:20]} {bits}-bit weights (int 4 or 8 bits, or float 8 bits)"
    )


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


def stored_weight_dtype(quant: Quantization, torch_dtype: str) -> str:
    return quant.dtype or torch_dtype
