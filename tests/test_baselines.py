"""The field's baseline schedulers reproduce schedules worked by hand from the sources they follow."""

from __future__ import annotations

import pytest

from sim.config.policies import ContinuousConfig, OrcaConfig, VllmV0Config
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.buddy import BuddyAllocator
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.orca import OrcaScheduler
from sim.engine.schedulers.vllm_v0 import VllmV0Scheduler

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


def test_vllm_v0_prefills_alone_and_preempts_the_newest_by_recompute() -> None:
    """A schedule worked by hand from Sarathi-Serve's `sarathi/core/scheduler/vllm_scheduler.py`.

    6 blocks of 4 slots, a 16-token budget (max_model_len), no watermark. A and B (8-token prompts, 3 tokens
    out) and C (4, 2 out) arrive at once.
    - step 0: A and B prefill (2 blocks each); C would take the step past 16 tokens (lines 65-67).
    - step 1: C prefills alone; A and B wait (lines 80-86: a step with admissions is theirs alone).
    - step 2: decodes, oldest first. A takes the last free block (its 9th token); B finds none, so the newest
      one not yet scheduled, C, is preempted (lines 107-112) and B takes the block it freed.
    - step 3: C needs 2 blocks, none free. A needs no new block, but `can_append_slot` asks for any free one
      (block manager lines 94-96): B is preempted, and A decodes its last token alone.
    - step 4: B (in front: preempted last, `waiting.insert(0, ...)`) recomputes 8 + 2 tokens, C 4 + 1, in one
      prefill step, and each emits its last token.
    """
    config = VllmV0Config(watermark=0.0)
    sched = VllmV0Scheduler(config, KvBudget(num_blocks=6, block_size=4, max_model_len=16))
    a, b, c = Request(0, 0.0, 8, 3, 3), Request(1, 0.0, 8, 3, 3), Request(2, 0.0, 4, 2, 2)
    for req in (a, b, c):
        assert sched.add(req, 0.0)
    steps = []
    for k in range(6):
        plan = sched.schedule(float(k))
        if plan is None:
            break
        steps.append(
            (plan.new_tokens.tolist(), plan.context.tolist(), plan.num_prefill_tokens, plan.preempted)
        )
        sched.update(plan, float(k + 1))
    assert steps == [
        ([8, 8], [0, 0], 16, 0),
        ([4], [0], 4, 0),
        ([1, 1], [8, 8], 0, 1),
        ([1], [9], 0, 1),
        ([10, 5], [0, 0], 15, 0),
    ]
    assert (a.finished_at, b.finished_at, c.finished_at) == (4.0, 5.0, 5.0)
    assert (a.preemptions, b.preemptions, c.preemptions) == (0, 1, 1)
    assert sched.free_blocks == 6 and not sched.running and not sched.waiting


def test_vllm_v0_rejects_what_it_cannot_run() -> None:
    sched = VllmV0Scheduler(VllmV0Config(max_num_batched_tokens=12), KvBudget(64, 4, 16))
    assert not sched.add(Request(0, 0.0, 8, 6, 6), 0.0)  # 14 > 12: could not be recomputed in one prefill
    assert not sched.add(Request(1, 0.0, 4, 4, 4, n=2), 0.0)
    assert sched.add(Request(2, 0.0, 8, 4, 4), 0.0)
    # 4 blocks of 4, watermark 0 (1% of 4): a request holding all of them leaves no free block to decode into
    tiny = VllmV0Scheduler(VllmV0Config(max_num_batched_tokens=16), KvBudget(4, 4, 16))
    assert not tiny.add(Request(3, 0.0, 8, 8, 8), 0.0)
    assert tiny.add(Request(4, 0.0, 8, 4, 4), 0.0)
