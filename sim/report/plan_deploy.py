"""The chosen configuration as a team would launch it: one `vllm serve` command line per group of
replicas, and how requests reach them.

The flags are vLLM's own engine arguments (`EngineArgs` in vllm/engine/arg_utils.py, as
`vllm serve --help` lists them): `--tensor-parallel-size`, `--max-num-seqs`, `--max-num-batched-tokens`,
`--max-model-len`, `--gpu-memory-utilization`, `--block-size`, `--enable-prefix-caching`,
`--no-enable-chunked-prefill` (vLLM's boolean flags take a `--no-` form), `--quantization`,
`--kv-cache-dtype` and `--kv-transfer-config`; a placement beyond TP adds `--pipeline-parallel-size`,
`--enable-expert-parallel` and `--data-parallel-size` (ep = tp x dp, as vLLM sizes its expert-parallel
group), and a replica over several nodes either `--data-parallel-size-local` (its data-parallel ranks per
node, each node running the line, as vLLM's data-parallel deployment guide starts them) or
`--distributed-executor-backend ray` (one instance over a Ray cluster of its nodes, vLLM's multi-node
serving), with a note saying how the nodes join. Prefill/decode groups hand KV over vLLM's NixlConnector
(`{"kv_connector": "NixlConnector", "kv_role": "kv_both"}`, as vLLM's NixlConnector usage guide launches
both sides). A flag is written only when the simulated configuration differs from vLLM's default, except
the TP degree and the batch knobs, which are always written.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from sim.catalog.gpus import get_gpu
from sim.catalog.models import resolve
from sim.config.scenario import Scenario
from sim.cost.placement import Placement, group_placement
from sim.io.errors import SimError
from sim.studies.plan_placements import placement_text

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default
VLLM_BLOCK_SIZE = 16


@dataclass(frozen=True, slots=True)
class GroupLaunch:
    """One group of identical replicas: what runs where, and the command each replica runs."""

    name: str
    role: str  # both, prefill or decode
    count: int
    gpu: str
    tp: int
    argv: tuple[str, ...]
    notes: tuple[str, ...] = ()
    placement: str = ""  # beyond TP, as a candidate's label shows it (empty for plain TP on one node)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "role": self.role, "count": self.count, "gpu": self.gpu, "tp": self.tp,
            "command": self.command, "notes": list(self.notes),
            **({"placement": self.placement} if self.placement else {}),
        }  # fmt: skip


def placement_argv(p: Placement) -> tuple[list[str], list[str]]:
    """(`vllm serve` arguments, notes) of a placement beyond TP: its stages, expert and data parallelism,
    and how a replica over several nodes is started."""
    argv: list[str] = []
    notes: list[str] = []
    if p.pp > 1:
        argv += ["--pipeline-parallel-size", str(p.pp)]
    if p.ep > 1:
        argv.append("--enable-expert-parallel")
    if p.dp > 1:
        argv += ["--data-parallel-size", str(p.dp)]
    nodes = p.node_count
    if nodes == 1:
        return argv, notes
    local = p.dp // nodes
    if p.dp % nodes == 0 and p.tp * p.pp * local <= p.gpus_per_node:
        argv += ["--data-parallel-size-local", str(local)]
        rest = (
            f"--data-parallel-start-rank {local} on the second"
            if nodes == 2
            else f"--data-parallel-start-rank k x {local} on node k = 1 to {nodes - 1}"
        )
        notes.append(
            f"one replica spans {nodes} nodes of {p.gpus_per_node} GPUs: run this line on each, adding "
            f"--data-parallel-address <first node> to all and --headless {rest}"
        )
    else:
        argv += ["--distributed-executor-backend", "ray"]
        notes.append(
            f"one replica spans {nodes} nodes of {p.gpus_per_node} GPUs: start a Ray cluster over them and "
            "run this line on its head node"
        )
    return argv, notes


def serve_argv(
    scenario: Scenario, policy: str, tp: int, role: str, placement: Placement | None = None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(`vllm serve` arguments, notes) for one replica of `scenario` at TP `tp` in `role`, placed by
    `placement` when it goes beyond TP."""
    try:
        _, hf_id, _ = resolve(scenario.model.name)
    except SimError:
        hf_id = scenario.model.name
    model = scenario.model
    _, config = scenario.policy(policy)
    argv = ["vllm", "serve", hf_id, "--tensor-parallel-size", str(tp)]
    notes: list[str] = []
    if placement is not None and placement.beyond_tp:
        extra, notes = placement_argv(placement)
        argv += extra
    for knob in ("max_num_seqs", "max_num_batched_tokens"):
        if hasattr(config, knob):
            argv += [f"--{knob.replace('_', '-')}", str(getattr(config, knob))]
    argv += ["--max-model-len", str(model.max_model_len)]
    if model.gpu_memory_utilization != VLLM_GPU_MEMORY_UTILIZATION:
        argv += ["--gpu-memory-utilization", f"{model.gpu_memory_utilization:g}"]
    if model.block_size != VLLM_BLOCK_SIZE:
        argv += ["--block-size", str(model.block_size)]
    if getattr(config, "enable_prefix_caching", False):
        argv.append("--enable-prefix-caching")
    if getattr(config, "enable_chunked_prefill", True) is False:
        argv.append("--no-enable-chunked-prefill")
    if model.weight_dtype == "fp8":
        argv += ["--quantization", "fp8"]
    elif model.weight_dtype in ("int8", "int4"):
        notes.append(
            f"{model.weight_dtype} weights: serve a checkpoint quantised to {model.weight_dtype} (GPTQ or "
            "AWQ) in place of the model id; vLLM reads its format from the checkpoint"
        )
    if model.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    elif model.kv_dtype not in (None, "bf16", "fp16"):
        notes.append(f"KV cache {model.kv_dtype}: no vLLM --kv-cache-dtype value is written for it")
    if role in ("prefill", "decode"):
        argv += ["--kv-transfer-config", json.dumps(NIXL, separators=(",", ":"))]
    if kind_of(scenario, policy) not in ("vllm", "sarathi"):
        notes.append(f"the simulated policy is {kind_of(scenario, policy)!r}, not vLLM's scheduler")
    return tuple(argv), tuple(notes)


