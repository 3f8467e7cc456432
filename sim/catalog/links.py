"""The KV-transfer link catalogue (`sim/catalog/links.toml`) and the transfer time."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sim.io.errors import SimError


@dataclass(frozen=True, slots=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per GPU, per direction
    latency_s: float
    source: str
    date: str

    def transfer_s(self, prompt_tokens: int, kv_bytes_per_token_per_gpu: int) -> float:
        """Seconds to move `prompt_tokens` tokens of KV: every GPU sends its shard in parallel."""
        return self.latency_s + prompt_tokens * kv_bytes_per_token_per_gpu / self.bandwidth


@cache
def _catalog() -> dict[str, Link]:
    text = (resources.files("sim") / "catalog" / "links.toml").read_text()
    return {
        name: Link(name, float(s["bandwidth"]), float(s["latency_s"]), str(s["source"]), str(s["date"]))
        for name, s in tomllib.loads(text)["links"].items()
    }


def link_names() -> list[str]:
    return list(_catalog())


def get_link(name: str) -> Link:
    links = _catalog()
    if name not in links:
        raise SimError(f"unknown link {name!r} (one of {', '.join(links)})")
    return links[name]
