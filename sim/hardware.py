"""GPU specs from the catalog (sim/catalog/gpus.toml): peak FLOP/s per dtype, bandwidths, memory."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sim.errors import SimError
from sim.model import normalize_dtype


@dataclass(frozen=True)
class Gpu:
    """One accelerator. FLOP/s are dense peaks; bandwidths are bytes/s; memory in bytes."""

    name: str
    aliases: tuple[str, ...]
    flops_16bit: float
    flops_fp8: float
    flops_int8: float
    hbm_bandwidth: float
    memory_bytes: int
    interconnect: str
    interconnect_bandwidth: float  # per GPU, per direction
    source: str

    def peak_flops(self, weight_dtype: str) -> tuple[float, str]:
        """Peak FLOP/s of the matmuls for weights stored in `weight_dtype`, and a note on fallbacks.

        fp8 uses the fp8 tensor peak, int8 the int8 peak (W8A8), where the GPU has them; otherwise,
        and for int4 (dequantized to 16-bit), the 16-bit peak. fp32 runs at half the 16-bit peak (TF32).
        """
        d = normalize_dtype(weight_dtype)
        if d == "fp8":
            if self.flops_fp8 > 0:
                return self.flops_fp8, ""
            return self.flops_16bit, f"{self.name} has no fp8 tensor cores: 16-bit compute"
        if d == "int8":
            if self.flops_int8 > 0:
                return self.flops_int8, ""
            return self.flops_16bit, f"{self.name} has no int8 peak recorded: computing at 16-bit peak"
        if d == "int4":
            return self.flops_16bit, "int4 weights are dequantized: 16-bit compute"
        if d == "fp32":
            return self.flops_16bit / 2, "fp32 weights: TF32 tensor rate, half the 16-bit peak"
        return self.flops_16bit, ""


@cache
def _catalog() -> dict[str, Gpu]:
    text = (resources.files("sim") / "catalog" / "gpus.toml").read_text()
    out: dict[str, Gpu] = {}
    for name, spec in tomllib.loads(text)["gpus"].items():
        out[name] = Gpu(
            name=name,
            aliases=tuple(spec.get("aliases", [])),
            flops_16bit=float(spec["flops_16bit"]),
            flops_fp8=float(spec.get("flops_fp8", 0)),
            flops_int8=float(spec.get("flops_int8", 0)),
            hbm_bandwidth=float(spec["hbm_bandwidth"]),
            memory_bytes=int(spec["memory_bytes"]),
            interconnect=str(spec["interconnect"]),
            interconnect_bandwidth=float(spec["interconnect_bandwidth"]),
            source=str(spec["source"]),
        )
    return out


def gpu_names() -> list[str]:
    """Canonical GPU names in the catalog."""
    return list(_catalog())


def get_gpu(name: str) -> Gpu:
    """Look up a GPU by name or alias, case-insensitive; SimError with the closest names if unknown."""
    cat = _catalog()
    index: dict[str, Gpu] = {}
    for gpu in cat.values():
        for key in (gpu.name, *gpu.aliases):
            index[key.lower()] = gpu
    found = index.get(name.strip().lower())
    if found is not None:
        return found
    keys = {k.lower(): k for g in cat.values() for k in (g.name, *g.aliases)}
    close = [keys[k] for k in difflib.get_close_matches(name.lower(), list(keys), n=4, cutoff=0.3)]
    hint = f"; closest: {', '.join(close)}" if close else ""
    raise SimError(f"unknown GPU {name!r}; known: {', '.join(cat)}{hint}")
