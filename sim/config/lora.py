"""LoRA's tables: `[workload.lora]` (each request's adapter) and a policy's `lora` (vLLM's slots)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sim.catalog.links import link_names
from sim.io.errors import SimError

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


MLP_MODULES = ("gate_proj", "up_proj", "down_proj")


MODULES = ATTENTION_MODULES + MLP_MODULES


# vLLM's accepted --max-lora-rank values (vllm/config LoRAConfig.possible_max_ranks).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


# Disk to host memory: an assumption, not a measurement. An NVMe SSD reads 3.5 GB/s (PCIe Gen3 x4) to
# 7 GB/s (Gen4 x4) sequentially; reading an adapter's safetensors file and building its tensors costs more
# than the raw read, so 2 GB/s. Set `disk_bandwidth` to what the deployment's storage delivers.
DISK_BANDWIDTH = 2e9


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


Rank = Annotated[int, Field(ge=1, le=512)]


class LoraWorkload(_Config):
    """`[workload.lora]`: which adapter each request names.

    `adapters` adapters, numbered 0 .. adapters - 1, drawn per request with `popularity` "uniform" or
    "zipf" (adapter i with probability proportional to 1 / (i + 1)^zipf_s); a trace's `adapter` column
    (-1: the base model) overrides the draw. Every adapter adapts `target_modules` at rank `rank`, or, with
    a list of ranks, adapter i at rank `rank[i % len(rank)]` (e.g. [64, 32, 16, 8] for a mix).
    """

    adapters: int = Field(gt=0, le=1_000_000)
    popularity: Literal["uniform", "zipf"] = "uniform"
    zipf_s: float = Field(1.0, ge=0.0, le=10.0)
    rank: Rank | list[Rank] = Field(8, description="one rank, or a list assigned round-robin")
    target_modules: list[Literal[MODULES]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(ATTENTION_MODULES), min_length=1
    )

    @field_validator("rank", mode="before")
    @classmethod
    def _rank(cls, value: Any) -> Any:
        """One message for a bad rank, whichever of its two forms was meant."""

        def whole(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_LORA_RANKS[-1]

        if whole(value) or (isinstance(value, list) and value and all(whole(x) for x in value)):
            return value
        raise ValueError(
            f"expected an adapter rank, a whole number from 1 to {MAX_LORA_RANKS[-1]} (served in slots of "
            f"max_lora_rank, one of {', '.join(map(str, MAX_LORA_RANKS))}), or a non-empty list of them"
        )

    @model_validator(mode="after")
    def _distinct(self) -> LoraWorkload:
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError("target_modules: each module at most once")
        if isinstance(self.rank, list) and not self.rank:
            raise ValueError("rank: give one rank or a non-empty list")
        return self

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self.rank) if isinstance(self.rank, list) else (self.rank,)

    def rank_of(self, adapter: int) -> int:
        ranks = self.ranks
        return ranks[adapter % len(ranks)]


class LoraConfig(_Config):
    """A policy's `lora` table (vLLM's --max-loras, --max-cpu-loras, --max-lora-rank)."""

    max_loras: int = Field(1, ge=1, le=4096, description="adapters in GPU slots, and per batch")
    max_cpu_loras: int | None = Field(None, ge=1, le=1_000_000, description="host cache (default max_loras)")
    max_lora_rank: int = Field(16, description=f"slot rank, one of {MAX_LORA_RANKS}")
    host_link: str | None = Field(None, description="host-to-GPU link (default: the GPU's PCIe)")
    disk_bandwidth: float = Field(DISK_BANDWIDTH, gt=0, le=1e12, description="disk to host, bytes/s")

    @model_validator(mode="after")
    def _valid(self) -> LoraConfig:
        if self.max_lora_rank not in MAX_LORA_RANKS:
            raise ValueError(f"max_lora_rank: one of {', '.join(map(str, MAX_LORA_RANKS))}")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras: at least max_loras ({self.max_loras})")
        return self

    @property
    def cpu_slots(self) -> int:
        return self.max_loras if self.max_cpu_loras is None else self.max_cpu_loras


def check_lora(scenario: Any, configs: dict[str, BaseModel], source: str) -> None:
    """A workload that names adapters needs LoRA on every policy (vLLM refuses a LoRA request without
    --enable-lora), within the slots' rank; LoRA is modelled for the vllm policies, on one replica or in a
    colocated fleet whose groups all serve adapters or none, and for slora (sim/engine/slora.py) on one
    replica."""
    wl: LoraWorkload | None = scenario.workload.lora
    for name, config in configs.items():
        lora = getattr(config, "lora", None)
        kind = scenario.policies[name]["scheduler"]
        if kind == "slora":  # S-LoRA serves any adapter from its pool (sim/engine/slora.py)
            if scenario.cluster is not None:
                raise SimError(f"{source}: policies.{name}.scheduler: slora is modelled on one replica, "
                               f"not with [cluster]")  # fmt: skip
            continue
        if wl is not None and lora is None:
            hint = "add lora = { max_loras = ... }" if hasattr(config, "lora") else "use vllm, sarathi, slora"
            raise SimError(
                f"{source}: policies.{name}.lora: the workload names LoRA adapters (workload.lora) but this "
                f"{kind} policy does not serve them; {hint}"
            )
        if lora is not None and wl is not None and max(wl.ranks) > lora.max_lora_rank:
            raise SimError(
                f"{source}: policies.{name}.lora.max_lora_rank: {lora.max_lora_rank} is below the adapters' "
                f"rank {max(wl.ranks)} (workload.lora.rank)"
            )
        if lora is not None and scenario.cluster is not None and scenario.cluster.disaggregated:
            raise SimError(
                f"{source}: policies.{name}.lora: LoRA is modelled in colocated fleets (groups of role "
                f"'both'), not with prefill/decode groups"
            )
        if lora is not None and lora.host_link is not None and lora.host_link not in link_names():
            raise SimError(
                f"{source}: policies.{name}.lora.host_link: unknown link {lora.host_link[:40]!r} "
                f"(one of {', '.join(link_names())})"
            )
    if scenario.cluster is not None:
        _check_fleet_groups(scenario, configs, source)


def _check_fleet_groups(scenario: Any, configs: dict[str, BaseModel], source: str) -> None:
    """In a fleet, the groups a policy runs either all serve LoRA or none does: the replicas' records are
    one frame, with or without the LoRA columns."""
    for name in configs:
        served = [
            (i, getattr(configs[g.policy or name], "lora", None) is not None)
            for i, g in enumerate(scenario.cluster.groups)
        ]
        if len({s for _, s in served}) > 1:
            i = next(i for i, s in served if s != served[0][1])
            group = scenario.cluster.groups[i]
            raise SimError(
                f"{source}: cluster.groups[{i}].policy: policy {group.policy or name!r} "
                f"{'serves' if served[i][1] else 'does not serve'} LoRA adapters and group 0's does"
                f"{'' if served[0][1] else ' not'}; every group of a fleet serves adapters, or none does"
            )
