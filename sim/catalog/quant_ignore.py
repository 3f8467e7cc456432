"""The linear modules a checkpoint keeps in 16-bit, from its `quantization_config`'s `ignore` (fp8,
compressed-tensors) or `modules_to_not_convert` (AWQ, GPTQ), matched per module as vLLM matches them, and the
share of each LINEAR_GROUPS group's parameters they hold.

vLLM's rules (vllm/model_executor/layers/quantization):
- compressed-tensors (`should_ignore_layer`, `_is_equal_or_regex_match`): an entry is an exact module name,
  or `re:` and a regular expression matched from the start of the name (`re.match`);
- fp8 (`utils/quant_utils.py` `is_layer_skipped`): exact module names;
- AWQ / GPTQ `modules_to_not_convert` (`is_layer_skipped_awq`): an entry skips every module whose name
  contains it;
- fp8 and compressed-tensors fuse q/k/v into qkv_proj and gate/up into gate_up_proj, and refuse a layer
  whose shards are not all skipped or all quantized.

The module table names the modules of the common layouts (`model.layers.N.self_attn.q_proj`, ...,
`model.layers.N.mlp.down_proj`, `lm_head`) with their parameters; a name in a group the table does not list
for the model (MoE experts and routers, MLA attention, vision towers) counts as before: its layer's whole
group, or the whole group when it names no layer, and a vision or projector module not at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sim.io.errors import SimError

# Module-name fragments of the names the table does not list, and the group each belongs to.
_FRAGMENT_GROUPS = (
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


# Shards vLLM fuses into one module: a layer must skip all of them or none.
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


@dataclass(frozen=True)
class Module:
    """One linear module of the language model: its name as vLLM prefixes it, its group and parameters."""

    name: str
    group: str
    layer: int | None
    params: int


def module_table(model_type: str, shape: dict[str, Any]) -> list[Module]:
    """The named linear modules of a model shape (`sim/catalog/hf_config.py`'s fields)."""
    H, L = shape["hidden_size"], shape["num_layers"]
    out: list[Module] = [Module("lm_head", "lm_head", None, shape["vocab_size"] * H)]
    if shape.get("kv_lora_rank"):  # MLA: its projections are not listed
        return out
    if model_type == "opt":
        per = shape["attention_params"] // L // 4
        for i in range(L):
            for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
                out.append(Module(f"model.decoder.layers.{i}.self_attn.{p}", "attention", i, per))
        return out
    q, kv = shape["num_heads"] * shape["head_dim"], shape["num_kv_heads"] * shape["head_dim"]
    attn = {"q_proj": H * q, "k_proj": H * kv, "v_proj": H * kv, "o_proj": q * H}
    dense = shape["num_experts"] == 0
    mlp = shape["dense_params"] // (3 * L) if dense else 0
    for i in range(L):
        for p, n in attn.items():
            out.append(Module(f"model.layers.{i}.self_attn.{p}", "attention", i, n))
        if dense:
            for p in ("gate_proj", "up_proj", "down_proj"):
                out.append(Module(f"model.layers.{i}.mlp.{p}", "dense", i, mlp))
    return out


def _matches(entry: str, name: str, method: str) -> bool:
    if entry.startswith("re:"):
        return re.match(entry[3:], name) is not None
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        return entry in name
    return entry.removeprefix("language_model.") == name


def kept_groups(
    ignore: list[str],
    method: str,
    table: list[Module],
    group_params: dict[str, int],
    num_layers: int,
    lm_head_quantized: bool,
    source: str,
) -> tuple[tuple[str, float], ...]:
    """Share of each linear group's parameters kept in 16-bit by the ignored modules."""
    listed = {m.group for m in table}
    matched: dict[str, Module] = {}
    layers: dict[str, set[str]] = {}
    whole: set[str] = set()
    for entry in ignore:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as err:
                raise SimError(
                    f"{source}: quantization_config.ignore: {entry[:60]!r} is no regular expression ({err})"
                ) from None
        hits = [m for m in table if _matches(entry, m.name, method)]
        matched.update((m.name, m) for m in hits)
        if hits or entry.startswith(("re:", "vision", "multi_modal")) or "vision" in entry:
            continue
        for fragment, group in _FRAGMENT_GROUPS:
            if fragment in entry:
                if group in listed:  # a name the model does not have: vLLM skips nothing
                    break
                layer = next((part for part in entry.split(".") if part.isdigit()), None)
                if layer is None:
                    whole.add(group)
                else:
                    layers.setdefault(group, set()).add(layer)
                break
    if method not in ("gptq", "awq", "gptq_marlin", "awq_marlin"):
        _check_fused(matched, table, source)
    kept = {g: min(1.0, len(ls) / max(num_layers, 1)) for g, ls in layers.items()}
    for m in matched.values():
        if m.group == "lm_head":
            kept["lm_head"] = 1.0
        elif group_params.get(m.group):
            kept[m.group] = min(1.0, kept.get(m.group, 0.0) + m.params / group_params[m.group])
    kept.update(dict.fromkeys(whole, 1.0))
    if not lm_head_quantized:
        kept["lm_head"] = 1.0
    return tuple(sorted(kept.items()))


def _check_fused(matched: dict[str, Module], table: list[Module], source: str) -> None:
    """Refuse a layer that skips some but not all of the shards vLLM fuses into one module."""
    names = {m.name for m in table}
    for name in matched:
        for shards in _FUSED:
            stem, _, proj = name.rpartition(".")
            if proj not in shards:
                continue
            missing = [s for s in shards if f"{stem}.{s}" in names and f"{stem}.{s}" not in matched]
            if missing:
                raise SimError(
                    f"{source}: quantization_config.ignore: {name} is kept in 16-bit but not "
                    f"{', '.join(missing)}; vLLM fuses {'/'.join(shards)} into one module and refuses "
                    "shards in different formats"
                )
