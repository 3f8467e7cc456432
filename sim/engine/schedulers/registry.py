"""Policies by name. A new policy is one module and one `register` call.

Each policy has a pydantic config model (its TOML knobs, `extra="forbid"`) and a factory
`build(config, memory) -> Scheduler`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from sim.engine.schedulers.base import Scheduler


@dataclass(frozen=True, slots=True)
class KvBudget:
    """The KV memory a replica gives its scheduler, in blocks of `block_size` token slots."""

    num_blocks: int
    block_size: int
    max_model_len: int

    @property
    def num_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    config: type[BaseModel]
    build: Callable[[BaseModel, KvBudget], Scheduler]


POLICIES: dict[str, Policy] = {}


def register(name: str, config: type[BaseModel], build: Callable[..., Scheduler]) -> None:
    POLICIES[name] = Policy(name, config, build)


def load_all() -> dict[str, Policy]:
    """Import the policy modules (each registers itself) and return the registry."""
    import importlib
    import pkgutil

    import sim.engine.schedulers as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in {"base", "registry"}:
            importlib.import_module(f"sim.engine.schedulers.{info.name}")
    return POLICIES
