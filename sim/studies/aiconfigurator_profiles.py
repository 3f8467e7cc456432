"""`sim kernels --import-aiconfigurator DIR`: NVIDIA aiconfigurator's measured per-op tables (PyPI package
`aiconfigurator-core`, Apache-2.0; `aiconfigurator_core/systems/data/<system>/...` Parquet files) turned into
small kernel tables under sim/catalog/profiles/<gpu>/aiconfigurator/, so fits run from the repository alone
and nothing reads the package at run time.

Per GPU (`SYSTEMS`), from the newest vLLM version the package has for that system:
- `gemm.csv` (model, tp, op, m, k, n, seconds): the bf16 GEMMs (`gemm/vllm/<v>/gemm_perf.parquet`, vLLM's
  RowParallelLinear timed in a CUDA graph of six instances) whose (K, N) is the QKV, O, gate+up or down shard
  of a dense catalog model (`MODELS`) at TP 1/2/4/8, at the token counts `TOKEN_COUNTS`; the table's other
  shapes (a grid of powers of two and their multiples) are left out.
- `custom_allreduce.csv` (kernel, degree, elements, seconds): vLLM's custom all-reduce, replayed in a CUDA
  graph (`graph`) and eager (`eager`), bf16 (`comm/vllm/<v>/custom_allreduce_perf.parquet`).
- `nccl_allreduce.csv` (degree, elements, seconds): NCCL all-reduce of fp16, at the NCCL version the
  package's system file names (`misc.nccl_version`), else the newest (`comm/nccl/<v>/nccl_perf.parquet`).
- `attention.csv` (phase, batch, q_len, kv_len, heads, kv_heads, head_dim, kernel, seconds): vLLM's attention
  kernel (`attention/vllm/<v>/{context,generation}_attention_perf.parquet`, the table's most used kernel, the
  system's default backend), bf16 KV, no sliding window, at the catalog models' head counts per GPU at TP
  1/2/4/8 with 128-wide heads, `ATTN_BATCHES` and `ATTN_LENGTHS`; decode attends over `step + 1` tokens
  (the tables step by 2^k - 1: the tokens cached before the new one).
- `moe.csv` (dtype, kernel, hidden, inter, topk, experts, tp, tokens, seconds): vLLM's fused-MoE layer
  (`moe/vllm/<v>/moe_perf.parquet`) with every expert on the GPU (`moe_ep_size` 1) and the intermediate
  width split over `tp` (1/2/4/8), the gate balanced, bf16 and FP8 with 128 x 128 weight blocks, each
  dtype's most used kernel on that system (Triton on the Hoppers and the L40S); a system without balanced
  rows (the A100's table has only skewed gates) gets none.
- `mla.csv` (phase, config, kernel, heads, batch, length, seconds): vLLM's MLA attention module of
  DeepSeek-V3 (`mla/vllm/<v>/mla_{context,generation}_module_perf.parquet`), where the system has one.
- `SOURCES.md`: package, version, each file read, system, runtime version and device name.
Message sizes are elements (the package's convention: an all-reduce of T tokens of width H is T·H).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sim.catalog.models import load_model
from sim.io.errors import SimError
from sim.studies.kernel_profiles import _write

SYSTEMS = {"h200": "h200_sxm", "h100": "h100_sxm", "a100": "a100_sxm", "l40s": "l40s", "b200": "b200_sxm"}
MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-2-7b", "llama-2-13b", "llama-2-70b", "mistral-7b",
          "mistral-nemo-12b", "qwen2.5-7b", "qwen3-4b", "qwen3-14b", "yi-34b", "codellama-34b", "phi-3-mini",
          "gemma-2-9b")  # fmt: skip
TPS = (1, 2, 4, 8)
# token counts every system's table has (the A100's stops at 8,192)
TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 512, 768, 1024, 2048, 4096, 8192)
SUBDIR = "aiconfigurator"
ATTN_BATCHES = (1, 8, 32, 128)
ATTN_LENGTHS = (128, 512, 1024, 2048, 4096, 8192, 16384)  # prompt tokens, or decode's cached tokens + 1


@dataclass(frozen=True)
class Source:
    """One Parquet file read: its path below the data folder and the runtime version it was measured on."""

    path: str
    version: str  # the runtime version of the file's folder
    row_version: str  # the `version` its rows give
    device: str
    rows: int


def data_root(given: Path) -> Path:
    """The package's `systems/data` folder from the package folder, its `systems/` or the data folder."""
    for cand in (given / "systems" / "data", given / "data", given):
        if (cand / "h100_sxm").is_dir():
            return cand
    raise SimError(f"{given}: expected aiconfigurator_core's folder (with systems/data/h100_sxm/)")


