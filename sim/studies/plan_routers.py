"""The router as an axis of `sim plan` (`--routers`): which routers fit the workload, and which routers
route alike.

Pruned by proofs only, each rule named in `pruned_by_rule`:
- `router_unfit`: a router whose key the workload does not carry. `adapter_affinity` without LoRA
  adapters (`workload.lora`) sends every request to its fallback router, so it is that router under
  another name; `prefix_affinity` without shared prefixes (`workload.prefix`, `shared_prefix`, or a trace,
  whose rows may name a prefix group) hashes request ids, which share nothing to be affine to.
- `router_equivalent`: with one replica in each group (one colocated replica, or 1 prefill + 1 decode)
  every router sends every request to the same replica, so one router stands for all: the scenario's own
  (least_outstanding without a [cluster] table) when it is on the axis, else the first listed.
The axis sets `cluster.router` to the router's name with its default knobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.config.cluster import ROUTERS
from sim.config.scenario import Scenario
from sim.io.errors import SimError

ROUTER_KNOB = "router"  # the knob's key: `cluster.router`, not the policy's
DEFAULT_ROUTER = "least_outstanding"  # a plan's router when the scenario has no [cluster]


def router_options(text: str) -> list[str]:
    """`--routers`: router names, comma-separated, or `all` (every built-in router); empty: no axis."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    if names == ["all"]:
        return sorted(ROUTERS)
    unknown = [n for n in names if n not in ROUTERS]
    if unknown:
        known = ", ".join(sorted(ROUTERS))
        raise SimError(f"--routers: unknown router {unknown[0][:40]!r} (one of {known}, or all)")
    return list(dict.fromkeys(names))


def router_unfit(scenario: Scenario, knobs: Sequence[tuple[str, Any]]) -> str | None:
    """Why the router among `knobs` does not fit the workload (the module docstring), or None."""
    name = dict(knobs).get(ROUTER_KNOB)
    w = scenario.workload
    if name == "adapter_affinity" and w.lora is None:
        return "adapter_affinity: the workload names no LoRA adapters"
    if (
        name == "prefix_affinity"
        and w.prefix is None
        and w.shared_prefix is None
        and w.arrival.kind != "trace"
    ):
        return "prefix_affinity: the workload has no shared prefixes"
    return None


def stands_in(scenario: Scenario, routers: Sequence[str]) -> str | None:
    """The router that stands for every router of the axis where they route alike (None: no axis)."""
    fits = [r for r in routers if router_unfit(scenario, [(ROUTER_KNOB, r)]) is None]
    if not fits:
        return None
    own = scenario.cluster.router_kind()[0] if scenario.cluster is not None else DEFAULT_ROUTER
    return own if own in fits else fits[0]


def routes_alike(knobs: Sequence[tuple[str, Any]], counts: Sequence[int], stand_in: str | None) -> bool:
    """One replica in each group, and a router on the axis other than the one standing in for all."""
    name = dict(knobs).get(ROUTER_KNOB)
    return name is not None and name != stand_in and all(n == 1 for n in counts)


def machine(c: Any) -> tuple[Any, ...]:
    """A candidate's family without its router (`plan_space.Candidate.family`): what one replica's
    saturated throughput depends on, so the routers of a family share one capacity run."""
    mode, gpu, tp, knobs, *rest = c.family
    return mode, gpu, tp, tuple(k for k in knobs if k[0] != ROUTER_KNOB), *rest
