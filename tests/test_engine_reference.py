"""The engine against a plain-SimPy reference loop on the same requests: identical request and step records.

The engine advances SimPy's clock itself when no event can come first and reads open-loop arrivals inline
(through SimPy internals: `_now`, `_queue`, `_eid`, `Event._ok`). The reference below uses only SimPy's public
API: one process per replica that does `yield env.timeout(step)`, one process delivering arrivals, one
process per closed-loop user. If a SimPy release changes the internals the engine relies on, these records
stop matching.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import polars as pl
import pytest
import simpy
from polars.testing import assert_frame_equal

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.policies import ContinuousConfig, StaticConfig, VllmConfig
from sim.core.request import Request
from sim.core.step import StepPlan
from sim.cost.kernel_model import KernelCostModel
from sim.cost.memory import KvBudget
from sim.cost.roofline import CostModel
from sim.engine.closed_loop import ClosedLoopSource
from sim.engine.horizon import Horizon
from sim.engine.replica import simulate
from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.static import StaticScheduler
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.records.columns import FINISHED, IN_FLIGHT, REJECTED
from sim.records.recorder import Recorder

COST = CostModel(load_model("llama-2-7b"), get_gpu("A100-80GB"))
MEMORY = KvBudget(num_blocks=2_000, block_size=16, max_model_len=4096)


def reference(
    scheduler: Scheduler,
    horizon: Horizon,
    requests: Sequence[Request] | None = None,
    users: ClosedLoopSource | None = None,
) -> Recorder:
    """A straightforward SimPy model of one replica (public API only)."""
    env = simpy.Environment()
    rec = Recorder()
    in_system = 0
    arrivals_open = True
    wakeup = env.event()
    finished_event: dict[int, simpy.Event] = {}  # request id -> fires when it leaves (closed loop)

    def poke() -> None:
        if not wakeup.triggered:
            wakeup.succeed()

    def leave(req: Request, state: str) -> None:
        rec.request(req, state)
        if req.id in finished_event:
            finished_event.pop(req.id).succeed()

    def submit(req: Request) -> None:
        nonlocal in_system
        rec.arrived += 1
        if horizon.max_waiting is not None and scheduler.num_waiting >= horizon.max_waiting:
            req.reject_reason = "queue full"
        elif scheduler.add(req, env.now):
            in_system += 1
            poke()
            return
        leave(req, REJECTED)

    def close() -> None:
        nonlocal arrivals_open
        arrivals_open = False
        poke()

    def open_loop(reqs: Sequence[Request]) -> Iterator[simpy.Event]:
        for req in reqs:
            if req.arrival > env.now:
                yield env.timeout(req.arrival - env.now)
            submit(req)
        close()

    sent = 0

    def user(u: int, source: ClosedLoopSource) -> Iterator[simpy.Event]:
        nonlocal sent
        delay = source.ramp_s * u / source.users if source.ramp_s else 0.0
        while True:
            if delay > 0:
                yield env.timeout(delay)
            if horizon.max_requests is not None and sent >= horizon.max_requests:
                return
            if horizon.duration_s is not None and env.now >= horizon.duration_s:
                return
            sent += 1
            req = source.new_request(env.now, u)
            done = finished_event[req.id] = env.event()
            submit(req)
            if horizon.max_requests is not None and sent >= horizon.max_requests:
                close()
            yield done
            delay = source.think_time()

    def close_at(t: float) -> Iterator[simpy.Event]:
        yield env.timeout(t)
        close()

    def replica() -> Iterator[simpy.Event]:
        nonlocal wakeup, in_system
        while True:
            plan = scheduler.schedule(env.now)
            if plan is None:
                if not arrivals_open and in_system == 0:
                    return
                wakeup = env.event()
                wake = scheduler.wake_at(env.now)
                yield wakeup if wake is None else wakeup | env.timeout(max(wake - env.now, 0.0))
                continue
            start = env.now
            seconds, compute_bound = COST.step_time(plan.new_tokens, plan.context)
            yield env.timeout(seconds)
            finished = scheduler.update(plan, env.now)
            rec.step(start, seconds, plan, compute_bound, scheduler.num_waiting)
            for req in finished:
                in_system -= 1
                leave(req, FINISHED)

    if requests is not None:
        env.process(open_loop(requests))
    else:
        assert users is not None
        if horizon.duration_s is not None:
            env.process(close_at(horizon.duration_s))
        for u in range(users.users):
            env.process(user(u, users))
    engine = env.process(replica())
    if horizon.duration_s is not None and not horizon.drain:
        env.run(until=horizon.duration_s)
    else:
        env.run(until=engine)
    for req in scheduler.in_flight():
        rec.request(req, IN_FLIGHT)
    return rec


def _scheduler(policy: str) -> Scheduler:
    if policy == "static":
        return StaticScheduler(StaticConfig(max_batch_size=16, batch_timeout_s=0.05), MEMORY)
    if policy == "continuous":
        return ContinuousScheduler(ContinuousConfig(max_num_seqs=16), MEMORY)
    # "vllm-fast": in bulk, as `sim run` builds it, so the engine advances its decode-only steps in runs
    return VllmScheduler(
        VllmConfig(max_num_seqs=16, max_num_batched_tokens=1024), MEMORY, fast=policy != "vllm"
    )


def _plain(policy: str) -> Scheduler:
    """The reference's scheduler: every row one by one."""
    return _scheduler("vllm" if policy == "vllm-fast" else policy)


