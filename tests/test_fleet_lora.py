"""LoRA in fleets: each replica's own adapter cache, the adapters a replica reports to the router, and the
adapter-affinity router against load-balancing routers."""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest

from sim.config.scenario import validate_scenario
from sim.core.request import Request
from sim.engine.replica import Horizon
from sim.fleet.engine import Fleet
from sim.fleet.routers import load_all, load_bound
from sim.fleet.routing import Snapshot
from sim.fleet.run import build_specs
from sim.io.errors import SimError
from sim.studies.run import run_policy

ADAPTERS, MAX_LORAS = 8, 2


def _scenario(router: str | dict[str, Any] = "round_robin", replicas: int = 4) -> dict[str, Any]:
    """Four Llama-2-7B replicas, eight rank-8 adapters drawn uniformly, two GPU slots per replica, a host
    cache holding every adapter."""
    return {
        "name": "fleet-lora-test",
        "seed": 3,
        "model": {"name": "llama-2-7b", "gpu": "A100-80GB", "max_model_len": 1024},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 16.0},
            "prompt": {"kind": "uniform", "low": 8, "high": 256},
            "output": {"kind": "uniform", "low": 8, "high": 64},
            "lora": {"adapters": ADAPTERS, "rank": 8},
        },
        "horizon": {"max_requests": 300, "drain": True},
        "policies": {"p": {"scheduler": "vllm", "lora": {"max_loras": MAX_LORAS, "max_cpu_loras": ADAPTERS}}},
        "cluster": {"router": router, "groups": [{"count": replicas}]},
    }


def _run(router: str | dict[str, Any]) -> Any:
    return run_policy(validate_scenario(_scenario(router), "t.toml"), "p", Path("."))


def test_each_replica_loads_adapters_into_its_own_cache() -> None:
    result = _run("round_robin")
    requests = result.requests.lazy().collect()
    steps = result.steps.lazy().collect()
    assert result.summary["requests"]["finished"] == 300 == requests.height
    per = result.summary["replicas"]
    # the host cache holds all 8 adapters: each replica reads each adapter it serves from disk once
    served = requests.group_by("replica").agg(pl.col("adapter").n_unique()).rows()
    assert {name: per[name]["lora"]["disk_loads"] for name, _ in served} == dict(served)
    assert sum(n for _, n in served) == result.summary["lora"]["disk_loads"] > ADAPTERS
    # the fleet's loads are its replicas' loads, each replica's the steps it ran
    assert result.summary["lora"]["loads"] == sum(p["lora"]["loads"] for p in per.values())
    by_replica = dict(steps.group_by("replica").agg(pl.col("lora_loads").sum()).rows())
    assert by_replica == {name: p["lora"]["loads"] for name, p in per.items()}
    assert int(steps["lora_adapters"].max()) <= MAX_LORAS
    # the LoRA slots come out of every replica's KV cache, as on one replica
    assert result.summary["replica"]["kv_blocks"] == result.summary["lora"]["kv_blocks_with_slots"]
    specs, _ = build_specs(
        validate_scenario(_scenario(), "t.toml"), validate_scenario(_scenario(), "t.toml").cluster, "p", "t"
    )
    caches = [spec.lora.step_time.cache for spec in specs if spec.lora is not None]
    assert len({id(c) for c in caches}) == len(specs) == 4


def test_adapter_affinity_loads_fewer_adapters_than_load_balancing() -> None:
    """Round robin sends every adapter to every replica, so two slots per replica churn among eight
    adapters; affinity keeps each adapter on the replicas that have it."""
    loads = {}
    for name, router in [
        ("round_robin", "round_robin"),
        ("least_outstanding", "least_outstanding"),
        ("adapter_affinity", {"kind": "adapter_affinity"}),
    ]:
        result = _run(router)
        assert result.summary["requests"]["finished"] == 300
        loads[name] = result.summary["lora"]["loads"]
        spread = result.requests.lazy().group_by("adapter").agg(pl.col("replica").n_unique()).collect()
        if name == "round_robin":
            assert spread["replica"].min() == 4  # every adapter on every replica
    assert loads["adapter_affinity"] < 0.6 * loads["round_robin"]
    assert loads["adapter_affinity"] < 0.6 * loads["least_outstanding"]
    again = _run({"kind": "adapter_affinity"})
    assert again.summary["lora"]["loads"] == loads["adapter_affinity"]  # deterministic


def _router(n: int, **knobs: object) -> Any:
    kind = load_all()["adapter_affinity"]
    return kind.build(kind.config.model_validate(knobs), n, np.random.default_rng(0))


def _req(i: int, adapter: int) -> Request:
    return Request(i, 0.0, 10, 5, 5, adapter=adapter)


