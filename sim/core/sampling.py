"""A request's sampling parameters, as vLLM's `SamplingParams` names them; None: not given (the checkpoint's
generation_config.json default, else vLLM's)."""

from __future__ import annotations

from dataclasses import dataclass

# The keys, in the order trace columns and records name them.
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "seed",
    "structured_output",
)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float | None = None  # 0: greedy
    top_p: float | None = None
    top_k: int | None = None  # 0 or -1: the whole vocabulary
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: int | None = None  # top log-probabilities returned per token
    seed: int | None = None
    structured_output: str | None = None  # "json", "regex", "grammar" or "choice"


NOT_GIVEN = SamplingParams()
