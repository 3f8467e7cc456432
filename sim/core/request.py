"""The request record that flows from the workload through a scheduler into the metrics.

Requests are plain mutable records, never SimPy processes. A scheduler advances `num_computed` and
`num_generated` and stamps token times through `emit` (or sets them in bulk when it knows them, as the
batching policies do); nothing per token is stored. A token's inter-token gap is the time since the same
request's previous token, as vLLM's benchmark measures it, so the mean gap is
(last - first token time) / (tokens - 1). A scheduler that lets a request sit out steps calls `stall` before
the token that ends the wait: the gaps that are not one step's duration are kept (one entry per wait).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NAN = math.nan


@dataclass(slots=True, eq=False)
class Request:
    id: int
    arrival: float
    prompt_len: int
    max_tokens: int
    # Tokens this request generates before it stops (EOS / stop string), capped at max_tokens.
    output_len: int
    n: int = 1
    prefix_group: int = -1
    prefix_len: int = 0
    # --- progress, owned by the scheduler ---
    num_computed: int = 0  # tokens (prompt + generated) whose KV is computed
    num_generated: int = 0  # output tokens emitted (per sequence when n > 1)
    scheduled_at: float = NAN  # first time any of its tokens were scheduled
    first_token_at: float = NAN
    last_token_at: float = NAN
    finished_at: float = NAN
    preemptions: int = 0
    # prefix-cache lookups at its sequences' first admissions, as vLLM reports them: tokens found, tokens
    # looked up (the whole prompt each time; lookups on resumption after a preemption are left out)
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    itl_max: float = 0.0
    # (previous token time, token time, whether the step counts the token among its decode tokens) of each
    # token whose previous one was not emitted at the end of the step before (`stall`); None: none yet
    stalls: list[tuple[float, float, bool]] | None = None
    reject_reason: str | None = None
    adapter: int = -1  # LoRA adapter id; -1: the base model
    prompt_id: int = -1  # position in a fixed prompt pool: requests with one id send the same prompt
    sampling: int = -1  # its sampling parameters: a row of the workload's table; -1: none given

    @property
    def length(self) -> int:
        """Current sequence length: prompt plus tokens generated so far."""
        return self.prompt_len + self.num_generated

    @property
    def done(self) -> bool:
        return self.num_generated >= self.output_len

    def emit(self, now: float) -> None:
        """Record one output token per sequence emitted at `now` (a step emits at most one)."""
        if self.num_generated == 0:
            self.first_token_at = now
        elif now - self.last_token_at > self.itl_max:
            self.itl_max = now - self.last_token_at
        self.last_token_at = now
        self.num_generated += 1
        if self.num_generated >= self.output_len:
            self.finished_at = now

    def stall(self, now: float, counted: bool) -> None:
        """The token about to be emitted at `now` ends a wait of more than its own step (the request sat
        out steps: a prefill-only step, a preemption, a token budget spent by others): its gap, from
        `last_token_at`, is kept. `counted`: the step's `num_decode_tokens` includes this token."""
        if self.stalls is None:
            self.stalls = []
        self.stalls.append((self.last_token_at, now, counted))

    def emit_run(self, count: int, now: float, longest_gap: float) -> None:
        """`count` calls of `emit` at consecutive step ends after a token already emitted, the last at
        `now`, the longest gap between two of them (the first measured from `last_token_at`) `longest_gap`:
        the same fields as one `emit` per token."""
        if longest_gap > self.itl_max:
            self.itl_max = longest_gap
        self.last_token_at = now
        self.num_generated += count
        if self.num_generated >= self.output_len:
            self.finished_at = now
