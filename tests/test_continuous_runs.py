"""The continuous policy's decode-only runs (`ContinuousScheduler.quiet_steps`, advanced at once by
`Replica.run_open` across finishes and arrivals) on generated scenarios: the records of the plain SimPy
reference loop, which takes every step on its own (tests/test_engine_reference.py)."""

from __future__ import annotations

import math

import numpy as np
import test_engine_reference as ref_module
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine_reference import DT, FixedTotalsStep, _assert_same, _requests_copy, reference

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.policies import ContinuousConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.cost.roofline import CostModel
from sim.engine.horizon import Horizon
from sim.engine.replica import simulate
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.records.recorder import Recorder

ROOFLINE = CostModel(load_model("llama-2-7b"), get_gpu("A100-80GB"))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[ContinuousConfig, KvBudget, list[Request], Horizon, bool, int]:
    """A small replica (few sequences, few KV blocks: the queue's head often waits), arrivals on a grid of
    half steps (exact step times: arrivals on step ends) or at random times, and one of the horizons."""
    exact = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    n = draw(st.integers(5, 60))
    if exact:
        times = np.cumsum(rng.choice([0, 0, 1, 1, 2, 3, 8], n)) * (DT / 2)
    else:
        times = np.cumsum(rng.exponential(draw(st.sampled_from([0.005, 0.05, 0.5])), n))
    prompts, outputs, ns = rng.integers(1, 300, n), rng.integers(1, 64, n), rng.choice([1, 1, 2], n)
    reqs = [
        Request(i, float(t), int(p), 64, int(o), int(k))
        for i, (t, p, o, k) in enumerate(zip(times, prompts, outputs, ns, strict=True))
    ]
    config = ContinuousConfig(max_num_seqs=draw(st.integers(1, 8)))
    budget = KvBudget(num_blocks=draw(st.integers(40, 400)), block_size=16, max_model_len=1024)
    end = float(times[-1])
    horizons = [
        Horizon(max_requests=n),
        Horizon(duration_s=end * 0.6 + DT),
        Horizon(duration_s=end + DT, drain=True),
        Horizon(duration_s=end + 1, drain=True, max_waiting=3),
    ]
    horizon = draw(st.sampled_from(horizons))
    return config, budget, reqs, horizon, exact, draw(st.sampled_from([3, 64, 65_536]))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_generated_scenarios_give_the_reference_records(
    case: tuple[ContinuousConfig, KvBudget, list[Request], Horizon, bool, int],
) -> None:
    config, budget, reqs, horizon, exact, chunk_rows = case
    stop = horizon.duration_s if horizon.duration_s is not None and not horizon.drain else math.inf
    arriving = [r for r in reqs if r.arrival < stop]
    cost = FixedTotalsStep() if exact else ROOFLINE
    kept, ref_module.COST = ref_module.COST, cost  # the reference loop's step time
    try:
        out = simulate(
            ContinuousScheduler(config, budget), cost.step_time, horizon,
            open_loop=iter(_requests_copy(arriving)), recorder=Recorder(chunk_rows=chunk_rows),
        )  # fmt: skip
        expected = reference(ContinuousScheduler(config, budget), horizon, requests=_requests_copy(arriving))
    finally:
        ref_module.COST = kept
    _assert_same(out.recorder, expected)
    assert out.recorder.requests_frame().height == len(arriving)  # every request recorded, none lost
