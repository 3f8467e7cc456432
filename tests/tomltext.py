"""A small TOML writer for tests: every top-level key as `"key" = <inline value>`."""

from __future__ import annotations

import json
import math
from typing import Any


def value(v: Any) -> str:
    """One TOML value (inline tables for mappings; inf and nan as TOML writes them)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(str(k))} = {value(x)}" for k, x in v.items()) + " }"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def dumps(data: dict[str, Any]) -> str:
    return "".join(f"{json.dumps(str(k))} = {value(v)}\n" for k, v in data.items())
