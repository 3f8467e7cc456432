"""Paged KV block manager: accounting, LRU eviction order, prefix-cache hits."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import pytest

from sim.engine.kv import Block, BlockPool, KvManager


@dataclass
class Toks:
    sid: int
    length: int
    group: str = ""
    num_computed: int = 0
    kv_blocks: list[Block] | None = None
    kv_slots: int = 0
    kv_cached: int = 0
    kv_room: int = -1

    @property
    def num_tokens(self) -> int:
        return self.length

    def block_hash(self, j: int) -> Hashable:
        return (self.group or self.sid, j)


def test_block_zero_is_reserved() -> None:
    pool = BlockPool(10)
    assert pool.num_free == 9
    assert all(b.id != 0 for b in pool.take(9))
    assert pool.num_free == 0
    with pytest.raises(RuntimeError):
        pool.take(1)


def test_allocate_on_demand_and_free() -> None:
    kv = KvManager(11, 16, 4096, caching=False)
    seq = Toks(1, 40)
    assert kv.allocate(seq, 20)
    assert kv.num_free == 8 and kv.held(seq) == 2
    seq.num_computed = 20
    assert kv.allocate(seq, 20)  # 40 slots: 3 blocks
    assert kv.held(seq) == 3 and kv.num_free == 7
    assert kv.waste == 3 * 16 - 40
    assert kv.allocated == 48 and kv.capacity == 160
    kv.free(seq)
    assert kv.num_free == 10 and kv.waste == 0 and kv.allocated == 0


def test_allocation_fails_without_side_effects() -> None:
    kv = KvManager(5, 16, 4096, caching=False)
    assert not kv.allocate(Toks(1, 100), 65)
    assert kv.num_free == 4
    assert kv.allocate(Toks(2, 100), 64)
    assert kv.num_free == 0


def test_prefix_hits_full_blocks_capped_below_length() -> None:
    kv = KvManager(20, 16, 4096, caching=True)
    a = Toks(1, 64, group="g")
    assert kv.allocate(a, 64)
    b = Toks(2, 64, group="g")
    hits, tokens = kv.lookup(b)
    assert tokens == 48  # capped at 63 tokens: 3 full blocks
    c = Toks(3, 65, group="g")
    assert kv.lookup(c)[1] == 64
    assert kv.allocate(b, 64 - tokens, hits, tokens)
    assert kv.held(b) == 4 and kv.num_free == 19 - 5  # 3 shared blocks, 1 own


def test_freed_blocks_stay_cached_and_tail_is_evicted_first() -> None:
    kv = KvManager(7, 16, 4096, caching=True)  # 6 usable blocks
    a = Toks(1, 64, group="g")
    assert kv.allocate(a, 64)
    kv.free(a)
    assert kv.num_free == 6
    assert kv.lookup(Toks(2, 100, group="g"))[1] == 64
    other = Toks(3, 48)
    assert kv.allocate(other, 48)  # 2 never-used blocks, then a's tail block
    assert kv.lookup(Toks(4, 100, group="g"))[1] == 48
    assert kv.allocate(Toks(5, 16), 16)  # evicts a's third block
    assert kv.lookup(Toks(6, 100, group="g"))[1] == 32


def test_touching_a_cached_free_block_counts_against_free() -> None:
    kv = KvManager(7, 16, 4096, caching=True)
    a = Toks(1, 32, group="g")
    assert kv.allocate(a, 32)
    kv.free(a)
    b = Toks(2, 48, group="g")
    hits, tokens = kv.lookup(b)
    assert tokens == 32 and kv.blocks_needed(b, 48, hits) == 3
    assert kv.allocate(b, 16, hits, tokens)
    assert kv.num_free == 3


def test_hit_rate_metrics() -> None:
    kv = KvManager(20, 16, 4096, caching=True)
    a = Toks(1, 40, group="g")
    kv.record_query(a, 0)
    assert kv.allocate(a, 40)
    b = Toks(2, 40, group="g")
    _, tokens = kv.lookup(b)
    kv.record_query(b, tokens)
    assert (kv.query_tokens, kv.hit_tokens) == (80, 32)


def test_freed_uncached_blocks_are_reused_before_any_cached_one() -> None:
    # vLLM BlockPool.free_blocks: blocks without a hash go to the free queue's head, hashed ones to its tail
    kv = KvManager(9, 16, 4096, caching=True)  # 8 usable blocks
    a = Toks(1, 40, group="g")  # two full (cached) blocks and a partial one
    assert kv.allocate(a, 40)
    partial = a.kv_blocks[2]  # type: ignore[index]
    kv.free(a)
    taken = kv.pool.take(1)
    assert taken == [partial]  # not one of the 5 never-used blocks queued ahead of it
    assert kv.lookup(Toks(2, 100, group="g"))[1] == 32  # both cached blocks survive
    kv.pool.take(5)  # the never-used blocks go next
    assert kv.lookup(Toks(3, 100, group="g"))[1] == 32
    kv.pool.take(1)  # then the tail's cached block is evicted first
    assert kv.lookup(Toks(4, 100, group="g"))[1] == 16


def test_without_caching_freed_blocks_are_reused_last_freed_first() -> None:
    kv = KvManager(6, 16, 4096, caching=False)
    a = Toks(1, 32)
    assert kv.allocate(a, 32)
    first, second = a.kv_blocks  # type: ignore[misc]
    kv.free(a)
    assert kv.pool.take(2) == [second, first]  # tail first, ahead of the never-used blocks


def test_without_caching_blocks_are_bare_ids_in_a_stack() -> None:
    """No prefix cache: a block is its id (no object, no reference count), taken from a stack."""
    kv = KvManager(8, 16, 4096, caching=False)  # 7 usable blocks
    a, b = Toks(1, 40), Toks(2, 20)
    assert kv.allocate(a, 40) and kv.allocate(b, 20)
    assert a.kv_blocks == [1, 2, 3] and b.kv_blocks == [4, 5]
    kv.free(a)
    assert kv.pool.take(3) == [3, 2, 1] and kv.num_free == 2
