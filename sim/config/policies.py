"""The knobs of each scheduling policy (a `[policies.NAME]` table), by scheduler name."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.catalog.engines import DEFAULT_ENGINE, engine_names
from sim.config.lora import LoraConfig
from sim.config.speculative import SpeculativeConfig


class EngineChoice(BaseModel):
    """The engine whose step costs a policy pays (sim/catalog/engines.toml): today's vLLM by default, left
    out of dumps then so that records and manifests without it are unchanged."""

    model_config = ConfigDict(extra="forbid", strict=True)

    engine: str = Field(
        DEFAULT_ENGINE,
        description="the engine whose step costs the policy pays: vllm-0.15 (today's calibration) or a "
        "profile fitted to published step times (sim/catalog/engines.toml)",
        exclude_if=lambda v: v == DEFAULT_ENGINE,
    )

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        known = engine_names()
        if value not in known:
            raise ValueError(f"unknown engine {value[:40]!r}; known: {', '.join(known)}")
        return value


class VllmConfig(EngineChoice):
    """Knobs of the `vllm` policy. Prefix caching is off by default (vLLM v1 turns it on) so that runs
    without shared prefixes pay no lookups; enable it for workloads with prefix groups."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    long_prefill_token_threshold: int = Field(0, ge=0)
    async_scheduling: bool = Field(
        True,
        description="form each step while the previous one runs, as vLLM does by default since 0.14: a "
        "request arriving during a step waits for the step after the next (off with draft-model or n-gram "
        "speculation)",
    )
    watermark: float = Field(
        0.0, ge=0.0, lt=1.0, description="share of KV blocks kept free at admission beside running sequences"
    )
    # --- speculative decoding (sim/config/speculative.py) and LoRA (sim/config/lora.py), left out of dumps
    # when absent so records and manifests without them are unchanged ---
    speculative: SpeculativeConfig | None = Field(None, exclude_if=lambda v: v is None)
    lora: LoraConfig | None = Field(
        None, description="serve LoRA adapters (sim/config/lora.py)", exclude_if=lambda v: v is None
    )

    @model_validator(mode="after")
    def _async_with_speculation(self) -> VllmConfig:
        """vLLM schedules asynchronously only with EAGLE/MTP speculation: it turns its default off for the
        other methods and refuses them when asked for it."""
        spec = self.speculative
        if spec is not None and spec.method not in ("eagle", "mtp") and self.async_scheduling:
            if "async_scheduling" in self.model_fields_set:
                raise ValueError(
                    f"async_scheduling: vLLM schedules asynchronously only with eagle or mtp speculation "
                    f"(method is {spec.method!r})"
                )
            self.async_scheduling = False
        return self

    @model_validator(mode="after")
    def _engine_alone(self) -> VllmConfig:
        """An engine profile costs plain steps: draft and verification passes, and LoRA's, are today's."""
        if self.engine != DEFAULT_ENGINE and (self.speculative is not None or self.lora is not None):
            feature = "speculative decoding" if self.speculative is not None else "LoRA"
            raise ValueError(f"engine: a profile ({self.engine!r}) is not modelled with {feature}; only "
                             f"{DEFAULT_ENGINE!r} is")  # fmt: skip
        return self


class SarathiConfig(VllmConfig):
    """Sarathi-Serve's stall-free batching: decodes first, prefill chunks fill a small token budget.

    The vllm rules already give this order: running sequences go first, and without a long-prefill
    threshold only the most recently admitted one can be mid-prefill, so it comes after every decode.
    Sarathi is therefore the same scheduler with a small budget and chunked prefill on.
    """

    max_num_batched_tokens: int = Field(512, ge=1)
    enable_chunked_prefill: bool = True


class StaticConfig(EngineChoice):
    model_config = ConfigDict(extra="forbid", strict=True)
    max_batch_size: int = Field(32, ge=1, description="Requests per batch.")
    batch_timeout_s: float = Field(
        0.0,
        ge=0,
        description="How long the oldest queued request may wait for a fuller batch (0: start at once).",
    )


class ContinuousConfig(EngineChoice):
    model_config = ConfigDict(extra="forbid", strict=True)
    max_num_seqs: int = Field(
        256, ge=1, description="Most sequences running at once (a request with n > 1 is n sequences)."
    )
    max_num_batched_tokens: int = Field(
        8192,
        ge=1,
        description="Prefill tokens admitted per step, n per prompt token (a longer one still runs alone).",
    )


class OrcaConfig(ContinuousConfig):
    """The vLLM paper's Orca baselines (engine/schedulers/buddy.py): `continuous` with a buddy allocator."""

    reservation: Literal["oracle", "pow2", "max"] = Field(
        "oracle",
        description="output slots reserved per request: the true output length (oracle), it rounded up to a "
        "power of two (pow2), or up to max_model_len (max)",
    )
    buddy_tokens: int | None = Field(
        None, ge=1, description="slots per buddy (at least max_model_len; default: max_model_len)"
    )


class VllmV0Config(EngineChoice):
    """vLLM before v1 as Sarathi-Serve's artifact runs it (engine/schedulers/vllm_v0.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_num_seqs: int = Field(256, ge=1, description="Most sequences running at once.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Prompt tokens per prefill step (default, and at most: max_model_len)."
    )
    watermark: float = Field(
        0.01, ge=0.0, lt=1.0, description="share of KV blocks an admission must leave free"
    )


class SLoraConfig(EngineChoice):
    """Knobs of the `slora` policy (engine/schedulers/slora.py), named as S-LoRA's server flags
    (S-LoRA/S-LoRA, slora/server/api_server.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    max_total_token_num: int | None = Field(
        None, ge=1, description="cells of the unified pool, one token's K and V each (default: the KV budget)"
    )
    batch_max_tokens: int | None = Field(
        None, ge=1, description="prompt tokens per prefill step (default: max(pool / 6, 3,072), as S-LoRA's)"
    )
    running_max_req_size: int = Field(1000, ge=1, description="most requests running at once")
    max_wait_tokens: int = Field(10, ge=1, description="decode steps between two admission attempts")
    max_new_tokens: Literal["max_tokens", "output"] = Field(
        "max_tokens",
        description="what the router reserves output cells for: max_tokens, or each request's own output "
        "length (S-LoRA's benchmark sends max_new_tokens = the output length, with ignore_eos)",
    )
    prefetch: bool = Field(
        False, description="load the adapters of queued requests during decode steps, off the step's time"
    )
    host_link: str | None = Field(None, description="host-to-GPU link (default: the GPU's PCIe)")

    @model_validator(mode="after")
    def _engine_alone(self) -> SLoraConfig:
        if self.engine != DEFAULT_ENGINE:
            raise ValueError(f"engine: a profile ({self.engine!r}) is not modelled with LoRA; only "
                             f"{DEFAULT_ENGINE!r} is")  # fmt: skip
        return self


# The knobs of each scheduling policy, by the name a `[policies.NAME]` table gives as `scheduler`; the
# policies themselves: sim.engine.schedulers.
POLICIES: dict[str, type[BaseModel]] = {
    "static": StaticConfig,
    "continuous": ContinuousConfig,
    "orca": OrcaConfig,
    "vllm": VllmConfig,
    "sarathi": SarathiConfig,
    "vllm-v0": VllmV0Config,
    "slora": SLoraConfig,
}
