"""TOML text of plain values: the `--set key=value` arguments `sim plan` prints, and scenario files written
from data."""

from __future__ import annotations

import json
import math
from typing import Any


def toml_value(v: Any) -> str:
    """An inline TOML value: numbers (inf and nan as TOML writes them), booleans, strings, arrays and inline
    tables."""
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
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def dumps(data: dict[str, Any]) -> str:
    """A TOML document with every top-level key as `"key" = <inline value>`."""
    return "".join(f"{json.dumps(str(k))} = {toml_value(v)}\n" for k, v in data.items())
