"""Reservation-based KV memory shared by the `static` and `continuous` policies (no paging).

A request holds `n × (prompt + max_tokens)` slots from admission to finish, whatever it actually generates:
the gap between `reserved` and `used` is the reserved-but-unused memory the vLLM paper measured.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from sim.core.request import Request
from sim.cost.memory import KvBudget


class Reservations:
    def __init__(self, memory: KvBudget):
        self.capacity = memory.num_tokens
        self.max_model_len = memory.max_model_len
        self.reserved = 0
        self._used = 0

    @staticmethod
    def need(req: Request) -> int:
        return req.n * (req.prompt_len + req.max_tokens)

    def admissible(self, req: Request) -> bool:
        """Reject (with a reason) a request that can never run."""
        if req.prompt_len + req.max_tokens > self.max_model_len:
            req.reject_reason = "prompt + max_tokens exceeds max_model_len"
        elif self.need(req) > self.capacity:
            req.reject_reason = "KV reservation exceeds the KV cache"
        return req.reject_reason is None

    def reserve(self, amount: int) -> bool:
        if self.reserved + amount > self.capacity:
            return False
        self.reserved += amount
        return True

    def reserve_for(self, req: Request) -> bool:
        """Reserve an admitted request's slots, if they fit."""
        return self.reserve(self.need(req))

    def unreserve(self, amount: int) -> None:
        self.reserved -= amount

    def release(self, req: Request) -> None:
        self.reserved -= self.need(req)
        self._used -= req.n * (req.prompt_len + req.num_generated)

    def store(self, tokens: int) -> None:
        """Token states written to the cache."""
        self._used += tokens

    def used(self) -> int:
        return self._used


class ReservationQueue:
    """What the reservation-based policies share: a FCFS waiting queue in front of KV reservations."""

    def __init__(self, memory: KvBudget):
        self.kv = Reservations(memory)
        self.waiting: deque[Request] = deque()

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add(self, request: Request, now: float) -> bool:
        """Queue a request, or reject one that can never run (its reason is set)."""
        if not self.kv.admissible(request):
            return False
        self.waiting.append(request)
        return True


def fill_progress(
    req: Request, step_ends: Sequence[float], first_step: int, last_step: int, finished: bool = True
) -> None:
    """Set a request's progress in bulk: it emitted one token per step from `first_step` to `last_step`."""
    req.num_generated = min(last_step - first_step + 1, req.output_len)
    req.num_computed = req.prompt_len + req.num_generated - 1
    req.last_token_at = step_ends[first_step + req.num_generated - 1]
    if finished:
        req.finished_at = req.last_token_at
