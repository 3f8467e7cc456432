"""Paged decode replicas under prefill/decode disaggregation: the group's vLLM policy on decode-only work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from sim.catalog.links import get_link
from sim.config.policies import ContinuousConfig, VllmConfig
from sim.config.scenario import load_scenario
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.fleet.decode import DecodeScheduler, PagedDecode
from sim.fleet.engine import Fleet, FleetOutput, ReplicaSpec
from sim.fleet.routers import load_all
from sim.studies.run import run_policy

ROOT = Path(__file__).resolve().parents[1]
PREFILL_S, DECODE_S = 0.2, 0.01


def _fixed(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return (PREFILL_S if int(new_tokens.max()) > 1 else DECODE_S), True


def _run(decode: object, requests: list[Request]) -> FleetOutput:
    big = KvBudget(10_000, 16, 100_000)
    prefill = ReplicaSpec("p0", "p", "prefill", ContinuousScheduler(ContinuousConfig(), big), _fixed, 131072)
    kind = load_all()["round_robin"]
    rng = np.random.default_rng(0)
    fleet = Fleet(
        [prefill, ReplicaSpec("d0", "d", "decode", decode, _fixed)],  # type: ignore[arg-type]
        lambda n: kind.build(kind.config(), n, rng), Horizon(max_requests=len(requests), drain=True),
        get_link("infiniband-ndr"),
    )  # fmt: skip
    return fleet.run(iter(requests))


def _paged(blocks: int) -> PagedDecode:
    config = VllmConfig(async_scheduling=False)
    return PagedDecode(VllmScheduler(config, KvBudget(blocks, 16, 100_000), fast=True))


def _requests() -> list[Request]:
    # 1,000-token prompts, 5 output tokens of a max_tokens of 500
    return [Request(0, 0.0, 1000, 500, 5), Request(1, 0.0, 1000, 500, 5)]


def test_paged_decode_holds_what_it_uses_where_the_reservation_holds_max_tokens() -> None:
    """150 blocks of 16 tokens. The reservation queue holds ceil((1000 + 500) / 16) = 94 blocks per request
    for its whole life, so the second waits for the first; the paged replica holds the blocks the tokens
    fill (ceil(1001 / 16) = 63, 63 at the end too), so both decode together, and every block it holds but
    the last of each sequence is full."""
    reserved = _run(DecodeScheduler(KvBudget(150, 16, 100_000), 256), _requests())
    paged = _run(_paged(150), _requests())
    r_rows = {r["id"]: r for r in reserved.members[1].recorder.requests_frame().iter_rows(named=True)}
    p_rows = {r["id"]: r for r in paged.members[1].recorder.requests_frame().iter_rows(named=True)}
    assert reserved.admitted_at[1] == pytest.approx(r_rows[0]["finished_at"])
    assert paged.admitted_at[1] == pytest.approx(paged.admitted_at[0])
    assert p_rows[1]["finished_at"] < r_rows[1]["finished_at"]
    assert all(r["generated_tokens"] == 5 for r in p_rows.values())
    # TTFT is the prefill and the transfer: the first decode step needs no prefill on the decode replica
    steps = paged.members[1].recorder.steps_frame()
    assert steps["prefill_tokens"].sum() == 0 and steps["decode_tokens"].sum() == 2 * 4
    used, held = steps["kv_used"].to_numpy(), steps["kv_allocated"].to_numpy()
    assert (held - used).max() < 2 * 16  # at most one partly filled block per sequence
    r_steps = reserved.members[1].recorder.steps_frame()
    assert (r_steps["kv_used"] / r_steps["kv_allocated"]).max() < 0.7  # 1001-1005 of 1504 slots


def test_paged_decode_preempts_and_recomputes_when_blocks_run_out() -> None:
    """130 blocks: both 1,000-token prompts are admitted (63 blocks each), and growing to 1,200 tokens
    (75 blocks each) runs out: the later one is preempted, recomputes its prompt and tokens on the decode
    replica (a prefill step there), and both still finish with all their tokens."""
    reqs = [Request(0, 0.0, 1000, 200, 200), Request(1, 0.0, 1000, 200, 200)]
    out = _run(_paged(130), reqs)
    steps = out.members[1].recorder.steps_frame()
    assert steps["preempted"].sum() >= 1 and steps["prefill_tokens"].sum() > 1000
    rows = out.members[1].recorder.requests_frame()
    assert rows["state"].to_list() == ["finished"] * 2 and rows["generated_tokens"].to_list() == [200, 200]
    assert rows["preemptions"].sum() >= 1


def test_pd_scenario_decode_replicas_allocate_what_they_use() -> None:
    """Llama-3.1-70B chat lengths, 1 prefill + 1 decode H100 TP4, 30 s at 8 req/s: the decode replica runs
    the group's vllm policy, and its KV allocated is within a block per sequence of its KV used."""
    path = ROOT / "scenarios" / "plan-llama70b-chat.toml"
    sc = load_scenario(path, [
        "horizon.duration_s=30", "workload.arrival.rate=8.0", "cluster.link='infiniband-ndr'",
        "cluster.groups=[{name='prefill',count=1,role='prefill'},{name='decode',count=1,role='decode'}]",
    ])  # fmt: skip
    res = run_policy(sc, "vllm", path.parent)
    assert res.summary["cluster"]["groups"]["decode"]["scheduler"] == "vllm (decode)"
    steps = res.steps.lazy().collect()
    decode = steps.filter(pl.col("replica").cast(pl.String) == "decode-0")
    assert decode.height > 100
    used = float((decode["kv_used"] * decode["duration"]).sum())
    held = float((decode["kv_allocated"] * decode["duration"]).sum())
    assert used / held > 0.97  # time-weighted; the reservation queue held 0.52 used on this run
