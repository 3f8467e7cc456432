"""The `[model]`, `[horizon]` and `[slo]` tables of a scenario."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.catalog.gpu_formats import check_formats
from sim.catalog.gpus import get_gpu
from sim.catalog.quantisation import check_dtype, check_group_size
from sim.io.errors import SimError
from sim.io.limits import (
    MAX_BLOCK_SIZE,
    MAX_COUNT,
    MAX_KV_BLOCKS,
    MAX_REQUESTS_CAP,
    MAX_SECONDS,
    MAX_TOKENS,
)


class StrictTable(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class ModelSection(StrictTable):
    """What runs, on what: the model, the GPU and the memory knobs of one replica."""

    name: str = Field(description="Catalog name, Hugging Face id, or path to a config.json.")
    gpu: str = Field(description="GPU catalog name, e.g. A100-80GB, H100-SXM.")
    tp: int = Field(1, ge=1, le=64, description="Tensor-parallel degree.")
    weight_dtype: str | None = Field(
        None, description="fp32, bf16, fp16, fp8, int8, int4 (default: config's)."
    )
    kv_dtype: str | None = Field(None, description="KV-cache dtype (default: the 16-bit activation dtype).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    max_model_len: int = Field(4096, ge=16, le=MAX_TOKENS)
    allow_long_max_model_len: bool = Field(
        False,
        description="Serve a max_model_len past the model's positions, as vLLM does with "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (and Sarathi-Serve's engine by linear RoPE scaling); costs are "
        "unchanged, the outputs' quality is not modelled.",
    )
    block_size: int = Field(16, ge=1, le=MAX_BLOCK_SIZE)
    num_kv_blocks: int | None = Field(
        None, ge=2, le=MAX_KV_BLOCKS, description="Override the KV blocks derived from memory."
    )
    weight_group_size: int | None = Field(
        None, description="int4/int8 weights per 16-bit scale: 32-1024, a power of two; 0: per channel."
    )

    @field_validator("weight_dtype", "kv_dtype")
    @classmethod
    def _known_dtype(cls, value: str | None, info: Any) -> str | None:
        return check_dtype(info.field_name, value)

    @model_validator(mode="after")
    def _group_size(self) -> ModelSection:
        check_group_size(self.weight_dtype, self.weight_group_size)
        return self

    @model_validator(mode="after")
    def _formats_the_gpu_runs(self) -> ModelSection:
        try:
            gpu = get_gpu(self.gpu)
        except SimError:  # an unknown GPU is reported, with its key, where the replica is built
            return self
        try:
            check_formats(gpu, self.weight_dtype, self.kv_dtype, ("weight_dtype", "kv_dtype"))
        except SimError as err:
            raise ValueError(str(err)) from None
        return self

    @model_validator(mode="before")
    @classmethod
    def _no_cpu_offload(cls, data: Any) -> Any:
        if isinstance(data, dict) and "cpu_offload_blocks" in data:
            raise ValueError(
                "cpu_offload_blocks: host-memory KV offloading is not modelled (in vLLM it is a second "
                "prefix-cache tier, not more GPU KV blocks); remove the key"
            )
        return data


class HorizonSection(StrictTable):
    """When arrivals stop. `sim run` and `sim sweep` estimate a run's size before it starts (requests =
    rate x duration_s, or max_requests; tokens = requests x mean prompt and output) and refuse, unless
    --force, one expected to exceed 1,000,000 requests or 1,000,000,000 tokens."""

    duration_s: float | None = Field(
        None, gt=0, le=MAX_SECONDS, description="Arrivals stop here; so does the run unless drain."
    )
    max_requests: int | None = Field(
        None, ge=1, le=MAX_REQUESTS_CAP, description="Arrivals stop after this many requests."
    )
    drain: bool = Field(False, description="After arrivals stop, serve every admitted request to the end.")
    max_waiting: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Reject arrivals while this many wait (queue full)."
    )

    @model_validator(mode="after")
    def _bounded(self) -> HorizonSection:
        if self.duration_s is None and self.max_requests is None:
            raise ValueError("give duration_s, max_requests or both")
        return self


class SloSection(StrictTable):
    ttft_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    tpot_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    e2e_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
