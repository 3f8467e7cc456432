"""The `[workload]` table: arrival processes, length distributions, shared prefixes, trace replay.

Configs are pydantic models tagged by `kind`: arrival kinds are listed in `ARRIVAL_KINDS`, length kinds in
`sim.config.lengths.DISTRIBUTIONS`; `sim.workload` draws the requests they describe.

Example::

    [workload]
    max_tokens = 512                 # cap on generated tokens (default 1024; traces: the trace's own)
    arrival = { kind = "poisson", rate = 12.0 }
    prompt = { kind = "lognormal", mean = 450, cv = 0.8, max = 4000 }   # the question after any prefix
    output = { kind = "exponential", mean = 200 }                       # stop length, capped at max_tokens
    prefix = { groups = 9, prefix_len = 100, users_per_group = 5 }

`prefix = {groups, prefix_len, prompts_per_group}` makes the prompts a fixed pool instead, as load
generators' shared-prefix datasets are: `groups` system prompts, each followed by `prompts_per_group`
questions drawn once; requests take the pool's prompts in one shuffled order, cycling, so each whole
prompt recurs every `groups * prompts_per_group` requests (and the prefix cache may hold all of it).

Other arrivals: `gamma {rate, cv}`, `deterministic {rate}`, `staged {stages = [[rate, s], ...],
exact_count}`, `closed_loop {users, think_time_s, ramp_s}`, `trace {path, format, time_scale}`.
`shared_prefix = {system_prompt_len, question_len, output_len, num_unique_system_prompts,
num_users_per_system_prompt}` replaces prompt, output and prefix with the load generator's profile of the
calibration runs: a pool of `num_unique_system_prompts` x `num_users_per_system_prompt` fixed prompts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from sim.config.lengths import MAX_CV, MIN_CV, DistConfig, FixedDist
from sim.config.lora import LoraWorkload
from sim.config.sampling import SamplingWorkload
from sim.config.validation import format_validation_error
from sim.io.errors import SimError
from sim.io.limits import (
    MAX_COUNT,
    MAX_PARALLEL_SAMPLES,
    MAX_RATE,
    MAX_SECONDS,
    MAX_TOKENS,
)

DEFAULT_MAX_TOKENS = 1024


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class PoissonArrival(_Config):
    """Exponential gaps at `rate` requests per second."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, le=MAX_RATE)


