"""Speculative decoding: the `speculative` table of the vllm policy, acceptance draws, the draft's cost and
memory, and the run's figures.

A decoding sequence carries k draft tokens (`num_speculative_tokens`); the target verifies them in one step
that computes 1 + k tokens for it. Draft token i is accepted with probability alpha independently of the
others, and verification stops at the first rejection, so the accepted count a in {0..k} has
P(a >= i) = alpha^i; the step emits a + 1 tokens (the accepted drafts and the target's own token at the first
rejected position). Its mean is (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al. 2023, eq. 1).

Who proposes the drafts sets their cost, added to the target's verification step:

- `draft`: a smaller model of the catalogue on the same GPUs and tensor parallelism: one pass over the step's
  rows (the new prompt tokens and the verified tokens, which the draft must cache too), then k - 1 passes of
  one token for every row that samples a token, as vLLM v1's proposers run;
- `eagle` / `mtp`: the same passes through a head of `head_layers` decoder layers of the target's own shape
  (with the target's LM head);
- `ngram`: prompt lookup on the host, `ngram_s_per_row` seconds per sampling row and step, no GPU work.

The scheduling side (spec tokens in the token budget, KV slots of rejected tokens freed) is in
sim/engine/schedulers/vllm_spec.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.catalog.model import ModelSpec, load_model
from sim.core.request import Request
from sim.cost.memory import kv_bytes_per_token_per_gpu, kv_memory, replica_kv_memory
from sim.cost.roofline import CostModel
from sim.engine.schedulers.base import StepPlan
from sim.engine.schedulers.registry import KvBudget
from sim.io.errors import SimError
from sim.records.recorder import Recorder
from sim.records.sinks import RecordSink

MAX_SPEC_TOKENS = 16
# Host time of an n-gram lookup per sampling sequence and step: vLLM's proposer matches the last n tokens
# against the context on the CPU (numba); a few microseconds per sequence. An assumption, not a measurement.
NGRAM_S_PER_ROW = 5e-6


class SpeculativeConfig(BaseModel):
    """The `speculative` table of a `vllm` / `sarathi` policy."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    method: Literal["draft", "ngram", "eagle", "mtp"]
    num_speculative_tokens: int = Field(ge=1, le=MAX_SPEC_TOKENS, description="Draft tokens k per step.")
    draft_model: str | None = Field(None, description="Catalogue name of the draft model (method = draft).")
    draft_tensor_parallel_size: int | None = Field(
        None, ge=1, le=64, description="GPUs the draft model is sharded over (default: the target's tp)."
    )
    head_layers: int | None = Field(
        None, ge=1, le=8, description="Decoder layers of the drafting head (method = eagle or mtp)."
    )
    acceptance: Literal["fixed", "beta", "trace"] = Field(
        "fixed", description="fixed alpha, alpha ~ Beta per request, or the trace's acceptance_rate column."
    )
    acceptance_rate: float | None = Field(
        None, ge=0.0, le=1.0, description="alpha (fixed), or the mean of the Beta distribution."
    )
    acceptance_concentration: float | None = Field(
        None, gt=0.0, le=1e6, description="Beta concentration a + b (acceptance = beta)."
    )
    ngram_s_per_row: float = Field(
        NGRAM_S_PER_ROW, ge=0.0, le=1e-2, description="Host seconds of an n-gram lookup per sequence."
    )

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeConfig:
        m = self.method
        if m == "draft":
            if self.draft_model is None:
                raise ValueError("draft_model: required when method = 'draft' (a catalogue model name)")
            try:
                load_model(self.draft_model)
            except SimError as err:
                raise ValueError(f"draft_model: {err}") from None
        else:
            for key in ("draft_model", "draft_tensor_parallel_size"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key}: only with method = 'draft' (method is {m!r})")
        if m in ("eagle", "mtp"):
            if self.head_layers is None:
                raise ValueError(f"head_layers: required when method = {m!r} (decoder layers of the head)")
        elif self.head_layers is not None:
            raise ValueError(f"head_layers: only with method = 'eagle' or 'mtp' (method is {m!r})")
        if self.acceptance in ("fixed", "beta") and self.acceptance_rate is None:
            raise ValueError(f"acceptance_rate: required when acceptance = {self.acceptance!r}")
        if self.acceptance == "beta":
            if self.acceptance_concentration is None:
                raise ValueError("acceptance_concentration: required when acceptance = 'beta'")
            assert self.acceptance_rate is not None
            if not 0.0 < self.acceptance_rate < 1.0:
                raise ValueError("acceptance_rate: the Beta mean must lie strictly between 0 and 1")
        elif self.acceptance_concentration is not None:
            raise ValueError("acceptance_concentration: only with acceptance = 'beta'")
        if self.acceptance == "trace" and self.acceptance_rate is not None:
            raise ValueError("acceptance_rate: not used with acceptance = 'trace' (the trace gives it)")
        return self


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens emitted by one verification of k drafts at per-token acceptance alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


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

    def stream(self, request_id: int, child: int) -> random.Random:
        """The uniform draws of one sequence's verification steps."""
        state = np.random.SeedSequence([self.seed, 2, request_id, child]).generate_state(2, np.uint64)
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
    from sim.io.tables import read_table
    from sim.workload.generator import TRACE_COLUMNS, TraceArrival, resolve

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


