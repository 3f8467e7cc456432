"""`--find-capacity` under a paper's own rule (`[sweep.capacity]`), each rule named and judged as stated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_manifest import TINY

from sim.config import sweep as sweep_config
from sim.config.capacity import AttainmentRule, CapacityConfig, LatencyRule, SchedulingDelayRule
from sim.io.errors import SimError
from sim.records.capacity_rules import meets_rules, rule_passes
from sim.studies import sweep


def row(**figures: Any) -> dict[str, Any]:
    return {"overloaded": False, "finished": 10, **figures}


def test_latency_rule_judges_the_mean_over_replications_of_one_statistic() -> None:
    rule = LatencyRule(rule="latency", metric="itl", stat="p99", bound_s=0.1)
    assert rule_passes(rule, [row(itl_p99=0.08), row(itl_p99=0.11)])  # mean 0.095
    assert not rule_passes(rule, [row(itl_p99=0.08), row(itl_p99=0.13)])  # mean 0.105
    assert not rule_passes(rule, [row(itl_p99=None)])
    tpot = LatencyRule(rule="latency", metric="tpot", bound_s=0.05)  # p99 by default
    assert rule_passes(tpot, [row(tpot_p99=None)])  # single-token outputs have no TPOT


def test_scheduling_delay_rule_is_the_median_queue_wait_by_default() -> None:
    rule = SchedulingDelayRule(rule="scheduling-delay", bound_s=2.0)
    assert rule_passes(rule, [row(queue_wait_p50=1.9, queue_wait_p99=30.0)])
    assert not rule_passes(rule, [row(queue_wait_p50=2.1, queue_wait_p99=2.1)])


def test_attainment_rule_is_the_share_within_the_slo() -> None:
    rule = AttainmentRule(rule="attainment")  # DistServe's 90%
    assert rule_passes(rule, [row(slo_attainment=0.9)])
    assert not rule_passes(rule, [row(slo_attainment=0.89)])
    assert not rule_passes(rule, [row(slo_attainment=None)])


def test_every_rule_must_pass_and_no_run_be_overloaded() -> None:
    config = CapacityConfig(
        rules=[
            LatencyRule(rule="latency", metric="itl", bound_s=0.1),
            SchedulingDelayRule(rule="scheduling-delay", bound_s=2.0),
        ]
    )
    good = row(itl_p99=0.05, queue_wait_p50=1.0)
    assert meets_rules([good], config)
    assert not meets_rules([{**good, "queue_wait_p50": 3.0}], config)
    assert not meets_rules([{**good, "overloaded": True}], config)


def write(tmp_path: Path, table: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.replace("seed = 5", "seed = 3") + table)
    return path


SARATHI = """
[sweep]
rates = [0.5, 2, 16, 64]
capacity_steps = 1
policies = ["continuous"]
[sweep.capacity]
rules = [{ rule = "latency", metric = "itl", bound_s = 0.1 }, { rule = "scheduling-delay", bound_s = 0.05 }]
per_gpu = true
"""


def test_find_capacity_under_sarathis_rule_and_per_gpu(tmp_path: Path) -> None:
    """The capacity under P99 ITL ≤ 100 ms and median scheduling delay ≤ 50 ms, on 2 GPUs (TP 2)."""
    res = sweep.run_sweep(
        write(tmp_path, SARATHI), ["horizon.duration_s=20", "model.tp=2"], jobs=1, find_capacity=True,
        out=tmp_path,
    )  # fmt: skip
    saved = json.loads((tmp_path / "sweep/capacity.json").read_text())
    assert saved == res.capacity
    assert saved["rules"][1] == {"rule": "scheduling-delay", "stat": "p50", "bound_s": 0.05}
    assert "p50 scheduling delay (queue_wait) ≤ 0.05 s" in saved["criterion"]
    (cap,) = saved["capacities"]
    assert cap["status"] == "found" and cap["gpus"] == 2
    assert cap["capacity_per_gpu"] == cap["capacity"] / 2
    points = {r: p for r, p in zip(res.points["rate"], res.points.iter_rows(named=True), strict=True)}
    for entry in cap["grid"] + cap["refined"]:  # each verdict is the rules' on that point
        p = points[entry["rate"]]
        ok = not p["overloaded"] and p["itl_p99"] <= 0.1 and p["queue_wait_p50"] <= 0.05
        below = cap["plateau_per_s"] is None or entry["rate"] <= cap["plateau_per_s"]
        assert entry["pass"] == (ok and below)


def test_default_capacity_output_has_no_rule_keys(tmp_path: Path) -> None:
    table = '[sweep]\nrates = [0.5, 64]\ncapacity_steps = 0\npolicies = ["continuous"]\n'
    res = sweep.run_sweep(write(tmp_path, table), ["horizon.duration_s=8"], find_capacity=True, out=tmp_path)
    assert res.capacity is not None and "rules" not in res.capacity and "per_gpu" not in res.capacity
    assert "gpus" not in res.capacity["capacities"][0]
    assert res.capacity["criterion"].startswith("mean over replications of p99 TTFT / TPOT / E2E")


def test_bad_capacity_rules_say_where(tmp_path: Path) -> None:
    with pytest.raises(SimError, match=r"f: sweep.capacity.rules"):
        sweep_config.parse_sweep({"capacity": {"rules": [{"rule": "p42"}]}}, "f")
    with pytest.raises(SimError, match=r"f: sweep.capacity.rules\[0\].latency.bound_s: Field required"):
        sweep_config.parse_sweep({"capacity": {"rules": [{"rule": "latency", "metric": "ttft"}]}}, "f")
    no_slo = TINY.replace("[slo]\nttft_s = 0.5\ntpot_s = 0.05\n", "")
    path = tmp_path / "t.toml"
    path.write_text(no_slo + '[sweep]\nrates = [1]\ncapacity = { rules = [{ rule = "attainment" }] }\n')
    with pytest.raises(SimError, match="the attainment rule needs an \\[slo\\]"):
        sweep.run_sweep(path, find_capacity=True, out=tmp_path)