def package_version(root: Path) -> str:
    """`aiconfigurator-core`'s version from the dist-info beside the package, or 'unknown'."""
    pkg = root.parents[1]  # .../aiconfigurator_core/systems/data -> .../aiconfigurator_core
    for meta in sorted(pkg.parent.glob("aiconfigurator_core-*.dist-info/METADATA")):
        for line in meta.read_text().splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _newest(folder: Path, filename: str) -> Path:
    found = sorted(folder.glob(f"*/{filename}"), key=lambda p: _version_key(p.parent.name))
    if not found:
        raise SimError(f"{folder}: no <version>/{filename}")
    return found[-1]


def _nccl_file(root: Path, system: str) -> Path:
    spec = root.parent / f"{system}.yaml"
    text = spec.read_text() if spec.is_file() else ""
    m = re.search(r"^\s*nccl_version:\s*'?([\w.]+)'?", text, re.MULTILINE)
    chosen = root / system / "comm" / "nccl" / (m.group(1) if m else "") / "nccl_perf.parquet"
    return chosen if m and chosen.is_file() else _newest(root / system / "comm" / "nccl", "nccl_perf.parquet")


def _read(path: Path, root: Path):  # type: ignore[no-untyped-def]
    import polars as pl

    try:
        df = pl.read_parquet(path)
    except Exception as exc:  # polars raises several kinds for a bad file
        raise SimError(f"{path}: cannot read as Parquet: {exc}") from None
    need = {"latency", "version", "device"}
    if not need <= set(df.columns):
        raise SimError(f"{path}: expected columns {sorted(need)}, found {df.columns}")
    return df


def _source(df, path: Path, root: Path) -> Source:  # type: ignore[no-untyped-def]
    versions = ", ".join(sorted({str(v) for v in df["version"].to_list()}))
    return Source(str(path.relative_to(root)), path.parent.name, versions, str(df["device"][0]), df.height)


def layer_shapes() -> dict[tuple[int, int], tuple[str, int, str]]:
    """{(K, N): (model, tp, op)} of the dense catalog models' four GEMMs per GPU at TP 1/2/4/8, the first
    model that has each shape (as sim.cost.kernel_model divides a layer's weights)."""
    out: dict[tuple[int, int], tuple[str, int, str]] = {}
    for name in MODELS:
        m = load_model(name)
        L, H = m.num_layers, m.hidden_size
        o = m.num_heads * m.v_head_dim * H
        qkv = m.attention_params / L - o
        dense = m.dense_params / L
        up = dense * 2 / 3  # gated MLPs: gate and up, two thirds of the layer's MLP weights
        for tp in TPS:
            shapes = {"qkv": (H, qkv / H / tp), "o": (o / H / tp, H), "gate_up": (H, up / H / tp),
                      "down": ((dense - up) / H / tp, H)}  # fmt: skip
            for op, (k, n) in shapes.items():
                if float(k).is_integer() and float(n).is_integer():
                    out.setdefault((int(k), int(n)), (name, tp, op))
    return out


