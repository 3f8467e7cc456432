"""Paged KV cache: a block pool with vLLM v1's prefix cache, and a per-sequence block manager.

Semantics follow vLLM v1 (`block_pool.py`, `single_type_kv_cache_manager.py`, `kv_cache_manager.py`):

- Block 0 is the reserved null block, so `num_blocks - 1` blocks are usable.
- Free blocks wait in one queue; allocation takes from its head. A freed block keeps its hash (it stays
  a cache hit until it is taken again) and joins the tail (LRU eviction); a freed block without cached
  content joins the head, so it is reused before any cached content is evicted. A sequence's blocks are
  freed tail first, so its tail goes first.
- A full block is cached (hashed) when it is allocated for tokens that fill it; hits count full blocks only,
  capped at `num_tokens - 1` tokens. Touching a cached free block takes it out of the free queue.

Token content is symbolic: a sequence names each block's content through `block_hash(j)`. A sequence carries
its own block table (`kv_*` fields), so the per-step work needs no lookups by sequence id.
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
    """All blocks, the LRU free queue and the hash -> cached blocks map.

    The blocks are made when first used (`blocks` or the free queue first read), so a pool that is never
    used (an idle replica of a fleet) holds no block; once made, they are plain attributes."""

    blocks: list[Block]
    _free: OrderedDict[int, Block]
    _made_on_use = ("blocks", "_free")

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is reserved)")
        self.num_blocks = num_blocks
        self._cache: dict[Hashable, dict[int, Block]] = {}

    def __getattr__(self, name: str) -> object:  # only called while an attribute is missing
        made = self.__dict__
        if name not in self._made_on_use or "blocks" in made or "num_blocks" not in made:
            raise AttributeError(name)
        self.blocks = [Block(i) for i in range(self.num_blocks)]
        self._make_free_queue()
        return self.__dict__[name]

    def _make_free_queue(self) -> None:
        self._free = OrderedDict((b.id, b) for b in self.blocks[1:])

    @property
    def num_usable(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        """Blocks not held by any sequence (cached-but-unreferenced blocks included)."""
        return len(self._free)

    def take(self, n: int) -> list[Block]:
        """Pop `n` blocks from the head of the free queue, evicting their cached content."""
        free = self._free
        if n > len(free):
            raise RuntimeError(f"cannot take {n} blocks, {len(free)} free")
        out: list[Block] = []
        cache = self._cache
        for _ in range(n):
            block = free.popitem(last=False)[1]
            if block.hash is not None:  # evict
                found = cache.get(block.hash)
                if found is not None:
                    found.pop(block.id, None)
                    if not found:
                        del cache[block.hash]
                block.hash = None
            block.ref = 1
            out.append(block)
        return out

    def release(self, blocks: Iterable[Block]) -> None:
        """Drop one reference from each block (given in eviction order). Unreferenced blocks without cached
        content go to the free queue's head, to be reused first; cached ones to its tail, so the cache
        evicts least recently used content first (vLLM `BlockPool.free_blocks`)."""
        free = self._free
        uncached: list[Block] = []
        for block in blocks:
            block.ref -= 1
            if block.ref == 0:
                if block.hash is None:
                    uncached.append(block)
                else:
                    free[block.id] = block
        for block in reversed(uncached):
            free[block.id] = block
            free.move_to_end(block.id, last=False)

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
        """Put `block`'s content in the prefix cache under `key`."""
        block.hash = key
        found = self._cache.get(key)
        if found is None:
            self._cache[key] = {block.id: block}
        else:
            found[block.id] = block