class GammaArrival(_Config):
    """Gamma-distributed gaps: mean 1/rate, coefficient of variation `cv` (> 1 is bursty)."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0, le=MAX_RATE)
    cv: float = Field(ge=MIN_CV, le=MAX_CV)


class DeterministicArrival(_Config):
    """One request every 1/rate seconds, the first at t = 0."""

    kind: Literal["deterministic"] = "deterministic"
    rate: float = Field(gt=0, le=MAX_RATE)


def _array_as_tuple(v: Any) -> Any:
    """A TOML array read as the tuple it stands for (strict mode takes only a tuple)."""
    return tuple(v) if isinstance(v, list) else v


Stage = Annotated[
    tuple[Annotated[float, Field(ge=0, le=MAX_RATE)], Annotated[float, Field(gt=0, le=MAX_SECONDS)]],
    BeforeValidator(_array_as_tuple),
]


class StagedArrival(_Config):
    """Poisson stages `[[rate, duration_s], ...]` run back to back; finite.

    With `exact_count`, each stage holds exactly round(rate × duration) requests: exponential gaps
    rescaled to span the stage (the inference-perf load shape of the calibration runs).
    """

    kind: Literal["staged"] = "staged"
    stages: list[Stage] = Field(min_length=1)
    exact_count: bool = False


def _number_as_fixed(v: Any) -> Any:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return {"kind": "fixed", "value": v}
    return v


class ClosedLoopArrival(_Config):
    """`users` clients, each sending its next request `think_time_s` after the previous one finished.

    `think_time_s = 0` with `ramp_s = 0` is an offline batch: every user sends at t = 0.
    """

    kind: Literal["closed_loop"] = "closed_loop"
    users: int = Field(gt=0, le=MAX_COUNT)
    think_time_s: Annotated[DistConfig, BeforeValidator(_number_as_fixed)] = FixedDist(value=0.0)
    ramp_s: float = Field(0.0, ge=0, le=MAX_SECONDS)


class TraceArrival(_Config):
    """Replay a CSV / JSON-lines trace: `arrival_s, prompt_tokens, output_tokens[, prefix_group, prefix_len]`.

    The Azure trace names `arrived_at, num_prefill_tokens, num_decode_tokens` are accepted too; a length
    column under any other name (`prompt_len`, `completion_tokens`) is refused rather than left unread.
    Arrival times are multiplied by `time_scale` (0.5 replays twice as fast).
    """

    kind: Literal["trace"] = "trace"
    path: str = Field(min_length=1)
    format: Literal["csv", "jsonl"] | None = None
    time_scale: float = Field(1.0, gt=0, le=1e6)


# The arrival kinds, by their `kind` tag.
ARRIVAL_KINDS = (
    PoissonArrival, GammaArrival, DeterministicArrival, StagedArrival, ClosedLoopArrival, TraceArrival
)  # fmt: skip

ArrivalConfig = Annotated[
    Union[ARRIVAL_KINDS],  # type: ignore[valid-type]  # noqa: UP007
    Field(discriminator="kind"),
]


class PrefixConfig(_Config):
    """`groups` system prompts of `prefix_len` tokens; each request picks a group uniformly at random.

    `users_per_group` records how many users share a prompt; a closed-loop user `u` belongs to group
    `u % groups`. With `prompts_per_group` the prompts are a fixed pool of `groups * prompts_per_group`
    whole prompts (a group's system prompt, then one of its questions, each drawn once) taken in one
    shuffled order, cycling: request k sends the pool's prompt at position k mod the pool's size.
    """

    groups: int = Field(gt=0, le=MAX_COUNT)
    prefix_len: int = Field(gt=0, le=MAX_TOKENS)
    users_per_group: int | None = Field(None, gt=0, le=MAX_COUNT)
    # left out of dumps when absent, so scenarios without a pool keep their manifests and hashes
    prompts_per_group: int | None = Field(None, gt=0, le=MAX_COUNT, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _pool_size(self) -> PrefixConfig:
        if self.prompts_per_group is not None and self.groups * self.prompts_per_group > MAX_COUNT:
            raise ValueError(f"prompts_per_group: groups x prompts_per_group must be at most {MAX_COUNT:,}")
        return self


class SharedPrefixProfile(_Config):
    """The calibration runs' `shared_prefix` profile; expands to `prefix`, fixed `prompt` and `output`."""

    system_prompt_len: int = Field(gt=0, le=MAX_TOKENS)
    question_len: int = Field(gt=0, le=MAX_TOKENS)
    output_len: int = Field(gt=0, le=MAX_TOKENS)
    num_unique_system_prompts: int = Field(gt=0, le=MAX_COUNT)
    num_users_per_system_prompt: int = Field(1, gt=0, le=MAX_COUNT)


class WorkloadConfig(_Config):
    """The `[workload]` table."""

    arrival: ArrivalConfig
    prompt: DistConfig | None = None  # the question; the prompt is prefix_len + this
    output: DistConfig | None = None  # tokens generated before stopping, capped at max_tokens
    max_tokens: int | None = Field(None, gt=0, le=MAX_TOKENS)
    n: int = Field(1, ge=1, le=MAX_PARALLEL_SAMPLES)
    ignore_eos: bool = False
    prefix: PrefixConfig | None = None
    shared_prefix: SharedPrefixProfile | None = None
    # LoRA adapter per request (sim/config/lora.py); left out of dumps when absent, so records stay as
    # they were
    lora: LoraWorkload | None = Field(None, exclude_if=lambda v: v is None)
    # Sampling parameters per request (sim/config/sampling.py); left out of dumps when absent
    sampling: SamplingWorkload | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _complete(self) -> WorkloadConfig:
        sp = self.shared_prefix
        if sp is not None:
            clash = [k for k in ("prompt", "output", "prefix") if getattr(self, k) is not None]
            if clash:
                raise ValueError(f"shared_prefix sets prompt, output and prefix; remove {', '.join(clash)}")
            self.prefix = PrefixConfig(
                groups=sp.num_unique_system_prompts,
                prefix_len=sp.system_prompt_len,
                users_per_group=sp.num_users_per_system_prompt,
                prompts_per_group=sp.num_users_per_system_prompt,
            )
            self.prompt = FixedDist(value=sp.question_len)
            self.output = FixedDist(value=sp.output_len)
            if self.max_tokens is None:
                self.max_tokens = sp.output_len
        trace = self.arrival.kind == "trace"
        if trace and self.prefix is not None and self.prefix.prompts_per_group is not None:
            raise ValueError(
                "prefix.prompts_per_group: a trace gives each request its own prompt; a fixed prompt pool "
                "needs generated prompts"
            )
        if self.prompt is None and not trace:
            raise ValueError("prompt: a length distribution is required (e.g. {kind = 'fixed', value = 512})")
        if self.output is None and not (trace or self.ignore_eos):
            raise ValueError("output: a length distribution is required unless ignore_eos = true")
        for name in ("prompt", "output"):
            d = getattr(self, name)
            if isinstance(d, FixedDist) and d.value < 1:
                raise ValueError(f"{name}.value: a length must be >= 1 (got {d.value:g})")
            if isinstance(d, FixedDist) and not d.value.is_integer():
                raise ValueError(f"{name}.value: a token count must be a whole number (got {d.value:g})")
            if d is not None and d.max is not None and d.max < 1:
                raise ValueError(f"{name}.max: a length must be >= 1 (got {d.max:g})")
            if d is not None and d.min is not None and d.max is not None and math.ceil(d.min) > d.max:
                raise ValueError(f"{name}: min {d.min:g} and max {d.max:g} allow no whole number of tokens")
        return self


def parse_workload(data: Mapping[str, Any], source: str = "<scenario>") -> WorkloadConfig:
    """Validate a `[workload]` table; SimError naming the file and dotted key on bad input."""
    try:
        return WorkloadConfig.model_validate(data)
    except ValidationError as e:
        raise SimError(format_validation_error(e, data, source)) from None
