"""Speculative decoding at run time: acceptance draws, the step time with the proposer's work, and the run's
figures (the `speculative` table: sim/config/speculative.py; the proposer's cost and memory:
sim/cost/draft.py).

A decoding sequence carries k draft tokens (`num_speculative_tokens`); the target verifies them in one step
that computes 1 + k tokens for it. Draft token i is accepted with probability alpha independently of the
others (or alpha_i per position; each times 2^(-g / acceptance_half_life) after g output tokens, when
acceptance falls along a response), and verification stops at the first rejection, so the accepted count
a in {0..k} has P(a >= i) = alpha^i; the step emits a + 1 tokens (the accepted drafts and the target's own
token at the first rejected position). Its mean is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023,
eq. 1).

Who proposes the drafts sets their cost, added to the target's verification step:

- `draft`: a smaller model of the catalogue on the same GPUs and tensor parallelism: one pass over the step's
  rows (the new prompt tokens and the verified tokens, which the draft must cache too), then k - 1 passes of
  one token for every row that samples a token, as vLLM v1's proposers run;
- `eagle` / `mtp`: the same passes through a head of `head_layers` decoder layers of the target's own shape
  (with the target's LM head);
- `ngram`: prompt lookup on the host, `ngram_s_per_row` seconds per sampling row and step, no GPU work.

The scheduling side (spec tokens in the token budget, KV slots of rejected tokens freed) is in
sim/engine/schedulers/vllm/spec.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from sim.config.lengths import resolve
from sim.config.speculative import SpeculativeConfig
from sim.config.workload import TraceArrival
from sim.core.request import Request
from sim.core.step import StepPlan
from sim.cost.draft import Drafter, build_drafter, kv_blocks_with_draft
from sim.cost.memory import KvBudget, replica_kv_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError
from sim.io.tables import read_table
from sim.records.recorder import Recorder
from sim.records.sinks import RecordSink
from sim.workload.traces import TRACE_COLUMNS


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens emitted by one verification of k drafts at per-token acceptance alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def accepted_positions(u: float, cumulative: tuple[float, ...], k: int, factor: float = 1.0) -> int:
    """Drafts accepted out of k when draft i is accepted with probability alpha_i given the ones before it:
    the largest a <= k with u < alpha_1 x ... x alpha_a (`cumulative` holds those products); with
    `factor` f, every alpha_i is f alpha_i, so the bound is f^a alpha_1 x ... x alpha_a."""
    a = 0
    if factor == 1.0:
        while a < k and u < cumulative[a]:
            a += 1
        return a
    while a < k and u < cumulative[a] * factor ** (a + 1):
        a += 1
    return a


def accepted_drafts(u: float, alpha: float, k: int) -> int:
    """Drafts accepted out of k for a uniform draw u in [0, 1): the largest a <= k with u < alpha^a, so that
    P(a >= i) = alpha^i (independent acceptances, stopping at the first rejection)."""
    if alpha <= 0.0:
        return 0
    if alpha >= 1.0 or u <= 0.0:
        return k
    a = int(math.log(u) / math.log(alpha))
    while a > 0 and u >= alpha**a:  # guard the floating-point edge of the division
        a -= 1
    while a < k and u < alpha ** (a + 1):
        a += 1
    return min(a, k)


# ----------------------------------------------------------------------------- acceptance per request


class Acceptance:
    """Per-request acceptance rate and per-sequence random streams, all derived from one run seed: the same
    scenario and seed give the same draws whatever else runs."""

    def __init__(self, config: SpeculativeConfig, seed: int, per_request: np.ndarray | None = None) -> None:
        self.config = config
        self.seed = seed
        self._per_request = per_request
        self._alpha: dict[int, float] = {}
        # alpha_1 x ... x alpha_i per draft position i (None: one alpha at every position)
        rates = config.position_rates()
        self.cumulative: tuple[float, ...] | None = (
            None if rates is None else tuple(np.cumprod(rates).tolist())
        )

    def alpha(self, request_id: int) -> float:
        """The acceptance rate of a request (drawn once)."""
        got = self._alpha.get(request_id)
        if got is not None:
            return got
        c = self.config
        if c.acceptance == "fixed":
            assert c.acceptance_rate is not None
            value = c.acceptance_rate
        elif c.acceptance == "beta":
            assert c.acceptance_rate is not None and c.acceptance_concentration is not None
            mean, kappa = c.acceptance_rate, c.acceptance_concentration
            rng = np.random.default_rng([self.seed, 1, request_id])
            value = float(rng.beta(mean * kappa, (1.0 - mean) * kappa))
        else:
            rates = self._per_request
            if rates is None or request_id >= rates.size:
                raise SimError(f"request {request_id}: no acceptance_rate in the trace")
            value = float(rates[request_id])
        self._alpha[request_id] = value
        return value

    def stream(self, request_id: int, child: int, kind: int = 2) -> random.Random:
        """The uniform draws of one sequence's verification steps (`kind` 3: its n-gram matches)."""
        state = np.random.SeedSequence([self.seed, kind, request_id, child]).generate_state(2, np.uint64)
        return random.Random(int(state[0]) << 64 | int(state[1]))


