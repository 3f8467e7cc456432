"""The `[cluster]` table of a scenario: replica groups, the router, the reporting delay, the KV link.

    [cluster]
    router = { kind = "power_of_two", choices = 2 }   # or just router = "round_robin" (the default)
    # with LoRA: router = { kind = "adapter_affinity", load_factor = 1.25, fallback = "least_outstanding" }
    report_delay_s = 0.0      # replicas report queue length and KV use this often (0: always current)
    link = "infiniband-ndr"   # prefill -> decode KV transfers (sim/catalog/links.toml)

    [[cluster.groups]]
    count = 2                 # identical replicas
    role = "prefill"          # both (colocated, the default), prefill or decode
    gpu = "H100-SXM"          # default: model.gpu
    tp = 2                    # default: model.tp
    policy = "vllm"           # a table of [policies] (default: the policy being run)
    pp = 1                    # pipeline stages, ep = expert-parallel ranks (1 or tp x dp), dp = data-parallel
    gpus_per_node = 8         #   attention ranks; nodes: default ceil(tp x pp x dp / gpus_per_node)
    two_batch_overlap = false # ep > 1: two micro-batches, one's all-to-all behind the other's compute
    ep_all_to_all = "per_expert"  # or deepep_normal, deepep_low_latency, deepep_auto (expert_parallel.py)
    ep_dispatch_dtype = "bf16"    # or "fp8" (the combine stays bf16)
    ep_redundant_experts = 0      # EPLB's redundant experts; (experts + this) % ep == 0

Without `[cluster]` a scenario is one replica, exactly as before.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.catalog.gpus import get_gpu
from sim.catalog.links import link_names
from sim.config.validation import format_validation_error
from sim.io.errors import SimError

MAX_REPLICAS = 4096
ROLES = ("both", "prefill", "decode")


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class GroupSection(_Table):
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$", description="Default: g<index>.")
    count: int = Field(1, ge=1, le=MAX_REPLICAS)
    role: Literal["both", "prefill", "decode"] = "both"
    gpu: str | None = Field(None, description="GPU catalog name (default: model.gpu).")
    tp: int | None = Field(None, ge=1, le=64, description="Tensor-parallel degree (default: model.tp).")
    policy: str | None = Field(None, description="A [policies] table (default: the policy being run).")
    pp: int = Field(1, ge=1, le=64, description="Pipeline-parallel stages (layers split across them).")
    ep: int = Field(1, ge=1, le=1024, description="Expert-parallel ranks: 1 (experts TP-sharded) or tp x dp.")
    dp: int = Field(1, ge=1, le=1024, description="DP attention ranks (MoE models), each with its own KV.")
    nodes: int | None = Field(None, ge=1, le=512, description="Nodes (default: enough for tp x pp x dp).")
    gpus_per_node: int = Field(8, ge=1, le=72, description="GPUs per node (an NVLink domain).")
    expert_skew: float = Field(
        0.0, ge=0.0, le=4.0, description="Zipf exponent of the gate's tokens per expert (0: uniform)."
    )
    intra_node_link: str = Field("nvlink-4", description="Link within a node (sim/catalog/links.toml).")
    inter_node_link: str = Field("infiniband-ndr", description="Link between nodes (sim/catalog/links.toml).")
    two_batch_overlap: bool = Field(
        False, description="Two micro-batches a step, one's EP all-to-all behind the other's compute."
    )

    ep_all_to_all: Literal["per_expert", "deepep_normal", "deepep_low_latency", "deepep_auto"] = Field(
        "per_expert", description="EP all-to-all: per expert pair, or DeepEP's kernels per node and rank."
    )
    ep_dispatch_dtype: Literal["bf16", "fp8"] = Field("bf16", description="EP dispatch dtype (combine bf16).")
    ep_redundant_experts: int = Field(
        0, ge=0, le=4096, description="EPLB's redundant experts (vLLM's num_redundant_experts)."
    )

    @model_validator(mode="after")
    def _placement(self) -> GroupSection:
        gpus = (self.tp or 1) * self.pp * self.dp
        if self.nodes is not None and gpus > self.nodes * self.gpus_per_node:
            raise ValueError(
                f"nodes: tp x pp x dp = {gpus} GPUs exceed {self.nodes} nodes x {self.gpus_per_node} GPUs"
            )
        if self.two_batch_overlap and self.ep == 1:
            raise ValueError("two_batch_overlap: overlaps the EP all-to-all; it needs ep > 1")
        if self.ep_redundant_experts and self.ep == 1:
            raise ValueError("ep_redundant_experts: EPLB's redundant experts need ep > 1")
        return self


# The placement keys beyond TP, with their defaults: left out of a run's manifest when at them, so records of
# plain-TP groups stay as they were.
PLACEMENT_KEYS = (
    "pp", "ep", "dp", "nodes", "gpus_per_node", "expert_skew", "intra_node_link", "inter_node_link",
    "two_batch_overlap", "ep_all_to_all", "ep_dispatch_dtype", "ep_redundant_experts",
)  # fmt: skip


def drop_default_placement(group: dict[str, Any]) -> dict[str, Any]:
    """A dumped group table without the placement keys left at their defaults."""
    fields = GroupSection.model_fields
    return {k: v for k, v in group.items() if k not in PLACEMENT_KEYS or v != fields[k].default}


class ClusterSection(_Table):
    router: str | dict[str, Any] = Field("round_robin", description="Router name, or {kind = ..., knobs}.")
    report_delay_s: float = Field(0.0, ge=0.0, le=3600.0, description="Seconds between load reports.")
    link: str = Field("nvlink-4", description="KV transfer link between prefill and decode replicas.")
    groups: list[GroupSection] = Field(default_factory=lambda: [GroupSection()], min_length=1, max_length=64)

    @model_validator(mode="after")
    def _roles(self) -> ClusterSection:
        roles = {g.role for g in self.groups}
        if ("prefill" in roles) != ("decode" in roles):
            raise ValueError("groups: a prefill group needs a decode group and a decode group a prefill one")
        if "both" in roles and "prefill" in roles:
            raise ValueError("groups: mix of role 'both' with prefill/decode groups is not supported")
        if sum(g.count for g in self.groups) > MAX_REPLICAS:
            raise ValueError(f"groups: more than {MAX_REPLICAS} replicas in all")
        names = [self.group_name(i) for i in range(len(self.groups))]
        if len(set(names)) != len(names):
            raise ValueError("groups: two groups share a name")
        return self

    def group_name(self, index: int) -> str:
        return self.groups[index].name or f"g{index}"

    @property
    def disaggregated(self) -> bool:
        return any(g.role == "prefill" for g in self.groups)

    @property
    def replicas(self) -> int:
        return sum(g.count for g in self.groups)

    def router_kind(self) -> tuple[str, dict[str, Any]]:
        """(router name, its knobs)."""
        if isinstance(self.router, str):
            return self.router, {}
        knobs = dict(self.router)
        return str(knobs.pop("kind", "")), knobs


def check_cluster(cluster: ClusterSection, policies: dict[str, Any], source: str) -> BaseModel:
    """The router's validated knobs; SimError naming the key for an unknown router, knob, policy or GPU."""
    name, knobs = cluster.router_kind()
    where = "cluster.router" if isinstance(cluster.router, str) else "cluster.router.kind"
    if name not in ROUTERS:
        raise SimError(
            f"{source}: {where}: unknown router {name[:40]!r} (one of {', '.join(sorted(ROUTERS))})"
        )
    try:
        config = ROUTERS[name].model_validate(knobs)
    except ValidationError as err:
        raise SimError(format_validation_error(err, knobs, source, root="cluster.router")) from None
    if cluster.link not in link_names():
        raise SimError(
            f"{source}: cluster.link: unknown link {cluster.link[:40]!r} (one of {', '.join(link_names())})"
        )
    for i, group in enumerate(cluster.groups):
        if group.policy is not None and group.policy not in policies:
            raise SimError(
                f"{source}: cluster.groups[{i}].policy: no policy {group.policy[:40]!r} "
                f"(have: {', '.join(policies)})"
            )
        for key in ("intra_node_link", "inter_node_link"):
            if getattr(group, key) not in link_names():
                raise SimError(
                    f"{source}: cluster.groups[{i}].{key}: unknown link {getattr(group, key)[:40]!r} "
                    f"(one of {', '.join(link_names())})"
                )
        if group.gpu is not None:
            try:
                get_gpu(group.gpu)
            except SimError as err:
                raise SimError(f"{source}: cluster.groups[{i}].gpu: {err}") from None
    return config


