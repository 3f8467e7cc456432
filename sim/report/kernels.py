"""`sim kernels`: tables of the per-GPU kernel fits, the leave-one-GPU-out test and the all-reduce fits."""

from __future__ import annotations

import json
from pathlib import Path


def print_kernels(
    write: Path | None,
    import_vidur: Path | None,
    as_json: bool,
    command: str,
    import_aiconfigurator: Path | None = None,
) -> dict[str, object]:
    from rich.console import Console
    from rich.table import Table

    from sim.studies.kernels import run_kernels

    if import_vidur is not None:
        from sim.cost.gemm_fit import profiles_root
        from sim.studies.kernel_profiles import import_vidur as convert

        convert(import_vidur, profiles_root())
    if import_aiconfigurator is not None:
        from sim.cost.gemm_fit import profiles_root
        from sim.studies.aiconfigurator_profiles import import_aiconfigurator as convert_aic

        convert_aic(import_aiconfigurator, profiles_root())
    result = run_kernels(write, command)
    if as_json:
        print(json.dumps(result, indent=2))
        return result
    console = Console()
    held = result["held_out"]
    assert isinstance(held, dict)
    table = Table(title="GEMMs and element-wise kernels of a GPU left out, predicted by the transfer rule "
                  "(from: its GPUs) / pooled over the other two / own fit: median |error| %")  # fmt: skip
    for col in ("data", "GPU", "from", "kind", "op", "rule", "pooled", "own fit"):
        table.add_column(col, justify="left" if col in ("data", "GPU", "from", "kind", "op") else "right")
    for dataset, report in held.items():
        for gpu, rep in report.items():
            rule = "+".join(rep.get("rule", []))
            for op, err in rep["gemm_held_out"].items():
                pooled = rep.get("gemm_pooled", {}).get(op, float("nan"))
                table.add_row(dataset, gpu, rule, "gemm", op, f"{err:.1f}", f"{pooled:.1f}",
                              f"{rep['gemm_own'][op]:.1f}")  # fmt: skip
            for op, err in rep.get("elementwise_held_out", {}).items():
                table.add_row(dataset, gpu, "others", "elementwise", op, f"{err:.1f}", "",
                              f"{rep['elementwise_own'][op]:.1f}")  # fmt: skip
    console.print(table)
    table = Table(title="Fused-MoE layers (aiconfigurator's vLLM tables) of a GPU left out, predicted from "
                  "its generation's GPUs with the format (else all the others) / own fit: median |error| %, "
                  "over all layers and the worst shape")  # fmt: skip
    for col in ("GPU", "format", "from", "held out", "worst shape", "own fit"):
        table.add_column(col, justify="left" if col in ("GPU", "format", "from") else "right")
    moe = result["moe_held_out"]
    assert isinstance(moe, dict)
    for key, rep in moe.items():
        gpu, fmt = key.split()
        held_out = rep.get("held_out", {})
        worst = max((v for k, v in held_out.items() if k != "all"), default=float("nan"))
        table.add_row(gpu, fmt, "+".join(rep["rule"]), f"{held_out.get('all', float('nan')):.1f}",
                      f"{worst:.1f}", f"{rep['own']['all']:.1f}")  # fmt: skip
    console.print(table)
    table = Table(title="All-reduce (aiconfigurator): latency + bytes moved / bandwidth per GPU, algorithm, "
                  "degree; custom: vLLM's kernel in a CUDA graph, <= 8 MiB; nccl: > 8 MiB")  # fmt: skip
    for col in ("GPU", "kind", "degree", "points", "latency µs", "GB/s", "median |err| %", "p90 %", "max %"):
        table.add_column(col, justify="left" if col in ("GPU", "kind") else "right")
    rows = result["allreduce"]
    assert isinstance(rows, list)
    for r in rows:
        table.add_row(r["gpu"], r["kind"], str(r["degree"]), str(r["points"]), f"{r['latency_s'] * 1e6:.1f}",
                      f"{r['bandwidth'] / 1e9:.0f}", f"{r['median_pct']:.1f}", f"{r['p90_pct']:.1f}",
                      f"{r['max_pct']:.1f}")  # fmt: skip
    console.print(table)
    table = Table(title="NCCL all-reduce (Vidur): latency + ring bytes / bus bandwidth, per node and degree, "
                  "fitted to the messages vLLM sends to NCCL there")  # fmt: skip
    for col in ("node", "degree", "messages", "latency µs", "bus GB/s", "median |err| %", "p90 %",
                "all sizes: median %"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("node", "messages") else "right")
    rows = result["allreduce_vidur"]
    assert isinstance(rows, list)
    for r in rows:
        figures = (r["latency_s"] * 1e6, r["bus_bandwidth"] / 1e9, r["median_pct"], r["p90_pct"])
        cells = [f"{figures[0]:.1f}", f"{figures[1]:.0f}", f"{figures[2]:.1f}", f"{figures[3]:.1f}"]
        table.add_row(r["node"], str(r["degree"]), f"{r['carried']} ({r['points']})", *cells,
                      f"{r['all_sizes_median_pct']:.1f}")  # fmt: skip
    console.print(table)
    table = Table(
        title="Attention (aiconfigurator's vLLM kernels) of a GPU left out, predicted by the transfer rule "
        "(from: its GPUs) / own fit: median |error| %, all kernels and those of >= 100 µs"
    )
    for col in ("GPU", "from", "prefill", ">= 100 µs", "decode", ">= 100 µs"):
        table.add_column(col, justify="left" if col in ("GPU", "from") else "right")
    attention = result["attention"]
    assert isinstance(attention, dict)
    for gpu, rep in attention.items():
        held, own = rep["held_out"], rep["own"]
        cells = [
            f"{held[k]:.1f} / {own[k]:.1f}" for k in ("prefill", "prefill_long", "decode", "decode_long")
        ]
        table.add_row(gpu, "+".join(rep["rule"]), *cells)
    console.print(table)
    table = Table(
        title="DeepSeek-V3's MLA attention module against vLLM 0.24.0's measured module (aiconfigurator): "
        "the projections and attention kernel alone, median signed error % (all, >= 300 µs); with the "
        "module's other kernels fitted (from: GPUs / own), median |error| %"
    )
    cols = ("GPU", "phase", "GEMMs / KV", "modules", "listed", ">= 300 µs", "listed", "from", "fitted")
    for i, col in enumerate(cols):
        table.add_column(col, justify="left" if i < 3 or col == "from" else "right")
    mla = result["mla"]
    assert isinstance(mla, list)
    for r in mla:
        table.add_row(r["gpu"], r["phase"], r["config"], str(r["modules"]), f"{r['median_pct']:+.1f}",
                      str(r["long_modules"]), f"{r['long_median_pct']:+.1f}", r["from"],
                      f"{r['held_out_abs_pct']:.1f} / {r['own_abs_pct']:.1f}")  # fmt: skip
    console.print(table)
    table = Table(
        title="Yi-34B TP 2 on A100-80GB: a prompt in 512-token chunks over unchunked and over 2,048-token "
        "chunks, % (Sarathi-Serve); the kernel model's error, unchunked and in 2,048-token chunks"
    )
    for col in ("prompt", "measured", "kernel model", "engine roofline", "measured, over 2,048",
                "kernel model, over 2,048", "engine, over 2,048", "kernel error, unchunked",
                "kernel error, 2,048"):  # fmt: skip
        table.add_column(col, justify="right")
    chunking = result["chunking"]
    assert isinstance(chunking, list)
    for r in chunking:
        keys = ("measured_pct", "kernel_pct", "roofline_pct", "measured_wide_pct", "kernel_wide_pct",
                "roofline_wide_pct", "kernel_whole_err_pct", "kernel_wide_err_pct")  # fmt: skip
        table.add_row(str(int(r["prompt"])), *(f"{r[k]:+.1f}" for k in keys))
    console.print(table)
    table = Table(title="Whole H200 steps (Llama-3.1-8B shape): measured against the kernel model's GPU time")
    for col in ("phase", "graph", "batch", "tokens", "context", "measured ms", "model ms", "error %"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    steps = result["steps"]
    assert isinstance(steps, list)
    for r in steps:
        table.add_row(r["phase"], "yes" if r["graph"] else "no", str(r["batch"]), str(r["tokens_each"]),
                      str(r["context"]), f"{r['measured_s'] * 1e3:.2f}", f"{r['model_s'] * 1e3:.2f}",
                      f"{r['error_pct']:+.1f}")  # fmt: skip
    console.print(table)
    table = Table(title="The engine's efficiencies on each GPU (aiconfigurator's vLLM tables, the shapes "
                  "every GPU has): 16-bit weight streaming of m <= 8 GEMMs and KV streaming of decode "
                  "attention (a fixed cost + bytes / bandwidth), compute of m >= 4,096 GEMMs, as fractions "
                  "of the GPU's peaks and over the H100-SXM's, whose served runs the engine is fitted on; "
                  "the engine charges each GPU its H100 efficiencies times these ratios")  # fmt: skip
    for col in (
        "GPU",
        "shapes",
        "weights",
        "x H100",
        "fixed µs",
        "|err| %",
        "shapes ",
        "compute",
        "x H100 ",
        "shapes  ",
        "KV",
        "x H100  ",
        "|err| % ",
    ):
        table.add_column(col, justify="left" if col == "GPU" else "right")
    ratios = result["serving_ratios"]
    assert isinstance(ratios, list)
    for r in ratios:
        stream = (
            f"{r['stream_eff']:.3f}",
            f"{r['stream_ratio']:.3f}",
            f"{r['fixed_s'] * 1e6:.2f}",
            f"{r['stream_median_err_pct']:.1f}",
        )
        kv = (str(r["kv_shapes"]), f"{r['kv_eff']:.3f}", f"{r['kv_ratio']:.3f}")
        kv += (f"{r['kv_median_err_pct']:.1f}",)
        table.add_row(r["gpu"], str(r["stream_shapes"]), *stream, str(r["compute_shapes"]),
                      f"{r['compute_eff']:.3f}", f"{r['compute_ratio']:.3f}", *kv)  # fmt: skip
    console.print(table)
    if write is not None:
        console.print(f"wrote {write}")
    return result
