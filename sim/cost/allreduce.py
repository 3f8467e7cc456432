"""All-reduce time from measurements: latency plus the bytes each GPU moves over a bandwidth, fitted per GPU
(node), degree and algorithm, and the message size below which vLLM uses its own all-reduce instead of NCCL.

    NCCL:    t = latency + 2 (n - 1) / n · bytes / bus_bandwidth                     (ring bytes)
    custom:  t = latency + traffic / bandwidth,  traffic = (n - 1) · bytes one-shot, ring bytes two-shot

vLLM runs a tensor-parallel all-reduce of at most `CUSTOM_ALLREDUCE_MAX_BYTES` on 2, 4, 6 or 8 fully NVLinked
GPUs (or 2 on PCIe) with its custom kernel (`CustomAllreduce`, max_size 8 MiB), not NCCL: decode steps live
there. The kernel reads every peer's whole buffer (one-shot) on 2 GPUs, and below 512 KiB on up to 4 and
256 KiB on up to 8 fully NVLinked GPUs; otherwise reduce-scatter then all-gather (two-shot), as NCCL's ring.

Data: aiconfigurator's tables (sim/catalog/profiles/<gpu>/aiconfigurator/custom_allreduce.csv, replayed in a
CUDA graph as decode runs it, and nccl_allreduce.csv: the fits the kernel model uses), and Vidur's single-node
NCCL profiles (profiles/allreduce.csv, NVSwitch and pairwise-NVLink nodes, reported beside them).
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


def custom_traffic(nbytes, degree, full_nvlink=True):  # type: ignore[no-untyped-def]
    """Bytes each GPU moves in vLLM's custom all-reduce: one-shot reads the n - 1 peers' buffers, two-shot
    the ring bytes (the switch as in vLLM's custom_all_reduce.cuh). Floats or arrays."""
    one = (degree == 2) | (full_nvlink & (((degree <= 4) & (nbytes < 512 * 1024)) |
                                          ((degree <= 8) & (nbytes < 256 * 1024))))  # fmt: skip
    return np.where(one, (degree - 1) * nbytes, ring_bytes(nbytes, degree))


def custom_seconds(nbytes, degree, latency_s, bandwidth, full_nvlink=True):  # type: ignore[no-untyped-def]
    """vLLM's custom all-reduce of `nbytes`: latency plus its traffic at `bandwidth`. Floats or arrays."""
    return latency_s + custom_traffic(nbytes, degree, full_nvlink) / bandwidth


def _fit_log(predict, nbytes: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    from scipy.optimize import least_squares  # imported here: a run's cost model needs only ring_bytes

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict(math.exp(x[0]), math.exp(x[1])) / seconds)

    res = least_squares(residuals, [math.log(2e-5), math.log(2e11)], loss="soft_l1", f_scale=0.05)
    return float(math.exp(res.x[0])), float(math.exp(res.x[1]))


def aic_allreduce_data(
    gpu: str, kind: str, root: Path | None = None
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{degree: (message bytes, seconds)} of a GPU's aiconfigurator table: `kind` "nccl", or "graph"/"eager"
    for vLLM's custom all-reduce (16-bit elements, 2 bytes each)."""
    base = (root or Path(str(resources.files("sim") / "catalog" / "profiles"))) / gpu / "aiconfigurator"
    path = base / ("nccl_allreduce.csv" if kind == "nccl" else "custom_allreduce.csv")
    with path.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if kind == "nccl" or r["kernel"] == kind]
    out: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        point = (float(r["elements"]) * ELEMENT_BYTES, float(r["seconds"]))
        out.setdefault(int(r["degree"]), []).append(point)
    return {k: (np.array([p[0] for p in v]), np.array([p[1] for p in v])) for k, v in sorted(out.items())}


def aic_allreduce_table(gpus: dict[str, bool], root: Path | None = None) -> list[dict[str, object]]:
    """Per GPU ({folder: fully NVLinked}), algorithm and degree: the fit and its median, 90th-percentile and
    largest |error| %, over the messages each algorithm carries in vLLM: the custom all-reduce (graph) up to
    `CUSTOM_ALLREDUCE_MAX_BYTES`, NCCL above it."""
    out = []
    for gpu, nvlink in gpus.items():
        for kind in ("custom", "nccl"):
            table = aic_allreduce_data(gpu, "graph" if kind == "custom" else kind, root)
            for degree, (b, s) in table.items():
                keep = b <= CUSTOM_ALLREDUCE_MAX_BYTES if kind == "custom" else b > CUSTOM_ALLREDUCE_MAX_BYTES
                b, s = b[keep], s[keep]
                if kind == "custom":
                    lat, bw = _fit_log(lambda la, bw: custom_seconds(b, degree, la, bw, nvlink), b, s)  # noqa: B023
                    pred = custom_seconds(b, degree, lat, bw, nvlink)
                else:
                    lat, bw = _fit_log(lambda la, bw: nccl_seconds(b, degree, la, bw), b, s)  # noqa: B023
                    pred = nccl_seconds(b, degree, lat, bw)
                err = np.abs(pred / s - 1.0) * 100.0
                out.append({
                    "gpu": gpu, "kind": kind, "degree": degree, "latency_s": lat, "bandwidth": bw,
                    "points": int(b.size), "median_pct": float(np.median(err)),
                    "p90_pct": float(np.quantile(err, 0.9)), "max_pct": float(err.max()),
                })  # fmt: skip
    return out


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
    """(latency_s, bus_bandwidth) of NCCL by soft-L1 least squares on log(predicted / measured)."""
    return _fit_log(lambda lat, bw: nccl_seconds(nbytes, degree, lat, bw), nbytes, seconds)


def nccl_carries(node: str, degree: int, nbytes: np.ndarray) -> np.ndarray:
    """Which of `nbytes` vLLM sends to NCCL on Vidur's `node` at `degree`: above `CUSTOM_ALLREDUCE_MAX_BYTES`
    where its custom all-reduce takes the rest (2 GPUs, or up to 8 fully NVLinked: the NVSwitch boards),
    every size on GPUs NVLinked in pairs beyond 2 (no custom all-reduce there)."""
    custom = degree == 2 or (node.endswith("_dgx") and degree in CUSTOM_ALLREDUCE_DEGREES)
    return nbytes > CUSTOM_ALLREDUCE_MAX_BYTES if custom else np.ones_like(nbytes, dtype=bool)


def allreduce_table(path: Path | None = None) -> list[dict[str, object]]:
    """Per (node, degree): the fit to the messages vLLM sends to NCCL there (`nccl_carries`) with its median
    and 90th-percentile |error| %, and beside it the fit to every size and its median (small messages on the
    NVSwitch boards are vLLM's custom all-reduce's, fitted to aiconfigurator's tables instead)."""
    out = []
    for (node, degree), (b, s) in allreduce_data(path).items():
        keep = nccl_carries(node, degree, b)
        lat, bw = fit_allreduce(b[keep], s[keep], degree)
        err = np.abs(nccl_seconds(b[keep], degree, lat, bw) / s[keep] - 1.0) * 100.0
        every = fit_allreduce(b, s, degree)
        err_all = np.abs(nccl_seconds(b, degree, *every) / s - 1.0) * 100.0
        out.append({
            "node": node, "degree": degree, "carried": "all" if keep.all() else "> 8 MiB",
            "latency_s": lat, "bus_bandwidth": bw, "points": int(keep.sum()),
            "median_pct": float(np.median(err)), "p90_pct": float(np.quantile(err, 0.9)),
            "all_sizes_median_pct": float(np.median(err_all)),
        })  # fmt: skip
    return out
