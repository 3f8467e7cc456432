"""One engine step as every layer sees it: which rows run, how many tokens each computes, the KV it holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np


@dataclass(slots=True)
class KvUsage:
    """KV-cache slots (tokens) at one step. `allocated - used` is waste: internal fragmentation
    for paged policies, reserved-but-unused memory for reservation-based ones."""

    used: int  # token states actually stored
    allocated: int  # slots held by requests (blocks or reservations)
    capacity: int  # slots available for KV in total


class StepTotals(NamedTuple):
    """A step's rows summed, for `CostModel.step_time_totals(*totals)` (c new tokens on q cached per row)."""

    rows: int
    tokens: int  # Σc
    ones: int  # rows with c = 1
    cq: int  # Σc·q
    cc: int  # Σc²
    ctx: int  # Σq
    max_end: int  # at least max(q + c)


@dataclass(slots=True)
class StepPlan:
    """One engine step: which rows run and how many tokens each computes.

    The one definition of a row, shared by every policy: row i computes `new_tokens[i]` tokens on top of
    `context[i]` tokens whose KV is already in the cache (computed by earlier steps). A prefill chunk is
    `new_tokens` prompt tokens on the tokens computed before it; a decode is 1 token on everything computed
    so far. After a P-token prompt the first decode row is `new_tokens = 1` on `context = P`: the token
    sampled at the end of the prefill has no KV yet, and that decode computes it, attending over P + 1 keys
    including itself (vLLM's `num_computed_tokens`). A row is one sequence: a request with `n > 1` runs as
    `n` rows, each with its own KV and its own copy of the prompt, as vLLM v1 fans it out into `n` child
    requests. The cost model sees only these two arrays; `payload` is private to the scheduler.
    """

    new_tokens: np.ndarray
    context: np.ndarray
    num_prefill_tokens: int
    num_decode_tokens: int
    kv: KvUsage
    payload: Any = None
    preempted: int = 0
    batch_size: int = field(default=0)

    def __post_init__(self) -> None:
        if not self.batch_size:
            self.batch_size = len(self.new_tokens)


class QuietSteps(NamedTuple):
    """Decode-only steps a scheduler can vouch for, from its next step on: no row is admitted, resumed or
    preempted, none finishes before the last, and every row decodes one token on a context one longer each
    step (rows that finish in the last step leave after it: `advance_quiet` returns them). Step j
    (from 0) has the totals (rows, rows, rows, ctx + j·rows, rows, ctx + j·rows, max_end + j), no prefill
    token, `rows` decode tokens, and KV used `used + j·used_step` of `allocated` slots (of `capacity`) plus
    those that steps 0 to j allocate: step j allocates `grow[j % len(grow)]` blocks of `block` slots (none
    when `grow` is empty)."""

    steps: int  # how many (at least 1)
    rows: int
    ctx: int  # Σq at the first
    max_end: int  # ≥ max(q + c) at the first
    used: int
    used_step: int
    allocated: int
    capacity: int
    grow: Sequence[int] = ()
    block: int = 0

    def after(self, k: int) -> QuietSteps:
        """These steps from step `k` on (the KV allocated then: what steps 0 to k - 1 added)."""
        later = self._replace(steps=self.steps - k, ctx=self.ctx + k * self.rows, max_end=self.max_end + k,
                              used=self.used + k * self.used_step)  # fmt: skip
        grow = self.grow
        if not grow:
            return later
        cycles, at = divmod(k, len(grow))
        blocks = cycles * sum(grow) + sum(grow[:at])
        return later._replace(allocated=self.allocated + self.block * blocks, grow=[*grow[at:], *grow[:at]])
