"""Pydantic validation errors as one message that names the file and the dotted key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError


def format_validation_error(err: ValidationError, data: Any, source: str, root: str = "workload") -> str:
    """One line per problem: `source: root.dotted.key: message`, dropping pydantic's union tags."""
    lines = []
    for e in err.errors():
        parts: list[str] = [root] if root else []
        cur: Any = data
        for item in e["loc"]:
            is_tag = isinstance(cur, Mapping) and item not in cur and cur.get("kind") == item
            if is_tag:
                continue  # the discriminator tag pydantic inserts
            if isinstance(item, int):
                parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
                cur = cur[item] if isinstance(cur, list | tuple) and item < len(cur) else None
            else:
                parts.append(item)
                cur = cur.get(item) if isinstance(cur, Mapping) else None
        msg = e["msg"].removeprefix("Value error, ")
        key = re.match(r"([a-z_]+(?:\.[a-z_]+)*): (.*)", msg) if e["type"] == "value_error" else None
        if key:  # a model-level check that names its own sub-key
            parts.append(key[1])
            msg = key[2]
        if e["type"] not in ("missing", "extra_forbidden") and not isinstance(e.get("input"), Mapping):
            msg += f" (got {e.get('input')!r})"
        where = ".".join(parts)
        lines.append(f"{source}: {where}: {msg}" if where else f"{source}: {msg}")
    return "\n".join(lines)
