"""Fleets from a scenario's [cluster] table: validation, equivalence with one replica, records, P/D."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from sim.catalog.links import get_link
from sim.cli import app
from sim.config.policies import ContinuousConfig
from sim.config.scenario import load_scenario
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.fleet.decode import DecodeScheduler
from sim.fleet.engine import Fleet, ReplicaSpec
from sim.fleet.routers import load_all
from sim.io.errors import SimError
from sim.studies.run import run_policy, write_result

ROOT = Path(__file__).resolve().parents[1]
RAG = ROOT / "scenarios" / "rag-chatbot.toml"
SHORT = ["horizon.duration_s=30"]
runner = CliRunner()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.router='nope'", "cluster.router"),
        ("cluster.router={kind='power_of_two', choices=0}", "cluster.router.choices"),
        ("cluster.router={kind='round_robin', extra=1}", "cluster.router.extra"),
        ("cluster.groups=[{count=0}]", "cluster.groups[0].count"),
        ("cluster.groups=[{count=100000}]", "cluster.groups[0].count"),
        ("cluster.groups=[{role='prefill'}]", "cluster.groups"),
        ("cluster.groups=[{role='middle'}]", "cluster.groups[0].role"),
        ("cluster.groups=[{gpu='H1000'}]", "cluster.groups[0].gpu"),
        ("cluster.groups=[{policy='nope'}]", "cluster.groups[0].policy"),
        ("cluster.groups=[{tp=0}]", "cluster.groups[0].tp"),
        ("cluster.report_delay_s=-1", "cluster.report_delay_s"),
        ("cluster.link='pigeon'", "cluster.link"),
        ("cluster.bogus=1", "cluster.bogus"),
        ("prices={'A100-80GB'=-2.0}", "prices.A100-80GB"),
    ],
)
def test_bad_cluster_names_file_and_key(override: str, key: str) -> None:
    with pytest.raises(SimError) as err:
        load_scenario(RAG, [override])
    assert f"rag-chatbot.toml: {key}:" in str(err.value)


def test_no_cluster_keeps_single_replica_records(tmp_path: Path) -> None:
    """Without [cluster] the summary and manifest carry no fleet keys (the single-replica path runs as
    before); a one-replica cluster reproduces the single-replica engine's records exactly (a different
    loop: the fleet's arrival process and `Replica.run`, against `Replica.run_open`)."""
    sc = load_scenario(RAG, SHORT)
    single = run_policy(sc, "vllm-prefix-cache", RAG.parent)
    assert "cluster" not in single.summary and "replicas" not in single.summary
    assert "cluster" not in single.manifest["compared"] and "prices" not in single.manifest["compared"]
    one = run_policy(
        load_scenario(RAG, [*SHORT, "cluster.groups=[{count=1}]"]), "vllm-prefix-cache", RAG.parent
    )
    assert one.requests.drop("replica").equals(single.requests)
    assert one.steps.drop("replica").equals(single.steps)
    assert one.summary["goodput_per_s"] == single.summary["goodput_per_s"]
    assert one.summary["cluster"]["replicas"] == 1


def test_fleet_records_and_summary(tmp_path: Path) -> None:
    sc = load_scenario(RAG, [*SHORT, "cluster.groups=[{count=3}]", "cluster.router='round_robin'"])
    res = run_policy(sc, "vllm", RAG.parent)
    req = res.requests
    assert set(req["replica"].unique()) == {"g0-0", "g0-1", "g0-2"}
    # round robin: request k (in arrival order) went to replica k mod 3
    expect = [f"g0-{k % 3}" for k in range(req.height)]
    assert req.sort("arrival")["replica"].to_list() == expect
    per = res.summary["replicas"]
    assert sum(p["requests"]["arrived"] for p in per.values()) == res.summary["requests"]["arrived"]
    assert res.summary["cluster"]["gpus"] == 3
    out = write_result(res, tmp_path)
    assert json.loads((out / "summary.json").read_text())["cluster"]["router"] == "round_robin"
    assert pl.read_parquet(out / "steps.parquet")["replica"].n_unique() == 3


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    args = ["run", str(RAG), "--set", "horizon.duration_s=20", "--set", "cluster.router='random'",
            "--set", "cluster.groups=[{count=3}]", "--policy", "vllm"]  # fmt: skip
    for sub in ("a", "b"):
        result = runner.invoke(app, [*args, "--out", str(tmp_path / sub)])
        assert result.exit_code == 0, result.output
    for name in ("requests.parquet", "steps.parquet", "summary.json", "manifest.json"):
        assert (tmp_path / "a" / "vllm" / name).read_bytes() == (tmp_path / "b" / "vllm" / name).read_bytes()


# --- disaggregated prefill/decode ---------------------------------------------------------------------