def run_seed(seed: int | np.random.SeedSequence) -> int:
    """One integer for the acceptance streams, from a run's seed (an int, or a sweep point's SeedSequence)."""
    if isinstance(seed, np.random.SeedSequence):
        seq = np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key, pool_size=seed.pool_size)
    else:
        seq = np.random.SeedSequence(seed)
    return int(seq.generate_state(1, np.uint64)[0])


def trace_acceptance(arrival: Any, base_dir: Path, source: str) -> np.ndarray:
    """The trace's `acceptance_rate` column in request order (arrival order, ties in file order)."""
    if not isinstance(arrival, TraceArrival):
        raise SimError(f"{source}: speculative.acceptance = 'trace' needs workload.arrival kind = 'trace'")
    path = resolve(arrival.path, base_dir)
    table = read_table(path, arrival.format)
    if "acceptance_rate" not in table.columns:
        raise SimError(f"{path}: no 'acceptance_rate' column (speculative.acceptance = 'trace')")
    rates = table.numbers("acceptance_rate")
    bad = ~((rates >= 0.0) & (rates <= 1.0))
    if bad.any():
        line = int(table.lines[int(np.argmax(bad))])
        raise SimError(f"{path}: line {line}: column 'acceptance_rate': expected a number in [0, 1]")
    name = next(n for n in TRACE_COLUMNS["arrival"] if n in table.columns)
    order = np.argsort(table.numbers(name), kind="stable")
    return rates[order]


# ----------------------------------------------------------------------------- the draft's cost and memory


# ----------------------------------------------------------------------------- step time


@dataclass(slots=True)
class DraftWork:
    """The rows of a step as the proposer sees them: the step's rows (c new tokens on q cached) and, for
    each row that samples a token, the context it drafts from."""

    counts: list[int]
    contexts: list[int]
    samplers: list[int]  # context after the step's tokens, one entry per sampling row


def draft_work(info: Any) -> DraftWork:
    """What the proposer computes after a scheduled step (its `StepInfo`): every row's tokens, then a draft
    from every row that samples a token."""
    return DraftWork(info.counts, info.contexts, [seq.num_computed for seq in info.emit])