def head_spec(target: ModelSpec, layers: int) -> ModelSpec:
    """A drafting head: `layers` decoder layers of the target's shape, its LM head (shared weights), no
    embedding of its own."""
    f = layers / target.num_layers
    moe = round(target.num_moe_layers * f)
    return replace(
        target,
        name=f"{target.name} head ({layers} layers)",
        num_layers=layers,
        num_sliding_layers=min(layers, round(target.num_sliding_layers * f)),
        num_moe_layers=moe,
        attention_params=round(target.attention_params * f),
        dense_params=round(target.dense_params * f),
        routed_expert_params=moe * target.num_experts * target.expert_params,
        norm_params=round(target.norm_params * f),
    )


@dataclass(slots=True)
class Drafter:
    """The proposer's cost model (None for n-gram) and the memory it takes on the GPU holding most of it (a
    draft sharded over fewer GPUs than the target sits whole on the first ones, which then bind the KV
    blocks every GPU gets)."""

    method: str
    k: int
    cost: CostModel | None
    weight_bytes: int  # per GPU, beside the target's
    kv_bytes_per_token: int  # per GPU, beside the target's
    host_s_per_row: float
    name: str


def build_drafter(config: SpeculativeConfig, target: CostModel) -> Drafter:
    """The proposer of a `speculative` table, on the target's GPU type and tensor parallelism."""
    k, tp = config.num_speculative_tokens, target.tp
    # Proposers draft greedily (argmax): no sort over the vocabulary, so no sampler term.
    greedy = replace(target.cal, sampler_s_per_entry=0.0)
    if config.method == "ngram":
        return Drafter("ngram", k, None, 0, 0, config.ngram_s_per_row, "n-gram")
    kv_dtype = target.kv_dtype
    if config.method == "draft":
        assert config.draft_model is not None
        spec = load_model(config.draft_model)
        tp = config.draft_tensor_parallel_size or tp
        if spec.num_heads % tp:
            raise SimError(
                f"speculative.draft_tensor_parallel_size: {spec.name} has {spec.num_heads} attention heads, "
                f"not divisible by {tp}; set draft_tensor_parallel_size (sim capacity: --draft-tp; 1 runs "
                "the draft on one GPU)"
            )
        cost = CostModel(spec, target.gpu, tp, None, kv_dtype, greedy)
        weights = int(spec.weight_bytes() / tp)
        name = spec.name
    else:
        assert config.head_layers is not None
        spec = head_spec(target.model, config.head_layers)
        cost = CostModel(spec, target.gpu, tp, target.weight_dtype, kv_dtype, greedy)
        groups = ("attention", "dense", "experts", "norm")
        wd = target.weight_dtype
        weights = int(sum(spec.group_params(g) * spec.param_bytes(g, wd) for g in groups) / tp)
        name = f"{config.method} head, {config.head_layers} layers"
    kv = kv_bytes_per_token_per_gpu(spec, tp, kv_dtype)
    return Drafter(config.method, k, cost, weights, kv, 0.0, name)