def gemm_rows(path: Path, root: Path) -> tuple[list[list[object]], Source]:
    """The bf16 GEMM rows of one gemm_perf.parquet at the layer shapes and `TOKEN_COUNTS`."""
    import polars as pl

    df = _read(path, root)
    need = {"gemm_dtype", "m", "n", "k"}
    if not need <= set(df.columns):
        raise SimError(f"{path}: expected columns {sorted(need)}, found {df.columns}")
    df = df.filter(pl.col("gemm_dtype").is_in(["bfloat16", "float16"]) & pl.col("m").is_in(TOKEN_COUNTS))
    shapes = layer_shapes()
    rows = []
    for r in df.sort(["k", "n", "m"]).iter_rows(named=True):
        hit = shapes.get((int(r["k"]), int(r["n"])))
        if hit is not None:  # latency is in milliseconds
            rows.append([hit[0], hit[1], hit[2], int(r["m"]), int(r["k"]), int(r["n"]), r["latency"] * 1e-3])
    if not rows:
        raise SimError(f"{path}: no bf16 GEMM at a catalog model's layer shape")
    rows.sort(key=lambda r: (r[2], r[4], r[5], r[3]))
    return rows, _source(df, path, root)


def allreduce_rows(path: Path, root: Path, kernel_col: str | None) -> tuple[list[list[object]], Source]:
    """All-reduce rows (kernel?, degree, elements, seconds) of a custom_allreduce or nccl Parquet file."""
    import polars as pl

    df = _read(path, root)
    need = {"num_gpus", "message_size", "op_name"}
    if not need <= set(df.columns):
        raise SimError(f"{path}: expected columns {sorted(need)}, found {df.columns}")
    df = df.filter(pl.col("op_name") == "all_reduce")
    dtype_col = "allreduce_dtype" if "allreduce_dtype" in df.columns else "nccl_dtype"
    if dtype_col in df.columns:
        df = df.filter(pl.col(dtype_col).is_in(["bfloat16", "half", "float16"]))
    rows: list[list[object]] = []
    for r in df.sort(["num_gpus", "message_size"]).iter_rows(named=True):
        cells: list[object] = [int(r["num_gpus"]), int(r["message_size"]), r["latency"] * 1e-3]
        if kernel_col is not None:
            cells.insert(0, str(r[kernel_col]).removeprefix("vLLM_custom_"))
        rows.append(cells)
    rows.sort(key=lambda c: tuple(c[:-1]))  # type: ignore[arg-type]
    if not rows:
        raise SimError(f"{path}: no 16-bit all_reduce rows")
    return rows, _source(df, path, root)