PREFILL_S, DECODE_S = 0.2, 0.01  # a prefill step, a decode step (fixed, to compute by hand)


def _fixed(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return (PREFILL_S if int(new_tokens.max()) > 1 else DECODE_S), True


def _pd_fleet(decode_blocks: int, kv_bytes: int) -> Fleet:
    big = KvBudget(10_000, 16, 100_000)
    prefill = ReplicaSpec(
        "p0", "p", "prefill", ContinuousScheduler(ContinuousConfig(), big), _fixed, kv_bytes
    )
    decode = ReplicaSpec(
        "d0", "d", "decode", DecodeScheduler(KvBudget(decode_blocks, 16, 100_000), 256), _fixed
    )
    kind = load_all()["round_robin"]
    rng = np.random.default_rng(0)
    return Fleet(
        [prefill, decode], lambda n: kind.build(kind.config(), n, rng), Horizon(max_requests=2, drain=True),
        get_link("infiniband-ndr"),
    )  # fmt: skip


def test_pd_transfer_time_and_ttft_by_hand() -> None:
    """A 1,000-token prompt at 131,072 KV bytes per token per GPU over NDR InfiniBand (50 GB/s, 20 us):
    transfer = 20e-6 + 1000 * 131072 / 50e9 = 2.64144 ms. TTFT = prefill step + transfer; the decode
    replica then runs one decode step per further token."""
    fleet = _pd_fleet(1000, 131072)
    out = fleet.run(iter([Request(0, 0.0, 1000, 5, 5)]))
    transfer = 20e-6 + 1000 * 131072 / 50e9
    assert out.handoffs[0].transfer_s == pytest.approx(transfer, rel=1e-12)
    rec = out.members[1].recorder.requests_frame().row(0, named=True)
    assert rec["ttft"] == pytest.approx(PREFILL_S + transfer)
    assert rec["e2e"] == pytest.approx(PREFILL_S + transfer + 4 * DECODE_S)
    assert rec["generated_tokens"] == 5
    assert out.members[0].recorder.requests_frame().height == 0  # recorded once, by its decode replica


def test_pd_decode_admits_only_when_blocks_are_free() -> None:
    """The decode replica holds 80 blocks of 16 tokens; each request needs ceil((1000 + 5) / 16) = 63, so the
    second waits for the first to finish all 4 decode steps before it starts decoding."""
    fleet = _pd_fleet(80, 131072)
    out = fleet.run(iter([Request(0, 0.0, 1000, 5, 5), Request(1, 0.0, 1000, 5, 5)]))
    rows = {r["id"]: r for r in out.members[1].recorder.requests_frame().iter_rows(named=True)}
    first_done = rows[0]["finished_at"]
    assert out.admitted_at[1] == pytest.approx(first_done)
    assert rows[1]["finished_at"] == pytest.approx(first_done + 4 * DECODE_S)
    # both prefills share one step on the prefill replica (continuous batching), so both arrive together
    assert rows[1]["first_token_at"] == pytest.approx(rows[0]["first_token_at"])


def test_pd_scenario_records_show_where_time_went() -> None:
    sc = load_scenario(
        RAG,
        [*SHORT, "cluster.link='ethernet-100g'",
         "cluster.groups=[{count=1, role='prefill'}, {count=1, role='decode'}]"],
    )  # fmt: skip
    res = run_policy(sc, "vllm", RAG.parent)
    fin = res.requests.filter(pl.col("state") == "finished", pl.col("generated_tokens") > 1)
    assert fin.height > 20
    kv = res.summary["cluster"]["groups"]["g0"]["kv_bytes_per_token"]
    link = get_link("ethernet-100g")
    expect = (link.latency_s + fin["prompt_len"].cast(pl.Float64) * kv / link.bandwidth).to_numpy()
    assert np.allclose(fin["transfer_s"].to_numpy(), expect, rtol=1e-12)
    total = fin["queue_wait"] + fin["prefill_s"] + fin["transfer_s"] + fin["decode_wait_s"] + fin["decode_s"]
    assert np.allclose(total.to_numpy(), fin["e2e"].to_numpy(), rtol=1e-9)
    ttft = fin["queue_wait"] + fin["prefill_s"] + fin["transfer_s"]
    assert np.allclose(ttft.to_numpy(), fin["ttft"].to_numpy(), rtol=1e-9)
    assert all(math.isfinite(x) for x in fin["decode_s"].to_list())


def test_stale_reports_leave_the_router_only_its_own_sends() -> None:
    """With reports older than the whole run, least-outstanding sees every replica at zero plus what it sent
    itself since: it deals requests out in turn, exactly as round-robin does."""
    base = [*SHORT, "cluster.groups=[{count=3}]"]
    stale = run_policy(
        load_scenario(RAG, [*base, "cluster.router='least_outstanding'", "cluster.report_delay_s=3600"]),
        "vllm",
        RAG.parent,
    )
    rr = run_policy(load_scenario(RAG, [*base, "cluster.router='round_robin'"]), "vllm", RAG.parent)
    assert stale.requests["replica"].to_list() == rr.requests["replica"].to_list()
    live = run_policy(load_scenario(RAG, [*base, "cluster.router='least_outstanding'"]), "vllm", RAG.parent)
    assert live.requests["replica"].to_list() != rr.requests["replica"].to_list()


def test_shipped_fleet_scenarios_validate() -> None:
    rag = load_scenario(ROOT / "scenarios" / "fleet-rag-chatbot.toml")
    assert rag.cluster is not None and rag.cluster.replicas == 8
    pd = load_scenario(ROOT / "scenarios" / "fleet-disaggregated.toml")
    assert pd.cluster is not None and pd.cluster.disaggregated


def test_prefix_affinity_beats_least_load_on_many_system_prompts() -> None:
    """256 system prompts of 1,500 tokens over 8 replicas: the prompts do not all fit one replica's cache
    beside its running requests. Keeping each prompt on a home replica finds it cached far more often than
    spreading by load, and the saved prefills lower p99 TTFT."""
    path = ROOT / "scenarios" / "fleet-rag-chatbot.toml"
    out = {}
    for router in ("least_outstanding", "prefix_affinity"):
        sc = load_scenario(
            path, ["horizon.duration_s=40", "workload.arrival.rate=56", f"cluster.router='{router}'"]
        )
        s = run_policy(sc, "vllm-prefix-cache", path.parent).summary
        out[router] = (s["prefix_cache_hit_rate"], s["latency"]["ttft"]["p99"])
    (hit_ll, p99_ll), (hit_pa, p99_pa) = out["least_outstanding"], out["prefix_affinity"]
    assert hit_pa > hit_ll + 0.15, out
    assert p99_pa < p99_ll, out


def test_cluster_benchmark_scenario_is_valid() -> None:
    import importlib.util
    import tomllib

    from sim.config.scenario import validate_scenario

    spec = importlib.util.spec_from_file_location("bench_cluster", ROOT / "benchmarks" / "bench_cluster.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text = bench.scenario_toml(32, 1000, 5.0, "vllm", "least_outstanding", 1)
    sc = validate_scenario(tomllib.loads(text), "bench")
    assert sc.cluster is not None and sc.cluster.replicas == 32
    assert sc.workload.arrival.rate == 160.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("equal-lengths", ["horizon.max_requests=300"]),
        ("coding-agent-long-context", ["horizon.duration_s=60"]),
    ],
)
def test_closed_loop_one_replica_cluster_matches_the_single_replica(name: str, overrides: list[str]) -> None:
    """Closed-loop users behind a one-replica fleet: the same records as the single-replica engine's users
    (to the horizon, and to max_requests)."""
    path = ROOT / "scenarios" / f"{name}.toml"
    for policy in load_scenario(path).policies:
        single = run_policy(load_scenario(path, overrides), policy, path.parent)
        one = run_policy(load_scenario(path, [*overrides, "cluster.groups=[{count=1}]"]), policy, path.parent)
        assert one.requests.drop("replica").equals(single.requests)
        assert one.steps.drop("replica").equals(single.steps)
        assert one.summary["horizon_s"] == single.summary["horizon_s"]


def test_pd_output_stops_at_max_model_len_as_vllm_does() -> None:
    """Prompt 1,000 with 50 output tokens wanted, max_model_len 1,010: the decode replica keeps the request
    and stops it at 1,010 - 1,000 = 10 tokens, reserving ceil(1,010 / 16) = 64 blocks."""
    big = KvBudget(10_000, 16, 1_010)
    prefill = ReplicaSpec("p0", "p", "prefill", ContinuousScheduler(ContinuousConfig(), big), _fixed, 1)
    decode_sched = DecodeScheduler(KvBudget(64, 16, 1_010), 256)
    decode = ReplicaSpec("d0", "d", "decode", decode_sched, _fixed)
    kind = load_all()["round_robin"]
    rng = np.random.default_rng(0)
    fleet = Fleet(
        [prefill, decode], lambda n: kind.build(kind.config(), n, rng), Horizon(max_requests=1, drain=True),
        get_link("nvlink-4"),
    )  # fmt: skip
    out = fleet.run(iter([Request(0, 0.0, 1000, 50, 50)]))
    rec = out.members[1].recorder.requests_frame().row(0, named=True)
    assert rec["state"] == "finished" and rec["generated_tokens"] == 10
    assert rec["max_tokens"] == 50
