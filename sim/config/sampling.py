"""`[workload.sampling]`: each request's sampling parameters, as vLLM's SamplingParams takes them.

One set of parameters for every request, or `profiles`: a mix of sets, each drawn with probability
proportional to its `share` and inheriting the keys the table sets beside it. A trace's columns of the same
names (`temperature`, `top_p`, ...) override both, per request. A key no one gives takes the checkpoint's
generation_config.json default, else vLLM's (sim/catalog/generation.py). Ranges are vLLM's
(`SamplingParams._verify_args`); `best_of` left vLLM in V1 and is refused; `n` is `workload.n`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.core.sampling import SAMPLING_KEYS, SamplingParams

# vLLM's default --max-logprobs: the most log-probabilities a request may ask for.
MAX_LOGPROBS = 20


STRUCTURED = ("json", "regex", "grammar", "choice")


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class SamplingProfile(_Config):
    """One set of sampling parameters (every key optional)."""

    temperature: float | None = Field(None, ge=0.0, le=100.0, description="0: greedy (argmax)")
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=1 << 30, description="0 or -1: the whole vocabulary")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS, description="top log-probabilities per token")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    structured_output: Literal[STRUCTURED] | None = Field(None, description="a grammar: json, regex, ...")  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _no_best_of(cls, data: Any) -> Any:
        if isinstance(data, dict) and "best_of" in data:
            raise ValueError(
                "best_of: vLLM V1 (0.15) no longer takes best_of; sample n sequences with workload.n instead"
            )
        return data

    def params(self, base: SamplingParams | None = None) -> SamplingParams:
        """These keys over `base`'s."""
        given = {k: getattr(self, k) for k in SAMPLING_KEYS if getattr(self, k) is not None}
        below = {k: getattr(base, k) for k in SAMPLING_KEYS} if base is not None else {}
        return SamplingParams(**{**below, **given})


class WeightedProfile(SamplingProfile):
    share: float = Field(gt=0.0, le=1e6, description="relative weight of this profile in the mix")


class SamplingWorkload(SamplingProfile):
    """`[workload.sampling]`: the parameters every request takes, and optionally a weighted mix."""

    profiles: list[WeightedProfile] | None = Field(None, min_length=1, max_length=1000)

    def table(self) -> tuple[tuple[SamplingParams, ...], tuple[float, ...]]:
        """The distinct parameter sets and their probabilities."""
        base = self.params()
        if not self.profiles:
            return (base,), (1.0,)
        total = sum(p.share for p in self.profiles)
        return tuple(p.params(base) for p in self.profiles), tuple(p.share / total for p in self.profiles)
