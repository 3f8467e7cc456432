"""Per-GPU kernel parameters (sim/catalog/kernel_gpus.toml, written by `sim kernels --write`) and the
transfer rule for a GPU without a kernel profile.

A profiled GPU (H200, H100-SXM, A100-80GB, L40S, B200) gets the parameters fitted to its own kernels. Any
other GPU gets those of the one profiled GPU of its exact compute capability (its chip architecture: the
A100-40GB the A100-80GB's, the L4 the L40S's), else the pooled fit over the profiled GPUs of its generation
(`[generation."<major>"]`, by CUDA compute capability: 8 Ampere and Ada, 9 Hopper, 10 Blackwell), else over
every profiled GPU (`[pooled]`): its efficiencies are fractions of that GPU's own catalog peaks (16-bit
FLOP/s, HBM bandwidth) and its fixed costs are seconds, carried as they are. The rule is tested by leaving
each profiled GPU out and predicting its kernels (`sim kernels`, docs/fidelity.md).

The engine's efficiencies, fitted on H100 runs, are scaled on each GPU by its kernels' efficiencies over the
H100's (`[serving."<name>"]`, sim.cost.serving_ratios), by the same rule for a GPU without tables.

All-reduce fits per profiled GPU's node (`[nccl.<folder>]`, `[custom_allreduce.<folder>]`); a GPU without one
takes the node of its NVLink generation (an 8-GPU NVSwitch board, as SXM parts are sold), and a PCIe Gen4
part (the L4, the A10G) the one measured PCIe Gen4 node's, the L40S's: the node's PCIe topology, not the GPU,
sets the all-reduce there."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

from sim.catalog.gpus import Gpu, get_gpu

FILE = "kernel_gpus.toml"
# catalog GPU -> its aiconfigurator node (the profile folder); others by their link's generation
NODE = {"H200": "h200", "H100-SXM": "h100", "A100-80GB": "a100", "L40S": "l40s", "B200": "b200"}
LINK_NODE = {"NVLink 5": "b200", "NVLink 4": "h100", "NVLink 3": "a100", "PCIe Gen4 x16": "l40s"}


@cache
def _table() -> dict[str, object]:
    return tomllib.loads((resources.files("sim") / "catalog" / FILE).read_text())


def reload() -> None:
    """Read the file again on next use (after `sim kernels --write` replaced it)."""
    _table.cache_clear()


def generation(gpu: Gpu) -> str | None:
    """The CUDA compute capability's major version of an NVIDIA GPU (8, 9, 10); None for others (AMD's
    Instinct parts, whose ROCm compute capability is no CUDA generation)."""
    return None if gpu.name.startswith("MI") else str(int(gpu.compute_capability))


def _by_rule(gpu: Gpu, own: str, by_generation: str, pooled: str, what: str) -> tuple[dict[str, float], str]:
    """(table, where it comes from) for `gpu`: its own (`[own."<name>"]`), else that of the one profiled GPU
    of its exact compute capability (the same chip architecture: the A100-80GB's for the A100-40GB, the
    L40S's for the L4), else its generation's pool (`[by_generation."<major>"]`), else the pool of every
    profiled GPU (`[pooled]`)."""
    table = _table()
    profiled: dict[str, dict[str, float]] = table.get(own, {})  # type: ignore[assignment]
    mine = profiled.get(gpu.name)
    if mine is not None:
        return {k: float(v) for k, v in mine.items()}, f"{what} the {gpu.name}'s kernel profile"
    kin = [n for n in profiled if generation(gpu) and get_gpu(n).compute_capability == gpu.compute_capability]
    if len(kin) == 1:
        return {k: float(v) for k, v in profiled[kin[0]].items()}, (
            f"{what} the {kin[0]}'s kernel profile, the same compute capability {gpu.compute_capability:.1f} "
            "(transfer rule)"
        )
    gen = table.get(by_generation, {}).get(generation(gpu) or "")  # type: ignore[union-attr]
    if gen is not None:
        return {k: float(v) for k, v in gen.items()}, (
            f"{what} the profiled GPUs of compute capability {generation(gpu)}.x, pooled (transfer rule)"
        )
    every = table[pooled]
    assert isinstance(every, dict)
    return {k: float(v) for k, v in every.items()}, f"{what} every profiled GPU, pooled (transfer rule)"


def kernel_gpu_params(gpu: Gpu) -> tuple[dict[str, float], str]:
    """(parameters, where they come from) for `gpu`: its own fit, else that of the profiled GPU of its
    compute capability, else its generation's pool, else the pool of every profiled GPU."""
    return _by_rule(gpu, "gpus", "generation", "pooled", "fitted to")


def serving_scales(gpu: Gpu) -> tuple[dict[str, float], str]:
    """({"weights", "compute", "kv"}: the factors on the engine's H100-fitted weight-streaming, compute and
    KV-streaming efficiencies on `gpu`, where they come from): its own kernels' efficiencies over the
    H100-SXM's (sim.cost.serving_ratios), else those of the profiled GPU of its compute capability, else the
    mean over its generation's profiled GPUs, else over all."""
    return _by_rule(gpu, "serving", "serving_generation", "serving_pooled", "measured on")


def transfer_note(gpu: Gpu) -> str | None:
    """The sentence a run or a plan on `gpu` owes its reader when the GPU has no kernel tables of its own
    (its costs rest on the transfer rule), else None."""
    if gpu.name in _table().get("serving", {}):  # type: ignore[operator]
        return None
    return (
        f"{gpu.name} has no kernel tables of its own: the engine charges it the H100-fitted efficiencies "
        f"times the ratios {serving_scales(gpu)[1]}, as docs/fidelity.md states"
    )


def _node_fit(kind: str, gpu: Gpu, degree: int) -> tuple[float, float] | None:
    node = NODE.get(gpu.name) or LINK_NODE.get(gpu.interconnect, "")
    fits = _table().get(kind, {}).get(node, {})  # type: ignore[union-attr]
    if degree not in fits.get("degrees", []):
        return None
    i = fits["degrees"].index(degree)
    return float(fits["latency_s"][i]), float(fits["bandwidth"][i])


def nccl_fit(gpu: Gpu, degree: int) -> tuple[float, float] | None:
    """(latency_s, bus_bandwidth) of NCCL all-reduce over `degree` of `gpu`, or None without a profile
    of its node at that degree."""
    return _node_fit("nccl", gpu, degree)


def custom_allreduce_fit(gpu: Gpu, degree: int) -> tuple[float, float] | None:
    """(latency_s, bandwidth) of vLLM's custom all-reduce (in a CUDA graph) over `degree` of `gpu`
    (sim.cost.allreduce.custom_seconds), or None without a profile of its node at that degree."""
    return _node_fit("custom_allreduce", gpu, degree)
