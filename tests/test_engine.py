"""The engine against queueing theory, the convoy effect on a crafted case, and request accounting."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.policies import ContinuousConfig, StaticConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.closed_loop import ClosedLoopSource
from sim.engine.horizon import Horizon
from sim.engine.replica import simulate
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.static import StaticScheduler
from sim.records.summary import Slo, summarize

DT = 0.01  # every step takes 10 ms
MEMORY = KvBudget(num_blocks=100_000, block_size=16, max_model_len=1_000_000)


def constant_step(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return DT, False


def poisson(n: int, rate: float, outputs: np.ndarray, seed: int = 1) -> Iterator[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    for i, (t, out) in enumerate(zip(times.tolist(), outputs.tolist(), strict=True)):
        yield Request(i, t, 16, int(out), int(out))


def run_single_server(outputs: np.ndarray, rate: float) -> dict:
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=1), MEMORY)
    out = simulate(
        sched,
        constant_step,
        Horizon(max_requests=len(outputs)),
        open_loop=poisson(len(outputs), rate, outputs),
    )
    frame = out.recorder.requests_frame()
    return {
        "wait": frame["queue_wait"].mean(),
        "frame": frame,
        "steps": out.recorder.steps_frame(),
        "end": out.end_time,
    }


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait(rho: float) -> None:
    """Batch size 1, fixed lengths: every service time is D = output × step; Poisson arrivals."""
    out_len = 4
    service = out_len * DT
    res = run_single_server(np.full(120_000, out_len), rho / service)
    expected = rho * service / (2 * (1 - rho))
    assert res["wait"] == pytest.approx(expected, rel=0.05)


def test_mg1_pollaczek_khinchine() -> None:
    """Variable output lengths: mean wait λE[S²] / (2(1−ρ))."""
    rng = np.random.default_rng(3)
    outputs = rng.geometric(1 / 5, 150_000)
    service = outputs * DT
    rate = 0.7 / service.mean()
    res = run_single_server(outputs, rate)
    rho = rate * service.mean()
    expected = rate * (service**2).mean() / (2 * (1 - rho))
    assert res["wait"] == pytest.approx(expected, rel=0.05)


def test_littles_law() -> None:
    """Time-average number in system from the step records equals throughput × mean E2E (within 2%)."""
    rng = np.random.default_rng(5)
    outputs = rng.integers(20, 200, 20_000)
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=16), MEMORY)
    out = simulate(
        sched,
        constant_step,
        Horizon(max_requests=len(outputs)),
        open_loop=poisson(len(outputs), 9.0, outputs),
    )
    req = out.recorder.requests_frame()
    steps = out.recorder.steps_frame()
    number_in_system = ((steps["batch_size"] + steps["waiting"]) * steps["duration"]).sum() / out.end_time
    throughput = req.height / out.end_time
    assert number_in_system == pytest.approx(throughput * req["e2e"].mean(), rel=0.02)


def test_static_convoy_short_request_waits_for_longest() -> None:
    """A 2-token request batched with a 50-token one returns only when the long one ends."""
    sched = StaticScheduler(StaticConfig(max_batch_size=2), MEMORY)
    reqs = iter([Request(0, 0.0, 16, 50, 50), Request(1, 0.0, 16, 50, 2)])
    out = simulate(sched, constant_step, Horizon(max_requests=2), open_loop=reqs)
    frame = out.recorder.requests_frame()
    short, long_ = frame.row(1, named=True), frame.row(0, named=True)
    assert short["finished_at"] == pytest.approx(long_["finished_at"])
    assert short["finished_at"] == pytest.approx(50 * DT)
    assert short["first_token_at"] == pytest.approx(DT)
    # Continuous batching lets it leave after its own 2 tokens.
    sched2 = ContinuousScheduler(ContinuousConfig(max_num_seqs=2), MEMORY)
    reqs = iter([Request(0, 0.0, 16, 50, 50), Request(1, 0.0, 16, 50, 2)])
    frame2 = simulate(
        sched2, constant_step, Horizon(max_requests=2), open_loop=reqs
    ).recorder.requests_frame()
    assert frame2.row(1, named=True)["finished_at"] == pytest.approx(2 * DT)


def test_static_newcomer_waits_for_next_batch() -> None:
    sched = StaticScheduler(StaticConfig(max_batch_size=4), MEMORY)
    reqs = iter([Request(0, 0.0, 16, 10, 10), Request(1, 0.015, 16, 10, 10)])
    frame = simulate(sched, constant_step, Horizon(max_requests=2), open_loop=reqs).recorder.requests_frame()
    assert frame["scheduled_at"][1] == pytest.approx(10 * DT)


def test_static_batch_timeout_waits_for_a_fuller_batch() -> None:
    sched = StaticScheduler(StaticConfig(max_batch_size=2, batch_timeout_s=0.5), MEMORY)
    reqs = iter([Request(0, 0.0, 16, 5, 5), Request(1, 0.2, 16, 5, 5), Request(2, 0.3, 16, 5, 5)])
    frame = simulate(sched, constant_step, Horizon(max_requests=3), open_loop=reqs).recorder.requests_frame()
    assert frame["scheduled_at"].to_list()[:2] == pytest.approx([0.2, 0.2])  # full at 0.2
    assert frame["scheduled_at"][2] == pytest.approx(0.8)  # alone: after its 0.5 s timeout


def test_overload_runs_to_horizon_and_says_so() -> None:
    outputs = np.full(100_000, 100)
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    # capacity is 4 requests per second (4 running, 1 s each); offer 20 per second
    out = simulate(
        sched, constant_step, Horizon(duration_s=60), open_loop=poisson(len(outputs), 20.0, outputs)
    )
    frame = out.recorder.requests_frame()
    summary = summarize(frame, out.recorder.steps_frame(), out.end_time, Slo(), out.overloaded)
    counts = summary["requests"]
    assert summary["overloaded"] is True
    assert counts["arrived"] == counts["finished"] + counts["rejected"] + counts["in_flight"]
    assert counts["in_flight"] > counts["finished"]


def test_admission_control_rejects_with_a_reason() -> None:
    outputs = np.full(5_000, 100)
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    out = simulate(
        sched,
        constant_step,
        Horizon(duration_s=30, max_waiting=10),
        open_loop=poisson(len(outputs), 20.0, outputs),
    )
    frame = out.recorder.requests_frame()
    rejected = frame.filter(frame["state"].cast(str) == "rejected")
    assert rejected.height > 0
    assert set(rejected["reject_reason"].to_list()) == {"queue full"}


def test_closed_loop_keeps_users_busy() -> None:
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=8), MEMORY)
    ids = iter(range(10**6))
    source = ClosedLoopSource(4, lambda: 0.0, lambda t, _user: Request(next(ids), t, 16, 10, 10))
    out = simulate(sched, constant_step, Horizon(max_requests=40), closed_loop=source)
    frame = out.recorder.requests_frame()
    assert frame.height == 40
    assert (frame["state"].cast(str) == "finished").all()
    assert out.end_time == pytest.approx(10 * 10 * DT)  # 10 waves of 4 users, 10 steps each


@settings(max_examples=25, deadline=None)
@given(
    policy=st.sampled_from(["static", "continuous"]),
    n=st.integers(1, 60),
    rate=st.floats(0.5, 200.0),
    seqs=st.integers(1, 8),
    blocks=st.integers(2, 200),
    duration=st.one_of(st.none(), st.floats(0.05, 5.0)),
    seed=st.integers(0, 10_000),
)
def test_no_request_is_lost(
    policy: str, n: int, rate: float, seqs: int, blocks: int, duration, seed: int
) -> None:
    """Every arrival ends finished, rejected (with a reason) or in flight; the counts add up."""
    rng = np.random.default_rng(seed)
    memory = KvBudget(blocks, 16, 512)
    if policy == "static":
        sched = StaticScheduler(StaticConfig(max_batch_size=seqs), memory)
    else:
        sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=seqs), memory)
    prompts = rng.integers(1, 400, n)
    outs = rng.integers(1, 300, n)
    times = np.cumsum(rng.exponential(1 / rate, n))
    reqs = iter(
        Request(i, float(t), int(p), int(o), int(min(o, rng.integers(1, o + 1))))
        for i, (t, p, o) in enumerate(zip(times, prompts, outs, strict=True))
    )
    out = simulate(sched, constant_step, Horizon(duration_s=duration, max_requests=n), open_loop=reqs)
    frame = out.recorder.requests_frame()
    state = frame["state"].cast(str)
    assert sorted(frame["id"].to_list()) == list(range(frame.height))
    assert frame.height == out.recorder.arrived
    if duration is None:
        assert frame.height == n and not (state == "in_flight").any()
    assert frame.filter(state == "rejected")["reject_reason"].null_count() == 0
    fin = frame.filter(state == "finished")
    assert (fin["generated_tokens"] == fin["output_len"]).all()
    assert (fin["finished_at"] >= fin["first_token_at"]).all()
    assert (fin["first_token_at"] >= fin["arrival"]).all()
    steps = out.recorder.steps_frame()
    assert (steps["kv_allocated"] <= steps["kv_capacity"]).all()
    assert (steps["kv_used"] <= steps["kv_allocated"]).all()


def test_request_admitted_into_a_step_cut_by_the_horizon_is_in_flight() -> None:
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    reqs = iter([Request(0, 0.0, 16, 100, 100), Request(1, 0.005, 16, 5, 5)])
    out = simulate(sched, constant_step, Horizon(duration_s=0.015, max_requests=2), open_loop=reqs)
    frame = out.recorder.requests_frame()
    assert frame["id"].to_list() == [0, 1]
    assert frame["state"].cast(str).to_list() == ["in_flight", "in_flight"]
    assert frame["scheduled_at"][1] == pytest.approx(DT)


def test_step_records_keep_capacity_changes_and_widen_to_64_bits() -> None:
    """KV capacity is stored where it changes; a value past 32 bits widens the rows without a stray part."""
    from sim.core.step import KvUsage, StepPlan
    from sim.records.recorder import Recorder

    rec = Recorder()
    caps = [100, 100, 200, 200, 100]
    used = [1, 2, 3, 2**40, 5]
    for i, (cap, u) in enumerate(zip(caps, used, strict=True)):
        plan = StepPlan(np.array([1]), np.array([0]), 0, 1, KvUsage(u, u, cap))
        rec.step(i * DT, DT, plan, False, waiting=i)
    steps = rec.steps_frame()
    assert steps["kv_capacity"].to_list() == caps
    assert steps["kv_used"].to_list() == used
    assert steps["waiting"].to_list() == list(range(5))
    assert steps["batch_size"].to_list() == [1] * 5
    assert rec.step_waiting(4) == 4


def test_arrival_at_a_step_end_joins_as_an_arrival_process_delivered_it() -> None:
    """A timed arrival at exactly a step's end joins that step's successor unless its predecessor arrived
    during the step (its timer was then set after the step's)."""
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    # Request 1 arrives at t = 0.01, the end of the first step, its predecessor having arrived before it.
    reqs = iter([Request(0, 0.0, 16, 3, 3), Request(1, DT, 16, 3, 3)])
    out = simulate(sched, constant_step, Horizon(max_requests=2), open_loop=reqs)
    assert out.recorder.requests_frame()["scheduled_at"].to_list() == [0.0, DT]
    # Request 2 arrives at the end of the step during which request 1 arrived: one step later.
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    reqs = iter([Request(0, 0.0, 16, 5, 5), Request(1, 0.015, 16, 3, 3), Request(2, 0.02, 16, 3, 3)])
    out = simulate(sched, constant_step, Horizon(max_requests=3), open_loop=reqs)
    scheduled = out.recorder.requests_frame()["scheduled_at"].to_list()
    assert scheduled[0] == 0.0 and scheduled[1] == pytest.approx(0.02) and scheduled[2] == pytest.approx(0.03)
