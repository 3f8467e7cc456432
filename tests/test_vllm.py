"""The vllm scheduler: vLLM v1's rules, step by step, and invariants over random traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.policies import SarathiConfig, VllmConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.kv import StackPool
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.registry import load_all
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.records.summary import Slo, summarize


def make(num_blocks: int = 100, max_model_len: int = 4096, **knobs: object) -> VllmScheduler:
    return VllmScheduler(VllmConfig(**knobs), KvBudget(num_blocks, 16, max_model_len))


def req(i: int, prompt: int, out: int, n: int = 1, group: int = -1, prefix: int = 0) -> Request:
    return Request(i, 0.0, prompt, out, out, n=n, prefix_group=group, prefix_len=prefix)


def rows(s: VllmScheduler) -> list[tuple[int, int]]:
    return [(seq.req.id, n) for seq, n in s.last.rows]


def step(s: VllmScheduler, now: float = 0.0) -> list[Request]:
    plan = s.schedule(now)
    return s.update(plan, now) if plan is not None else []


def test_registered_with_presets() -> None:
    policies = load_all()
    assert policies["vllm"].config is VllmConfig
    assert policies["sarathi"].config is SarathiConfig
    assert SarathiConfig().max_num_batched_tokens < VllmConfig().max_num_batched_tokens


def test_chunked_prefill_then_decode_and_finish() -> None:
    s = make(max_num_batched_tokens=64)
    r = req(0, 100, 3)
    assert s.add(r, 0.0)
    plan = s.schedule(0.0)
    assert plan is not None and plan.new_tokens.tolist() == [64] and plan.context.tolist() == [0]
    assert s.update(plan, 1.0) == [] and r.num_generated == 0
    plan = s.schedule(1.0)
    assert plan is not None and plan.new_tokens.tolist() == [36] and plan.context.tolist() == [64]
    s.update(plan, 2.0)
    assert r.num_generated == 1 and r.first_token_at == 2.0 and r.scheduled_at == 0.0
    step(s, 3.0)
    assert step(s, 4.0) == [r] and r.finished_at == 4.0
    assert s.kv.num_free == 99 and s.in_flight() == []


def test_long_prefill_threshold_caps_chunks() -> None:
    s = make(max_num_batched_tokens=512, long_prefill_token_threshold=100)
    s.add(req(0, 250, 2), 0.0)
    s.add(req(1, 30, 1), 0.0)
    step(s)
    assert rows(s) == [(0, 100), (1, 30)]
    step(s)  # request 1 finished: request 0, alone now, gets its remaining 150 tokens at once
    assert rows(s) == [(0, 150)]


def test_long_prefill_threshold_off_for_a_lone_request() -> None:
    # vLLM 0.32 scheduler.py: the threshold is 0 unless more than one request is running or waiting
    s = make(max_num_batched_tokens=1024, long_prefill_token_threshold=256)
    s.add(req(0, 864, 3), 0.0)
    step(s)
    assert rows(s) == [(0, 864)]
    s = make(max_num_batched_tokens=1024, long_prefill_token_threshold=256)
    s.add(req(0, 864, 3), 0.0)
    s.add(req(1, 900, 3), 0.0)
    step(s)
    assert rows(s) == [(0, 256), (1, 256)]
    s.add(req(2, 20, 1), 1.0)
    step(s, 1.0)  # the threshold also caps the running requests' chunks
    assert rows(s) == [(0, 256), (1, 256), (2, 20)]


def test_admission_needs_whole_sequence_and_blocks_head_of_line() -> None:
    s = make(num_blocks=11, max_num_batched_tokens=32)  # 10 usable blocks
    s.add(req(0, 120, 20), 0.0)  # 8 blocks for the whole prompt, though only 2 are allocated now
    s.add(req(1, 48, 5), 0.0)  # 3 blocks: does not fit beside request 0
    s.add(req(2, 8, 5), 0.0)
    for _ in range(4):
        step(s)
    assert all(seq.req.id == 0 for seq in s.running)
    assert [seq.req.id for seq in s.waiting] == [1, 2]  # request 2 would fit but waits behind 1


def test_watermark_holds_blocks_back_at_admission() -> None:
    s = VllmScheduler(VllmConfig(), KvBudget(11, 16, 4096), watermark_blocks=3)  # 10 usable blocks
    s.add(req(0, 100, 5), 0.0)  # 7 blocks, admitted with none running
    s.add(req(1, 10, 5), 0.0)  # 1 + 3 watermark > 3 free beside a running request: waits
    step(s)
    assert rows(s) == [(0, 100)]


def test_watermark_ignored_while_nothing_runs() -> None:
    # vLLM 0.32 kv_cache_manager.py allocate_slots: the watermark applies only with has_scheduled_reqs
    s = VllmScheduler(VllmConfig(), KvBudget(11, 16, 4096), watermark_blocks=3)  # 10 usable blocks
    lone = req(0, 150, 2)  # 10 blocks: fits only without the watermark
    assert s.add(lone, 0.0)
    step(s)
    assert rows(s) == [(0, 150)]
    s.add(req(1, 10, 2), 1.0)
    step(s, 1.0)
    step(s, 2.0)  # request 0 finished; request 1 is admitted alone again, watermark or not
    assert rows(s) == [(1, 10)]


def test_preemption_recomputes_from_the_front_of_the_queue() -> None:
    s = make(num_blocks=6, max_num_batched_tokens=256)  # 5 usable blocks
    a, b = req(0, 32, 40), req(1, 32, 40)
    s.add(a, 0.0)
    s.add(b, 0.0)
    step(s)
    assert rows(s) == [(0, 32), (1, 32)]
    t = 1.0
    while not s.last.preempted:
        step(s, t)
        t += 1
    assert [seq.req.id for seq in s.last.preempted] == [1]
    assert s.last.new == [] and s.last.resumed == []  # no admission in a step that preempted
    assert s.waiting[0].req is b and b.preemptions == 1 and b.num_generated > 0
    kept = b.num_generated
    while not s.last.resumed:
        step(s, t)
        t += 1
    assert rows(s)[-1] == (1, 32 + kept)  # recomputes prompt and kept tokens
    while s.in_flight():
        step(s, t)
        t += 1
    assert a.num_generated == b.num_generated == 40


def test_no_chunked_prefill_stops_admission_at_a_prompt_over_budget() -> None:
    s = make(max_model_len=256, max_num_batched_tokens=256, enable_chunked_prefill=False)
    s.add(req(0, 200, 5), 0.0)
    s.add(req(1, 100, 5), 0.0)
    s.add(req(2, 10, 5), 0.0)
    step(s)
    assert rows(s) == [(0, 200)]


def test_rejections_at_add() -> None:
    s = make(num_blocks=11, max_model_len=1000)
    too_long = req(0, 1000, 5)
    assert not s.add(too_long, 0.0) and "max_model_len" in (too_long.reject_reason or "")
    too_big = req(1, 200, 5)
    assert not s.add(too_big, 0.0) and "blocks" in (too_big.reject_reason or "")
    capped = req(2, 990, 50)
    s2 = make(num_blocks=100, max_model_len=1000)
    assert s2.add(capped, 0.0) and capped.output_len == 10


def test_rejection_reasons_are_one_per_cause_not_per_length() -> None:
    """The summary counts rejections by reason: requests of different lengths rejected for one cause give
    one reason (their lengths stay in their records)."""
    s = make(num_blocks=11, max_model_len=1000)
    reasons = set()
    for i, (prompt, output) in enumerate([(1000, 5), (1200, 5), (3000, 9)]):
        r = req(i, prompt, output)
        assert not s.add(r, 0.0)
        reasons.add(r.reject_reason)
    assert reasons == {"prompt leaves no room for output within max_model_len 1000"}
    reasons = set()
    # 10 usable blocks (one is vLLM's null block): 160 tokens
    for i, (prompt, output) in enumerate([(150, 100), (120, 200)]):
        r = req(10 + i, prompt, output)
        assert not s.add(r, 0.0)
        reasons.add(r.reject_reason)
    assert reasons == {"prompt and output need more than the 10 KV blocks"}


def test_prefix_cache_hits_count_as_context() -> None:
    s = make(enable_prefix_caching=True)
    s.add(req(0, 100, 2, group=7, prefix=64), 0.0)
    step(s)
    r = req(1, 80, 2, group=7, prefix=64)
    s.add(r, 1.0)
    plan = s.schedule(1.0)
    assert plan is not None and rows(s) == [(0, 1), (1, 16)]
    assert plan.context.tolist() == [100, 64] and r.prefix_hit_tokens == 64
    assert s.kv.hit_tokens == 64


def test_parallel_sampling_shares_the_prompt_through_the_cache() -> None:
    s = make(enable_prefix_caching=True)
    r = req(0, 40, 3, n=3)
    s.add(r, 0.0)
    step(s)
    assert rows(s) == [(0, 40), (0, 8), (0, 8)]  # 2 full prompt blocks shared, partial block per sequence
    assert s.kv.num_free == 99 - 2 - 3
    assert r.num_generated == 1
    step(s, 1.0)
    assert step(s, 2.0) == [r] and r.num_generated == 3 and s.kv.num_free == 99


def constant_step(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return 0.01, False


def summary_of(s: VllmScheduler, reqs: list[Request]) -> dict:
    out = simulate(s, constant_step, Horizon(max_requests=len(reqs), drain=True), open_loop=iter(reqs))
    return summarize(out.recorder.requests_frame(), out.recorder.steps_frame(), out.end_time, Slo(), False)


def test_prefix_hit_rate_of_parallel_sampling_counts_each_lookup() -> None:
    # n = 4, no shared prefix: the first sequence finds nothing, the other three find the 6 full blocks
    # below the last prompt token: 3 * 96 of 4 * 100 tokens looked up (vLLM's queries and hits)
    s = make(enable_prefix_caching=True)
    r = req(0, 100, 5, n=4)
    summary = summary_of(s, [r])
    assert (r.prefix_hit_tokens, r.prefix_query_tokens) == (3 * 96, 4 * 100)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(0.72)


def test_prefix_hit_rate_leaves_out_lookups_after_a_preemption() -> None:
    # vLLM 0.32 PrefixCacheStats.record: a preempted request's lookups go to preempted_queries/_hits, which
    # neither the logged hit rate nor the prefix_cache_queries/hits counters include
    s = make(num_blocks=8, max_num_batched_tokens=256, enable_prefix_caching=True)  # 7 usable blocks
    a, b = req(0, 32, 40), req(1, 32, 40)
    s.add(a, 0.0)
    s.add(b, 0.0)
    t = 0.0
    while not s.last.resumed:
        step(s, t)
        t += 1
    assert b.preemptions == 1
    (resumed, n), context = s.last.rows[-1], s.last.contexts[-1]
    assert resumed.req is b and context > 0 and context + n == 32 + b.num_generated - 1  # emitted since
    assert (b.prefix_query_tokens, b.prefix_hit_tokens) == (32, 0)  # its first lookup only
    assert (s.kv.preempted_query_tokens, s.kv.preempted_hit_tokens) == (context + n, context)
    while s.in_flight():
        step(s, t)
        t += 1
    assert (s.kv.query_tokens, s.kv.hit_tokens) == (64, 0)


def test_prefix_hit_rate_is_zero_without_caching() -> None:
    s = make()
    r = req(0, 100, 3, n=2)
    assert summary_of(s, [r])["prefix_cache_hit_rate"] == 0.0
    assert r.prefix_query_tokens == 0


@settings(max_examples=40, deadline=None)
@given(
    trace=st.lists(
        st.tuples(
            st.integers(1, 300),
            st.integers(1, 40),
            st.integers(1, 4),
            st.integers(-1, 1),
            st.integers(0, 200),
        ),
        min_size=1,
        max_size=12,
    ),
    num_blocks=st.integers(30, 120),
)
def test_prefix_hit_rate_lies_in_unit_interval(
    trace: list[tuple[int, int, int, int, int]], num_blocks: int
) -> None:
    s = VllmScheduler(
        VllmConfig(max_num_batched_tokens=256, enable_prefix_caching=True), KvBudget(num_blocks, 16, 512)
    )
    reqs = [
        Request(i, 0.001 * i, p, m, m, n=n, prefix_group=g, prefix_len=pl)
        for i, (p, m, n, g, pl) in enumerate(trace)
    ]
    rate = summary_of(s, reqs)["prefix_cache_hit_rate"]
    assert 0.0 <= rate <= 1.0
    for r in reqs:
        assert 0 <= r.prefix_hit_tokens <= r.prefix_query_tokens
    if all(r.finished_at == r.finished_at for r in reqs):  # every lookup belongs to a finished request
        assert rate == pytest.approx(s.kv.hit_tokens / s.kv.query_tokens if s.kv.query_tokens else 0.0)
        first_lookups = sum(r.prompt_len * r.n for r in reqs)  # one per sequence, of its whole prompt
        assert s.kv.query_tokens == first_lookups


def test_token_times_match_request_emit() -> None:
    s = make(max_num_batched_tokens=64)
    r, shadow = req(0, 100, 6), req(0, 100, 6)
    s.add(r, 0.0)
    t = 0.0
    while s.in_flight():
        before = r.num_generated
        step(s, t)
        if r.num_generated > before:
            shadow.emit(t)
        t += 0.5 + 0.25 * (t % 2)
    fields = ("num_generated", "first_token_at", "last_token_at", "itl_max", "finished_at")
    assert [getattr(r, f) for f in fields] == [getattr(shadow, f) for f in fields]


def test_kv_usage_reports_fragmentation() -> None:
    s = make()
    s.add(req(0, 20, 5), 0.0)
    plan = s.schedule(0.0)
    assert plan is not None
    assert (plan.kv.used, plan.kv.allocated, plan.kv.capacity) == (20, 32, 99 * 16)


trace_strategy = st.lists(
    st.tuples(
        st.integers(0, 30),  # arrival step
        st.integers(1, 300),  # prompt
        st.integers(1, 60),  # max tokens
        st.integers(1, 3),  # n
        st.integers(-1, 2),  # prefix group
        st.integers(0, 200),  # prefix len
    ),
    min_size=1,
    max_size=25,
)


def blocks_in_use(s: VllmScheduler) -> int:
    """Blocks held by sequences: by reference count with a prefix cache; without one, where blocks are bare
    ids, the ids in the sequences' tables, each held once and none of them free as well."""
    pool = s.kv.pool
    if isinstance(pool, StackPool):
        held = [b for q in [*s.running, *s.waiting] for b in q.kv_blocks or ()]
        assert len(set(held)) == len(held) and not set(held) & set(pool._stack)
        assert all(0 < b < pool.num_blocks for b in held)
        return len(held)
    return sum(1 for b in pool.blocks[1:] if b.ref > 0)


