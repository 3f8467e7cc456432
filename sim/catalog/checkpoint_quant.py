"""A checkpoint's stored formats, from its config's `quantization_config` (GPTQ, AWQ, FP8, ...)."""

from __future__ import annotations

from typing import Any

from sim.catalog.model import Quantization
from sim.io.errors import SimError

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


def stored_weight_dtype(quant: Quantization, torch_dtype: str) -> str:
    return quant.dtype or torch_dtype
