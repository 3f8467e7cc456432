"""The engine's efficiencies on each GPU: how far a GPU's measured kernels reach its catalogue peaks, over
the H100-SXM's, whose served runs the roofline's efficiencies are fitted on (`sim calibrate`).

aiconfigurator's vLLM tables (sim/catalog/profiles/<gpu>/aiconfigurator/) measure every GPU the same way.
Over the shapes every GPU's table has:
- weight streaming: the memory-bound 16-bit GEMMs (m <= 8, k x n >= 2048^2), a fixed cost plus bytes /
  bandwidth by non-negative least squares, the bandwidth a fraction of the GPU's HBM peak;
- compute: the compute-bound 16-bit GEMMs (m >= 4,096), the median FLOP/s over the 16-bit peak;
- KV streaming: decode attention over at least 32 MB of 16-bit KV cache, fitted as weight streaming is.

Each ratio is the GPU's fraction over the H100-SXM's (1 on the H100 itself). The engine charges a GPU its
H100-fitted efficiency times its ratio (`Calibration.on_gpu`); a GPU without tables takes those of the one
profiled GPU of its exact compute capability, else the mean ratio of the profiled GPUs of its generation, else
of all (`sim.catalog.kernel_gpus.serving_scales`)."""

from __future__ import annotations

import csv

import numpy as np
from scipy.optimize import nnls

from sim.catalog.gpus import get_gpu
from sim.cost.gemm_fit import PROFILED, gemm_data, generation, profiles_root

STREAM_M, COMPUTE_M = 8, 4096  # GEMMs of at most / at least this many tokens: memory- / compute-bound
MIN_WEIGHTS = 2048 * 2048  # k x n elements: weights large enough that a kernel's fixed cost is a small part
MIN_KV_BYTES = 32e6  # decode attention over at least this much KV cache: memory-bound
REFERENCE = "h100"  # the GPU the engine's serving efficiencies are fitted on (its runs, sim calibrate)
SCALES = {"weights": "stream_ratio", "compute": "compute_ratio", "kv": "kv_ratio"}  # shipped key: column


def _tables(name: str, key: tuple[str, ...], keep: str | None = None) -> dict[str, dict[tuple, float]]:
    """{profile folder: {shape: seconds}} of aiconfigurator's `name`.csv, rows whose `phase` is `keep`."""
    out = {}
    for gpu in PROFILED:
        with (profiles_root() / gpu / "aiconfigurator" / f"{name}.csv").open(newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if keep is None or r["phase"] == keep]
        shape = [(c, c in ("model", "op")) for c in key]  # text columns kept, numbers as integers
        out[gpu] = {tuple(r[c] if text else int(float(r[c])) for c, text in shape): float(r["seconds"])
                    for r in rows}  # fmt: skip
    return out


def _common(tables: dict[str, dict[tuple, float]]) -> list[tuple]:
    return sorted(set.intersection(*(set(t) for t in tables.values())))


def _streaming(nbytes: np.ndarray, seconds: np.ndarray, hbm: float) -> tuple[float, float, float]:
    """(bandwidth as a fraction of `hbm`, fixed seconds, median |error| %) of seconds = fixed + bytes / bw."""
    (fixed, per_byte), _ = nnls(np.stack([np.ones_like(nbytes), nbytes], axis=1), seconds)  # both >= 0
    err = float(np.median(np.abs((fixed + per_byte * nbytes) / seconds - 1.0))) * 100.0
    return float(1.0 / per_byte / hbm), float(fixed), err


def _gemm_efficiencies(tables: dict[str, dict[tuple, float]]) -> tuple[dict[str, dict[str, float]], int, int]:
    """Per GPU of `tables` ({folder: {shape ending in (m, k, n): seconds}}), over the shapes all of them have:
    the weight-streaming efficiency of its memory-bound GEMMs with the fit's fixed cost and median |error|,
    and the median compute efficiency of its compute-bound ones; and the two shape counts."""
    common = _common(tables)
    stream = [s for s in common if s[-3] <= STREAM_M and s[-2] * s[-1] >= MIN_WEIGHTS]
    compute = [s for s in common if s[-3] >= COMPUTE_M and s[-2] * s[-1] >= MIN_WEIGHTS]
    weights = np.array([2.0 * s[-2] * s[-1] for s in stream])
    out = {}
    for gpu, table in tables.items():
        g = get_gpu(PROFILED[gpu])
        eff, fixed, err = _streaming(weights, np.array([table[s] for s in stream]), g.hbm_bandwidth)
        flops = np.array([2.0 * s[-3] * s[-2] * s[-1] / table[s] for s in compute]) / g.flops_16bit
        out[gpu] = {"stream_eff": eff, "fixed_s": fixed, "stream_median_err_pct": err,
                    "compute_eff": float(np.median(flops))}  # fmt: skip
    return out, len(stream), len(compute)


