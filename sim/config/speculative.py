"""The `speculative` table of a `vllm` / `sarathi` policy."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.catalog.models import load_model
from sim.io.errors import SimError

MAX_SPEC_TOKENS = 16


# Host time of an n-gram lookup per sampling sequence and step: vLLM's proposer matches the last n tokens
# against the context on the CPU (numba); a few microseconds per sequence. An assumption, not a measurement.
NGRAM_S_PER_ROW = 5e-6


def _unset(value: object) -> bool:
    """A key not given (None)."""
    return value is None


class SpeculativeConfig(BaseModel):
    """The `speculative` table of a `vllm` / `sarathi` policy."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

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
    # Added later: left out of dumps when not given, so existing runs' manifests stay as they were.
    ngram_match_rate: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        exclude_if=_unset,
        description="Share of lookups that find a match (method = ngram; default 1).",
    )
    draft_vocab_size: int | None = Field(
        None,
        ge=1,
        le=1 << 24,
        exclude_if=_unset,
        description="An EAGLE-3 head's reduced vocabulary (method = eagle).",
    )
    acceptance_per_position: list[float] | None = Field(
        None,
        exclude_if=_unset,
        description="alpha_i of each draft position i, given the ones before it were accepted.",
    )
    acceptance_decay: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        exclude_if=_unset,
        description="alpha_i = acceptance_rate x decay^(i - 1) (acceptance = fixed).",
    )
    accepted_per_position: list[int] | None = Field(
        None,
        exclude_if=_unset,
        description="vLLM's spec_decode_num_accepted_tokens_per_pos counts, with num_drafts.",
    )
    num_drafts: int | None = Field(
        None, ge=1, le=2**53, exclude_if=_unset, description="vLLM's spec_decode_num_drafts count."
    )
    acceptance_half_life: float | None = Field(
        None,
        gt=0.0,
        le=1e9,
        exclude_if=_unset,
        description="Output tokens over which acceptance halves along a response (default: no fall).",
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
        if m != "ngram" and self.ngram_match_rate is not None:
            raise ValueError(f"ngram_match_rate: only with method = 'ngram' (method is {m!r})")
        if m != "eagle" and self.draft_vocab_size is not None:
            raise ValueError(f"draft_vocab_size: only with method = 'eagle' (method is {m!r})")
        positions = self._per_position()
        if positions is not None and self.acceptance != "fixed":
            raise ValueError("acceptance_per_position: only with acceptance = 'fixed'")
        if positions is None and self.acceptance in ("fixed", "beta") and self.acceptance_rate is None:
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
        if self.acceptance_decay is not None and self.acceptance != "fixed":
            raise ValueError("acceptance_decay: only with acceptance = 'fixed'")
        return self

    def _per_position(self) -> list[float] | None:
        """alpha_i from `acceptance_per_position`, from vLLM's per-position counts, or None (ValueError
        naming the key when they are inconsistent)."""
        k = self.num_speculative_tokens
        given = [key for key in ("acceptance_per_position", "accepted_per_position") if getattr(self, key)]
        if self.num_drafts is not None and self.accepted_per_position is None:
            raise ValueError("num_drafts: only with accepted_per_position (vLLM's two counters)")
        if not given:
            return None
        if len(given) > 1 or self.acceptance_rate is not None or self.acceptance_decay is not None:
            raise ValueError(
                f"{given[0]}: give one of acceptance_rate (with acceptance_decay), acceptance_per_position "
                "and accepted_per_position"
            )
        if self.acceptance_per_position is not None:
            alphas = self.acceptance_per_position
            if len(alphas) != k or not all(0.0 <= a <= 1.0 for a in alphas):
                raise ValueError(
                    f"acceptance_per_position: expected {k} rates in [0, 1], one per draft position "
                    f"(num_speculative_tokens = {k})"
                )
            return alphas
        counts, drafts = self.accepted_per_position or [], self.num_drafts
        if drafts is None:
            raise ValueError("accepted_per_position: needs num_drafts (vLLM's spec_decode_num_drafts)")
        before = [drafts, *counts]
        if len(counts) != k or any(not 0 <= n <= b for n, b in zip(counts, before, strict=False)):
            raise ValueError(
                f"accepted_per_position: expected {k} counts, each at most the one before it and the first "
                f"at most num_drafts ({drafts}): a draft at position i is accepted only after the ones before"
            )
        return [n / b if b else 0.0 for n, b in zip(counts, before, strict=False)]

    def along_response(self, generated: int) -> float:
        """The factor on every alpha_i of a verification after `generated` output tokens: 2^(-generated /
        acceptance_half_life), 1 without a half-life."""
        half = self.acceptance_half_life
        return 1.0 if half is None else 0.5 ** (generated / half)

    def position_rates(self) -> list[float] | None:
        """alpha_i of each draft position (None: one alpha at every position, as `acceptance_rate`)."""
        positions = self._per_position()
        if positions is not None:
            return positions
        if self.acceptance_decay is not None and self.acceptance_rate is not None:
            d = self.acceptance_decay
            return [self.acceptance_rate * d**i for i in range(self.num_speculative_tokens)]
        return None


def check_draft(config: SpeculativeConfig, target: Any, target_tp: int) -> None:
    """Refuse a draft model vLLM refuses beside `target` (a ModelSpec) at tensor parallelism `target_tp`
    (ValueError "key: why"): a draft TP other than 1 or the target's (vLLM's SpeculativeConfig
    `_verify_and_get_draft_tp`), a vocabulary other than the target's (the target verifies the draft's token
    ids against its own logits), and the target drafting for itself (a pass that costs what it saves)."""
    if config.method != "draft" or config.draft_model is None:
        return
    draft = load_model(config.draft_model)
    draft_tp = config.draft_tensor_parallel_size
    if draft_tp is not None and draft_tp not in (1, target_tp):
        raise ValueError(
            f"draft_tensor_parallel_size: expected 1 or the target's tensor parallel size ({target_tp}), as "
            f"vLLM requires (got {draft_tp})"
        )
    if draft.hf_id == target.hf_id or draft.name == target.name:
        raise ValueError(
            f"draft_model: {draft.name} is the target model itself: each draft pass would cost as much as "
            "the verification it saves; name a smaller model with the same vocabulary"
        )
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft_model: {draft.name}'s vocabulary ({draft.vocab_size:,} entries) differs from "
            f"{target.name}'s ({target.vocab_size:,}); the target verifies the draft's token ids against its "
            "own vocabulary, so vLLM needs both to share one"
        )
