"""The vllm policy's waiting queue (`Admission`): arrivals into it, and step 2 in scheduler.py's docstring.

An arriving request is refused if it can never run (`_reject_reason`), else fanned out into its `n` sequences
and queued; with asynchronous scheduling it is held until the step being formed could have seen it
(`_release`, called by `VllmScheduler.schedule`). After the running pass (`RunningPass`, running.py), if
nothing was preempted, waiting sequences are admitted FCFS within the budget, `max_num_seqs`, the free blocks
and the watermark (`_schedule_waiting`); with LoRA, one whose adapter would pass `max_loras` is passed over,
not blocking (sim/engine/lora.py).

`Admission` is one of the parts `VllmScheduler` (scheduler.py) is made of.
"""

from __future__ import annotations

import math
from collections import deque

from sim.core.request import Request
from sim.engine.kv import KvManager, cdiv
from sim.engine.lora import LoraGate
from sim.engine.schedulers.vllm.plan import Seq, StepInfo


class Admission:
    """Arrivals into the waiting queue, and the waiting sequences admitted each step (see the module
    docstring). An admitted sequence in fast mode starts handled row by row (`_busy`, bulk.py)."""

    lora_gate: LoraGate | None = None  # the max_loras rule for waiting requests (sim/engine/lora.py)

    # shared with the other parts of `VllmScheduler`
    kv: KvManager
    block_size: int
    max_model_len: int
    max_num_seqs: int
    chunked: bool
    watermark_blocks: int
    fast: bool
    running: list[Seq]
    waiting: deque[Seq]
    async_scheduling: bool
    _held: deque[tuple[float, list[Seq]]]  # arrivals not yet seen, with their arrival times
    _held_seqs: int  # sequences in `_held`
    _next_sid: int
    _open: dict[int, list[Seq]]  # request id -> its unfinished sequences
    _order: int  # admissions so far
    _busy: dict[Seq, None]

    # ---- arrival -------------------------------------------------------------------------------------
    def add(self, request: Request, now: float) -> bool:
        reason = self._reject_reason(request)
        if reason is not None:
            request.reject_reason = reason
            return False
        request.output_len = min(request.output_len, self.max_model_len - request.prompt_len)
        seqs = []
        for child in range(request.n):
            seq = Seq(
                self._next_sid,
                request,
                child,
                request.output_len,
                request.prompt_len,
                block_size=self.block_size,
            )
            self._next_sid += 1
            seqs.append(seq)
        if self.async_scheduling:
            self._held.append((now, seqs))
            self._held_seqs += len(seqs)
        else:
            self.waiting.extend(seqs)
        self._open[request.id] = seqs
        return True

    def add_transferred(self, request: Request, now: float) -> bool:
        """A request whose prompt's KV another replica computed (a prefill replica, under disaggregation)
        and whose first token it emitted: queued like any other, its sequences already hold their generated
        tokens, and at admission the prompt's KV is loaded into its blocks instead of computed (vLLM's KV
        connector: external computed tokens). Blocks, budget and preemption are the policy's; a sequence
        preempted later forgets that KV and recomputes it, as vLLM's decode instance does."""
        if not self.add(request, now):
            return False
        for seq in self._open[request.id]:
            seq.num_generated = request.num_generated
            seq.num_tokens = request.prompt_len + request.num_generated
            seq.external = request.prompt_len
        return True

    def _reject_reason(self, r: Request) -> str | None:
        """Why a request can never run, else None. One wording per cause and run (the request's lengths are
        in its record), so that the summary counts rejections by cause."""
        if r.prompt_len < 1 or r.output_len < 1 or r.n < 1:
            return "empty prompt or output"
        if r.prompt_len >= self.max_model_len:
            return f"prompt leaves no room for output within max_model_len {self.max_model_len}"
        usable = self.kv.pool.num_usable
        if cdiv(r.prompt_len, self.block_size) > usable:
            return f"prompt needs more than the {usable} KV blocks"
        longest = min(r.prompt_len + r.output_len - 1, self.max_model_len)
        if cdiv(longest, self.block_size) > usable:
            return f"prompt and output need more than the {usable} KV blocks"
        return None

    def _release(self, seen_by: float) -> None:
        """Queue the held arrivals that came no later than `seen_by`."""
        held, waiting = self._held, self.waiting
        while held and held[0][0] <= seen_by:
            seqs = held.popleft()[1]
            waiting.extend(seqs)
            self._held_seqs -= len(seqs)

    @property
    def num_waiting(self) -> int:
        """Sequences queued (new, preempted, or arrived and not yet seen by the scheduler)."""
        return len(self.waiting) + self._held_seqs

    # ---- admission -----------------------------------------------------------------------------------
    def _schedule_waiting(self, info: StepInfo, budget: int, now: float, threshold: int) -> None:
        waiting, running, kv = self.waiting, self.running, self.kv
        max_num_seqs, chunked = self.max_num_seqs, self.chunked
        gate = self.lora_gate.start(info.seqs) if self.lora_gate is not None else None
        skipped: list[Seq] = []  # waiting sequences passed over for their adapter (LoRA)
        while waiting and budget > 0 and len(running) < max_num_seqs:
            seq = waiting[0]
            if gate is not None and gate.skip(seq):  # its adapter would pass max_loras: skip, do not block
                skipped.append(waiting.popleft())
                continue
            hits, num_hit = kv.lookup(seq)
            looked_up = num_hit
            if seq.external > num_hit:  # the rest of the transferred KV is loaded, not computed
                num_hit = seq.external
            length = seq.num_tokens
            n = length - num_hit
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget if chunked else length)
            if n > budget:
                break
            watermark = self.watermark_blocks if running else 0  # kept free only beside running sequences
            if kv.blocks_needed(seq, length, hits) + watermark > kv.num_free:
                break
            if not kv.allocate(seq, n, hits, num_hit):
                break
            waiting.popleft()
            if gate is not None:
                gate.admit(seq)
            running.append(seq)
            seq.order = self._order
            self._order += 1
            if self.fast:
                self._busy[seq] = None
            resumed = seq.preempted
            (info.resumed if resumed else info.new).append(seq)
            seq.preempted = False
            req = seq.req
            seq.external = 0  # loaded once: a preempted sequence recomputes it
            if kv.caching:  # this admission's lookup, counted as vLLM's prefix-cache stats count it
                kv.record_query(seq, looked_up, resumed)
                if not resumed:  # vLLM reports the lookups of sequences never preempted
                    req.prefix_query_tokens += length
                    req.prefix_hit_tokens += looked_up
            if math.isnan(req.scheduled_at):
                req.scheduled_at = now
            end = num_hit + n
            info.seqs.append(seq)
            info.counts.append(n)
            info.contexts.append(num_hit)
            seq.num_computed = end
            self._sync(seq)
            if end >= length:
                info.emit.append(seq)
                if n == 1 and seq.num_generated > 0:
                    info.decode += 1
            budget -= n
        if skipped:  # back at the head of the queue, in their order
            waiting.extendleft(reversed(skipped))
