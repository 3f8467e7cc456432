"""Policies by name. A new policy is one module and one `register` call, and its knobs' config model.

Each policy has a pydantic config model (its TOML knobs, `extra="forbid"`, in `sim.config.policies.POLICIES`
under the same name) and a factory `build(config, memory) -> Scheduler`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from sim.config.policies import POLICIES as KNOBS
from sim.cost.memory import KvBudget
from sim.engine.schedulers.base import Scheduler


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    config: type[BaseModel]
    build: Callable[[BaseModel, KvBudget], Scheduler]


POLICIES: dict[str, Policy] = {}


def register(name: str, build: Callable[..., Scheduler]) -> None:
    POLICIES[name] = Policy(name, KNOBS[name], build)


def load_all() -> dict[str, Policy]:
    """Import the policy modules (each registers itself) and return the registry."""
    import importlib
    import pkgutil

    import sim.engine.schedulers as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name not in {"base", "registry"}:
            importlib.import_module(f"sim.engine.schedulers.{info.name}")
    return POLICIES