def test_adapter_affinity_on_hand_made_reports() -> None:
    r = _router(3, fallback="round_robin")
    reports = [Snapshot(2, 0, 0.0, frozenset({1})), Snapshot(1, 0, 0.0, frozenset({1, 2})), Snapshot(0)]
    # total 3: bound ceil(1.25 x 4 / 3) = 2; replicas 0 and 1 hold adapter 1, only replica 1 is below it
    assert r.route(_req(0, 1), reports) == 1
    assert r.route(_req(1, 2), reports) == 1
    # nobody has adapter 5, and the base model names none: round robin from replica 0
    assert [r.route(_req(2, 5), reports), r.route(_req(3, -1), reports)] == [0, 1]
    # at the bound: replica 1 has 2 of total 4, bound ceil(1.25 x 5 / 3) = 3; at 3 of 5, ceil(7.5 / 3) = 3
    assert r.route(_req(4, 2), [Snapshot(2), Snapshot(2, adapters=frozenset({2})), Snapshot(0)]) == 1
    assert r.route(_req(5, 2), [Snapshot(2), Snapshot(3, adapters=frozenset({2})), Snapshot(0)]) == 2
    # among holders below the bound, the fewest outstanding, ties to the lowest index
    both = frozenset({7})
    assert r.route(_req(6, 7), [Snapshot(1, adapters=both), Snapshot(1, adapters=both), Snapshot(0)]) == 0
    assert r.route(_req(7, 7), [Snapshot(1, adapters=both), Snapshot(0, adapters=both), Snapshot(1)]) == 1
    # the default fallback is least_outstanding
    assert _router(3).route(_req(8, 9), [Snapshot(3), Snapshot(1), Snapshot(2)]) == 1


def test_a_routing_sequence_worked_by_hand() -> None:
    """Eleven requests arrive at t = 0 on two replicas, before either runs a step: no adapter is in a
    slot yet, so the router follows the adapters of the requests each replica holds. With fallback
    round robin and load_factor 1.25 (bound ceil(1.25 (total + 1) / 2)):

    req adapter  holders (outstanding)  total bound  to
     0    0      none                     0    1     0 (round robin)
     1    1      none                     1    2     1 (round robin)
     2    0      0 (1)                    2    2     0
     3    1      1 (1)                    3    3     1
     4    2      none                     4    4     0 (round robin)
     5    0      0 (3)                    5    4     0
     6    1      1 (2)                    6    5     1
     7    0      0 (4)                    7    5     0
     8    0      0 (5)                    8    6     0
     9    0      0 (6)                    9    7     0
    10    0      0 (7): at the bound     10    7     1 (round robin)
    """
    sent, out = _hand_worked(report_delay_s=0.0, arrival=0.0)
    assert sent == HAND_WORKED
    assert out.routed == [7, 4]
    assert [m.outstanding for m in out.members] == [0, 0]
    assert [len(m.adapters) for m in out.members] == [MAX_LORAS, MAX_LORAS]  # held none; slots full
    # request 10's bound, from the router's own rule: 7 and 3 outstanding on the two replicas
    held = [SimpleNamespace(outstanding=7), SimpleNamespace(outstanding=3)]
    assert load_bound(held, 1.25) == 7  # replica 0 is at it, so request 10 goes by the fallback


def test_delayed_reports_count_the_adapters_sent_since() -> None:
    """With report_delay_s, a report is a snapshot (here the one at t = 0, with nothing held); the
    router's own sends since add their adapters to it, so the sequence worked by hand routes alike."""
    sent, out = _hand_worked(report_delay_s=10.0, arrival=1.0)
    assert sent == HAND_WORKED
    assert out.routed == [7, 4]


HAND_WORKED = [0, 1, 0, 1, 0, 0, 1, 0, 0, 0, 1]


def _hand_worked(report_delay_s: float, arrival: float) -> tuple[list[int], Any]:
    """Two replicas behind adapter_affinity with fallback round robin, eleven requests at one instant;
    the replica each was sent to, and the fleet's output."""
    data = _scenario({"kind": "adapter_affinity", "fallback": "round_robin"}, replicas=2)
    data["cluster"]["report_delay_s"] = report_delay_s
    scenario = validate_scenario(data, "t.toml")
    assert scenario.cluster is not None
    specs, _ = build_specs(scenario, scenario.cluster, "p", "t")
    kind, config = load_all()["adapter_affinity"], scenario._router_config
    fleet = Fleet(
        specs,
        lambda n: kind.build(config, n, np.random.default_rng(0)),
        Horizon(drain=True),
        None,
        report_delay_s,
    )
    sent: list[int] = []
    route = fleet.entry_router.route

    def recording(req: Request, reports: Any) -> int:
        sent.append(route(req, reports))
        return sent[-1]

    fleet.entry_router.route = recording  # type: ignore[method-assign]
    requests = [_req(i, a) for i, a in enumerate([0, 1, 0, 1, 2, 0, 1, 0, 0, 0, 0])]
    for req in requests:
        req.arrival = arrival
    return sent, fleet.run(iter(requests))


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (
            lambda d: d["cluster"].update(
                link="nvlink-4", groups=[{"count": 1, "role": "prefill"}, {"count": 1, "role": "decode"}]
            ),
            "policies.p.lora: LoRA is modelled in colocated fleets",
        ),
        (
            lambda d: (
                d["workload"].pop("lora"),
                d["policies"].update(q={"scheduler": "vllm"}),
                d["cluster"]["groups"].append({"count": 1, "policy": "q"}),
            ),
            "cluster.groups[1].policy",
        ),
        (
            lambda d: d["cluster"].update(router={"kind": "adapter_affinity", "fallback": "x"}),
            "cluster.router.fallback",
        ),
        (
            lambda d: d["cluster"].update(router={"kind": "adapter_affinity", "load_factor": 0.5}),
            "cluster.router.load_factor",
        ),
    ],
)
def test_bad_fleet_lora_input_names_the_key(change, key) -> None:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(_scenario())
    change(data)
    with pytest.raises(SimError) as err:
        validate_scenario(data, "t.toml")
    assert f"t.toml: {key}" in str(err.value)
    assert "\n" not in str(err.value)
