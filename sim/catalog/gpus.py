"""GPU specs from the catalog (sim/catalog/gpus.toml): peak FLOP/s per dtype, bandwidths, memory."""

from __future__ import annotations

import difflib
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources

from sim.catalog.dtypes import normalize_dtype
from sim.io.errors import SimError


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
    compute_capability: float  # CUDA compute capability (7.5 Turing, 8.0 Ampere, ...)
    sms: int  # streaming multiprocessors (AMD: compute units)

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
            compute_capability=float(spec["compute_capability"]),
            sms=int(spec["sms"]),
        )
    return out


def gpu_names() -> list[str]:
    """Canonical GPU names in the catalog."""
    return list(_catalog())


def get_gpu(name: str) -> Gpu:
    """Look up a GPU by its name or an alias, case-insensitive; SimError with "did you mean" if unknown.

    Only exact names and aliases match: a near miss such as "A100-80G" is refused, never guessed.
    """
    cat = _catalog()
    keys = {k.lower(): (k, gpu) for gpu in cat.values() for k in (gpu.name, *gpu.aliases)}
    found = keys.get(name.strip().lower())
    if found is not None:
        return found[1]
    close = difflib.get_close_matches(name.strip().lower(), list(keys), n=3, cutoff=0.6)
    names = list(dict.fromkeys(keys[k][1].name for k in close))
    hint = f"; did you mean {' or '.join(names)}?" if names else ""
    raise SimError(f"unknown GPU {name!r}{hint} (known: {', '.join(cat)})")