class _NoKnobs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class PowerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    choices: int = Field(2, ge=1, le=64, description="Replicas sampled per request.")


class AffinityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    load_factor: float = Field(
        1.25, ge=1.0, le=100.0, description="Bound on a replica's load, as a multiple of the mean."
    )
    virtual_nodes: int = Field(64, ge=1, le=4096, description="Ring points per replica.")


# The routers an adapter-affinity router may fall back on (each with its default knobs).
Fallback = Literal["round_robin", "random", "least_outstanding", "power_of_two", "least_kv"]


class AdapterAffinityConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    load_factor: float = Field(
        1.25, ge=1.0, le=100.0, description="Bound on a replica's load, as a multiple of the mean."
    )
    fallback: Fallback = Field(
        "least_outstanding", description="Router for a request no replica under the bound has the adapter of."
    )


# The knobs of each router, by name (`cluster.router = { kind = NAME, ... }`); the routers: sim.fleet.routers.
ROUTERS: dict[str, type[BaseModel]] = {
    "round_robin": _NoKnobs,
    "random": _NoKnobs,
    "least_outstanding": _NoKnobs,
    "power_of_two": PowerConfig,
    "least_kv": _NoKnobs,
    "prefix_affinity": AffinityConfig,
    "adapter_affinity": AdapterAffinityConfig,
}