def _requests(n: int, rate: float, seed: int, same_instant: bool = False) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1 / rate, n))
    if same_instant:  # groups of arrivals at one instant
        times = np.repeat(times[::4], 4)[:n]
    prompts = rng.integers(8, 600, n)
    outputs = rng.integers(1, 300, n)
    ns = rng.choice([1, 1, 1, 2, 3], n)
    return [
        Request(i, float(t), int(p), 300, int(o), int(k))
        for i, (t, p, o, k) in enumerate(zip(times, prompts, outputs, ns, strict=True))
    ]


def _assert_same(engine: Recorder, ref: Recorder) -> None:
    assert engine.arrived == ref.arrived
    assert_frame_equal(engine.requests_frame(), ref.requests_frame())
    assert_frame_equal(engine.steps_frame(), ref.steps_frame())


HORIZONS = {
    "drain": Horizon(duration_s=40.0, drain=True),
    "cut": Horizon(duration_s=25.0),
    "count": Horizon(max_requests=150),
    "admission": Horizon(duration_s=30.0, max_waiting=8),
}


@pytest.mark.parametrize("policy", ["static", "continuous", "vllm", "vllm-fast"])
@pytest.mark.parametrize("horizon", sorted(HORIZONS))
@pytest.mark.parametrize("same_instant", [False, True])
def test_open_loop_matches_the_reference(policy: str, horizon: str, same_instant: bool) -> None:
    h = HORIZONS[horizon]
    reqs = _requests(150, 6.0, seed=len(policy) + len(horizon), same_instant=same_instant)
    stop = h.duration_s if h.duration_s is not None else math.inf
    arriving = [r for r in reqs if r.arrival < stop]
    out = simulate(_scheduler(policy), COST.step_time, h, open_loop=iter(_requests_copy(arriving)))
    ref = reference(_plain(policy), h, requests=_requests_copy(arriving))
    assert out.recorder.steps_frame().height > 100
    _assert_same(out.recorder, ref)


DT = 2.0**-6  # a step time whose multiples are exact: events coincide at step ends