def head_shapes() -> set[tuple[int, int, int]]:
    """(query heads, KV heads, head dim) per GPU of the dense catalog models at TP 1/2/4/8."""
    out = set()
    for name in MODELS:
        m = load_model(name)
        for tp in TPS:
            if m.num_heads % tp == 0:
                out.add((m.num_heads // tp, max(m.num_kv_heads // tp, 1), m.head_dim))
    return out


def attention_rows(path: Path, root: Path, phase: str) -> tuple[list[list[object]], Source]:
    """Rows of one context_ or generation_attention_perf.parquet (see the module's docstring)."""
    import polars as pl

    df = _read(path, root)
    need = {"batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "kv_cache_dtype"}
    if not need <= set(df.columns):
        raise SimError(f"{path}: expected columns {sorted(need)}, found {df.columns}")
    df = df.filter(pl.col("kv_cache_dtype").is_in(["bfloat16", "float16"]) & (pl.col("head_dim") == 128))
    if "window_size" in df.columns:
        df = df.filter(pl.col("window_size") == 0)
    kernel = str(df["kernel_source"].mode().sort()[0]) if df.height else ""
    df = df.filter(pl.col("kernel_source") == kernel)
    shapes = head_shapes()
    rows: list[list[object]] = []
    for r in df.iter_rows(named=True):
        q, kv = (int(r["isl"]), int(r["isl"])) if phase == "prefill" else (1, int(r["step"]) + 1)
        shape = (int(r["num_heads"]), int(r["num_key_value_heads"]), int(r["head_dim"]))
        if shape in shapes and int(r["batch_size"]) in ATTN_BATCHES and kv in ATTN_LENGTHS:
            rows.append([phase, int(r["batch_size"]), q, kv, *shape, kernel, r["latency"] * 1e-3])
    if not rows:
        raise SimError(f"{path}: no bf16 attention at a catalog model's head counts")
    rows.sort(key=lambda c: tuple(c[:-1]))  # type: ignore[arg-type]
    return rows, _source(df, path, root)


MOE_DTYPES = {"bfloat16": "bf16", "fp8_block": "fp8_block"}  # the table's name -> moe.csv's
MOE_TPS = (1, 2, 4, 8)


def moe_rows(path: Path, root: Path) -> tuple[list[list[object]], Source] | None:
    """The balanced, all-experts-local fused-MoE rows of one moe_perf.parquet (see the module's docstring),
    or None when it has none."""
    import polars as pl

    df = _read(path, root)
    need = {"moe_dtype", "kernel_source", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts",
            "moe_tp_size", "moe_ep_size", "distribution"}  # fmt: skip
    if not need <= set(df.columns):
        raise SimError(f"{path}: expected columns {sorted(need)}, found {df.columns}")
    keep = (pl.col("moe_ep_size") == 1) & (pl.col("distribution") == "balanced")
    df = df.filter(keep & pl.col("moe_dtype").is_in(list(MOE_DTYPES)) & pl.col("moe_tp_size").is_in(MOE_TPS))
    rows: list[list[object]] = []
    for dtype in sorted(MOE_DTYPES):
        part = df.filter(pl.col("moe_dtype") == dtype)
        if not part.height:
            continue
        counts = part.group_by("kernel_source").len().sort(["len", "kernel_source"], descending=[True, False])
        kernel = str(counts["kernel_source"][0])
        for r in part.filter(pl.col("kernel_source") == kernel).iter_rows(named=True):
            shape = [int(r[c]) for c in ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size")]
            rows.append([MOE_DTYPES[dtype], kernel, *shape, int(r["num_tokens"]), r["latency"] * 1e-3])
    if not rows:
        return None
    rows.sort(key=lambda c: tuple(c[:-1]))  # type: ignore[arg-type]
    return rows, _source(df, path, root)


MLA_CONFIGS = {
    ("bfloat16", "bfloat16"): "bf16",
    ("fp8_block", "fp8"): "fp8",
}  # (GEMMs, KV cache) -> mla.csv's
MLA_HEADS = (128, 64, 32, 16)  # DeepSeek-V3's 128 heads at TP 1/2/4/8
MLA_BATCHES = (1, 8, 32, 64, 128, 256)
MLA_LENGTHS = (512, 1024, 2048, 4096, 8192)  # prompt tokens, or decode's cached tokens


def mla_rows(folder: Path, root: Path) -> tuple[list[list[object]], Source] | None:
    """vLLM's MLA attention module of DeepSeek-V3 (`mla/vllm/<v>/mla_{context,generation}_module_perf.
    parquet`: the layer's projections, latent KV and attention kernel, timed whole), bf16 GEMMs and KV and
    FP8 block GEMMs with FP8 KV, at `MLA_HEADS`, `MLA_BATCHES` and `MLA_LENGTHS`; or None without them."""
    import polars as pl

    paths = {ph: folder / f"mla_{ph}_module_perf.parquet" for ph in ("context", "generation")}
    if not all(p.is_file() for p in paths.values()):
        return None
    rows: list[list[object]] = []
    for phase, path in paths.items():
        df = _read(path, root)
        need = {
            "model",
            "gemm_type",
            "kv_cache_dtype",
            "kernel_source",
            "num_heads",
            "batch_size",
            "isl",
            "step",
        }
        if not need <= set(df.columns):
            raise SimError(f"{path}: expected columns {sorted(need)}, found {df.columns}")
        df = df.filter(pl.col("model") == "deepseek-ai/DeepSeek-V3")
        for r in df.iter_rows(named=True):
            config = MLA_CONFIGS.get((r["gemm_type"], r["kv_cache_dtype"]))
            length = int(r["isl"]) if phase == "context" else int(r["step"])
            fresh = phase == "generation" or int(r["step"]) == 0  # no cached prefix under a prompt
            keep = int(r["num_heads"]) in MLA_HEADS and int(r["batch_size"]) in MLA_BATCHES
            if config and fresh and keep and length in MLA_LENGTHS:
                shape = [int(r["num_heads"]), int(r["batch_size"]), length]
                kind = "prefill" if phase == "context" else "decode"
                rows.append([kind, config, r["kernel_source"], *shape, r["latency"] * 1e-3])
    if not rows:
        return None
    rows.sort(key=lambda c: tuple(c[:-1]))  # type: ignore[arg-type]
    return rows, _source(df, paths["generation"], root)


def _sources_md(gpu: str, system: str, version: str, files: dict[str, Source]) -> str:
    lines = [
        f"# {gpu}: kernel tables from NVIDIA aiconfigurator",
        "",
        "Converted by `sim kernels --import-aiconfigurator DIR` (sim/studies/aiconfigurator_profiles.py) "
        f"from the PyPI package `aiconfigurator-core` {version} (Apache-2.0, Copyright NVIDIA Corporation), "
        f"system `{system}`, folder `aiconfigurator_core/systems/data/`. Times in seconds (the package's are "
        "milliseconds); message sizes in elements.",
        "",
        "| file | source file | runtime version (folder) | `version` in its rows | device | 16-bit rows |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in files.items():
        lines.append(f"| `{name}` | `{s.path}` | {s.version} | {s.row_version} | {s.device} | {s.rows} |")
    return "\n".join(lines) + "\n"


def import_aiconfigurator(source: Path, dest: Path) -> list[Path]:
    """Write dest/<gpu>/aiconfigurator/{gemm,custom_allreduce,nccl_allreduce,attention,moe,mla}.csv and
    SOURCES.md for every system of `SYSTEMS` from the package folder `source`; returns the files written."""
    root = data_root(source)
    version = package_version(root)
    written: list[Path] = []
    for gpu, system in SYSTEMS.items():
        base = root / system
        if not base.is_dir():
            raise SimError(f"{root}: no {system}/ folder")
        out = dest / gpu / SUBDIR
        gemm, gs = gemm_rows(_newest(base / "gemm" / "vllm", "gemm_perf.parquet"), root)
        car, cs = allreduce_rows(_newest(base / "comm" / "vllm", "custom_allreduce_perf.parquet"), root,
                                 "kernel_source")  # fmt: skip
        nccl, ns = allreduce_rows(_nccl_file(root, system), root, None)
        attn_dir = _newest(base / "attention" / "vllm", "context_attention_perf.parquet").parent
        pre, ps = attention_rows(attn_dir / "context_attention_perf.parquet", root, "prefill")
        dec, ds = attention_rows(attn_dir / "generation_attention_perf.parquet", root, "decode")
        header = ["phase", "batch", "q_len", "kv_len", "heads", "kv_heads", "head_dim", "kernel", "seconds"]
        _write(out / "attention.csv", header, pre + dec)
        _write(out / "gemm.csv", ["model", "tp", "op", "m", "k", "n", "seconds"], gemm)
        _write(out / "custom_allreduce.csv", ["kernel", "degree", "elements", "seconds"], car)
        _write(out / "nccl_allreduce.csv", ["degree", "elements", "seconds"], nccl)
        sources = {"gemm.csv": gs, "custom_allreduce.csv": cs, "nccl_allreduce.csv": ns,
                   "attention.csv (prefill)": ps, "attention.csv (decode)": ds}  # fmt: skip
        names = ["gemm.csv", "custom_allreduce.csv", "nccl_allreduce.csv", "attention.csv"]
        moe_dir = base / "moe" / "vllm"
        moe = moe_rows(_newest(moe_dir, "moe_perf.parquet"), root) if moe_dir.is_dir() else None
        if moe is not None:
            header = ["dtype", "kernel", "hidden", "inter", "topk", "experts", "tp", "tokens", "seconds"]
            _write(out / "moe.csv", header, moe[0])
            sources["moe.csv"] = moe[1]
            names.append("moe.csv")
        mla_dir = base / "mla" / "vllm"
        mla = (
            mla_rows(_newest(mla_dir, "mla_generation_module_perf.parquet").parent, root)
            if mla_dir.is_dir()
            else None
        )
        if mla is not None:
            _write(
                out / "mla.csv", ["phase", "config", "kernel", "heads", "batch", "length", "seconds"], mla[0]
            )
            sources["mla.csv"] = mla[1]
            names.append("mla.csv")
        (out / "SOURCES.md").write_text(_sources_md(gpu, system, version, sources))
        written += [out / n for n in (*names, "SOURCES.md")]
    return written
