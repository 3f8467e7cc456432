"""The contract between a fleet and its routers: what a replica reports, and what a router does.

A router picks one replica of a role for each request, from what the replicas report (`ReplicaReport`).
The routers themselves, by name: `sim.fleet.routers`; their knobs: `sim.config.cluster.ROUTERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from pydantic import BaseModel

from sim.core.request import Request


class ReplicaReport(Protocol):
    """What a replica tells the router: requests it holds (queued, running or on their way to it), those
    of them queued, the share of its KV cache held, and, serving LoRA, its adapters (those in its GPU
    slots and those the requests it holds name, which it loads when it runs them), as of its latest
    report."""

    @property
    def outstanding(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    @property
    def kv_fraction(self) -> float: ...

    @property
    def adapters(self) -> Collection[int]: ...


NO_ADAPTERS: frozenset[int] = frozenset()


@dataclass(slots=True)
class Snapshot:
    """A report as it was at one instant (for routers that see reports with a delay)."""

    outstanding: int = 0
    waiting: int = 0
    kv_fraction: float = 0.0
    adapters: frozenset[int] = field(default=NO_ADAPTERS)


class Router(Protocol):
    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        """The index (into `reports`) of the replica that gets `req`."""
        ...


@dataclass(frozen=True, slots=True)
class RouterKind:
    name: str
    config: type[BaseModel]
    build: Callable[[BaseModel, int, np.random.Generator], Router]
