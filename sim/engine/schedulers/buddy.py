"""A buddy allocator of KV blocks, and the reservations the vLLM paper's Orca baselines make through it.

The vLLM paper (Kwon et al., SOSP'23, §6.1 "Baselines") compares against its own implementation of Orca, which
"uses the buddy allocation algorithm to determine the memory address to store KV cache", in three variants
that differ only in how many output slots a request reserves:

- `oracle`: the true output length ("the upper-bound performance of Orca, infeasible in practice");
- `pow2`: the output length rounded up to a power of two ("over-reserves the space for outputs by at most
  2×: if the true output length is 25, it reserves 32 positions");
- `max`: the maximum sequence length of the model (2,048 tokens for OPT).

The memory is cut into buddies of `buddy_tokens` slots (the maximum sequence length: 2,048 tokens for OPT,
as the artifact's `orca/cacheflow/master/block_manager.py` is described; that file could not be read here,
so its rule is taken as stated: one buddy holds one longest sequence). A reservation of r slots takes
2^⌈log2 ⌈r / block_size⌉⌉ blocks, split from the smallest free piece that holds it; freed pieces merge with
their free buddy (Knuth, TAOCP vol. 1, §2.5). Slots past the last whole buddy are never used. So even
`oracle` wastes memory: the power-of-two rounding (internal) and the pieces too small to hold a request
(external fragmentation).
"""

from __future__ import annotations

import heapq
from typing import Literal

from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.kv import cdiv
from sim.engine.schedulers.reservation import Reservations
from sim.io.errors import SimError

Rule = Literal["oracle", "pow2", "max"]


def ceil_pow2(x: int) -> int:
    """The least power of two ≥ x (x ≥ 1)."""
    return 1 << (x - 1).bit_length()


class BuddyAllocator:
    """Power-of-two pieces of blocks inside arenas of `buddy_blocks` blocks (a power of two).

    Pieces of order k (2^k blocks) start at multiples of 2^k; a piece's buddy is at `start ^ 2^k`. The lowest
    free start of the smallest fitting order is taken, so placements are deterministic.
    """

    def __init__(self, num_blocks: int, buddy_blocks: int) -> None:
        if buddy_blocks < 1 or buddy_blocks & (buddy_blocks - 1):
            raise SimError(f"a buddy must hold a power of two of KV blocks (got {buddy_blocks})")
        self.top = buddy_blocks.bit_length() - 1
        self.num_buddies = num_blocks // buddy_blocks
        self.capacity_blocks = self.num_buddies * buddy_blocks
        self._heaps: list[list[int]] = [[] for _ in range(self.top + 1)]
        self._free: list[set[int]] = [set() for _ in range(self.top + 1)]
        for i in range(self.num_buddies):
            self._push(self.top, i * buddy_blocks)
        self.free_blocks = self.capacity_blocks

    def _push(self, order: int, start: int) -> None:
        self._free[order].add(start)
        heapq.heappush(self._heaps[order], start)

    def _pop(self, order: int) -> int | None:
        heap, free = self._heaps[order], self._free[order]
        while heap:
            start = heapq.heappop(heap)
            if start in free:
                free.remove(start)
                return start
        return None

    def allocate(self, order: int) -> int | None:
        """The start of a free piece of 2^order blocks, or None when no free piece is that large."""
        for j in range(order, self.top + 1):
            if self._free[j]:
                start = self._pop(j)
                assert start is not None
                while j > order:  # split: keep the lower half, free the upper
                    j -= 1
                    self._push(j, start + (1 << j))
                self.free_blocks -= 1 << order
                return start
        return None

    def free(self, start: int, order: int) -> None:
        self.free_blocks += 1 << order
        while order < self.top:
            buddy = start ^ (1 << order)
            if buddy not in self._free[order]:
                break
            self._free[order].remove(buddy)  # its heap entry goes stale
            start = min(start, buddy)
            order += 1
        self._push(order, start)


class BuddyReservations(Reservations):
    """The Orca baselines' reservations: each sequence's slots (by `rule`) placed by a `BuddyAllocator`.

    `reserved` counts the slots of the pieces held (the power-of-two rounding included), `capacity` the slots
    of the whole buddies.
    """

    def __init__(self, memory: KvBudget, rule: Rule, buddy_tokens: int | None) -> None:
        super().__init__(memory)
        self.rule = rule
        self.block_size = memory.block_size
        buddy = memory.max_model_len if buddy_tokens is None else buddy_tokens
        if buddy < memory.max_model_len:
            raise SimError(
                f"buddy_tokens ({buddy}) must be at least max_model_len ({memory.max_model_len}): a buddy "
                "holds one longest sequence"
            )
        buddy_blocks = ceil_pow2(cdiv(buddy, memory.block_size))
        self.allocator = BuddyAllocator(memory.num_blocks, buddy_blocks)
        self.capacity = self.allocator.capacity_blocks * memory.block_size
        self._held: dict[int, list[int]] = {}  # request id -> its sequences' piece starts
        self._order: dict[int, int] = {}  # request id -> the order of its pieces

    def wanted(self, req: Request) -> int:
        """Slots one sequence of `req` reserves, before the allocator's rounding."""
        if self.rule == "oracle":
            return req.prompt_len + req.output_len
        if self.rule == "pow2":
            return min(req.prompt_len + ceil_pow2(req.output_len), self.max_model_len)
        return self.max_model_len

    def order(self, req: Request) -> int:
        blocks = cdiv(self.wanted(req), self.block_size)
        return (blocks - 1).bit_length()

    def need(self, req: Request) -> int:  # type: ignore[override]
        return req.n * (self.block_size << self.order(req))

    def reserve_for(self, req: Request) -> bool:
        order = self.order(req)
        starts: list[int] = []
        for _ in range(req.n):
            start = self.allocator.allocate(order)
            if start is None:
                for s in starts:
                    self.allocator.free(s, order)
                return False
            starts.append(start)
        self._held[req.id] = starts
        self._order[req.id] = order
        self.reserved += len(starts) * (self.block_size << order)
        return True

    def release(self, req: Request) -> None:
        order = self._order.pop(req.id)
        starts = self._held.pop(req.id)
        for start in starts:
            self.allocator.free(start, order)
        self.reserved -= len(starts) * (self.block_size << order)
        self._used -= req.n * (req.prompt_len + req.num_generated)
