"""Fleet sections of the report: per-replica load, prefix-hit rate per replica and router, P/D timeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sim.config.scenario import load_scenario
from sim.report.build import build_report, frames
from sim.report.fleet import fleet_sections, hit_rates, load_balance, pd_timeline
from sim.report.inputs import PolicyRun, load_inputs
from sim.studies.run import run_policy, write_result

ROOT = Path(__file__).resolve().parents[1]
RAG = ROOT / "scenarios" / "rag-chatbot.toml"
PD = ["horizon.duration_s=20", "cluster.link='ethernet-100g'",
      "cluster.groups=[{count=2, role='prefill'}, {count=2, role='decode'}]"]  # fmt: skip


@pytest.fixture(scope="module")
def pd_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pd")
    sc = load_scenario(RAG, PD)
    for policy in sc.policies:
        write_result(run_policy(sc, policy, RAG.parent), out)
    return out


def _steps(replica: str, starts: list[float], durations: list[float], waiting: list[int]) -> pl.DataFrame:
    n = len(starts)
    return pl.DataFrame({
        "start": starts, "duration": durations, "batch_size": [1] * n, "waiting": waiting,
        "kv_used": [0] * n, "kv_allocated": [50] * n, "kv_capacity": [100] * n, "replica": [replica] * n,
    })  # fmt: skip


def test_per_replica_averages_and_fleet_totals_by_hand() -> None:
    """Bins [0, 1) and [1, 2). Replica a: one step [0, 2) with 4 waiting -> 4 in each bin. Replica b: a step
    [0.5, 1) with 2 waiting -> 1 in the first bin, 0 in the second. Steps of different replicas overlap in
    time, so the fleet's waiting is the sum per bin (5, 4) and its KV share the mean of the replicas'
    (a holds half its KV all along; b half of it for half of the first bin: 0.25, then 0)."""
    steps = pl.concat([_steps("a", [0.0], [2.0], [4]), _steps("b", [0.5], [0.5], [2])])
    edges = np.array([0.0, 1.0, 2.0])
    per = frames.replica_averages(steps, edges)
    assert per["a"]["waiting requests"].tolist() == [4.0, 4.0]
    assert per["b"]["waiting requests"].tolist() == [1.0, 0.0]
    fleet = frames._fleet_averages(steps, edges)
    assert fleet["waiting requests"].tolist() == [5.0, 4.0]
    assert fleet["KV allocated (share)"].tolist() == [(0.5 + 0.25) / 2, 0.25]


def test_pd_report_has_fleet_sections_with_valid_specs(pd_report: Path) -> None:
    inputs = load_inputs(pd_report)
    sections = fleet_sections(inputs.runs)
    assert [s.key for s in sections] == ["fleet_balance", "fleet_prefix_hits", "pd_timeline"]
    for s in sections:
        assert s.chart is not None
        s.chart.to_dict(validate=True)
    written = build_report(pd_report, png=False)
    html = written[0].read_text()
    assert 'id="chart-pd_timeline"' in html and 'id="chart-fleet_balance"' in html


def test_pd_timeline_phases_cover_each_request_end_to_end(pd_report: Path) -> None:
    runs = load_inputs(pd_report).runs
    tl = pd_timeline(runs)
    assert set(tl["phase"].unique()) >= {"prefill", "transfer", "decode"}
    run = runs[0]
    for rid, part in tl.filter(pl.col("policy") == run.policy).group_by("id"):
        rec = run.requests.filter(pl.col("id") == rid[0]).row(0, named=True)
        assert part["start"].min() == pytest.approx(rec["arrival"])
        assert part["end"].max() == pytest.approx(rec["finished_at"])
        assert float((part["end"] - part["start"]).sum()) == pytest.approx(rec["e2e"], rel=1e-9)


def test_hit_rates_per_replica_come_from_the_summaries() -> None:
    summary = {
        "prefix_cache_hit_rate": 0.5,
        "cluster": {"router": "prefix_affinity"},
        "replicas": {"r0": {"prefix_cache_hit_rate": 0.8, "requests": {"arrived": 3}},
                     "r1": {"prefix_cache_hit_rate": 0.0, "requests": {"arrived": 0}}},
    }  # fmt: skip
    run = PolicyRun("p", pl.DataFrame({"replica": ["r0"]}), pl.DataFrame(), summary)
    frame = hit_rates([run])
    assert frame.rows() == [("p (prefix_affinity)", "fleet", 0.5), ("p (prefix_affinity)", "r0", 0.8)]


def test_single_replica_report_has_no_fleet_sections(tmp_path: Path) -> None:
    sc = load_scenario(RAG, ["horizon.duration_s=10"])
    write_result(run_policy(sc, "vllm", RAG.parent), tmp_path)
    assert fleet_sections(load_inputs(tmp_path).runs) == []
    assert load_balance([]).is_empty()
