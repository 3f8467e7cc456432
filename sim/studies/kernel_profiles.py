"""`sim kernels --import-vidur DIR`: Vidur's published per-op profiles (microsoft/vidur,
`data/profiling/`) turned into the catalog's kernel tables (sim/catalog/profiles/<gpu>/), so fits run from the
repository alone.

From each `compute/<gpu>/<hf id>/mlp.csv` the four GEMMs of a decoder layer (QKV, O, gate+up, down) become
rows of `gemm.csv` (model, tp, op, m, k, n, seconds: one GPU's shard, as the H200 profile's) and the
element-wise ops (two RMSNorms, rotary embedding, activation, residual add) rows of `elementwise.csv` (model,
tp, op, m, hidden, qk_width, inter_width, gated, seconds), each at the median of its timings. Token counts are
thinned to `TOKEN_COUNTS` (the profile has every multiple of 8 to 32K); nothing else is changed. From each
`network/<node>/all_reduce.csv` the single-node all-reduces, binned by message size (`allreduce_rows`), become
rows of `sim/catalog/profiles/allreduce.csv`.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from sim.io.errors import SimError

TOKEN_COUNTS = frozenset(
    [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144,
     8192, 12288, 16384, 24576, 32768]
)  # fmt: skip
GEMMS = {"attn_pre_proj": "qkv", "attn_post_proj": "o", "mlp_up_proj": "gate_up", "mlp_down_proj": "down"}
ELEMENTWISE = {
    "input_layernorm": "norm",
    "post_attention_layernorm": "norm",
    "attn_rope": "rope",
    "mlp_act": "act",
    "add": "add",
}
GPUS = ("h100", "a100")


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def _median_seconds(row: dict[str, str], op: str) -> float | None:
    v = row.get(f"time_stats.{op}.median", "")
    return float(v) * 1e-3 if v else None  # Vidur's timings are in milliseconds


def compute_rows(mlp_csv: Path) -> tuple[list[list[object]], list[list[object]]]:
    """(GEMM rows, element-wise rows) of one model's mlp.csv."""
    model = mlp_csv.parent.name
    gemm: list[list[object]] = []
    elem: list[list[object]] = []
    for r in _read(mlp_csv):
        m = int(r["num_tokens"])
        if m not in TOKEN_COUNTS:
            continue
        tp = int(r["num_tensor_parallel_workers"])
        h, nh, nkv, inter = (int(r[c]) for c in ("n_embd", "n_head", "n_kv_head", "n_expanded_embd"))
        gated = r["use_gated_mlp"] == "True"
        hd = h // nh
        shapes = {
            "qkv": (h, (nh + 2 * nkv) * hd // tp),
            "o": (nh * hd // tp, h),
            "gate_up": (h, (2 if gated else 1) * inter // tp),
            "down": (inter // tp, h),
        }
        for col, op in GEMMS.items():
            s = _median_seconds(r, col)
            if s is not None:
                gemm.append([model, tp, op, m, *shapes[op], s])
        qk = (nh + nkv) * hd // tp
        for col, op in ELEMENTWISE.items():
            s = _median_seconds(r, col)
            if s is not None:
                elem.append([model, tp, op, m, h, qk, inter // tp, int(gated), s])
    return gemm, elem


def allreduce_rows(path: Path) -> list[list[object]]:
    """The single-node all-reduces of one all_reduce.csv (every GPU of the group on one node, as tensor
    parallelism runs), in bins of a factor of √2 in message size: each bin's median size and median time.
    (Vidur measured each size a few times; single small-message timings are noisy, 7 or 41 µs alike.)"""
    by_group: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for r in _read(path):
        degree, per_node = int(r["num_workers"]), int(r["devices_per_node"])
        if degree == per_node:
            seconds = float(r["time_stats.all_reduce.median"]) * 1e-3
            by_group.setdefault((degree, per_node), []).append((int(r["size"]), seconds))
    out: list[list[object]] = []
    for (degree, per_node), points in sorted(by_group.items()):
        bins: dict[int, list[tuple[int, float]]] = {}
        for size, seconds in points:
            bins.setdefault(int(math.floor(2 * math.log2(size))), []).append((size, seconds))
        for _, members in sorted(bins.items()):
            size = int(statistics.median_low(sorted(m[0] for m in members)))
            seconds = statistics.median(m[1] for m in members)
            out.append([path.parent.name, degree, per_node, size, seconds])
    return out


def import_vidur(source: Path, dest: Path) -> list[Path]:
    """Write dest/<gpu>/gemm.csv, dest/<gpu>/elementwise.csv and dest/allreduce.csv from Vidur's
    `data/profiling` folder `source`; returns the files written."""
    if not (source / "compute").is_dir() or not (source / "network").is_dir():
        raise SimError(f"{source}: expected Vidur's profiling folder (with compute/ and network/)")
    written = []
    for gpu in GPUS:
        gemm: list[list[object]] = []
        elem: list[list[object]] = []
        files = sorted((source / "compute" / gpu).glob("*/*/mlp.csv"))
        if not files:
            raise SimError(f"{source}/compute/{gpu}: no <org>/<model>/mlp.csv files")
        for f in files:
            g, e = compute_rows(f)
            gemm += g
            elem += e
        _write(dest / gpu / "gemm.csv", ["model", "tp", "op", "m", "k", "n", "seconds"], gemm)
        header = ["model", "tp", "op", "m", "hidden", "qk_width", "inter_width", "gated", "seconds"]
        _write(dest / gpu / "elementwise.csv", header, elem)
        written += [dest / gpu / "gemm.csv", dest / gpu / "elementwise.csv"]
    ar: list[list[object]] = []
    for f in sorted((source / "network").glob("*/all_reduce.csv")):
        ar += allreduce_rows(f)
    _write(dest / "allreduce.csv", ["node", "degree", "devices_per_node", "elements", "seconds"], ar)
    return [*written, dest / "allreduce.csv"]
