"""The vllm policy's running pass and its recompute preemption (`RunningPass`): step 1 of scheduler.py.

Each running sequence, in admission order, gets the tokens it still lacks, within the caps; one that cannot
get blocks preempts from the back of the running list (`_allocate_or_preempt`), and a preempted sequence
returns to the front of the waiting queue with its computed tokens forgotten (`_preempt`), from which
`Admission` (admission.py) resumes it.

`RunningPass` is one of the parts `VllmScheduler` (scheduler.py) is made of; in fast mode `BulkDecoding`
(bulk.py) hands it only the rows handled one by one. `SpeculativeScheduler` (spec.py) replaces
`_schedule_running` with its own, which preempts through `_allocate_or_preempt` too.
"""

from __future__ import annotations

from collections import deque

from sim.engine.kv import KvManager
from sim.engine.schedulers.vllm.plan import Seq, StepInfo


class RunningPass:
    """The tokens each running sequence gets this step, and the preemptions that make room for them (see the
    module docstring). A preempted sequence in bulk is first brought up to date (`_wake`, bulk.py)."""

    # shared with the other parts of `VllmScheduler`
    kv: KvManager
    max_model_len: int
    running: list[Seq]
    waiting: deque[Seq]
    _busy: dict[Seq, None]

    def _schedule_running(self, info: StepInfo, running: list[Seq], budget: int, threshold: int) -> int:
        if not running:
            return budget
        kv, limit = self.kv, self.max_model_len - 1
        add_seq, add_count, add_context = info.seqs.append, info.counts.append, info.contexts.append
        add_emit = info.emit.append
        decode = grown = 0
        for seq in running:  # a preemption pops only sequences after this one, or this one (then stop)
            if budget <= 0 or seq.preempted:  # (in fast mode `running` may be a copy: popped ones remain)
                break
            computed = seq.num_computed
            length = seq.num_tokens
            req = seq.req
            if computed + 1 == length and length <= seq.kv_room and computed < limit:
                # a decode within its blocks (no cap binds one token): no call into the KV manager
                grown += length - seq.kv_slots
                seq.kv_slots = seq.num_computed = length
                add_seq(seq)
                add_count(1)
                add_context(computed)
                add_emit(seq)
                if seq.num_generated > 0:
                    decode += 1
                budget -= 1
                if req.n == 1:
                    req.num_computed = length
                else:
                    self._sync(seq)
                continue
            n = length - computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > limit - computed:
                n = limit - computed
            if n <= 0:
                continue
            end = computed + n
            if end <= seq.kv_room:  # within its blocks, nothing to cache
                grown += end - seq.kv_slots
                seq.kv_slots = end
            elif not self._allocate_or_preempt(seq, n, info):
                break
            add_seq(seq)
            add_count(n)
            add_context(computed)
            seq.num_computed = end
            if req.n == 1:
                req.num_computed = end
            else:
                self._sync(seq)
            if end >= length:
                add_emit(seq)
                if n == 1 and seq.num_generated > 0:
                    decode += 1
            budget -= n
        kv.filled(grown)
        info.decode += decode
        return budget

    def _allocate_or_preempt(self, seq: Seq, n: int, info: StepInfo) -> bool:
        """Blocks for `n` more tokens of a running `seq`, preempting from the back until they fit; False
        when `seq` itself had to go."""
        running = self.running
        while not self.kv.allocate(seq, n):
            victim = running.pop()
            self._preempt(victim)
            info.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Seq) -> None:
        if seq.bulk_since >= 0:
            self._wake(seq)
        self._busy.pop(seq, None)
        self.kv.free(seq)
        seq.num_computed = 0
        self._sync(seq)
        seq.preempted = True
        seq.req.preemptions += 1
        self.waiting.appendleft(seq)
