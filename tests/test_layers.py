"""The house by layers: `sim/` holds only the command line and one package per layer, and each registry
that pairs a configuration (in `sim.config`) with its builder (in a layer above) names the same kinds on
both sides. The import contracts themselves are checked by `lint-imports` in `make test`."""

from __future__ import annotations

import typing
from pathlib import Path

import numpy as np

from sim.config.cluster import ROUTERS as ROUTER_KNOBS
from sim.config.lengths import DISTRIBUTIONS
from sim.config.policies import POLICIES as POLICY_KNOBS
from sim.config.workload import ARRIVAL_KINDS, ClosedLoopArrival
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.schedulers.registry import load_all as load_policies
from sim.fleet.routers import load_all as load_routers
from sim.fleet.routing import Snapshot
from sim.workload.generator import ARRIVALS
from sim.workload.lengths import SAMPLERS

SIM = Path(__file__).resolve().parent.parent / "sim"


def _tag(config: type) -> str:
    (tag,) = typing.get_args(config.model_fields["kind"].annotation)
    return str(tag)


def test_sim_holds_only_the_command_line_and_packages() -> None:
    files = sorted(p.name for p in SIM.glob("*.py"))
    assert files == ["__init__.py", "__main__.py"]
    packages = sorted(p.name for p in SIM.iterdir() if (p / "__init__.py").is_file())
    layers = ["catalog", "config", "core", "cost", "engine", "fleet", "io", "records", "report", "studies"]
    assert packages == ["catalog", "cli", *layers[1:], "workload"]


def test_every_policy_has_its_knobs_and_its_scheduler() -> None:
    """Each `[policies]` kind a scenario accepts has a registered scheduler, built from its default knobs."""
    registry = load_policies()
    assert sorted(registry) == sorted(POLICY_KNOBS)
    for name, policy in registry.items():
        scheduler = policy.build(POLICY_KNOBS[name](), KvBudget(64, 16, 1024))
        assert scheduler.schedule(0.0) is None, name  # nothing queued: nothing to run


def test_every_router_has_its_knobs_and_its_class() -> None:
    """Each router the `[cluster]` table accepts builds from its default knobs and routes to a replica."""
    routers = load_routers()
    assert sorted(routers) == sorted(ROUTER_KNOBS)
    reports = [Snapshot(), Snapshot()]
    request = Request(id=0, arrival=0.0, prompt_len=8, max_tokens=4, output_len=4)
    for name, kind in routers.items():
        router = kind.build(ROUTER_KNOBS[name](), len(reports), np.random.default_rng(0))
        assert router.route(request, reports) in (0, 1), name


def test_every_open_loop_arrival_kind_has_a_process_and_every_length_kind_a_sampler() -> None:
    open_loop = {_tag(c) for c in ARRIVAL_KINDS if c is not ClosedLoopArrival}
    assert sorted(ARRIVALS) == sorted(open_loop)
    assert sorted(SAMPLERS) == sorted(_tag(c) for c in DISTRIBUTIONS)
