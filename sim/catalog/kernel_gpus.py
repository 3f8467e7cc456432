"""Per-GPU kernel parameters (sim/catalog/kernel_gpus.toml, written by `sim kernels --write`) and the
transfer rule for a GPU without a kernel profile.

A profiled GPU (H200, H100-SXM, A100-80GB) gets the parameters fitted to its own kernels. Any other GPU gets
the pooled fit over every profiled GPU (`[pooled]`): its efficiencies are fractions of that GPU's own
catalog peaks (16-bit FLOP/s, HBM bandwidth) and its fixed costs are seconds, carried as they are. The rule
is tested by leaving each profiled GPU out of the pool and predicting its kernels (`sim kernels`,
docs/fidelity.md)."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources

from sim.catalog.gpus import Gpu

FILE = "kernel_gpus.toml"
# NCCL all-reduce fits by interconnect: the profiled node of the same NVLink generation, GPUs on an NVSwitch
# (an 8-GPU HGX/DGX board, as SXM parts are sold); other links have no NCCL profile.
ALLREDUCE_NODE = {"NVLink 4": "h100_dgx", "NVLink 3": "a100_dgx"}


@cache
def _table() -> dict[str, object]:
    return tomllib.loads((resources.files("sim") / "catalog" / FILE).read_text())


def reload() -> None:
    """Read the file again on next use (after `sim kernels --write` replaced it)."""
    _table.cache_clear()


def kernel_gpu_params(gpu: Gpu) -> tuple[dict[str, float], str]:
    """(parameters, where they come from) for `gpu`: its own fit, else the pooled one."""
    table = _table()
    own = table.get("gpus", {}).get(gpu.name)  # type: ignore[union-attr]
    if own is not None:
        return {k: float(v) for k, v in own.items()}, f"fitted to the {gpu.name} kernel profile"
    pooled = table["pooled"]
    assert isinstance(pooled, dict)
    return {k: float(v) for k, v in pooled.items()}, "pooled fit over the profiled GPUs (transfer rule)"


def nccl_fit(gpu: Gpu, degree: int) -> tuple[float, float] | None:
    """(latency_s, bus_bandwidth) of NCCL all-reduce over `degree` of `gpu`, or None without a profile
    of its interconnect at that degree."""
    node = ALLREDUCE_NODE.get(gpu.interconnect)
    fits = _table().get("allreduce", {}).get(node or "", {})  # type: ignore[union-attr]
    if degree not in fits.get("degrees", []):
        return None
    i = fits["degrees"].index(degree)
    return float(fits["latency_s"][i]), float(fits["bus_bandwidth"][i])
