"""The built-in routers. Each sees only the replicas' reports (`ReplicaReport`), never their internals.

- `round_robin`: replicas in turn.
- `random`: uniformly at random (seeded from the scenario).
- `least_outstanding`: join the shortest queue (fewest outstanding requests); ties go to the next replica
  after the previous choice.
- `power_of_two`: sample `choices` distinct replicas at random, take the one with fewest outstanding.
- `least_kv`: the smallest share of KV cache in use (then fewest outstanding).
- `prefix_affinity`: consistent hashing of the request's prefix group (its id when it has none) on a ring
  of `virtual_nodes` points per replica, with bounded load (Mirrokni, Thorup and Zadimoghaddam, 2018):
  walk the ring from the key to the first replica whose outstanding count is below
  ceil(load_factor x (total + 1) / replicas).
- `adapter_affinity` (LoRA): of the replicas below that same bound whose adapters (in GPU slots, or named
  by requests they hold) include the request's, the one with fewest outstanding (ties: the lowest index);
  when there is none, or the request names no adapter, the `fallback` router (least_outstanding by
  default) picks among all replicas.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel

from sim.config.cluster import ROUTERS as KNOBS
from sim.config.cluster import AdapterAffinityConfig, AffinityConfig, PowerConfig
from sim.core.request import Request
from sim.fleet.routing import ReplicaReport, RouterKind


class RoundRobin:
    def __init__(self, config: BaseModel, n: int, rng: np.random.Generator) -> None:
        self.next = 0

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        i = self.next % len(reports)
        self.next = i + 1
        return i


class RandomRouter:
    def __init__(self, config: BaseModel, n: int, rng: np.random.Generator) -> None:
        self.rng = rng

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        return int(self.rng.integers(len(reports)))


class LeastOutstanding:
    def __init__(self, config: BaseModel, n: int, rng: np.random.Generator) -> None:
        self.last = -1

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        n = len(reports)
        start = self.last + 1
        best, best_load = start % n, math.inf
        for k in range(n):
            i = (start + k) % n
            load = reports[i].outstanding
            if load < best_load:
                best, best_load = i, load
        self.last = best
        return best


class PowerOfChoices:
    def __init__(self, config: PowerConfig, n: int, rng: np.random.Generator) -> None:
        self.d = config.choices
        self.rng = rng

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        n = len(reports)
        d = min(self.d, n)
        picks = self.rng.choice(n, size=d, replace=False) if d > 1 else [int(self.rng.integers(n))]
        best = int(picks[0])
        for i in picks[1:]:
            if reports[int(i)].outstanding < reports[best].outstanding:
                best = int(i)
        return best


class LeastKv:
    def __init__(self, config: BaseModel, n: int, rng: np.random.Generator) -> None:
        pass

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        return min(range(len(reports)), key=lambda i: (reports[i].kv_fraction, reports[i].outstanding, i))


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def load_bound(reports: Sequence[ReplicaReport], load_factor: float) -> int:
    """Bounded load: a replica takes a request while its outstanding count is below this."""
    total = sum(r.outstanding for r in reports)
    return math.ceil(load_factor * (total + 1) / len(reports))


class PrefixAffinity:
    def __init__(self, config: AffinityConfig, n: int, rng: np.random.Generator) -> None:
        self.load_factor = config.load_factor
        points = sorted(
            (_hash64(f"replica-{i}-{v}"), i) for i in range(n) for v in range(config.virtual_nodes)
        )
        self.ring = [p for p, _ in points]
        self.owner = [i for _, i in points]

    def key(self, req: Request) -> str:
        return f"group-{req.prefix_group}" if req.prefix_group >= 0 else f"request-{req.id}"

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        bound = load_bound(reports, self.load_factor)
        ring, owner = self.ring, self.owner
        start = bisect.bisect_left(ring, _hash64(self.key(req)))
        for k in range(len(ring)):
            i = owner[(start + k) % len(ring)]
            if reports[i].outstanding < bound:
                return i
        return owner[start % len(ring)]  # unreachable: some replica is below the mean


class AdapterAffinity:
    def __init__(self, config: AdapterAffinityConfig, n: int, rng: np.random.Generator) -> None:
        self.load_factor = config.load_factor
        self.fallback = BUILDERS[config.fallback](KNOBS[config.fallback](), n, rng)

    def route(self, req: Request, reports: Sequence[ReplicaReport]) -> int:
        adapter = req.adapter
        if adapter >= 0:
            bound = load_bound(reports, self.load_factor)
            best, best_load = -1, bound
            for i, report in enumerate(reports):
                load = report.outstanding
                if load < best_load and adapter in report.adapters:
                    best, best_load = i, load
            if best >= 0:
                return best
        return self.fallback.route(req, reports)  # type: ignore[no-any-return]


BUILDERS: dict[str, Any] = {
    "round_robin": RoundRobin,
    "random": RandomRouter,
    "least_outstanding": LeastOutstanding,
    "power_of_two": PowerOfChoices,
    "least_kv": LeastKv,
    "prefix_affinity": PrefixAffinity,
    "adapter_affinity": AdapterAffinity,
}
ROUTERS = {name: RouterKind(name, KNOBS[name], build) for name, build in BUILDERS.items()}


def load_all() -> dict[str, RouterKind]:
    """Every router by name: its knobs' config and its factory `build(config, replicas, rng)`."""
    return ROUTERS
