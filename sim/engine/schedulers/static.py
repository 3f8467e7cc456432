"""Request-level (static) batching, FasterTransformer style.

A batch forms from the queue when the engine is free: up to `max_batch_size` requests, or fewer once
the oldest has waited `batch_timeout_s`. Prompts are padded to the longest one and prefilled together;
the batch then decodes until its longest member ends. A member that stops early keeps its slot as
padding, and its response returns only when the whole batch ends: the convoy effect. Newcomers wait
for the next batch. KV is reserved for the padded batch: rows x (longest prompt + largest max_tokens).
A request with `n > 1` is `n` rows (sequences), each prefilling its own copy of the prompt.
"""

from __future__ import annotations

from array import array

import numpy as np

from sim.config.policies import StaticConfig
from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.memory import KvBudget
from sim.engine.schedulers.registry import register
from sim.engine.schedulers.reservation import ReservationQueue, fill_progress


class StaticScheduler(ReservationQueue):
    def __init__(self, config: StaticConfig, memory: KvBudget):
        super().__init__(memory)
        self.cfg = config
        self.batch: list[Request] = []
        self.rows = 0  # sequences in the batch (sum of n), padding included
        self.width = 0  # padded prompt length
        self.length = 0  # decode steps the batch runs (its longest output)
        self.reservation = 0
        self.step_ends = array("d")  # end times of the current batch's steps

    def wake_at(self, now: float) -> float | None:
        if self.batch or not self.waiting:
            return None
        return self.waiting[0].arrival + self.cfg.batch_timeout_s

    def _form_batch(self, now: float) -> bool:
        full = len(self.waiting) >= self.cfg.max_batch_size
        if not self.waiting or not (full or now >= self.waiting[0].arrival + self.cfg.batch_timeout_s):
            return False
        width = max_tokens = rows = 0
        batch: list[Request] = []
        for req in self.waiting:
            if len(batch) == self.cfg.max_batch_size:
                break
            w, m, r = max(width, req.prompt_len), max(max_tokens, req.max_tokens), rows + req.n
            if r * (w + m) > self.kv.capacity:
                break
            width, max_tokens, rows = w, m, r
            batch.append(req)
        if not batch:
            return False
        for _ in batch:
            self.waiting.popleft()
        for req in batch:
            req.scheduled_at = now
        self.reservation = rows * (width + max_tokens)
        self.kv.reserve(self.reservation)
        self.batch, self.rows, self.width = batch, rows, width
        self.length = max(r.output_len for r in batch)
        self.step_ends = array("d")
        return True

    def schedule(self, now: float) -> StepPlan | None:
        if not self.batch and not self._form_batch(now):
            return None
        done = len(self.step_ends)  # steps run so far: 0 means this is the prefill
        rows = self.rows
        if done == 0:
            new_tokens = np.full(rows, self.width, dtype=np.int64)
            context = np.zeros(rows, dtype=np.int64)
            prefill, decode = rows * self.width, 0
        else:
            new_tokens = np.ones(rows, dtype=np.int64)  # decode step `done` computes token `done` - 1
            context = np.full(rows, self.width + done - 1, dtype=np.int64)
            prefill, decode = 0, rows
        used = sum(r.n * (r.prompt_len + min(done, r.output_len)) for r in self.batch)
        return StepPlan(
            new_tokens, context, prefill, decode, KvUsage(used, self.reservation, self.kv.capacity)
        )

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        self.step_ends.append(now)
        if len(self.step_ends) == 1:
            for req in self.batch:
                req.emit(now)
                req.num_computed = req.prompt_len
        if len(self.step_ends) < self.length:
            return []
        finished = self.batch
        for req in finished:
            fill_progress(req, self.step_ends, 0, self.length - 1)
            req.finished_at = now  # the response returns when the whole batch ends
        self.kv.unreserve(self.reservation)
        self.batch, self.reservation = [], 0
        self.step_ends = array("d")
        return finished

    def in_flight(self) -> list[Request]:
        if self.step_ends:
            for req in self.batch:
                fill_progress(req, self.step_ends, 0, len(self.step_ends) - 1, finished=False)
        return [*self.batch, *self.waiting]


def build(config: StaticConfig, memory: KvBudget) -> StaticScheduler:
    return StaticScheduler(config, memory)


register("static", build)