class FixedStep:
    def step_time(self, new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        return DT, False


class FixedTotalsStep(FixedStep):
    """The same step time from a plan's integer sums, as a cost model gives it: the engine then advances the
    continuous policy's decode-only steps in runs (`quiet_steps`), so arrivals land exactly on a run's
    step ends."""

    def step_time_totals(
        self, rows: int, tokens: int, ones: int, cq: int, cc: int, ctx: int, max_end: int
    ) -> tuple[float, bool]:
        return DT, False


@pytest.fixture(params=[FixedStep, FixedTotalsStep], ids=["rows", "totals"])
def fixed_steps(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FixedStep:
    fixed: FixedStep = request.param()
    monkeypatch.setattr(__import__(__name__), "COST", fixed)
    return fixed


def _on_step_ends(n: int, seed: int) -> list[Request]:
    """Arrivals on a grid of half steps, several at one instant, many at a step's end."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.choice([0, 0, 1, 1, 2, 3, 8], n)) * (DT / 2)
    return [
        Request(i, float(t), int(rng.integers(1, 40)), 12, int(rng.integers(1, 12)), int(rng.choice([1, 2])))
        for i, t in enumerate(times)
    ]


@pytest.mark.parametrize("policy", ["static", "continuous", "vllm", "vllm-fast"])
@pytest.mark.parametrize(
    "horizon", [Horizon(max_requests=200), Horizon(duration_s=40 * DT), Horizon(duration_s=40.5 * DT)]
)
def test_arrivals_at_step_ends_match_the_reference(
    fixed_steps: FixedStep, policy: str, horizon: Horizon
) -> None:
    """Exact step times, so arrivals, timers and the horizon fall on step ends: the order of same-time
    events decides which step a request joins."""
    reqs = [
        r for r in _on_step_ends(200, seed=3) if horizon.duration_s is None or r.arrival < horizon.duration_s
    ]
    out = simulate(_scheduler(policy), fixed_steps.step_time, horizon, open_loop=iter(_requests_copy(reqs)))
    ref = reference(_plain(policy), horizon, requests=_requests_copy(reqs))
    _assert_same(out.recorder, ref)


@pytest.mark.parametrize("max_num_seqs", [2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_arrivals_at_the_step_ends_of_runs_match_the_reference(
    monkeypatch: pytest.MonkeyPatch, max_num_seqs: int, seed: int
) -> None:
    """A full batch keeps the queue's head out, so the continuous policy's decode-only steps run on while
    requests arrive, many exactly at a run's step ends: each joins the queue before the step it ends with is
    applied, and that step's row counts it as waiting, as in the reference's one step at a time."""
    fixed = FixedTotalsStep()
    monkeypatch.setattr(__import__(__name__), "COST", fixed)
    horizon = Horizon(max_requests=200)
    reqs = _on_step_ends(200, seed=seed)
    sched = _CountingContinuous(ContinuousConfig(max_num_seqs=max_num_seqs), MEMORY)
    out = simulate(sched, fixed.step_time, horizon, open_loop=iter(_requests_copy(reqs)))
    plain = ContinuousScheduler(ContinuousConfig(max_num_seqs=max_num_seqs), MEMORY)
    ref = reference(plain, horizon, requests=_requests_copy(reqs))
    steps = out.recorder.steps_frame()
    assert steps["waiting"].max() > 5  # the queue was held up
    assert sched.schedules < steps.height / 2  # most steps were advanced in runs
    _assert_same(out.recorder, ref)


class _CountingVllm(VllmScheduler):
    """Counts `schedule` calls: the steps of a run (`quiet_steps`) are not scheduled."""

    schedules = 0

    def schedule(self, now: float) -> StepPlan | None:
        self.schedules += 1
        return super().schedule(now)


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("horizon", [Horizon(max_requests=120), Horizon(duration_s=300 * DT)])
def test_vllm_runs_with_arrivals_at_their_step_ends_match_the_reference(
    monkeypatch: pytest.MonkeyPatch, async_scheduling: bool, seed: int, horizon: Horizon
) -> None:
    """The vllm policy in bulk: its decode-only steps run on until an arrival, many exactly at a run's step
    ends, which a run takes as its last step; with asynchronous scheduling the step after it cannot see
    the arrival either. The records are the reference's, scheduler stepping every row."""
    fixed = FixedTotalsStep()
    monkeypatch.setattr(__import__(__name__), "COST", fixed)
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.choice([0, 1, 2, 8, 32, 64, 96], 120)) * (DT / 2)
    reqs = [
        Request(i, float(t), int(rng.integers(1, 60)), 200, int(rng.integers(1, 200)))
        for i, t in enumerate(times)
    ]
    reqs = [r for r in reqs if horizon.duration_s is None or r.arrival < horizon.duration_s]
    config = VllmConfig(max_num_seqs=16, max_num_batched_tokens=1024, async_scheduling=async_scheduling)
    budget = KvBudget(num_blocks=400, block_size=16, max_model_len=4096)
    sched = _CountingVllm(config, budget, fast=True)
    out = simulate(sched, fixed.step_time, horizon, open_loop=iter(_requests_copy(reqs)))
    plain = VllmScheduler(config, budget)
    ref = reference(plain, horizon, requests=_requests_copy(reqs))
    steps = out.recorder.steps_frame()
    assert sched.schedules < steps.height / 2  # most steps were advanced in runs
    if async_scheduling:  # the step after an arrival's is in the run too: about as few plans as without
        sync = _CountingVllm(config.model_copy(update={"async_scheduling": False}), budget, fast=True)
        simulate(sync, fixed.step_time, horizon, open_loop=iter(_requests_copy(reqs)))
        assert sched.schedules <= sync.schedules * 1.1
    _assert_same(out.recorder, ref)


def test_a_vllm_run_leaves_the_step_after_an_arrival_that_step_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """An arrival timed exactly at a step's end, after another arrived (and was rejected) during that step,
    is queued after the next step was formed. A run from there takes the step it is delivered in, but not
    the one after: that step, formed when the arrival's step started, sees it (asynchronous scheduling)."""
    fixed = FixedTotalsStep()
    monkeypatch.setattr(__import__(__name__), "COST", fixed)
    reqs = [
        Request(0, 0.0, 10, 100, 100),
        Request(1, 10.5 * DT, 5_000, 10, 10),
        Request(2, 11 * DT, 10, 20, 20),
    ]
    horizon = Horizon(max_requests=3)
    sched = _CountingVllm(VllmConfig(max_num_seqs=16, max_num_batched_tokens=1024), MEMORY, fast=True)
    out = simulate(sched, fixed.step_time, horizon, open_loop=iter(_requests_copy(reqs)))
    ref = reference(_plain("vllm"), horizon, requests=_requests_copy(reqs))
    assert sched.schedules < 20
    _assert_same(out.recorder, ref)


@pytest.mark.parametrize("policy", ["static", "continuous", "vllm"])
@pytest.mark.parametrize("horizon", [Horizon(max_requests=150), Horizon(duration_s=60 * DT)])
def test_closed_loop_at_step_ends_matches_the_reference(
    fixed_steps: FixedStep, policy: str, horizon: Horizon
) -> None:
    """Think times of whole and half steps: users send exactly at step ends."""

    def source() -> ClosedLoopSource:
        rng, think = np.random.default_rng(9), np.random.default_rng(10)
        ids = iter(range(10**6))

        def new_request(now: float, user: int) -> Request:
            return Request(next(ids), now, int(rng.integers(1, 40)), 12, int(rng.integers(1, 12)))

        return ClosedLoopSource(5, lambda: float(think.choice([0, 0.5, 1, 2])) * DT, new_request, 2 * DT)

    out = simulate(_scheduler(policy), fixed_steps.step_time, horizon, closed_loop=source())
    ref = reference(_scheduler(policy), horizon, users=source())
    _assert_same(out.recorder, ref)


def _requests_copy(reqs: Sequence[Request]) -> list[Request]:
    return [Request(r.id, r.arrival, r.prompt_len, r.max_tokens, r.output_len, r.n) for r in reqs]


def _closed_source(seed: int, ramp_s: float) -> ClosedLoopSource:
    rng = np.random.default_rng(seed)
    think = iter(rng.exponential(0.5, 100_000).tolist())
    ids = iter(range(10**6))
    lengths = np.random.default_rng(seed + 1)

    def new_request(now: float, user: int) -> Request:
        out = int(lengths.integers(1, 200))
        return Request(next(ids), now, int(lengths.integers(8, 500)), 200, out, prefix_group=user)

    return ClosedLoopSource(12, lambda: next(think), new_request, ramp_s)


@pytest.mark.parametrize("policy", ["static", "continuous", "vllm"])
@pytest.mark.parametrize(
    "horizon", [Horizon(max_requests=120), Horizon(duration_s=20.0), Horizon(duration_s=15.0, drain=True)]
)
@pytest.mark.parametrize("ramp_s", [0.0, 3.0])
def test_closed_loop_matches_the_reference(policy: str, horizon: Horizon, ramp_s: float) -> None:
    out = simulate(_scheduler(policy), COST.step_time, horizon, closed_loop=_closed_source(5, ramp_s))
    ref = reference(_scheduler(policy), horizon, users=_closed_source(5, ramp_s))
    assert out.recorder.requests_frame().height > 20
    _assert_same(out.recorder, ref)
    if ramp_s == 0:  # every user sends at t = 0, in order: request u is user u's
        frame = out.recorder.requests_frame()
        assert frame.filter(pl.col("id") < 12)["prefix_group"].to_list() == list(range(12))


class _CountingContinuous(ContinuousScheduler):
    """Counts `schedule` calls: decode-only steps advanced at once (`quiet_steps`) are not scheduled."""

    schedules = 0

    def schedule(self, now: float) -> StepPlan | None:
        self.schedules += 1
        return super().schedule(now)


@pytest.mark.parametrize("model", ["llama-2-7b", "gemma-2-9b", "kernel"])
@pytest.mark.parametrize("horizon", sorted(HORIZONS))
def test_continuous_quiet_steps_match_the_reference(
    monkeypatch: pytest.MonkeyPatch, model: str, horizon: str
) -> None:
    """The continuous policy's decode-only steps, advanced at once across arrivals and finishes, give the
    records of the reference loop's one step at a time, across record chunks of a few rows, and with
    sliding-window layers (gemma-2, prompts near its 4,096-token window: past it, the rows decide), and
    with the kernel cost model."""
    h = HORIZONS[horizon]
    reqs = _requests(150, 6.0, seed=11 + len(horizon))
    memory = MEMORY
    if model == "gemma-2-9b":
        memory = KvBudget(num_blocks=8_000, block_size=16, max_model_len=8192)
        for r in reqs:
            r.prompt_len += 3_200  # some batches cross the window as they decode
    stop = h.duration_s if h.duration_s is not None else math.inf
    arriving = [r for r in reqs if r.arrival < stop]
    if model == "kernel":  # a cost model without `decode_timer`: each step from its totals
        cost: CostModel | KernelCostModel = KernelCostModel(load_model("llama-2-7b"), get_gpu("A100-80GB"))
    else:
        cost = CostModel(load_model(model), get_gpu("A100-80GB"))
    monkeypatch.setattr(__import__(__name__), "COST", cost)  # the reference loop's step time
    sched = _CountingContinuous(ContinuousConfig(max_num_seqs=16), memory)
    source = iter(_requests_copy(arriving))
    out = simulate(sched, cost.step_time, h, open_loop=source, recorder=Recorder(chunk_rows=5))
    plain = ContinuousScheduler(ContinuousConfig(max_num_seqs=16), memory)
    ref = reference(plain, h, _requests_copy(arriving))
    frame = out.recorder.steps_frame()
    steps, admitting = frame.height, frame.filter(pl.col("prefill_tokens") > 0).height
    assert steps > 100
    assert sched.schedules < (steps / 2 if memory is MEMORY else steps)  # steps advanced without a plan
    if memory is MEMORY:  # runs go on across finishes and arrivals: only the steps that admit are planned
        assert sched.schedules <= admitting + 5
    _assert_same(out.recorder, ref)