def kv_blocks_with_draft(available: int, target_per_token: int, drafter: Drafter, block_size: int) -> int:
    """KV blocks when the draft's weights come out of the KV memory and every block also holds the draft's
    KV for its tokens (one block table for both, as vLLM allocates them)."""
    per_block = (target_per_token + drafter.kv_bytes_per_token) * block_size
    return max(0, (available - drafter.weight_bytes) // per_block)


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


def spec_summary(
    config: SpeculativeConfig, drafter: Drafter, timing: SpeculativeTiming, counts: SpecCounts
) -> dict[str, Any]:
    """The summary's `speculative` block."""
    steps, drafted, accepted, stops = counts.steps, counts.drafted, counts.accepted, counts.rejections
    busy = timing.target_s + timing.draft_s
    return {
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
        "expected_tokens_per_step": (
            tokens_per_step(config.acceptance_rate, config.num_speculative_tokens)
            if config.acceptance == "fixed" and config.acceptance_rate is not None
            else None
        ),
        "draft_time_s": timing.draft_s,
        "draft_time_share": timing.draft_s / busy if busy > 0 else 0.0,
        "draft_weight_bytes_per_gpu": drafter.weight_bytes,
        "draft_kv_bytes_per_token": drafter.kv_bytes_per_token,
    }


# ----------------------------------------------------------------------------- wiring into a run


class SpecRun:
    """A run's speculative decoding: the KV budget less the draft's memory, the step time with the draft's
    work, and the figures added to the records and summary (`sim.studies.run.run_policy` calls these in order)."""

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


# ----------------------------------------------------------------------------- `sim capacity --draft-model`


def draft_capacity(
    model: str,
    gpu: str,
    tp: int,
    gpu_memory_utilization: float,
    weight_dtype: str | None,
    kv_dtype: str | None,
    draft_model: str,
    draft_tp: int | None,
    typical_len: int,
) -> dict[str, Any]:
    """KV capacity of `model` without and with a draft model beside it (JSON-ready, bytes per GPU)."""
    from sim.catalog.gpus import get_gpu

    g = get_gpu(gpu)
    target = load_model(model)
    mem = kv_memory(target, g, tp, gpu_memory_utilization, weight_dtype, kv_dtype)
    cost = CostModel(target, g, tp, weight_dtype, kv_dtype)
    try:
        cfg = SpeculativeConfig(
            method="draft", draft_model=draft_model, draft_tensor_parallel_size=draft_tp,
            num_speculative_tokens=1, acceptance_rate=0.5,
        )  # fmt: skip
    except ValidationError as err:  # an unknown or malformed draft model
        message = err.errors()[0]["msg"].removeprefix("Value error, ").removeprefix("draft_model: ")
        raise SimError(f"--draft-model: {message}") from None
    drafter = build_drafter(cfg, cost)
    blocks = kv_blocks_with_draft(mem.kv_bytes_available, mem.kv_bytes_per_token, drafter, mem.block_size)
    per_seq = math.ceil(typical_len / mem.block_size)
    return {
        "model": target.name,
        "draft_model": drafter.name,
        "gpu": g.name,
        "tp": tp,
        "draft_tp": draft_tp or tp,
        "kv_bytes_available": mem.kv_bytes_available,
        "draft_weight_bytes": drafter.weight_bytes,
        "kv_bytes_per_token": mem.kv_bytes_per_token,
        "draft_kv_bytes_per_token": drafter.kv_bytes_per_token,
        "block_size": mem.block_size,
        "kv_blocks": mem.num_blocks,
        "kv_blocks_with_draft": blocks,
        "typical_len": typical_len,
        "max_seqs_at_typical_len": mem.num_blocks // per_seq,
        "max_seqs_at_typical_len_with_draft": blocks // per_seq,
    }


def print_draft_capacity(figures: dict[str, Any], as_json: bool) -> None:
    """`sim capacity MODEL --draft-model DRAFT`: the KV blocks the draft's weights and KV take."""
    import json

    from rich.console import Console
    from rich.table import Table

    if as_json:
        print(json.dumps(figures))
        return
    f, gb = figures, 1e9
    t = Table(title=f"{f['model']} on {f['gpu']} x{f['tp']} with draft {f['draft_model']} (x{f['draft_tp']})")
    t.add_column("quantity")
    t.add_column("without draft", justify="right")
    t.add_column("with draft", justify="right")
    t.add_column("arithmetic")
    t.add_row("draft weights / GPU", "0", f"{f['draft_weight_bytes'] / gb:,.2f} GB", "on the draft's GPUs")
    per, dper = f["kv_bytes_per_token"], f["draft_kv_bytes_per_token"]
    t.add_row("KV bytes / token", f"{per:,} B", f"{per + dper:,} B", f"target {per:,} + draft {dper:,}")
    t.add_row(
        "KV blocks", f"{f['kv_blocks']:,}", f"{f['kv_blocks_with_draft']:,}",
        f"({f['kv_bytes_available'] / gb:,.2f} GB - draft weights) / ({f['block_size']} x KV bytes / token)",
    )  # fmt: skip
    t.add_row(
        f"max seqs @ {f['typical_len']:,} tokens", f"{f['max_seqs_at_typical_len']:,}",
        f"{f['max_seqs_at_typical_len_with_draft']:,}", "blocks / blocks per sequence",
    )  # fmt: skip
    Console(width=140).print(t)
