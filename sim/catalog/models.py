"""The model catalogue: a catalogue name, a Hugging Face id or a config.json path, as a `ModelSpec`."""

from __future__ import annotations

import difflib
import json
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from sim.catalog.hf_config import from_config
from sim.catalog.model import ModelSpec
from sim.io.errors import SimError


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