def kind_of(scenario: Scenario, policy: str) -> str:
    return scenario.policy(policy)[0]


def launch_plan(scenario: Scenario, policy: str) -> tuple[list[GroupLaunch], str]:
    """Each group's launch and the routing sentence for a configured scenario (one [cluster] of groups)."""
    cluster = scenario.cluster
    if cluster is None:
        argv, notes = serve_argv(scenario, policy, scenario.model.tp, "both")
        return [GroupLaunch("replica", "both", 1, scenario.model.gpu, scenario.model.tp, argv, notes)], ""
    launches = []
    for gi, group in enumerate(cluster.groups):
        tp = group.tp or scenario.model.tp
        gpu = get_gpu(group.gpu or scenario.model.gpu).name
        placement = group_placement(group, tp)
        argv, notes = serve_argv(scenario, policy, tp, group.role, placement)
        shown = placement_text(placement).strip() if placement.beyond_tp else ""
        launches.append(
            GroupLaunch(cluster.group_name(gi), group.role, group.count, gpu, tp, argv, notes, shown)
        )
    router, _ = cluster.router_kind()
    entry = sum(g.count for g in launches if g.role != "decode")
    if any(g.role == "decode" for g in launches):
        decode = sum(g.count for g in launches if g.role == "decode")
        routing = (
            "A disaggregating proxy (as vLLM's disaggregated-serving examples run) sends each request to "
            f"one of the {entry} prefill instances with max_tokens 1, then to one of the {decode} decode "
            f"instances, each chosen by the {router} router, as simulated; the KV crosses {cluster.link}."
        )
    else:
        routing = f"Requests are spread over the {entry} replicas by the {router} router, as simulated."
    return launches, routing
