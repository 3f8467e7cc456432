"""Large fleets: a replica that is never sent a request costs nothing (no KV block, no record file, no
summary of its own, no event after its start), and the run-size estimate covers the fleet's replicas."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from test_manifest import TINY

from sim.cli import main
from sim.config.scenario import load_scenario
from sim.cost.replica import build_cost_and_memory
from sim.fleet import run as fleet_run
from sim.fleet.engine import Fleet
from sim.io.limits import RUN_MAX_KV_BLOCKS
from sim.records.summary import Slo, summarize
from sim.studies.run import run_policy
from sim.studies.run_size import estimate

# Five requests, round robin over REPLICAS replicas: replicas 0-4 serve one each, the rest are idle.
REPLICAS = 24
VLLM = """
[policies.vllm]
scheduler = "vllm"
max_num_seqs = 8

[policies.vllm-cache]
scheduler = "vllm"
max_num_seqs = 8
enable_prefix_caching = true
"""
FLEET = (
    TINY.replace("duration_s = 10", "duration_s = 60\nmax_requests = 5")
    + VLLM
    + f"\n[cluster]\nrouter = 'round_robin'\n\n[[cluster.groups]]\ncount = {REPLICAS}\n"
)


@pytest.fixture
def fleet_toml(tmp_path: Path) -> Path:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET)
    return path


def pool_made(spec: Any) -> bool:
    """Whether a replica's KV block pool has made its blocks (`Block`s, or the bare ids' stack)."""
    return bool({"blocks", "_stack"} & vars(spec.scheduler.kv.pool).keys())


@pytest.mark.parametrize("policy", ["vllm", "vllm-cache"])  # blocks on a stack; in an LRU queue
def test_an_idle_replica_holds_no_kv_block_and_writes_no_record_file(
    fleet_toml: Path, tmp_path: Path, policy: str
) -> None:
    sc = load_scenario(fleet_toml)
    records = tmp_path / "records"
    records.mkdir()
    out, specs, _ = fleet_run.simulate_fleet(sc, policy, tmp_path, None, "fleet.toml", records)
    assert out.routed == [1] * 5 + [0] * (REPLICAS - 5)
    assert [pool_made(s) for s in specs] == [True] * 5 + [False] * (REPLICAS - 5)
    fleet_run.write_fleet_records(out, False, records)
    folders = sorted(p.name for p in (records / fleet_run.REPLICA_RECORDS).iterdir())
    assert folders == [f"g0-{i}" for i in range(5)]
    assert pl.read_parquet(records / "requests.parquet")["replica"].to_list() == [f"g0-{i}" for i in range(5)]


def test_idle_replicas_are_summarised_once_and_as_each_would_be(
    fleet_toml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def counted(requests: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return summarize(requests, *args, **kwargs)

    monkeypatch.setattr(fleet_run, "summarize", counted)
    result = run_policy(load_scenario(fleet_toml), "continuous", tmp_path)
    assert len(calls) == 1 + 5 + 1  # the fleet, each busy replica, and one for all the idle ones
    monkeypatch.undo()
    requests, steps = result.requests.lazy().collect(), result.steps.lazy().collect()
    for name in ("g0-0", "g0-23"):  # a busy and an idle replica, as the summary of its own records
        own = summarize(
            requests.filter(pl.col("replica") == name),
            steps.filter(pl.col("replica") == name),
            60.0,
            Slo(0.5, 0.05, None),
            False,
            (),
        )
        got = {
            k: v for k, v in result.summary["replicas"][name].items() if k not in ("group", "role", "routed")
        }
        assert json.dumps(got, sort_keys=True) == json.dumps(own, sort_keys=True)


def test_an_idle_replica_has_no_event_after_its_start(fleet_toml: Path, tmp_path: Path) -> None:
    """The events of a run grow by one per idle replica (its process's start), however long the run."""

    def events(replicas: int, duration: float) -> int:
        toml = FLEET.replace(f"count = {REPLICAS}", f"count = {replicas}")
        toml = toml.replace("duration_s = 60", f"duration_s = {duration}")
        path = tmp_path / f"f{replicas}-{duration}.toml"
        path.write_text(toml)
        counted = [0]
        real_step = Fleet.__init__

        def init(self: Fleet, *args: Any, **kwargs: Any) -> None:
            real_step(self, *args, **kwargs)
            step = self.env.step

            def step_counted() -> None:
                counted[0] += 1
                step()

            self.env.step = step_counted  # type: ignore[method-assign]

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Fleet, "__init__", init)
            run_policy(load_scenario(path), "continuous", tmp_path)
        return counted[0]

    assert events(25, 60) - events(5, 60) == 20
    assert events(25, 600) - events(5, 600) == 20


def test_the_run_size_of_a_fleet_counts_the_replicas_its_requests_reach(tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    groups = "[[cluster.groups]]\ncount = 3\n\n[[cluster.groups]]\ncount = 100\ngpu = 'H100-SXM'\ntp = 2\n"
    path.write_text(FLEET.split("[[cluster.groups]]")[0] + groups)
    sc = load_scenario(path)
    a100 = build_cost_and_memory(sc, "x")[2]["kv_blocks"]
    h100 = build_cost_and_memory(fleet_run.group_scenario(sc, "H100-SXM", 2), "x")[2]["kv_blocks"]
    size = estimate(sc, tmp_path)
    assert size.requests == 5 and size.replicas == 103
    assert size.kv_blocks == max(a100, h100)  # the largest replica's
    assert size.fleet_kv_blocks == 3 * a100 + 5 * h100  # five requests reach at most five of the 100
    assert size.excess() == []


def test_a_fleet_too_large_for_memory_is_refused_unless_forced(
    fleet_toml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = ["--set", "cluster.groups=[{count=4096}]", "--set", "workload.arrival.rate=200"]
    big += ["--set", "horizon.max_requests=100000"]  # 12,000 requests: every replica reached
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(fleet_toml), *big, "--out", str(fleet_toml.parent / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {fleet_toml}: the run would hold ")
    assert "KV blocks in the replicas its requests reach, of 4,096" in err
    assert f"(limit {RUN_MAX_KV_BLOCKS:,})" in err and "--force" in err
    assert not (fleet_toml.parent / "out").exists()