class StackPool(BlockPool):
    """The block pool without a prefix cache: no block is ever shared or hashed, so a block is its id (an
    int, no `Block` object or reference count), every freed block goes to the free queue's head and the queue
    is a stack (its head is the list's end). Same block ids in the same order as `BlockPool`, without the
    ordered map. The stack is made when first used, as `BlockPool`'s blocks are."""

    _stack: list[int]

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError("num_blocks must be at least 2 (block 0 is reserved)")
        self.num_blocks = num_blocks

    def __getattr__(self, name: str) -> object:  # only called while the stack is not made yet
        if name != "_stack" or "num_blocks" not in self.__dict__:
            raise AttributeError(name)
        self._stack = list(range(self.num_blocks - 1, 0, -1))  # the head (next taken) last: block 1
        return self._stack

    @property
    def num_free(self) -> int:
        return len(self._stack)

    def take(self, n: int) -> list[int]:  # type: ignore[override]
        stack = self._stack
        if n > len(stack):
            raise RuntimeError(f"cannot take {n} blocks, {len(stack)} free")
        if n <= 0:
            return []
        out = stack[-n:]
        del stack[-n:]
        out.reverse()
        return out

    def release(self, blocks: Iterable[int]) -> None:  # type: ignore[override]
        freed = list(blocks)
        freed.reverse()  # the first given ends at the head
        self._stack.extend(freed)

    def touch(self, blocks: Iterable[Block]) -> None:
        raise RuntimeError("a pool without a prefix cache has no cache hits to touch")

    def lookup(self, key: Hashable) -> Block | None:
        return None

    def cache(self, block: Block, key: Hashable) -> None:
        raise RuntimeError("a pool without a prefix cache caches nothing")


