"""Inter-token latency as vLLM's benchmark measures it: each token's gap is the time since the same
request's previous token (`itls` in vLLM's benchmarks/benchmark_serving.py), pooled over requests. A
request that sat out steps (behind a prefill-only step, or preempted) has the whole wait as one gap."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.policies import VllmConfig, VllmV0Config
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon, RunOutput, simulate
from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.engine.schedulers.vllm_v0 import VllmV0Scheduler
from sim.records.columns import QUANTILES
from sim.records.summary import Slo, summarize


def per_token(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    """1/8 s per token computed: every sum of step times is exact in binary."""
    return float(new_tokens.sum()) * 0.125, False


def unit_step(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return 1.0, False


def run(sched: Scheduler, requests: list[Request], step_time=per_token) -> tuple[RunOutput, dict]:  # type: ignore[no-untyped-def]
    out = simulate(sched, step_time, Horizon(max_requests=len(requests), drain=True), iter(requests))
    rec = out.recorder
    frames = rec.requests_frame(), rec.steps_frame()
    summary = summarize(*frames, out.end_time, Slo(), False, (), rec.itl_gaps())
    return out, summary["latency"]["itl"]  # type: ignore[index]


def test_a_decode_behind_a_prefill_only_step_has_the_whole_wait_as_its_gap() -> None:
    """vllm-v0 (sarathi/core/scheduler/vllm_scheduler.py lines 80-86: a step with admissions is theirs
    alone), 1/8 s per token computed. A (8-token prompt, 4 out) arrives at 0, B (4, 3 out) at 0.5.
    - step 0, 0 -> 1: A prefills (8 tokens); its first token at 1.
    - step 1, 1 -> 1.5: B prefills alone (4 tokens), A waits; B's first token at 1.5.
    - steps 2, 3: A and B decode (2 tokens, 0.25 s each): tokens at 1.75 and 2; B is done.
    - step 4, 2 -> 2.125: A decodes alone.
    A's gaps: 0.75 (its own decode and B's prefill-only step before it), 0.25, 0.125; B's: 0.25, 0.25."""
    sched = VllmV0Scheduler(VllmV0Config(watermark=0.0), KvBudget(64, 4, 64))  # 64 blocks of 4, length 64
    a, b = Request(0, 0.0, 8, 4, 4), Request(1, 0.5, 4, 3, 3)
    out, itl = run(sched, [a, b])
    steps = out.recorder.steps_frame()
    assert steps["prefill_tokens"].to_list() == [8, 4, 0, 0, 0]
    assert steps["decode_tokens"].to_list() == [0, 0, 2, 2, 1]
    gaps = {0: [0.75, 0.25, 0.125], 1: [0.25, 0.25]}
    rows = out.recorder.requests_frame().sort("id")
    for row in rows.iter_rows(named=True):
        g = gaps[row["id"]]
        assert row["itl_p50"] == pytest.approx(np.quantile(g, 0.5))
        assert row["itl_p99"] == pytest.approx(np.quantile(g, 0.99))
        assert row["itl_max"] == max(g)
        assert row["itl_mean"] == pytest.approx(np.mean(g))
    pooled = sorted(gaps[0] + gaps[1])  # [0.125, 0.25, 0.25, 0.25, 0.75]
    assert itl["p99"] == pooled[-1] == itl["max"]  # the stall: 5 x 0.99 of the weight lies past 4 gaps
    assert itl["p50"] == 0.25


def test_a_preempted_request_has_its_time_out_as_one_gap() -> None:
    """The schedule of test_baselines.test_vllm_v0_prefills_alone_and_preempts_the_newest_by_recompute, each
    step taking 1 s: A and B prefill (step 0, ends 1), C prefills alone (ends 2), A and B decode and C is
    preempted (ends 3), A decodes alone and B is preempted (ends 4), B and C recompute in one prefill that
    emits each one's last token (ends 5). Tokens: A at 1, 3, 4; B at 1, 3, 5; C at 2, 5."""
    sched = VllmV0Scheduler(VllmV0Config(watermark=0.0), KvBudget(6, 4, 16))  # 6 blocks of 4, length 16
    reqs = [Request(0, 0.0, 8, 3, 3), Request(1, 0.0, 8, 3, 3), Request(2, 0.0, 4, 2, 2)]
    out, itl = run(sched, reqs, unit_step)
    steps = out.recorder.steps_frame()
    assert steps["prefill_tokens"].to_list() == [16, 4, 0, 0, 15]
    assert steps["preempted"].to_list() == [0, 0, 1, 1, 0]
    gaps = {0: [2.0, 1.0], 1: [2.0, 2.0], 2: [3.0]}
    for row in out.recorder.requests_frame().iter_rows(named=True):
        g = gaps[row["id"]]
        assert (row["itl_p50"], row["itl_p99"], row["itl_max"]) == (
            np.quantile(g, 0.5),
            np.quantile(g, 0.99),
            max(g),
        )
    assert itl["max"] == itl["p99"] == 3.0  # C's time out; the decode steps alone would give 1.0
    assert itl["p50"] == 2.0


