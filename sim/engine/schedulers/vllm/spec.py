"""The vllm policy with speculative decoding, as vLLM v1's scheduler runs it (its v1 scheduler.py).

- A running sequence that decodes (every token but the last sampled one computed) asks for
  `num_tokens_with_spec - num_computed` = 1 + k tokens. Like any row it is capped by the remaining token
  budget, `long_prefill_token_threshold` and `max_model_len - 1 - computed`; spec tokens that do not fit are
  dropped (vLLM trims `spec_token_ids` to the tokens scheduled). Prefill chunks and admissions are unchanged.
- KV slots are allocated for every scheduled token, drafts included (a failed allocation preempts as
  usual). After the step, `update` draws the accepted drafts, rolls `num_computed` back by the rejected ones
  (vLLM's `num_computed_tokens -= num_rejected`) and returns the blocks past the kept tokens to the pool.
  vLLM keeps those blocks (and allocates `num_lookahead_tokens` more for EAGLE and draft models) and reuses
  them next step; freeing them is this simulator's simplification (see docs/speculative.md).
- The step emits a + 1 tokens per verifying sequence, never past its output length.

No bulk decoding: every row is handled one by one (`fast=False`).
"""

from __future__ import annotations

import random

from sim.config.policies import VllmConfig
from sim.config.speculative import SpeculativeConfig
from sim.core.request import Request
from sim.core.step import StepPlan
from sim.cost.memory import KvBudget
from sim.engine.schedulers.vllm.plan import Seq, StepInfo, VllmPlan
from sim.engine.schedulers.vllm.scheduler import VARIANTS, VllmScheduler
from sim.engine.speculative import Acceptance, SpecCounts, accepted_drafts, accepted_positions


class SpeculativeScheduler(VllmScheduler):
    """`VllmScheduler` whose decoding rows verify k draft tokens (see the module docstring)."""

    def __init__(self, config: VllmConfig, budget: KvBudget, spec: SpeculativeConfig) -> None:
        super().__init__(config, budget, fast=False)
        self.spec = spec
        self.k = spec.num_speculative_tokens
        self.acceptance = Acceptance(spec, 0)
        self.counts = SpecCounts()
        self._drafts: dict[int, int] = {}  # sid -> drafts scheduled in the latest step
        self._streams: dict[int, random.Random] = {}
        self._matches: dict[int, random.Random] = {}  # sid -> its n-gram match draws (ngram_match_rate)
        self._emitted_by_decodes = 0
        self.falls = spec.acceptance_half_life is not None  # acceptance falls along a response

    def pipeline(self, in_flight: int) -> bool:
        """Speculative rows are not kept in flight: one batch at a time."""
        return False

    def drafts_scheduled(self) -> int:
        """Draft tokens the latest scheduled step verifies."""
        return sum(self._drafts.values())

    def attach(self, acceptance: Acceptance) -> None:
        """The run's acceptance draws (seeded from the run's seed)."""
        self.acceptance = acceptance

    # ---- scheduling ------------------------------------------------------------------------------------
    def _schedule_running(self, info: StepInfo, running: list[Seq], budget: int, threshold: int) -> int:
        """`VllmScheduler._schedule_running` with 1 + k tokens for decoding rows."""
        self._drafts = {}
        limit = self.max_model_len - 1
        for seq in running:
            if budget <= 0 or seq.preempted:
                break
            computed, length = seq.num_computed, seq.num_tokens
            decoding = seq.num_generated > 0 and computed + 1 == length
            n = length - computed + (self.k if decoding and self._proposes(seq) else 0)
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget, limit - computed)
            if n <= 0:
                continue
            if not self._allocate_or_preempt(seq, n, info):
                break
            info.seqs.append(seq)
            info.counts.append(n)
            info.contexts.append(computed)
            seq.num_computed = computed + n
            self._sync(seq)
            if computed + n >= length:
                info.emit.append(seq)
            if decoding:  # its drafts (none when a cap left it one token: a plain decode)
                self._drafts[seq.sid] = n - 1
                info.decode += n
            budget -= n
        return budget

    def _plan(self, info: StepInfo) -> VllmPlan:
        plan = super()._plan(info)
        plan.num_decode_tokens = info.decode  # tokens of the verifying rows (1 + drafts each), until `update`
        plan.num_prefill_tokens = plan.totals.tokens - info.decode
        return plan

    # ---- applying a step -------------------------------------------------------------------------------
    def update(self, plan: StepPlan, now: float) -> list[Request]:
        finished = super().update(plan, now)
        plan.num_decode_tokens = self._emitted_by_decodes
        return finished

    def _emit_rows(self, rows: list[Seq], now: float) -> list[Seq]:
        """The step's tokens: a + 1 for a verifying row (its accepted drafts and the target's token), one
        for a row that finished its prefill; the rejected drafts' KV slots are given back."""
        done: list[Seq] = []
        drafts, kv = self._drafts, self.kv
        emitted_by_decodes = 0
        for seq in rows:
            req = seq.req
            count = 1
            k = drafts.get(seq.sid)
            if k:  # a verification: draw the accepted drafts, give back the rejected ones' slots
                u, cumulative = self._stream(seq).random(), self.acceptance.cumulative
                fall = self.spec.along_response(seq.num_generated) if self.falls else 1.0
                if cumulative is None:
                    a = accepted_drafts(u, self.acceptance.alpha(req.id) * fall, k)
                else:
                    a = accepted_positions(u, cumulative, k, fall)
                self.counts.add(req.id, k, a)
                seq.num_computed -= k - a
                self._sync(seq)
                kv.trim(seq, seq.num_computed)
                count = min(a + 1, seq.out_len - seq.num_generated)
            if k is not None:
                emitted_by_decodes += count
            for _ in range(count):
                self._emit_token(seq, now, k is not None)
            if seq.num_generated >= seq.out_len:
                done.append(seq)
                self._streams.pop(seq.sid, None)
                self._matches.pop(seq.sid, None)
        self._emitted_by_decodes = emitted_by_decodes
        return done

    def _proposes(self, seq: Seq) -> bool:
        """Whether the proposer drafts for `seq` this step: n-gram lookup finds a match at
        `ngram_match_rate` (a row without a match carries no drafts, as in vLLM); every other proposer
        always drafts."""
        rate = self.spec.ngram_match_rate
        if rate is None:
            return True
        rng = self._matches.get(seq.sid)
        if rng is None:
            rng = self._matches[seq.sid] = self.acceptance.stream(seq.req.id, seq.child, kind=3)
        return rng.random() < rate

    def _stream(self, seq: Seq) -> random.Random:
        rng = self._streams.get(seq.sid)
        if rng is None:
            rng = self._streams[seq.sid] = self.acceptance.stream(seq.req.id, seq.child)
        return rng


def build_speculative(config: VllmConfig, budget: KvBudget) -> SpeculativeScheduler:
    assert config.speculative is not None
    return SpeculativeScheduler(config, budget, config.speculative)


VARIANTS["speculative"] = build_speculative
