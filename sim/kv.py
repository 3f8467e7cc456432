"""Paged KV cache: a block pool with vLLM v1's prefix cache, and a per-sequence block manager.

Semantics follow vLLM v1 (`block_pool.py`, `single_type_kv_cache_manager.py`, `kv_cache_manager.py`):

- Block 0 is the reserved null block, so `num_blocks - 1` blocks are usable.
- Free blocks wait in one LRU queue; allocation takes from its head. A freed block keeps its hash (it stays
  a cache hit until it is taken again); a sequence's blocks are freed tail first, so its tail goes first.
- A full block is cached (hashed) when it is allocated for tokens that fill it; hits count full blocks only,
  capped at `num_tokens - 1` tokens. Touching a cached free block takes it out of the free queue.

Token content is symbolic: a sequence names each block's content through `block_hash(j)`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(slots=True, eq=False)
class Block:
    """One KV block: `ref` sequences hold it; `hash` is set while its content is in the prefix cache."""

    id: int
    ref: int = 0
    hash: Hashable | None = None


class BlockPool:
    """All blocks, the LRU free queue and the hash -> cached blocks map."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is reserved)")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks[1:])
        self._cache: dict[Hashable, dict[int, Block]] = {}

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks not held by any sequence (cached-but-unreferenced blocks included)."""
        return len(self._free)

    def take(self, n: int) -> list[Block]:
        """Pop `n` blocks from the head of the free queue, evicting their cached content."""
        if n > len(self._free):
            raise RuntimeError(f"cannot take {n} blocks, {len(self._free)} free")
        out: list[Block] = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.hash is not None:
                self._evict(block)
            block.ref = 1
            out.append(block)
        return out

    def release(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block; unreferenced ones join the free queue's tail in this order."""
        for block in blocks:
            block.ref -= 1
            if block.ref == 0:
                self._free[block.id] = block

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on cache-hit blocks, removing free ones from the free queue."""
        for block in blocks:
            if block.ref == 0:
                del self._free[block.id]
            block.ref += 1

    def lookup(self, key: Hashable) -> Block | None:
        """The first cached block holding `key`, if any."""
        found = self._cache.get(key)
        return next(iter(found.values())) if found else None

    def cache(self, block: Block, key: Hashable) -> None:
        block.hash = key
        self._cache.setdefault(key, {})[block.id] = block

    def _evict(self, block: Block) -> None:
        found = self._cache.get(block.hash)
        if found is not None:
            found.pop(block.id, None)
            if not found:
                del self._cache[block.hash]
        block.hash = None


class Tokens(Protocol):
    """What the block manager needs to know about a sequence."""

    sid: int
    num_computed: int

    @property
    def num_tokens(self) -> int: ...

    def block_hash(self, j: int) -> Hashable: ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KvManager:
    """Blocks held per sequence, allocation on demand, prefix-cache lookups and fragmentation accounting."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, caching: bool) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.caching = caching
        self._blocks: dict[int, list[Block]] = {}
        self._num_cached: dict[int, int] = {}
        self._slots: dict[int, int] = {}
        self.waste = 0  # unused slots in the sequences' last blocks (internal fragmentation)
        self.query_tokens = 0
        self.hit_tokens = 0

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    @property
    def capacity(self) -> int:
        """Token slots available for KV in total."""
        return self.pool.num_usable * self.block_size

    @property
    def allocated(self) -> int:
        """Token slots in blocks held by sequences (a shared block counts once)."""
        return (self.pool.num_usable - self.pool.num_free) * self.block_size

    def held(self, seq: Tokens) -> int:
        return len(self._blocks.get(seq.sid, ()))

    def lookup(self, seq: Tokens) -> tuple[list[Block], int]:
        """Longest prefix-cache hit for a sequence with nothing computed: (blocks, tokens)."""
        if not self.caching:
            return [], 0
        hits: list[Block] = []
        for j in range((seq.num_tokens - 1) // self.block_size):
            block = self.pool.lookup(seq.block_hash(j))
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_query(self, seq: Tokens, hit_tokens: int) -> None:
        """Count one admission's lookup in the hit-rate metrics."""
        if self.caching:
            self.query_tokens += seq.num_tokens
            self.hit_tokens += hit_tokens

    def blocks_needed(self, seq: Tokens, num_tokens: int, hits: Sequence[Block] = ()) -> int:
        """Free blocks consumed to hold `num_tokens` tokens of `seq` (after taking the cache `hits`)."""
        need = cdiv(min(num_tokens, self.max_model_len), self.block_size)
        need -= len(hits) + self.held(seq)
        return max(need, 0) + sum(1 for b in hits if b.ref == 0)

    def allocate(self, seq: Tokens, num_new: int, hits: Sequence[Block] = (), num_hit: int = 0) -> bool:
        """Give `seq` slots for `num_new` tokens after `num_hit` cached ones; False if blocks are short."""
        computed = seq.num_computed + num_hit
        slots = min(computed + num_new, self.max_model_len)
        blocks = self._blocks.get(seq.sid)
        if blocks is not None and not hits and slots <= len(blocks) * self.block_size:
            # fast path (most decode steps): the last block has room
            self.waste += self._slots[seq.sid] - slots
            self._slots[seq.sid] = slots
            if self.caching and min(slots, seq.num_tokens) // self.block_size > self._num_cached[seq.sid]:
                self._cache_full(seq, blocks, min(computed + num_new, seq.num_tokens))
            return True
        if self.blocks_needed(seq, slots, hits) > self.pool.num_free:
            return False
        old_waste = self._waste_of(seq.sid)
        blocks = self._blocks.setdefault(seq.sid, [])
        if hits:
            self.pool.touch(hits)
            blocks.extend(hits)
        if seq.sid not in self._num_cached:
            self._num_cached[seq.sid] = len(hits)
        more = cdiv(slots, self.block_size) - len(blocks)
        if more > 0:
            blocks.extend(self.pool.take(more))
        self.waste += len(blocks) * self.block_size - slots - old_waste
        self._slots[seq.sid] = slots
        if self.caching:
            self._cache_full(seq, blocks, min(computed + num_new, seq.num_tokens))
        return True

    def free(self, seq: Tokens) -> None:
        """Release every block of `seq`, tail first (its tail is evicted first)."""
        blocks = self._blocks.pop(seq.sid, [])
        self.waste -= self._waste_of(seq.sid, blocks)
        self._slots.pop(seq.sid, None)
        self._num_cached.pop(seq.sid, None)
        self.pool.release(reversed(blocks))

    def _waste_of(self, sid: int, blocks: list[Block] | None = None) -> int:
        if sid not in self._slots:
            return 0
        held = len(blocks) if blocks is not None else len(self._blocks.get(sid, ()))
        return held * self.block_size - self._slots[sid]

    def _cache_full(self, seq: Tokens, blocks: list[Block], num_tokens: int) -> None:
        done = self._num_cached[seq.sid]
        full = num_tokens // self.block_size
        for j in range(done, full):
            self.pool.cache(blocks[j], seq.block_hash(j))
        if full > done:
            self._num_cached[seq.sid] = full
