"""The step sums a plan carries for the cost model, named, against sums of its own row arrays."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.policies import ContinuousConfig, VllmConfig
from sim.core.request import Request
from sim.core.step import StepTotals
from sim.cost.memory import KvBudget
from sim.engine.kv import BlockPool
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.vllm.scheduler import VllmScheduler

MEMORY = KvBudget(num_blocks=60, block_size=16, max_model_len=1024)


def _sums(new: np.ndarray, ctx: np.ndarray) -> tuple[int, ...]:
    return (len(new), int(new.sum()), int((new == 1).sum()), int((new * ctx).sum()), int((new * new).sum()),
            int(ctx.sum()))  # fmt: skip


@pytest.mark.parametrize("policy", ["vllm", "continuous"])
def test_plan_totals_are_the_sums_of_its_rows(policy: str) -> None:
    if policy == "vllm":
        sched = VllmScheduler(VllmConfig(max_num_seqs=6, max_num_batched_tokens=100), MEMORY)
    else:
        sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=6), MEMORY)
    rng = np.random.default_rng(0)
    for i in range(12):
        sched.add(Request(i, 0.0, int(rng.integers(5, 120)), 60, int(rng.integers(1, 60))), 0.0)
    now, seen = 0.0, 0
    while (plan := sched.schedule(now)) is not None:
        totals = plan.totals  # type: ignore[attr-defined]
        assert isinstance(totals, StepTotals)
        new, ctx = plan.new_tokens, plan.context
        assert totals[:6] == _sums(new, ctx)
        assert totals.max_end >= int((new + ctx).max())
        assert plan.batch_size == totals.rows
        now += 0.01
        sched.update(plan, now)
        seen += 1
    assert seen > 20


def test_block_pool_counts_free_blocks_and_finds_cached_content() -> None:
    pool = BlockPool(5)
    assert pool.num_free == 4
    taken = pool.take(3)
    assert pool.num_free == 1
    pool.cache(taken[0], "k")
    assert pool.lookup("k") is taken[0] and pool.lookup("other") is None
    pool.release(taken)
    assert pool.num_free == 4
    assert pool.lookup("k") is taken[0]  # freed, still cached until taken again
    pool.take(4)
    assert pool.lookup("k") is None
