"""The vllm policy's bulk decoding (`VllmScheduler(fast=True)`, what `sim run` uses) against the same
scheduler stepping every row one by one: byte-identical request and step records, on the conformance cases'
traces and on generated scenarios (KV pressure and preemption, prefix caching, `n > 1`, chunking limits,
horizons cut mid-run)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.policies import VllmConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.cost.roofline import CostModel
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.registry import load_all
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.records.recorder import Recorder
from sim.studies.replay import build, config_from, load_trace, read_steps

COST = CostModel(load_model("llama-2-7b"), get_gpu("A100-80GB"))
DATA = Path(__file__).parent / "data" / "oracle"
CASES = sorted(p.name.removesuffix(".trace.json") for p in DATA.glob("*.trace.json"))


def _copies(reqs: list[Request]) -> list[Request]:
    return [Request(r.id, r.arrival, r.prompt_len, r.max_tokens, r.output_len, r.n, r.prefix_group,
                    r.prefix_len) for r in reqs]  # fmt: skip


def _records(sched: VllmScheduler, reqs: list[Request], horizon: Horizon) -> Recorder:
    return simulate(sched, COST.step_time, horizon, open_loop=iter(_copies(reqs))).recorder


def _assert_same(slow: Recorder, fast: Recorder) -> None:
    assert_frame_equal(slow.requests_frame(), fast.requests_frame())
    assert_frame_equal(slow.steps_frame(), fast.steps_frame())


def test_sim_run_builds_the_fast_scheduler() -> None:
    sched = load_all()["vllm"].build(VllmConfig(), KvBudget(100, 16, 1024))
    assert isinstance(sched, VllmScheduler) and sched.fast


@pytest.mark.parametrize("case", CASES)
def test_conformance_traces_give_the_same_records_in_bulk(case: str) -> None:
    config, _ = read_steps(DATA / f"{case}.steps.jsonl.gz")
    cfg = config_from(config)
    reqs = [t.request for t in load_trace(DATA / f"{case}.trace.json")]
    for r in reqs:
        r.arrival *= 0.02  # trace steps as about one engine step each
    slow, fast = build(cfg), build(cfg, fast=True)
    horizon = Horizon(max_requests=len(reqs), drain=True)
    _assert_same(_records(slow, reqs, horizon), _records(fast, reqs, horizon))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[VllmConfig, KvBudget, list[Request], Horizon, int]:
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    config = VllmConfig(
        max_num_seqs=draw(st.integers(1, 48)),
        max_num_batched_tokens=draw(st.integers(600, 4096)),
        enable_prefix_caching=draw(st.booleans()),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 64, 300])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.05])),
    )
    block = draw(st.sampled_from([8, 16, 32]))
    budget = KvBudget(draw(st.integers(80, 1500)), block, draw(st.sampled_from([600, 2048])))
    n = draw(st.integers(1, 90))
    times = np.cumsum(rng.exponential(1 / draw(st.floats(1.0, 60.0)), n))
    groups = rng.integers(-1, 3, n) if draw(st.booleans()) else np.full(n, -1)
    reqs = [
        Request(i, float(times[i]), int(rng.integers(1, 500)), 400, int(rng.integers(1, 400)),
                int(rng.choice([1, 1, 1, 2])), int(groups[i]), int(rng.integers(0, 200)))
        for i in range(n)
    ]  # fmt: skip
    horizon = draw(
        st.sampled_from(
            [Horizon(drain=True, duration_s=1e6), Horizon(duration_s=float(times[-1]) * 0.6 + 0.5),
             Horizon(max_requests=n), Horizon(duration_s=float(times[-1]) + 1, drain=True, max_waiting=4)]
        )
    )  # fmt: skip
    return config, budget, reqs, horizon, seed


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_generated_scenarios_give_the_same_records_in_bulk(
    case: tuple[VllmConfig, KvBudget, list[Request], Horizon, int],
) -> None:
    config, budget, reqs, horizon, _ = case
    slow = _records(VllmScheduler(config, budget), reqs, horizon)
    sched = VllmScheduler(config, budget, fast=True)
    fast = _records(sched, reqs, horizon)
    _assert_same(slow, fast)
    # every block lent to a sequence in bulk reached its table: none left over, the pool's count whole
    held = {id(b) for s in sched.running for b in s.kv_blocks or ()}  # shared prefix blocks once
    assert sched._lent == [] and len(held) + sched.kv.num_free == budget.num_blocks - 1


def test_a_long_lone_decode_is_advanced_in_bulk() -> None:
    """One request decoding alone for 1,000 steps: its token times are the step ends and its KV grows one
    token a step, as a hand count says."""
    budget = KvBudget(200, 16, 4096)
    sched = VllmScheduler(VllmConfig(), budget, fast=True)
    req = Request(0, 0.0, 100, 1000, 1000)
    out = simulate(sched, COST.step_time, Horizon(max_requests=1), open_loop=iter([req]))
    steps = out.recorder.steps_frame()
    ends = (steps["start"] + steps["duration"]).to_list()
    assert steps.height == 1000  # a prefill that emits the first token, then 999 decodes
    assert req.first_token_at == ends[0] and req.finished_at == ends[-1] == req.last_token_at
    gaps = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    assert req.itl_max == max(gaps)
    assert steps["kv_used"].to_list() == [100 + k for k in range(1000)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 10, allow_nan=False, width=32), min_size=1, max_size=60),
    st.data(),
)
def test_suffix_max_answers_the_largest_gap_since_any_step(values: list[float], data: st.DataObject) -> None:
    """The bulk sequences' largest step gap (`SuffixMax`) is `max` over the steps since theirs, with values
    dropped before a step no query reaches back to."""
    from sim.engine.schedulers.vllm.bulk import SuffixMax

    stack, kept_from = SuffixMax(), 0
    for step, value in enumerate(values):
        stack.append(step, value)
        if data.draw(st.booleans()):
            kept_from = data.draw(st.integers(kept_from, step))
            stack.drop_before(kept_from)
        first = data.draw(st.integers(kept_from, step))
        assert stack.since(first) == max(values[first : step + 1])
