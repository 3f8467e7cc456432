"""vLLM before v1: prefill-first steps that never mix, paged KV, recompute preemption.

The baseline Sarathi-Serve (OSDI'24) measured as "vLLM", in its artifact's
`sarathi/core/scheduler/vllm_scheduler.py` (microsoft/sarathi-serve, `VLLMScheduler._schedule`), with the
block rules of `sarathi/core/block_space_manager/base_block_space_manager.py`. Each step:

1. Waiting sequences are admitted FCFS (lines 49-78). Admission stops at the first one whose blocks for its
   whole current length (`ceil(len / block_size)`) would leave fewer than the watermark free (`can_allocate`,
   watermark 1% of the blocks, lines 57-82 of the block manager), whose length would take the step past
   `max_num_batched_tokens`, or that would run more than `max_num_seqs`. The source ignores a sequence
   longer than `max_num_batched_tokens` (its prompt limit, line 30) when it reaches the head; here a request
   whose prompt + max_tokens exceeds it is rejected on arrival, as a preempted one is recomputed whole.
2. If anyone was admitted, the step is theirs alone: their prefills, and every running sequence's decode
   waits (lines 80-86).
3. Otherwise every running sequence decodes one token, oldest arrival first (`FCFS.sort_by_priority`). Each
   needs a free block to be left (`can_append_slot`: any free block, lines 94-96, even if it needs none);
   while none is, the newest running sequence not yet scheduled is preempted, or, with none left, the
   sequence itself (lines 107-118). A preempted sequence frees its blocks, loses its computed tokens and goes
   to the front of the waiting queue (`_preempt`, base_scheduler.py lines 116-122); readmitted, it
   recomputes its prompt and the tokens it generated in one prefill, which emits its next token.

A running sequence's token after a prefill-only step, or a preempted one's after its recompute, has the
whole wait as its inter-token gap (`Request.stall`).

`max_num_batched_tokens` defaults to, and is capped at, `max_model_len` (`VllmSchedulerConfig`,
`sarathi/config/config.py` lines 197-200).

Preemption is by recompute only. vLLM v0's own scheduler (`vllm/core/scheduler.py`) swaps to CPU only
sequence groups with more than one running sequence and recomputes single ones, and this policy runs one
sequence per request: a request with `n > 1` is rejected. Its steps are costed by the scenario's one cost
model, as every policy's are. On a group with pipeline stages it runs as vLLM 0.6 does, one such scheduler
per virtual engine (sim/engine/virtual_engines.py).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.config.policies import VllmV0Config
from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.memory import KvBudget
from sim.engine.kv import cdiv
from sim.engine.schedulers.registry import register


@dataclass(slots=True)
class V0Seq:
    req: Request
    blocks: int = 0  # KV blocks held


@dataclass(slots=True)
class V0Step:
    prefill: list[V0Seq]  # admitted this step (a prefill-only step) ...
    decode: list[V0Seq]  # ... or the sequences decoding (a decode-only step)


class VllmV0Scheduler:
    # Under pipeline parallelism vLLM 0.6 runs one such scheduler per stage's virtual engine, each with a
    # share of the blocks (sim/engine/virtual_engines.py, which the fleet builds for `pp` > 1).
    virtual_engines = True

    def __init__(self, config: VllmV0Config, memory: KvBudget) -> None:
        self.block_size = memory.block_size
        self.max_model_len = memory.max_model_len
        self.num_blocks = memory.num_blocks
        limit = config.max_num_batched_tokens
        self.token_budget = memory.max_model_len if limit is None else min(limit, memory.max_model_len)
        self.max_num_seqs = config.max_num_seqs
        self.watermark_blocks = int(config.watermark * memory.num_blocks)
        self.usable_blocks = memory.num_blocks - max(self.watermark_blocks, 1)  # most one request may hold
        self.free_blocks = memory.num_blocks
        self.waiting: deque[V0Seq] = deque()
        self.running: list[V0Seq] = []
        self._last_end = -math.inf  # when the latest applied step ended

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def add(self, request: Request, now: float) -> bool:
        if request.n > 1:
            request.reject_reason = "vllm-v0 runs one sequence per request (n > 1)"
        elif request.prompt_len + request.max_tokens > self.max_model_len:
            request.reject_reason = "prompt + max_tokens exceeds max_model_len"
        elif request.prompt_len + request.max_tokens > self.token_budget:
            # the source ignores a sequence longer than the budget when it is next admitted (its prompt
            # limit); a preempted one is recomputed whole, so any that could grow past it is refused here
            request.reject_reason = "prompt + max_tokens exceeds max_num_batched_tokens"
        elif self._blocks(request.prompt_len + request.max_tokens) > self.usable_blocks:
            # Admitted alone it must leave the watermark free, and each decode needs a free block left: one
            # that could never finish so would wait for ever (the source's `can_allocate` only ever says no)
            held = max(self.usable_blocks, 0)
            request.reject_reason = f"prompt + max_tokens need more than the {held} KV blocks one may hold"
        if request.reject_reason is not None:
            return False
        self.waiting.append(V0Seq(request))
        return True

    def _blocks(self, tokens: int) -> int:
        return cdiv(tokens, self.block_size)

    def wake_at(self, now: float) -> float | None:
        return None

    def schedule(self, now: float) -> StepPlan | None:
        admitted: list[V0Seq] = []
        batched = 0
        waiting = self.waiting
        while waiting:
            seq = waiting[0]
            length = seq.req.length
            need = self._blocks(length)
            if self.free_blocks - need < self.watermark_blocks:
                break
            if batched + length > self.token_budget:
                break
            if len(self.running) + 1 > self.max_num_seqs:
                break
            waiting.popleft()
            seq.blocks = need
            self.free_blocks -= need
            batched += length
            if math.isnan(seq.req.scheduled_at):  # first time scheduled
                seq.req.scheduled_at = now
            admitted.append(seq)
            self.running.append(seq)
        if admitted:
            lengths = np.array([s.req.length for s in admitted], np.int64)
            return self._plan(V0Step(admitted, []), lengths, np.zeros(len(admitted), np.int64), 0)
        if not self.running:
            return None
        queue = deque(sorted(self.running, key=lambda s: s.req.arrival))  # FCFS: oldest first (a stable sort)
        scheduled: list[V0Seq] = []
        preempted = 0
        while queue:
            seq = queue.popleft()
            while self.free_blocks == 0:
                victim = queue.pop() if queue else seq
                self._preempt(victim)
                preempted += 1
                if victim is seq:
                    break
            else:
                need = self._blocks(seq.req.length)
                if need > seq.blocks:
                    self.free_blocks -= need - seq.blocks
                    seq.blocks = need
                scheduled.append(seq)
        self.running = scheduled
        if not scheduled:
            return None
        contexts = np.array([s.req.num_computed for s in scheduled], np.int64)
        return self._plan(V0Step([], scheduled), np.ones(len(scheduled), np.int64), contexts, preempted)

    def _preempt(self, seq: V0Seq) -> None:
        self.free_blocks += seq.blocks
        seq.blocks = 0
        seq.req.num_computed = 0
        seq.req.preemptions += 1
        self.waiting.appendleft(seq)

    def _plan(self, step: V0Step, new_tokens: np.ndarray, context: np.ndarray, preempted: int) -> StepPlan:
        stored = sum(s.req.num_computed for s in self.running) + int(new_tokens.sum())
        allocated = (self.num_blocks - self.free_blocks) * self.block_size
        prefill = int(new_tokens.sum()) if step.prefill else 0
        usage = KvUsage(stored, allocated, self.num_blocks * self.block_size)
        return StepPlan(
            new_tokens, context, prefill, len(step.decode), usage, payload=step, preempted=preempted
        )

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        step: V0Step = plan.payload
        finished: list[Request] = []
        for seq in step.prefill:
            seq.req.num_computed = seq.req.length
        for seq in step.decode:
            seq.req.num_computed += 1
        done: list[V0Seq] = []
        before, self._last_end = self._last_end, now
        counted = not step.prefill  # a decode-only step counts its tokens as decode tokens
        for seq in step.prefill or step.decode:
            if seq.req.last_token_at < before:  # it sat out steps: a prefill-only step, or preempted
                seq.req.stall(now, counted)
            seq.req.emit(now)
            if seq.req.done:
                done.append(seq)
        if done:
            gone = {id(s) for s in done}
            self.running = [s for s in self.running if id(s) not in gone]
            for seq in done:
                self.free_blocks += seq.blocks
                seq.blocks = 0
                finished.append(seq.req)
        return finished

    def in_flight(self) -> list[Request]:
        return [s.req for s in (*self.running, *self.waiting)]


def build(config: VllmV0Config, memory: KvBudget) -> VllmV0Scheduler:
    return VllmV0Scheduler(config, memory)


register("vllm-v0", build)