class SpeculativeTiming:
    """The engine's step time (`plan_time`): the target's verification step plus the proposer's work, read
    from the plan's rows (`work(plan.payload)`), timed right after `schedule` returned the plan."""

    def __init__(
        self,
        target: CostModel,
        drafter: Drafter,
        work: Callable[[Any], DraftWork],
        drafts: Callable[[], int],
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.work = work
        self.drafts = drafts  # draft tokens the step just scheduled verifies
        self.target_s = 0.0
        self.draft_s = 0.0

    def draft_seconds(self, w: DraftWork) -> float:
        d = self.drafter
        if d.cost is None:
            return d.host_s_per_row * len(w.samplers)
        if not w.counts:
            return 0.0
        seconds = d.cost.step_time(np.array(w.counts, np.int64), np.array(w.contexts, np.int64))[0]
        if w.samplers and d.k > 1:
            ctx = np.array(w.samplers, np.int64)
            ones = np.ones_like(ctx)
            for i in range(d.k - 1):
                seconds += d.cost.step_time(ones, ctx + i)[0]
        return seconds

    def __call__(self, new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        """The target's step alone (rows without a plan have no proposer work)."""
        return self.target.step_time(new_tokens, context)

    def plan_time(self, plan: StepPlan) -> tuple[float, bool]:
        seconds, bound = self.target.step_time(plan.new_tokens, plan.context)
        # The rejection sampler applies top-k/top-p at every verified position, not once per row.
        seconds += self.target.sampler_seconds(self.drafts())
        draft = self.draft_seconds(self.work(plan.payload))
        self.target_s += seconds
        self.draft_s += draft
        return seconds + draft, bound


# ----------------------------------------------------------------------------- records and summary


@dataclass(slots=True)
class SpecCounts:
    """Verification steps, drafts verified and drafts accepted: in all, and per request until its record is
    written (`pop`), so that the counts held do not grow with the run."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # steps that stopped at a rejected draft (all requests)
    open: dict[int, list[int]] = field(default_factory=dict)  # request id -> [steps, drafted, accepted]

    def add(self, request_id: int, drafted: int, accepted: int) -> None:
        if accepted < drafted:
            self.rejections += 1
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        mine = self.open.get(request_id)
        if mine is None:
            self.open[request_id] = [1, drafted, accepted]
        else:
            mine[0] += 1
            mine[1] += drafted
            mine[2] += accepted

    def pop(self, request_id: int) -> tuple[int, int, int]:
        """A request's counts (zeros if it never verified), forgotten here."""
        mine = self.open.pop(request_id, None)
        return (0, 0, 0) if mine is None else (mine[0], mine[1], mine[2])


SPEC_COLUMNS = ("spec_steps", "spec_drafted_tokens", "spec_accepted_tokens")


class SpecRecorder(Recorder):
    """`Recorder` with each request's verification steps, drafts and accepted drafts (`SPEC_COLUMNS`)."""

    EXTRA_COLUMNS = SPEC_COLUMNS

    def __init__(self, counts: SpecCounts, sink: RecordSink | None = None) -> None:
        self._counts = counts
        super().__init__(sink)

    def _request_extras(self, req: Request) -> tuple[int, ...]:
        return self._counts.pop(req.id)


def _expected_tokens(config: SpeculativeConfig) -> float | None:
    """Tokens a verification emits on average, from the configured acceptance (None when drawn)."""
    if config.acceptance_half_life is not None:  # alpha falls along each response: no closed form
        return None
    rates = config.position_rates()
    if rates is not None:
        match = 1.0 if config.ngram_match_rate is None else config.ngram_match_rate
        return 1.0 + match * float(np.cumprod(rates).sum())
    if config.acceptance != "fixed" or config.acceptance_rate is None:
        return None
    if config.ngram_match_rate is not None:
        return 1.0 + config.ngram_match_rate * (
            tokens_per_step(config.acceptance_rate, config.num_speculative_tokens) - 1.0
        )
    return tokens_per_step(config.acceptance_rate, config.num_speculative_tokens)


def spec_summary(
    config: SpeculativeConfig, drafter: Drafter, timing: SpeculativeTiming, counts: SpecCounts
) -> dict[str, Any]:
    """The summary's `speculative` block."""
    steps, drafted, accepted, stops = counts.steps, counts.drafted, counts.accepted, counts.rejections
    busy = timing.target_s + timing.draft_s
    falling = (
        {} if config.acceptance_half_life is None else {"acceptance_half_life": config.acceptance_half_life}
    )
    return {
        **falling,
        "method": config.method,
        "proposer": drafter.name,
        "num_speculative_tokens": config.num_speculative_tokens,
        "acceptance": config.acceptance,
        "acceptance_rate_config": config.acceptance_rate,
        "verification_steps": steps,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "mean_tokens_per_step": (accepted + steps) / steps if steps else None,
        "mean_accepted_per_step": accepted / steps if steps else None,
        "draft_acceptance_rate": accepted / drafted if drafted else None,
        # per-token acceptance: accepted drafts over drafts judged (each step judges its accepted drafts and,
        # unless all were accepted, the one rejected): the estimate of alpha
        "per_token_acceptance": accepted / (accepted + stops) if accepted + stops else None,
        "expected_tokens_per_step": _expected_tokens(config),
        "draft_time_s": timing.draft_s,
        "draft_time_share": timing.draft_s / busy if busy > 0 else 0.0,
        "draft_weight_bytes_per_gpu": drafter.weight_bytes,
        "draft_kv_bytes_per_token": drafter.kv_bytes_per_token,
    }


# ----------------------------------------------------------------------------- wiring into a run


class SpecRun:
    """A run's speculative decoding: the KV budget less the draft's memory, the step time with the draft's
    work, and the figures added to the records and summary (`sim.studies.run.run_policy` calls these in
    order)."""

    def __init__(self, config: SpeculativeConfig, drafter: Drafter, acceptance: Acceptance) -> None:
        self.config = config
        self.drafter = drafter
        self.acceptance = acceptance
        self.timing: SpeculativeTiming | None = None
        self.counts = SpecCounts()
        self.budget: KvBudget | None = None  # the replica's KV budget with the draft's memory taken out

    def replica_info(self) -> dict[str, Any]:
        """The summary's `replica` figures that the draft changes."""
        assert self.budget is not None
        return {"kv_blocks": self.budget.num_blocks, "kv_tokens": self.budget.num_tokens}

    def step_time(self, target: CostModel, scheduler: Any) -> SpeculativeTiming:
        """Hand the scheduler its acceptance draws; the engine's step-time function (`plan_time`)."""
        scheduler.attach(self.acceptance)
        self.counts = scheduler.counts
        self.timing = SpeculativeTiming(target, self.drafter, draft_work, scheduler.drafts_scheduled)
        return self.timing

    def recorder(self, sink: RecordSink | None = None) -> SpecRecorder:
        """The run's recorder, with the per-request speculation columns (after `step_time`)."""
        return SpecRecorder(self.counts, sink)

    def summary(self) -> dict[str, Any]:
        assert self.timing is not None
        return spec_summary(self.config, self.drafter, self.timing, self.counts)


def speculative_setup(
    scenario: Any,
    policy_config: BaseModel,
    target: CostModel,
    budget: KvBudget,
    seed: int | np.random.SeedSequence,
    base_dir: Path,
    source: str,
) -> SpecRun | None:
    """The run's `SpecRun`, or None when the policy has no `speculative` table."""
    config = getattr(policy_config, "speculative", None)
    if config is None:
        return None
    try:
        drafter = build_drafter(config, target)
    except SimError as err:
        raise SimError(f"{source}: {err}") from None
    arrival = scenario.workload.arrival
    rates = trace_acceptance(arrival, base_dir, source) if config.acceptance == "trace" else None
    m = scenario.model
    if m.num_kv_blocks is not None:
        blocks = budget.num_blocks
    else:
        mem = replica_kv_memory(m, target.model, target.gpu, source)
        blocks = kv_blocks_with_draft(mem.kv_bytes_available, mem.kv_bytes_per_token, drafter, m.block_size)
    if blocks < 2:
        raise SimError(
            f"{source}: speculative: the draft's weights ({drafter.weight_bytes / 1e9:.2f} GB per GPU) and "
            "KV leave no room for KV blocks"
        )
    run = SpecRun(config, drafter, Acceptance(config, run_seed(seed), rates))
    run.budget = KvBudget(blocks, budget.block_size, budget.max_model_len)
    return run
