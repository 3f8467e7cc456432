"""`sim plan --routers`: the router as an axis, among the routers that fit the workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.io.errors import SimError
from sim.studies import plan, plan_options, plan_space

runner = CliRunner()
SCENARIO = """
name = "plan-routers"
seed = 2
prices = { "A100-80GB" = 1.0 }
[model]
name = "llama-3.1-8b-instruct"
gpu = "A100-80GB"
[workload]
arrival = { kind = "poisson", rate = 4.0 }
prompt = { kind = "fixed", value = 500 }
output = { kind = "fixed", value = 100 }
max_tokens = 100
[horizon]
duration_s = 20
[slo]
ttft_s = 0.5
[policies.vllm]
scheduler = "vllm"
"""


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "routers.toml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def _grid(path: Path, sets: list[str]) -> tuple[list[plan_space.Candidate], dict[str, dict[str, int]], int]:
    sc = load_scenario(path, sets)
    _, tps, knobs, modes = plan_options.grid_options(None, "1", "", "", "colocated,pd", routers="all")
    removed: dict[str, dict[str, int]] = {}
    cands, total, _ = plan_space.candidates(
        sc, "vllm", 4.0, path.parent, ["A100-80GB"], tps, knobs, 2, modes, theory=False, removed=removed
    )
    return cands, removed, total


def test_routers_that_do_not_fit_or_route_alike_are_pruned(scenario: Path) -> None:
    """Up to 2 GPUs at TP 1: 1 replica, 2 replicas and 1P+1D, x the 7 routers = 21. No LoRA adapters and no
    shared prefixes: adapter_affinity and prefix_affinity do not fit (6). One replica per group routes
    alike under every router: of 1x and 1P+1D only least_outstanding (the plan's router without a
    [cluster]) is kept (8 removed). Left: 2 replicas under each of the 5 others, and the two stand-ins.
    With shared prefixes, prefix_affinity fits."""
    cands, removed, total = _grid(scenario, [])
    assert total == 21
    assert removed["router_unfit"] == {
        "configurations": 6, "gpu=A100-80GB": 6, "tp=1": 6, "router=adapter_affinity": 3,
        "router=prefix_affinity": 3,
    }  # fmt: skip
    assert removed["router_equivalent"]["configurations"] == 8
    assert "router=least_outstanding" not in removed["router_equivalent"]
    labels = sorted(c.label() for c in cands)
    assert labels == sorted(
        ["1x A100-80GB TP1 [router=least_outstanding]", "1P+1D x A100-80GB TP1 [router=least_outstanding]"]
        + [f"2x A100-80GB TP1 [router={r}]" for r in ("least_kv", "least_outstanding", "power_of_two",
                                                       "random", "round_robin")]
    )  # fmt: skip
    two = next(c for c in cands if c.label() == "2x A100-80GB TP1 [router=power_of_two]")
    assert two.overrides(load_scenario(scenario, []), "vllm")["cluster.router"] == "power_of_two"
    with_prefix, removed, _ = _grid(scenario, ["workload.prefix={groups=4, prefix_len=100}"])
    assert (
        removed["router_unfit"]["configurations"] == 3
        and "router=prefix_affinity" not in removed["router_unfit"]
    )
    assert "2x A100-80GB TP1 [router=prefix_affinity]" in {c.label() for c in with_prefix}
    with pytest.raises(SimError, match="--routers: unknown router 'nearest'"):
        plan_options.grid_options(None, "1", "", "", "colocated", routers="least_kv,nearest")


def test_the_router_chosen_is_part_of_the_answer(
    scenario: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stubbed runs: only 2 replicas under round_robin meet the SLO. The search runs the 2-replica fleet
    under each router (a failure under one prunes nothing under another) and answers round_robin, whose
    --set carries it; plan.json's pruned_by_rule names the router rules."""

    def fake(task: plan.PlanTask) -> dict[str, Any]:
        ok = (
            task.overrides["cluster.router"] == "round_robin"
            and task.overrides["cluster.groups"][0]["count"] == 2
        )
        return {
            **{k: 0.0 for k in plan.FIGURES}, "overloaded": not ok, "finished": 100, "judged": 100,
            "judged_good": 99, "judged_in_flight_counted": 0, "judged_in_flight_left_out": 0,
            "judged_attainment": 0.99, "judged_ttft_p99": 0.1, "judged_tpot_p99": 0.01, "judged_e2e_p99": 2.0,
        }  # fmt: skip

    monkeypatch.setattr(plan, "evaluate", fake)
    monkeypatch.setattr(plan, "single_capacity", lambda task: 1000.0)
    monkeypatch.setattr(plan_space, "work_bounds", lambda *a: (1, 1, 1))
    out = tmp_path / "plan"
    res = runner.invoke(
        app, ["plan", str(scenario), "--rate", "4", "--max-gpus", "2", "--tp", "1", "--routers", "all",
              "--jobs", "1", "--settle-seeds", "0", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads((out / "plan.json").read_text())
    assert info["best"]["config"] == "2x A100-80GB TP1 [router=round_robin]"
    assert 'cluster.router="round_robin"' in info["best"]["set"]
    assert {"router_unfit", "router_equivalent"} <= set(info["pruned_by_rule"])
    tried = [c["config"] for c in info["candidates"] if c["config"].startswith("2x")]
    assert len(tried) == 5
    assert "Removed by router_unfit: 6" in res.output
