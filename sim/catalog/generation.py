"""A checkpoint's generation_config.json: the sampling defaults vLLM applies to requests that do not set them.

vLLM 0.15 serves with `--generation-config auto`: it reads the checkpoint's generation_config.json and takes
`temperature`, `top_p`, `top_k`, `min_p` and `repetition_penalty` from it as each request's defaults
(`ModelConfig.get_diff_sampling_param`); `do_sample` is not read. A model named by a config.json path reads
the generation_config.json beside it; a catalogue model `sim/catalog/models/NAME.generation_config.json`,
shipped for the checkpoints whose file is known (sim/catalog/models.toml says which, and where from). A file
that sets none of those keys leaves vLLM's own defaults (temperature 1, neither top-p nor top-k: no sort).
Without a file the engine keeps the calibration's flat sampler term (sim/cost/sampler.py).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from sim.catalog.models import resolve
from sim.io.errors import SimError

# The keys vLLM reads, each with its accepted range (vLLM's SamplingParams._verify_args).
GENERATION_KEYS: dict[str, tuple[float, float, bool]] = {
    "temperature": (0.0, 100.0, False),
    "top_p": (1e-9, 1.0, False),
    "top_k": (-1, 1 << 30, True),
    "min_p": (0.0, 1.0, False),
    "repetition_penalty": (1e-9, 2.0, False),
}


def generation_file(name_or_path: str) -> Any:
    """The generation_config.json of a model (a resource or a path), or None when it has none."""
    short, _, ref = resolve(name_or_path)
    models = resources.files("sim") / "catalog" / "models"
    if ref != models / f"{short}.json":  # a config.json path (the catalogue's files are paths too, on disk)
        found = Path(ref).parent / "generation_config.json"
        return found if found.is_file() else None
    found = models / f"{short}.generation_config.json"
    return found if found.is_file() else None


def generation_defaults(name_or_path: str) -> dict[str, float] | None:
    """The sampling defaults a model's generation_config.json sets (empty when it sets none), checked key by
    key naming the file; None when the model has no such file."""
    ref = generation_file(name_or_path)
    if ref is None:
        return None
    try:
        data = json.loads(ref.read_bytes())
    except (OSError, UnicodeDecodeError, RecursionError, json.JSONDecodeError):
        raise SimError(f"{ref}: not a readable JSON generation config") from None
    if not isinstance(data, dict):
        raise SimError(f"{ref}: a generation config is a JSON object")
    out: dict[str, float] = {}
    for key, (low, high, whole) in GENERATION_KEYS.items():
        value = data.get(key)
        if value is None:
            continue
        kind = int if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
            what = "a whole number" if whole else "a number"
            raise SimError(f"{ref}: {key}: expected {what} in [{low:g}, {high:g}] (got {repr(value)[:40]})")
        out[key] = value
    return out


def generation_note(name_or_path: str) -> str | None:
    """The sentence a run owes its reader when the model's generation_config.json sets sampling defaults
    (they change what its sampler costs), else None."""
    defaults = generation_defaults(name_or_path)
    if defaults is None:
        return None
    given = ", ".join(f"{k} {v:g}" for k, v in defaults.items())
    sets = (
        f"sets {given} for what a request leaves unset"
        if given
        else "sets no sampling default, so a request that sets none samples at vLLM's own (temperature 1, "
        "no top-p or top-k)"
    )
    return (
        f"{name_or_path}'s generation_config.json {sets}, as vLLM's --generation-config auto applies it; "
        "the vllm and sarathi policies' sampler is priced so (docs/sampling.md)"
    )
