"""Iteration-level (continuous) batching, Orca style, with reservation-based KV memory.

Requests join and leave at every step, up to `max_num_seqs`. At admission a request reserves KV slots for
`n × (prompt + max_tokens)` tokens (no paging, no sharing), so `max_tokens` and `n` are memory reservations.
Newcomers' whole-prompt prefills share a step with the others' decodes.

Every running request emits one token per step, so its finishing step is known at admission: a heap keyed by
that step replaces any per-request work in the steady decode loop, and contexts live in one numpy array.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sim.request import Request
from sim.schedulers.base import KvUsage, StepPlan
from sim.schedulers.registry import KvBudget, register
from sim.schedulers.reservation import Reservations, fill_progress


class ContinuousConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once.")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="Prefill tokens admitted per step (a single longer prompt still runs alone)."
    )


class ContinuousScheduler:
    def __init__(self, config: ContinuousConfig, memory: KvBudget):
        self.cfg = config
        self.kv = Reservations(memory)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admitted in earlier steps, decoding; aligned with `ctx`
        self.ctx = np.zeros(0, dtype=np.int64)  # tokens in each running request's KV cache (per sequence)
        self.seqs = np.zeros(0, dtype=np.int64)  # sequences per running request (n)
        self.finish_heap: list[tuple[int, int, Request]] = []
        self.step = 0  # steps applied so far
        self.first_step: dict[int, int] = {}  # request id -> step that emitted its first token
        self.step_ends = array("d")  # end time of every applied step

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add(self, request: Request, now: float) -> bool:
        if not self.kv.admissible(request):
            return False
        self.waiting.append(request)
        return True

    def wake_at(self, now: float) -> float | None:
        return None

    def schedule(self, now: float) -> StepPlan | None:
        admitted: list[Request] = []
        budget = self.cfg.max_num_batched_tokens
        while self.waiting and len(self.running) + len(admitted) < self.cfg.max_num_seqs:
            head = self.waiting[0]
            if admitted and head.prompt_len > budget:
                break
            if not self.kv.reserve(self.kv.need(head)):
                break  # head-of-line blocking: FCFS, no overtaking
            self.waiting.popleft()
            head.scheduled_at = now
            admitted.append(head)
            budget -= head.prompt_len
        if not admitted and not self.running:
            return None
        prompts = np.fromiter((r.prompt_len for r in admitted), dtype=np.int64, count=len(admitted))
        new_tokens = np.concatenate([self.seqs, prompts])
        context = np.concatenate([self.ctx * 1, np.zeros(len(admitted), dtype=np.int64)])
        decode = int(self.seqs.sum())
        return StepPlan(
            new_tokens=new_tokens,
            context=context,
            num_prefill_tokens=int(prompts.sum()),
            num_decode_tokens=decode,
            kv=KvUsage(self.kv.used(), self.kv.reserved, self.kv.capacity),
            payload=admitted,
        )

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        admitted: list[Request] = plan.payload
        self.step_ends.append(now)
        # Decodes: one token per running sequence.
        self.ctx += 1
        self.kv.store(int(self.seqs.sum()))
        # Prefills: prompt computed, first token emitted now.
        for req in admitted:
            req.emit(now)
            req.num_computed = req.prompt_len
            self.first_step[req.id] = self.step
            self.kv.store(req.n * (req.prompt_len + 1))
            heapq.heappush(self.finish_heap, (self.step + req.output_len - 1, req.id, req))
        if admitted:
            self.running.extend(admitted)
            self.ctx = np.concatenate([self.ctx, [r.prompt_len + 1 for r in admitted]])
            self.seqs = np.concatenate([self.seqs, [r.n for r in admitted]])
        finished: list[Request] = []
        while self.finish_heap and self.finish_heap[0][0] <= self.step:
            _, _, req = heapq.heappop(self.finish_heap)
            fill_progress(req, self.step_ends, self.first_step.pop(req.id), len(self.step_ends) - 1)
            finished.append(req)
        if finished:
            done = {r.id for r in finished}
            keep = [i for i, r in enumerate(self.running) if r.id not in done]
            self.running = [self.running[i] for i in keep]
            self.ctx = self.ctx[keep]
            self.seqs = self.seqs[keep]
            for req in finished:
                self.kv.release(req)
        self.step += 1
        return finished

    def in_flight(self) -> list[Request]:
        last = len(self.step_ends) - 1
        for req in self.running:
            fill_progress(req, self.step_ends, self.first_step[req.id], last, finished=False)
        return [*self.running, *self.waiting]


def build(config: ContinuousConfig, memory: KvBudget) -> ContinuousScheduler:
    return ContinuousScheduler(config, memory)


register("continuous", ContinuousConfig, build)
