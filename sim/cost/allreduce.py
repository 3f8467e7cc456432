"""All-reduce time from NCCL measurements (sim/catalog/profiles/allreduce.csv, Vidur's published profiles):
latency plus ring bytes over a bus bandwidth, fitted per GPU generation, node topology and degree, and the
message size below which vLLM uses its own all-reduce instead of NCCL.

    NCCL:   t = latency + 2 (n - 1) / n · bytes / bus_bandwidth

vLLM (0.15) runs a tensor-parallel all-reduce of at most `CUSTOM_ALLREDUCE_MAX_BYTES` on 2, 4, 6 or 8 fully
NVLinked GPUs with its custom one-shot/two-shot kernel (`CustomAllreduce`, max_size 8 MiB), not NCCL: decode
steps live there. NCCL's measured small-message latency (20-60 µs) does not apply to it; the model keeps the
in-step latency fitted end to end on vLLM runs (`allreduce_latency_s`) with the link at
`allreduce_bandwidth_eff` for those messages, and uses the NCCL fit above that size (prefill chunks).
"""

from __future__ import annotations

import csv
import math
from importlib import resources
from pathlib import Path

import numpy as np

CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 1024 * 1024
CUSTOM_ALLREDUCE_DEGREES = (2, 4, 6, 8)
ELEMENT_BYTES = 2  # Vidur's sizes are fp16 elements


def ring_bytes(nbytes, degree):  # type: ignore[no-untyped-def]
    """Bytes each GPU sends in a ring all-reduce of `nbytes` over `degree` GPUs. Floats or arrays."""
    return 2.0 * (degree - 1) / degree * nbytes


def nccl_seconds(nbytes, degree, latency_s, bus_bandwidth):  # type: ignore[no-untyped-def]
    """NCCL all-reduce of `nbytes`: latency plus ring bytes at the bus bandwidth. Floats or arrays."""
    return latency_s + ring_bytes(nbytes, degree) / bus_bandwidth


def allreduce_data(path: Path | None = None) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray]]:
    """{(node, degree): (message bytes, seconds)} of the profile."""
    path = path or Path(str(resources.files("sim") / "catalog" / "profiles" / "allreduce.csv"))
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    out: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in rows:
        key = (r["node"], int(r["degree"]))
        out.setdefault(key, []).append((float(r["elements"]) * ELEMENT_BYTES, float(r["seconds"])))
    return {k: (np.array([p[0] for p in v]), np.array([p[1] for p in v])) for k, v in sorted(out.items())}


def fit_allreduce(nbytes: np.ndarray, seconds: np.ndarray, degree: int) -> tuple[float, float]:
    """(latency_s, bus_bandwidth) by soft-L1 least squares on log(predicted / measured)."""
    from scipy.optimize import least_squares  # imported here: a run's cost model needs only ring_bytes


    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(nccl_seconds(nbytes, degree, math.exp(x[0]), math.exp(x[1])) / seconds)

    res = least_squares(residuals, [math.log(2e-5), math.log(2e11)], loss="soft_l1", f_scale=0.05)
    return float(math.exp(res.x[0])), float(math.exp(res.x[1]))


def allreduce_table(path: Path | None = None) -> list[dict[str, object]]:
    """Per (node, degree): the fit and its median and 90th-percentile |error| %, overall and for the
    messages vLLM sends to NCCL (above `CUSTOM_ALLREDUCE_MAX_BYTES`)."""
    out = []
    for (node, degree), (b, s) in allreduce_data(path).items():
        lat, bw = fit_allreduce(b, s, degree)
        err = np.abs(nccl_seconds(b, degree, lat, bw) / s - 1.0) * 100.0
        big = b > CUSTOM_ALLREDUCE_MAX_BYTES
        out.append({
            "node": node, "degree": degree, "latency_s": lat, "bus_bandwidth": bw, "points": int(b.size),
            "median_pct": float(np.median(err)), "p90_pct": float(np.quantile(err, 0.9)),
            "median_large_pct": float(np.median(err[big])) if big.any() else math.nan,
        })  # fmt: skip
    return out
