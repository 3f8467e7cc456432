"""The field's baseline schedulers reproduce schedules worked by hand from the sources they follow."""

from __future__ import annotations

import pytest

from sim.config.policies import ContinuousConfig, OrcaConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.buddy import BuddyAllocator
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.orca import OrcaScheduler

# 20 blocks of 16 slots, sequences up to 128 tokens: two 128-slot buddies of 8 blocks, 4 blocks left over.
SMALL = KvBudget(num_blocks=20, block_size=16, max_model_len=128)


def admissions(sched: Scheduler, requests: list[Request], steps: int) -> list[list[int]]:
    """Add every request at t = 0, run `steps` unit steps; the ids each step admitted."""
    for req in requests:
        assert sched.add(req, 0.0)
    out: list[list[int]] = []
    for k in range(steps):
        plan = sched.schedule(float(k))
        if plan is None:
            out.append([])
            continue
        out.append([r.id for r in plan.payload])
        sched.update(plan, float(k + 1))
    return out


def same(count: int, prompt: int, output: int, max_tokens: int = 100) -> list[Request]:
    return [Request(i, 0.0, prompt, max_tokens, output) for i in range(count)]


@pytest.mark.parametrize(("rule", "admitted"), [("oracle", 8), ("pow2", 4), ("max", 2)])
def test_orca_reservations_as_the_vllm_paper_defines_them(rule: str, admitted: int) -> None:
    """vLLM paper §6.1: oracle reserves the true output (20 + 10 = 30 slots: 2 blocks), pow2 the output
    rounded up to a power of two (20 + 16 = 36: 3 blocks, a 4-block piece), max the longest sequence (128).
    Two 8-block buddies hold 8, 4 and 2 of them; the 4 blocks past the last buddy are never used."""
    sched = OrcaScheduler(OrcaConfig(reservation=rule), SMALL)  # type: ignore[arg-type]
    steps = admissions(sched, same(10, 20, 10), 1)
    assert steps[0] == list(range(admitted))
    assert sched.kv.capacity == 256
    assert sched.kv.reserved == 128 * 2  # every buddy held whole


def test_continuous_reserves_prompt_plus_max_tokens_exactly() -> None:
    """The `continuous` rule for contrast: 20 + 100 = 120 slots each, 320 slots in all: two fit."""
    sched = ContinuousScheduler(ContinuousConfig(), SMALL)
    assert admissions(sched, same(10, 20, 10), 1)[0] == [0, 1]


def test_orca_oracle_waits_for_a_whole_piece_not_free_slots() -> None:
    """External fragmentation in the buddy allocator, worked by hand.

    A (100 + 10 = 110 slots: 7 blocks, an 8-block piece) takes buddy 0; B (10 + 6 = 16: 1 block) splits
    buddy 1; C (as A) finds 7 free blocks but no free 8-block piece, and head-of-line blocking holds it. B
    prefills at step 0 and emits its 6th token at step 5 (continuous.py: it finishes at step k + output - 1),
    its piece merges back into a whole buddy, and C is admitted at step 6.
    """
    a, b, c = Request(0, 0.0, 100, 20, 10), Request(1, 0.0, 10, 20, 6), Request(2, 0.0, 100, 20, 10)
    sched = OrcaScheduler(OrcaConfig(reservation="oracle"), SMALL)
    steps = admissions(sched, [a, b, c], 8)
    assert steps == [[0, 1], [], [], [], [], [], [2], []]
    assert b.finished_at == 6.0 and c.scheduled_at == 6.0


def test_buddy_allocator_splits_and_merges() -> None:
    """Knuth's buddy system on two 8-block buddies: lowest fitting start first, buddies merge when freed."""
    alloc = BuddyAllocator(num_blocks=16, buddy_blocks=8)
    assert alloc.allocate(0) == 0  # splits buddy 0 into [0] [1] [2,4) [4,8)
    assert alloc.allocate(2) == 4
    assert alloc.allocate(1) == 2
    assert alloc.allocate(3) == 8  # buddy 1 whole
    assert alloc.allocate(1) is None and alloc.free_blocks == 1
    alloc.free(0, 0)
    alloc.free(2, 1)
    alloc.free(4, 2)  # 0 merges with 1, then with [2,4), then with [4,8): buddy 0 whole again
    assert alloc.allocate(3) == 0