@settings(max_examples=150, deadline=None)
@given(
    trace=trace_strategy,
    block_size=st.sampled_from([1, 4, 16, 32]),
    num_blocks=st.integers(30, 400),
    max_num_seqs=st.integers(1, 12),
    budget=st.integers(16, 600),
    chunked=st.booleans(),
    caching=st.booleans(),
    threshold=st.sampled_from([0, 0, 17, 128]),
    watermark=st.sampled_from([0.0, 0.0, 0.05]),
)
def test_invariants_every_step(
    trace: list[tuple[int, int, int, int, int, int]],
    block_size: int,
    num_blocks: int,
    max_num_seqs: int,
    budget: int,
    chunked: bool,
    caching: bool,
    threshold: int,
    watermark: float,
) -> None:
    max_model_len = 512
    if not chunked:
        budget = max(budget, max_model_len)
    config = VllmConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=caching,
        long_prefill_token_threshold=threshold,
        watermark=watermark,
    )
    s = VllmScheduler(config, KvBudget(num_blocks, block_size, max_model_len))
    reqs = [req(i, p, m, n, g, pl) for i, (_, p, m, n, g, pl) in enumerate(trace)]
    arrivals = sorted(range(len(trace)), key=lambda i: trace[i][0])
    accepted: list[Request] = []
    pool = s.kv.pool
    head, t = 0, 0
    while head < len(arrivals) or s.in_flight():
        assert t < 20_000, "no progress"
        while head < len(arrivals) and trace[arrivals[head]][0] <= t:
            r = reqs[arrivals[head]]
            if s.add(r, float(t)):
                accepted.append(r)
            head += 1
        plan = s.schedule(float(t))
        in_use = blocks_in_use(s)
        assert in_use + pool.num_free == num_blocks - 1
        assert len(s.running) <= max_num_seqs
        if plan is not None:
            assert 0 < int(plan.new_tokens.sum()) <= budget
            assert (plan.new_tokens > 0).all()
            assert 0 <= plan.kv.used <= plan.kv.allocated <= plan.kv.capacity
            s.update(plan, float(t) + 0.5)
        in_use = blocks_in_use(s)
        assert in_use + pool.num_free == num_blocks - 1
        held = [q for q in s.running if q.kv_blocks is not None]
        assert len(held) == len(s.running) and all(q.kv_blocks is None for q in s.waiting)
        assert s.kv.waste == sum(len(q.kv_blocks or ()) * block_size - q.kv_slots for q in held)
        assert all(q.kv_slots <= q.kv_room or q.kv_room == -1 for q in held)
        for r in accepted:
            assert r.num_generated <= r.max_tokens
        t += 1
    for r in accepted:
        assert r.num_generated == r.output_len and r.finished_at == r.finished_at
    assert pool.num_free == num_blocks - 1 and s.kv.waste == 0