class Tokens(Protocol):
    """A sequence as the block manager sees it; the `kv_*` fields are its block table, owned by the manager.

    `kv_blocks` is None while the sequence holds nothing (else its `Block`s; without a prefix cache, the
    blocks' ids); `kv_slots` is the token slots it has been given;
    `kv_cached` counts its leading blocks in the prefix cache; `kv_room` is the most slots it may reach
    without a call to `allocate` (see `KvManager.filled`); -1 while it holds nothing.
    """

    sid: int
    num_computed: int
    kv_blocks: list[Block] | None
    kv_slots: int
    kv_cached: int
    kv_room: int

    @property
    def num_tokens(self) -> int: ...

    def block_hash(self, j: int) -> Hashable: ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KvManager:
    """Blocks held per sequence, allocation on demand, prefix-cache lookups and fragmentation accounting."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, caching: bool) -> None:
        self.pool = BlockPool(num_blocks) if caching else StackPool(num_blocks)
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.caching = caching
        self.waste = 0  # unused slots in the sequences' last blocks (internal fragmentation)
        # prefix-cache lookups, as vLLM's PrefixCacheStats: tokens looked up and found, apart for sequences
        # that were preempted before (vLLM reports only the first pair)
        self.query_tokens = self.hit_tokens = 0
        self.preempted_query_tokens = self.preempted_hit_tokens = 0

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
        return len(seq.kv_blocks or ())

    def lookup(self, seq: Tokens) -> tuple[list[Block], int]:
        """Longest prefix-cache hit for a sequence with nothing computed: (blocks, tokens)."""
        if not self.caching:
            return [], 0
        hits: list[Block] = []
        lookup = self.pool.lookup
        for j in range((seq.num_tokens - 1) // self.block_size):
            block = lookup(seq.block_hash(j))
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def record_query(self, seq: Tokens, hit_tokens: int, preempted: bool = False) -> None:
        """Count one admission's lookup (`preempted`: by a sequence preempted before)."""
        if not self.caching:
            return
        if preempted:
            self.preempted_query_tokens += seq.num_tokens
            self.preempted_hit_tokens += hit_tokens
        else:
            self.query_tokens += seq.num_tokens
            self.hit_tokens += hit_tokens

    def blocks_needed(self, seq: Tokens, num_tokens: int, hits: Sequence[Block] = ()) -> int:
        """Free blocks consumed to hold `num_tokens` tokens of `seq` (after taking the cache `hits`)."""
        need = cdiv(min(num_tokens, self.max_model_len), self.block_size) - self.held(seq)
        if not hits:
            return max(need, 0)
        return max(need - len(hits), 0) + sum(1 for b in hits if b.ref == 0)

    def allocate(self, seq: Tokens, num_new: int, hits: Sequence[Block] = (), num_hit: int = 0) -> bool:
        """Give `seq` slots for `num_new` tokens after `num_hit` cached ones; False if blocks are short."""
        end = seq.num_computed + num_hit + num_new
        slots = end if end < self.max_model_len else self.max_model_len
        filled = end if end < seq.num_tokens else seq.num_tokens
        blocks = seq.kv_blocks
        if blocks is not None and not hits:
            return self._grow(seq, blocks, slots, filled)
        if self.blocks_needed(seq, slots, hits) > self.pool.num_free:
            return False
        bs = self.block_size
        if blocks is None:
            old_waste = 0
            blocks = seq.kv_blocks = []
            seq.kv_cached = len(hits)
        else:
            old_waste = len(blocks) * bs - seq.kv_slots
        if hits:
            self.pool.touch(hits)
            blocks.extend(hits)
        more = cdiv(slots, bs) - len(blocks)
        if more > 0:
            blocks.extend(self.pool.take(more))
        self.waste += len(blocks) * bs - slots - old_waste
        seq.kv_slots = slots
        if self.caching:
            self._cache_full(seq, blocks, filled)
        self._set_room(seq, blocks)
        return True

    def _grow(self, seq: Tokens, blocks: list[Block], slots: int, filled: int) -> bool:
        """`allocate` for a holder without cache hits: `slots` in all, `filled` tokens of content."""
        bs = self.block_size
        held = len(blocks)
        if slots > held * bs:  # new blocks
            more = -(-slots // bs) - held
            if more > self.pool.num_free:
                return False
            blocks.extend(self.pool.take(more))
            self.waste += more * bs + seq.kv_slots - slots
            seq.kv_slots = slots
            if self.caching and filled // bs > seq.kv_cached:
                self._cache_full(seq, blocks, filled)
        else:
            self.waste += seq.kv_slots - slots
            seq.kv_slots = slots
            if self.caching and (slots if slots < seq.num_tokens else seq.num_tokens) // bs > seq.kv_cached:
                self._cache_full(seq, blocks, filled)
        room = len(blocks) * bs  # as _set_room
        if self.caching and room >= (seq.kv_cached + 1) * bs:
            room = (seq.kv_cached + 1) * bs - 1
        seq.kv_room = room if room <= self.max_model_len else self.max_model_len
        return True

    def lend(self, n: int) -> list[Block]:
        """`n` blocks for holders that report their slots through `filled` and will put the blocks in their
        tables later, without prefix caching: what `allocate` does when each of `n` holders opens a new block
        with its next token, less the one slot each that `filled` then accounts."""
        assert not self.caching
        self.waste += self.block_size * n
        return self.pool.take(n)

    def filled(self, tokens: int) -> None:
        """Account `tokens` slots that holders took within their `kv_room` by raising `kv_slots` themselves.

        Up to `kv_room`, `allocate` would move no block and cache none, only do this bookkeeping; a scheduler
        may skip the call per row and report the rows' total here once.
        """
        self.waste -= tokens

    def free(self, seq: Tokens) -> None:
        """Release every block of `seq`, tail first (its tail is evicted first)."""
        blocks = seq.kv_blocks
        if blocks is None:
            return
        self.waste -= len(blocks) * self.block_size - seq.kv_slots
        seq.kv_blocks = None
        seq.kv_slots = seq.kv_cached = 0
        seq.kv_room = -1
        self.pool.release(reversed(blocks))

    def trim(self, seq: Tokens, num_tokens: int) -> None:
        """Keep only the slots of the first `num_tokens` tokens of `seq`: the blocks past them go back to the
        pool, tail first (rejected speculative tokens; those blocks were never cached)."""
        blocks = seq.kv_blocks
        if blocks is None:
            return
        bs = self.block_size
        keep = cdiv(num_tokens, bs)
        old_waste = len(blocks) * bs - seq.kv_slots
        if keep < len(blocks):
            extra = blocks[keep:]
            del blocks[keep:]
            self.pool.release(reversed(extra))
        seq.kv_slots = num_tokens
        self.waste += len(blocks) * bs - num_tokens - old_waste
        self._set_room(seq, blocks)

    def _set_room(self, seq: Tokens, blocks: list[Block]) -> None:
        bs = self.block_size
        room = len(blocks) * bs
        if self.caching and room >= (seq.kv_cached + 1) * bs:
            room = (seq.kv_cached + 1) * bs - 1  # filling the next block caches it
        seq.kv_room = room if room <= self.max_model_len else self.max_model_len

    def _cache_full(self, seq: Tokens, blocks: list[Block], num_tokens: int) -> None:
        done = seq.kv_cached
        full = num_tokens // self.block_size
        if full <= done:
            return
        cache = self.pool.cache
        for j in range(done, full):
            cache(blocks[j], seq.block_hash(j))
        seq.kv_cached = full