def pooled_quantile(gaps: np.ndarray, q: float) -> float:
    """The summary's rule: the smallest gap whose cumulative count (sorted) reaches q times the total."""
    ordered = np.sort(gaps)
    return float(ordered[int(np.searchsorted(np.arange(1, len(ordered) + 1), q * len(ordered), side="left"))])


def recorded_tokens(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[float]]:
    """Every token time `Request.emit` stamps, by request id (the brute-force record of a run)."""
    times: dict[int, list[float]] = {}
    emit = Request.emit

    def stamped(self: Request, now: float) -> None:
        times.setdefault(self.id, []).append(now)
        emit(self, now)

    monkeypatch.setattr(Request, "emit", stamped)
    return times


def workload(draw: st.DrawFn) -> list[Request]:
    n = draw(st.integers(2, 9))
    arrivals = np.cumsum(draw(st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.3]), min_size=n, max_size=n)))
    out = []
    for i in range(n):
        prompt, output = draw(st.integers(1, 40)), draw(st.integers(1, 14))
        out.append(Request(i, float(arrivals[i]), prompt, output, output))
    return out


def step_cost(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return 0.01 + 0.002 * float(new_tokens.sum()) + 0.0001 * float(context.sum()), False


@st.composite
def runs(draw: st.DrawFn) -> tuple[str, int, list[Request]]:
    return draw(st.sampled_from(["vllm-v0", "vllm"])), draw(st.integers(8, 16)), workload(draw)


def build(kind: str, blocks: int) -> Scheduler:
    budget = KvBudget(num_blocks=blocks, block_size=8, max_model_len=64)
    if kind == "vllm-v0":
        return VllmV0Scheduler(VllmV0Config(watermark=0.0), budget)
    config = VllmConfig(max_num_batched_tokens=24, max_num_seqs=4)  # a small budget: decodes left out too
    return VllmScheduler(config, budget, watermark_blocks=0)


@settings(max_examples=60, deadline=None)
@given(runs())
def test_each_gap_is_the_time_since_the_previous_token(case: tuple[str, int, list[Request]]) -> None:
    """Against the token times themselves, on small KV caches (room for the longest request and one block
    more: preemptions) and a small token budget: each request's gaps sum to its last minus first token
    time, its p50, p99 and max are those of its gaps, and the run's pooled quantiles and max are those of
    every gap of every request."""
    kind, blocks, requests = case
    with pytest.MonkeyPatch.context() as mp:
        times = recorded_tokens(mp)
        out, itl = run(build(kind, blocks), requests, step_cost)
    frame = out.recorder.requests_frame().filter(pl.col("state").cast(pl.String) == "finished")
    pooled: list[float] = []
    for row in frame.iter_rows(named=True):
        t = np.array(times[row["id"]])
        g = np.diff(t)
        assert len(t) == row["generated_tokens"]
        pooled.extend(g)
        if len(g) == 0:
            continue
        assert g.sum() == pytest.approx(t[-1] - t[0])
        assert row["itl_mean"] == pytest.approx(g.mean())
        assert row["itl_max"] == pytest.approx(g.max())
        assert row["itl_p50"] == pytest.approx(np.quantile(g, 0.5))
        assert row["itl_p99"] == pytest.approx(np.quantile(g, 0.99))
    if not pooled:
        return
    if frame.height == len(requests):  # every request finished: the pool is every gap of the run
        gaps = np.array(pooled)
        assert itl["max"] == pytest.approx(gaps.max())
        for key, q in QUANTILES.items():
            assert itl[key] == pytest.approx(pooled_quantile(gaps, q)), key


def test_the_fast_path_records_the_same_waits_as_row_by_row() -> None:
    """Bulk decoding (`fast`, whose sequences in bulk skip `emit`) leaves the per-request ITL figures and the
    pooled quantiles of stepping every row, on a run with preemptions and decodes left out by the token
    budget: those of the gaps between the token times that run stamps."""
    figures = []
    for fast in (False, True):
        rng = np.random.default_rng(3)
        reqs = [
            Request(i, 0.02 * i, int(rng.integers(1, 40)), int(k), int(k))
            for i, k in enumerate(rng.integers(1, 30, 40))
        ]
        config = VllmConfig(max_num_batched_tokens=24, max_num_seqs=6)
        sched = VllmScheduler(config, KvBudget(10, 8, 64), watermark_blocks=0, fast=fast)
        with pytest.MonkeyPatch.context() as mp:
            times = recorded_tokens(mp)
            out, itl = run(sched, reqs, step_cost)
        assert int(out.recorder.steps_frame()["preempted"].sum()) > 0
        figures.append((out.recorder.requests_frame().select("id", "itl_p50", "itl_p99", "itl_max"), itl))
        if not fast:
            gaps = np.concatenate([np.diff(t) for t in times.values()])
    assert figures[0][0].equals(figures[1][0])
    assert figures[0][1] == figures[1][1]
    for key, q in QUANTILES.items():
        assert figures[1][1][key] == pytest.approx(pooled_quantile(gaps, q)), key