def serving_ratios() -> list[dict[str, object]]:
    """Per profiled GPU: its weight-streaming, compute and KV-streaming efficiencies, their fits' fixed costs
    and errors, the shapes they rest on, and each ratio over the H100-SXM's."""
    gemms, n_stream, n_compute = _gemm_efficiencies(_tables("gemm", ("model", "tp", "op", "m", "k", "n")))
    decode = _tables("attention", ("batch", "kv_len", "kv_heads", "head_dim"), keep="decode")
    kv = [s for s in _common(decode) if 4.0 * s[0] * s[1] * s[2] * s[3] >= MIN_KV_BYTES]  # K and V, 2 bytes
    cache = np.array([4.0 * s[0] * s[1] * s[2] * s[3] for s in kv])
    out: list[dict[str, object]] = []
    for gpu, gemm in gemms.items():
        hbm = get_gpu(PROFILED[gpu]).hbm_bandwidth
        kv_eff, kv_fixed, kv_err = _streaming(cache, np.array([decode[gpu][s] for s in kv]), hbm)
        out.append({"gpu": gpu, **gemm, "kv_eff": kv_eff, "kv_fixed_s": kv_fixed,
                    "kv_median_err_pct": kv_err, "stream_shapes": n_stream, "compute_shapes": n_compute,
                    "kv_shapes": len(kv)})  # fmt: skip
    ref = next(r for r in out if r["gpu"] == REFERENCE)
    for r in out:
        for eff in ("stream", "compute", "kv"):
            r[f"{eff}_ratio"] = float(r[f"{eff}_eff"]) / float(ref[f"{eff}_eff"])  # type: ignore[arg-type]
    return out


def stream_ratios(rows: list[dict[str, object]]) -> dict[str, float]:
    """{profile folder: its weight-streaming ratio over the H100-SXM's} of `serving_ratios()`'s rows."""
    return {str(r["gpu"]): float(r["stream_ratio"]) for r in rows}  # type: ignore[arg-type]


def shipped_scales(rows: list[dict[str, object]]) -> dict[str, object]:
    """The shipped scales (sim/catalog/kernel_gpus.toml), each {"weights", "compute", "kv"}: {"serving":
    {catalog name: its own ratios}, "serving_generation": {major: the mean over that generation's profiled
    GPUs}, "serving_pooled": the mean over every profiled GPU}."""

    def mean(chosen: list[dict[str, object]]) -> dict[str, float]:
        return {k: float(np.mean([float(r[c]) for r in chosen])) for k, c in SCALES.items()}  # type: ignore[arg-type]

    own = {PROFILED[str(r["gpu"])]: mean([r]) for r in rows}
    gens = sorted({g for r in rows if (g := generation(str(r["gpu"]))) is not None}, key=int)
    by_gen = {g: mean([r for r in rows if generation(str(r["gpu"])) == g]) for g in gens}
    return {"serving": own, "serving_generation": by_gen, "serving_pooled": mean(rows)}


def vidur_gemm_ratios() -> dict[str, float]:
    """The A100-80GB's weight-streaming and compute efficiencies over the H100's from Vidur's GEMM profiles
    (profiles/<gpu>/gemm.csv: another stack and measurement than aiconfigurator's), by the same fits over the
    shapes both GPUs have: a check on the rule's ratios from data it was not fitted on."""
    tables = {}
    for gpu in ("h100", "a100"):
        d = gemm_data(gpu, dataset="profiles")
        shapes = zip(d["m"], d["k"], d["n"], d["seconds"], strict=True)
        tables[gpu] = {(int(m), int(k), int(n)): float(t) for m, k, n, t in shapes}
    eff, n_stream, n_compute = _gemm_efficiencies(tables)
    a100, h100 = eff["a100"], eff["h100"]
    return {"stream_ratio": a100["stream_eff"] / h100["stream_eff"],
            "compute_ratio": a100["compute_eff"] / h100["compute_eff"],
            "stream_shapes": n_stream, "compute_shapes": n_compute}  # fmt: skip
