"""The sampler's time in a step, following each row's sampling parameters as vLLM V1's `Sampler`
(vllm/v1/sample/sampler.py) runs them.

Without per-request sampling parameters the engine charges every row the fitted `sampler_s_per_entry`
times the vocabulary (the calibration's term, sim/cost/roofline.py `overhead_seconds`), which is the
full-vocabulary top-k/top-p sort's path; that default is unchanged. With parameters (`[workload.sampling]`,
a trace's sampling columns, or a checkpoint's generation_config.json) a step pays, over all its rows, for each
stage some row needs, because vLLM runs each stage on the whole batch's logits at once:

- fp32 logits, always: `logits.to(float32)`, 6 B per row and vocabulary entry (read bf16, write fp32);
- greedy, when a row has temperature 0: `logits.argmax(-1)` (`greedy_sample`), 4 B;
- random, when a row has temperature > 0 (`random_sample`): `div_(temperature)`, `softmax`, `exponential_`,
  `div_`, `argmax`, 44 B;
- top-k alone, when a row has top_k and none top_p: `topk` and a mask (`apply_top_k_only`), 16 B;
- top-p, when a row has top_p < 1: a `sort` of the whole vocabulary, `softmax`, `cumsum`, `scatter`
  (`apply_top_k_top_p`): `sampler_s_per_entry`, the fitted term;
- min-p, when a row has min_p > 0: `softmax`, `amax`, a mask (`apply_min_p`), 28 B;
- penalties, when a row has one (`apply_all_penalties`): bin counts of the prompt and output tokens, their
  masks, a `where` and two subtractions, 80 B, and 16 B per prompt or output token of every row (the ids
  read and scattered: the penalties read the rows' output history);
- logprobs, when a row asks for them: a copy of the raw logits, `log_softmax`, `topk`, a rank count
  (`compute_logprobs`, `gather_logprobs`), 36 B;
- a grammar, per structured row: `apply_token_bitmask_inplace`, 8.125 B, and GRAMMAR_HOST_S on the host;
- a seed, per seeded row: its own `exponential_(generator=...)` launch, SEEDED_ROW_S.

Bytes are fp32 reads and writes at the GPU's HBM bandwidth times the calibration's `bandwidth_eff`, counted
from the kernels' passes over the logits (a derivation, not a measurement). The top-p row is the fitted
constant: the shipped calibration charges it to every row today. Greedy rows drop top_p, top_k and min_p as
vLLM's SamplingParams does (temperature below 1e-5).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace

from sim.core.sampling import SamplingParams

# vLLM's defaults for what neither the request nor generation_config.json sets (vllm/sampling_params.py).
VLLM_DEFAULTS = SamplingParams(
    temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, presence_penalty=0.0,
    frequency_penalty=0.0,
)  # fmt: skip
SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy

CAST_BYTES = 6.0
GREEDY_BYTES = 4.0
RANDOM_BYTES = 44.0  # temperature div_ (8), softmax (16), exponential_ (4), div_ (12), argmax (4)
TOP_K_BYTES = 16.0
MIN_P_BYTES = 28.0
PENALTY_BYTES = 80.0
PENALTY_BYTES_PER_TOKEN = 16.0  # each prompt or output token id read and scattered into its row's counts
LOGPROBS_BYTES = 36.0  # a copy of the raw logits (8), log_softmax (16), topk (8), rank count (4)
GRAMMAR_BYTES = 8.125  # the row's bitmask (1 bit per entry) and its logits read and written
# Host time to fill one structured row's token bitmask per step (XGrammar in vLLM's engine core): an
# assumption, below the XGrammar paper's "under 40 µs per token" (Dong et al., 2024) as its mask cache hits.
GRAMMAR_HOST_S = 1e-5
# One kernel launch per seeded row (vLLM draws each seeded row with its own torch.Generator): a prior, the
# 3 µs element-wise kernel latency of kernel_calibration.toml's elementwise_fixed_s.
SEEDED_ROW_S = 3e-6


def resolve(params: SamplingParams, defaults: dict[str, float]) -> SamplingParams:
    """A request's parameters with the generation_config.json `defaults` and vLLM's filled in."""
    filled = {}
    for f in fields(SamplingParams):
        value = getattr(params, f.name)
        if value is None:
            value = defaults.get(f.name, getattr(VLLM_DEFAULTS, f.name))
        filled[f.name] = value
    out = SamplingParams(**filled)
    if out.temperature is not None and out.temperature < SAMPLING_EPS:
        out = replace(out, top_p=1.0, top_k=0, min_p=0.0)
    return out


@dataclass
class BatchSampling:
    """The stages a step's sampler runs, from its rows' resolved parameters."""

    rows: int = 0
    greedy: bool = False
    random: bool = False
    top_k: bool = False
    top_p: bool = False
    min_p: bool = False
    penalties: bool = False
    logprobs: bool = False
    structured: int = 0
    seeded: int = 0
    tokens: int = 0  # prompt and output tokens of every row (read by the penalties)

    def add(self, p: SamplingParams, tokens: int) -> None:
        """One row: resolved parameters `p`, with `tokens` prompt and output tokens so far."""
        self.rows += 1
        self.tokens += tokens
        if p.temperature is not None and p.temperature < SAMPLING_EPS:
            self.greedy = True
        else:
            self.random = True
            self.top_p |= p.top_p is not None and p.top_p < 1.0
            self.top_k |= p.top_k is not None and p.top_k > 0
            self.min_p |= p.min_p is not None and p.min_p > 0.0
            self.seeded += p.seed is not None
        self.penalties |= (
            p.repetition_penalty not in (None, 1.0) or p.presence_penalty not in (None, 0.0)
        ) or p.frequency_penalty not in (None, 0.0)
        self.logprobs |= p.logprobs is not None
        self.structured += p.structured_output is not None


def entry_bytes(b: BatchSampling) -> float:
    """Bytes per row and vocabulary entry that the batch's stages stream, the top-p sort's aside."""
    bytes_ = CAST_BYTES + (GREEDY_BYTES if b.greedy else 0.0)
    if b.random:
        bytes_ += RANDOM_BYTES + (MIN_P_BYTES if b.min_p else 0.0)
        bytes_ += TOP_K_BYTES if b.top_k and not b.top_p else 0.0
    return bytes_ + (PENALTY_BYTES if b.penalties else 0.0) + (LOGPROBS_BYTES if b.logprobs else 0.0)


def sorts(b: BatchSampling) -> bool:
    """Whether the batch runs the top-p sort (the fitted `sampler_s_per_entry`)."""
    return b.random and b.top_p


@dataclass(frozen=True)
class RowSampler:
    """The sampler of a batch whose rows all sample alike, as terms the cost model's step prices: per row,
    `sort_entries` under the fitted sort term and `row_bytes` streamed; per prompt or output token of every
    row, `token_bytes` streamed (the penalties' history)."""

    sort_entries: float
    row_bytes: float
    token_bytes: float

    @classmethod
    def of(cls, p: SamplingParams, vocab: int) -> RowSampler:
        """The terms of rows resolved to `p` (sampling parameters without per-row extras: no grammar, seed
        or logprobs, as a generation_config.json gives them)."""
        if p.structured_output is not None or p.seed is not None or p.logprobs is not None:
            raise ValueError("a grammar, a seed or logprobs are priced per row, by SampledTiming")
        b = batch_of([(p, 0)])
        token = PENALTY_BYTES_PER_TOKEN if b.penalties else 0.0
        return cls(float(vocab) if sorts(b) else 0.0, vocab * entry_bytes(b), token)


class SamplerCost:
    """The sampler's seconds for a batch of rows over a `vocab`-entry vocabulary on a GPU streaming
    `bytes_per_s` (HBM bandwidth x efficiency), with the fitted sort term `sort_s_per_entry`."""

    def __init__(self, vocab: int, bytes_per_s: float, sort_s_per_entry: float) -> None:
        self.vocab, self.byte_s, self.sort_s = vocab, 1.0 / bytes_per_s, sort_s_per_entry

    def entry_seconds(self, b: BatchSampling) -> float:
        """Seconds per row and vocabulary entry of the stages the batch runs on every row."""
        return entry_bytes(b) * self.byte_s + (self.sort_s if sorts(b) else 0.0)

    def seconds(self, b: BatchSampling, positions: int | None = None) -> float:
        """The batch's sampler time over `positions` sampled positions (default: one per row)."""
        n = b.rows if positions is None else positions
        per_row = self.vocab * self.entry_seconds(b)
        grammar = b.structured * (self.vocab * GRAMMAR_BYTES * self.byte_s + GRAMMAR_HOST_S)
        penalty = b.tokens * PENALTY_BYTES_PER_TOKEN * self.byte_s if b.penalties else 0.0
        return n * per_row + grammar + penalty + b.seeded * SEEDED_ROW_S


def batch_of(rows: Iterable[tuple[SamplingParams, int]]) -> BatchSampling:
    """The stages of a batch of (resolved parameters, tokens so far) rows."""
    b = BatchSampling()
    for params, tokens in rows:
        b.add(params, tokens)
    return b
