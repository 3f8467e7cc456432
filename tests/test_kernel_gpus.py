"""Per-GPU kernel parameters (sim/catalog/kernel_gpus.toml): fitted to each GPU's kernel table, pooled for
GPUs without one (the transfer rule, tested by leaving a GPU out), all-reduce (NCCL and vLLM's custom kernel)
by degree and node, and the importers of Vidur's and aiconfigurator's tables."""

from __future__ import annotations

import csv
import json
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import kernel_gpu_params
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.calibration import KernelCalibration
from sim.cost.gemm_fit import PROFILED, fit_gemm, gemm_data, leave_one_gpu_out, predict_gemm
from sim.cost.graph_fit import steps_table
from sim.cost.kernel_model import KernelCostModel
from sim.studies import kernels as studies_kernels
from sim.studies.aiconfigurator_profiles import import_aiconfigurator
from sim.studies.kernel_profiles import import_vidur
from sim.studies.kernels import (
    chunked_prefill_seconds,
    chunking_table,
    fit_kernel_gpus,
    kernel_gpus_toml,
)

leave_one_gpu_out_stub = {
    "h200": {"rule": ["h100"], "gemm_held_out": {"all": 11.0}, "gemm_pooled": {"all": 12.0},
             "gemm_own": {"all": 4.0}}
}  # fmt: skip
SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "catalog" / "kernel_gpus.toml"


def test_shipped_parameters_are_the_fit_and_each_gpu_fits_its_own_gemms() -> None:
    fits = fit_kernel_gpus()
    fresh = tomllib.loads(kernel_gpus_toml(fits, "sim kernels"))
    shipped = tomllib.loads(SHIPPED.read_text())
    assert fresh.keys() == shipped.keys() == {
        "gpus", "generation", "pooled", "nccl", "custom_allreduce", "serving", "serving_generation",
        "serving_pooled",
    }  # fmt: skip
    for kind in ("serving", "serving_generation"):
        assert fresh[kind].keys() == shipped[kind].keys()
        for name, scales in fresh[kind].items():
            assert scales == pytest.approx(shipped[kind][name], rel=2e-3), (kind, name)
    assert fresh["serving_pooled"] == pytest.approx(shipped["serving_pooled"], rel=2e-3)
    assert set(fresh["gpus"]) == {"H200", "H100-SXM", "A100-80GB", "L40S", "B200"}
    assert set(fresh["generation"]) == {"8", "9", "10"}
    tables = [*fresh["gpus"].items(), ("pooled", fresh["pooled"])]
    tables += [(f"generation {g}", p) for g, p in fresh["generation"].items()]
    for name, params in tables:
        if name == "pooled":
            ships = shipped["pooled"]
        elif name.startswith("generation"):
            ships = shipped["generation"][name.split()[1]]
        else:
            ships = shipped["gpus"][name]
        assert params.keys() == ships.keys(), name
        for key, value in params.items():
            assert value == pytest.approx(ships[key], rel=2e-3), (name, key)
    # aiconfigurator's GEMMs are timed in a CUDA graph: no isolated fixed cost shipped from them
    assert "kernel_fixed_s" in shipped["gpus"]["H200"] and "kernel_fixed_s" not in shipped["gpus"]["H100-SXM"]
    for kind in ("nccl", "custom_allreduce"):
        assert fresh[kind].keys() == shipped[kind].keys() == {"h200", "h100", "a100", "l40s", "b200"}
        for node, f in fresh[kind].items():
            assert f["degrees"] == shipped[kind][node]["degrees"] == [2, 4, 8]
            assert f["bandwidth"] == pytest.approx(shipped[kind][node]["bandwidth"], rel=2e-3)
            assert f["latency_s"] == pytest.approx(shipped[kind][node]["latency_s"], rel=2e-3)
    for folder, name in PROFILED.items():  # own fits: 4.5-6.2%, the L40S 9.2%
        d = gemm_data(folder)
        own = np.median(np.abs(predict_gemm(fit_gemm([folder]), d, folder) / d["seconds"] - 1))
        assert own < (0.10 if folder == "l40s" else 0.07), name
    d = gemm_data("h200")  # the H200 ships its own profile's fit, fixed cost included
    assert np.median(np.abs(predict_gemm(shipped["gpus"]["H200"], d, "h200") / d["seconds"] - 1)) < 0.06


def test_leaving_a_gpu_out_predicts_its_gemms() -> None:
    """The transfer rule (the other GPUs of the same generation, else all of them, at this GPU's peaks) on
    aiconfigurator's tables: the Hoppers predict each other within 10% per GEMM kind (7.2 and 8.6% over all);
    the A100, with no Ampere left in the pool, misses (15.3%); the B200 and L40S, outside the pool, 8.0 and
    15.2%. On the previous tables (H200 profile, Vidur's H100/A100) pooled fits gave 11.6 / 12.8 / 5.4%."""
    report = leave_one_gpu_out()
    assert set(report) == {"h200", "h100", "a100", "l40s", "b200"}
    assert report["h200"]["rule"] == ["h100"] and report["h100"]["rule"] == ["h200"]
    assert report["a100"]["rule"] == ["h200", "h100"] and report["l40s"]["rule"] == ["a100"]
    for gpu in ("h200", "h100"):
        held = report[gpu]["gemm_held_out"]
        assert set(held) == {"qkv", "o", "gate_up", "down", "all"}
        assert max(held.values()) <= 10.0, (gpu, held)
        assert report[gpu]["gemm_own"]["all"] < held["all"]
    assert 12 < report["a100"]["gemm_held_out"]["all"] < 18  # across generations: a stated miss
    assert report["b200"]["gemm_held_out"]["all"] < 9 and report["l40s"]["gemm_held_out"]["all"] < 17
    assert "elementwise_held_out" in report["h100"] and "elementwise_held_out" not in report["h200"]
    assert report["a100"]["elementwise_held_out"]["all"] < 30
    old = leave_one_gpu_out(dataset="profiles")
    assert set(old) == {"h200", "h100", "a100"}
    assert old["h200"]["gemm_pooled"]["all"] == pytest.approx(11.6, abs=0.1)
    assert old["h100"]["gemm_pooled"]["all"] == pytest.approx(12.8, abs=0.1)


def test_transfer_rule_profiled_gpus_own_fit_others_their_generation_or_the_pool() -> None:
    table = tomllib.loads(SHIPPED.read_text())
    params, source = kernel_gpu_params(get_gpu("A100-80GB"))
    assert params == table["gpus"]["A100-80GB"] and "A100-80GB" in source
    params, source = kernel_gpu_params(get_gpu("L40S"))
    assert params == table["gpus"]["L40S"] and "L40S" in source
    for gpu, kin in (("A100-40GB", "A100-80GB"), ("L4", "L40S")):  # the one profiled GPU of its capability
        params, source = kernel_gpu_params(get_gpu(gpu))
        assert params == table["gpus"][kin] and kin in source and "transfer rule" in source, gpu
    for gpu, gen in (("H100-PCIe", "9"), ("H800-SXM", "9"), ("A10G", "8")):  # two of 9.0; none of 8.6
        params, source = kernel_gpu_params(get_gpu(gpu))
        assert params == table["generation"][gen] and "transfer rule" in source, gpu
    for gpu in ("T4", "MI300X"):  # no profiled GPU of their generation (MI300X: no CUDA generation at all)
        params, source = kernel_gpu_params(get_gpu(gpu))
        assert params == table["pooled"] and "transfer rule" in source, gpu
    cal = KernelCalibration.load(gpu=get_gpu("H100"))
    assert cal.gemm_n_half_mem_cols == pytest.approx(table["gpus"]["H100-SXM"]["gemm_n_half_mem_cols"])
    assert cal.kernel_fixed_s == KernelCalibration().kernel_fixed_s  # the isolated H200 kernel's
    assert KernelCalibration.load() == KernelCalibration()  # no GPU: the shipped defaults alone


def test_import_vidur_converts_gemms_elementwise_and_single_node_allreduce(tmp_path: Path) -> None:
    src = tmp_path / "profiling"
    mlp = src / "compute" / "h100" / "org" / "Tiny" / "mlp.csv"
    mlp.parent.mkdir(parents=True)
    ops = ["attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "input_layernorm", "attn_rope",
           "mlp_act", "add", "post_attention_layernorm"]  # fmt: skip
    shape = {"n_head": 8, "n_kv_head": 2, "n_embd": 1024, "n_expanded_embd": 4096, "vocab_size": 1000,
             "use_gated_mlp": "True"}  # fmt: skip
    with mlp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, [f"time_stats.{o}.median" for o in ops] + list(shape) +
                           ["num_tokens", "num_tensor_parallel_workers"])  # fmt: skip
        w.writeheader()
        for m in (1, 8, 40):  # 40 is not kept
            w.writerow({f"time_stats.{o}.median": 0.01 for o in ops} | shape |
                       {"num_tokens": m, "num_tensor_parallel_workers": 2})  # fmt: skip
    a100 = src / "compute" / "a100" / "org" / "Tiny" / "mlp.csv"
    a100.parent.mkdir(parents=True)
    a100.write_text(mlp.read_text())
    net = src / "network" / "h100_dgx" / "all_reduce.csv"
    net.parent.mkdir(parents=True)
    net.write_text("time_stats.all_reduce.median,num_workers,devices_per_node,size\n"
                   "0.02,2,2,1024\n0.04,2,2,1100\n0.5,2,1,1024\n")  # fmt: skip
    import_vidur(src, tmp_path / "out")
    gemm = list(csv.DictReader((tmp_path / "out" / "h100" / "gemm.csv").open()))
    assert len(gemm) == 8 and {r["op"] for r in gemm} == {"qkv", "o", "gate_up", "down"}
    qkv = next(r for r in gemm if r["op"] == "qkv")
    assert (int(qkv["k"]), int(qkv["n"]), float(qkv["seconds"])) == (1024, (8 + 4) * 128 // 2, 1e-5)
    elem = list(csv.DictReader((tmp_path / "out" / "h100" / "elementwise.csv").open()))
    assert len(elem) == 10
    ar = list(csv.DictReader((tmp_path / "out" / "allreduce.csv").open()))
    assert len(ar) == 1 and float(ar[0]["seconds"]) == pytest.approx(3e-5)  # one bin, the 2-node row left out


def _fake_aiconfigurator(root: Path) -> Path:
    """A package folder shaped as aiconfigurator_core's, with a few rows per table for every system."""
    import polars as pl

    pkg = root / "aiconfigurator_core"
    meta = root / "aiconfigurator_core-9.9.9.dist-info" / "METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text("Metadata-Version: 2.4\nName: aiconfigurator-core\nVersion: 9.9.9\n")
    for system in ("h200_sxm", "h100_sxm", "a100_sxm", "l40s", "b200_sxm"):
        (pkg / "systems").mkdir(parents=True, exist_ok=True)
        (pkg / "systems" / f"{system}.yaml").write_text("misc:\n  nccl_version: '2.27.3'\n")
        data = pkg / "systems" / "data" / system
        common = {"framework": "VLLM", "device": f"GPU {system}"}
        # llama-3.1-8b's TP 1 qkv (K 4096, N 6144) at M 1 and 17 (not kept), fp8, a grid shape
        gemm = pl.DataFrame([
            common | {"version": "0.24.0", "op_name": "gemm", "gemm_dtype": "bfloat16", "m": 1, "n": 6144,
                      "k": 4096, "latency": 0.02},
            common | {"version": "0.24.0", "op_name": "gemm", "gemm_dtype": "bfloat16", "m": 17, "n": 6144,
                      "k": 4096, "latency": 0.02},
            common | {"version": "0.24.0", "op_name": "gemm", "gemm_dtype": "fp8", "m": 1, "n": 6144,
                      "k": 4096, "latency": 0.01},
            common | {"version": "0.24.0", "op_name": "gemm", "gemm_dtype": "bfloat16", "m": 1, "n": 32,
                      "k": 32, "latency": 0.003},
        ])  # fmt: skip
        for version in ("0.14.0", "0.24.0"):  # the newest is read
            (data / "gemm" / "vllm" / version).mkdir(parents=True)
            gemm.with_columns(latency=pl.col("latency") * (2 if version == "0.14.0" else 1)).write_parquet(
                data / "gemm" / "vllm" / version / "gemm_perf.parquet"
            )
        (data / "attention" / "vllm" / "0.24.0").mkdir(parents=True)
        attn = {"framework": "VLLM", "version": "0.24.0", "device": "x", "kernel_source": "fa", "isl": 1,
                "step": 0, "num_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "kv_cache_dtype": "bfloat16", "window_size": 0, "batch_size": 8}  # fmt: skip
        adir = data / "attention" / "vllm" / "0.24.0"
        ctx = {"op_name": "context_attention", "latency": 0.1}
        pl.DataFrame([attn | ctx | {"isl": 1024}, attn | ctx | {"isl": 1000},  # 1,000: not a kept length
                      attn | ctx | {"isl": 1024, "window_size": 128}]).write_parquet(
            adir / "context_attention_perf.parquet"
        )  # fmt: skip
        gen = {"op_name": "generation_attention", "step": 4095}
        pl.DataFrame([attn | gen | {"latency": 0.05}, attn | gen | {"kv_cache_dtype": "fp8", "latency": 0.03}
                      ]).write_parquet(adir / "generation_attention_perf.parquet")  # fmt: skip
        (data / "comm" / "vllm" / "0.24.0").mkdir(parents=True)
        pl.DataFrame([
            common | {"version": "0.24.0", "op_name": "all_reduce", "kernel_source": f"vLLM_custom_{k}",
                      "allreduce_dtype": "bfloat16", "num_gpus": 8, "message_size": 1024, "latency": lat}
            for k, lat in (("graph", 0.005), ("eager", 0.02))
        ]).write_parquet(data / "comm" / "vllm" / "0.24.0" / "custom_allreduce_perf.parquet")  # fmt: skip
        for version in ("2.27.3", "2.29.2"):  # the system file's version is read, not the newest
            (data / "comm" / "nccl" / version).mkdir(parents=True)
            pl.DataFrame([
                common | {"version": "x", "op_name": op, "kernel_source": "NCCL", "nccl_dtype": dt,
                          "num_gpus": 4, "message_size": 2048,
                          "latency": 0.01 if version == "2.27.3" else 9.0}
                for op, dt in (("all_reduce", "half"), ("all_reduce", "int8"), ("all_gather", "half"))
            ]).write_parquet(data / "comm" / "nccl" / version / "nccl_perf.parquet")  # fmt: skip
        if system == "h100_sxm":  # fused MoE: kept (balanced, EP 1, bf16, TP 2), and four rows left out
            moe = {"framework": "VLLM", "version": "0.24.0", "device": "x", "op_name": "moe",
                   "kernel_source": "triton", "moe_dtype": "bfloat16", "num_tokens": 64, "hidden_size": 4096,
                   "inter_size": 14336, "topk": 2, "num_experts": 8, "moe_tp_size": 2, "moe_ep_size": 1,
                   "distribution": "balanced", "latency": 0.5}  # fmt: skip
            (data / "moe" / "vllm" / "0.24.0").mkdir(parents=True)
            pl.DataFrame([moe, moe | {"moe_ep_size": 2}, moe | {"distribution": "power_law_1.2"},
                          moe | {"moe_dtype": "int4_wo"}, moe | {"moe_tp_size": 16}]).write_parquet(
                data / "moe" / "vllm" / "0.24.0" / "moe_perf.parquet"
            )  # fmt: skip
    return pkg


def test_import_aiconfigurator_keeps_layer_shaped_bf16_gemms_attention_and_allreduce(tmp_path: Path) -> None:
    pkg = _fake_aiconfigurator(tmp_path / "site")
    written = import_aiconfigurator(pkg, tmp_path / "out")
    assert len(written) == 5 * 5 + 1  # moe.csv for the one system with a fused-MoE table
    base = tmp_path / "out" / "h100" / "aiconfigurator"
    gemm = list(csv.DictReader((base / "gemm.csv").open()))
    assert gemm == [{"model": "llama-3.1-8b", "tp": "1", "op": "qkv", "m": "1", "k": "4096", "n": "6144",
                     "seconds": "2e-05"}]  # fmt: skip
    custom = list(csv.DictReader((base / "custom_allreduce.csv").open()))
    assert [(r["kernel"], r["degree"], r["elements"], float(r["seconds"])) for r in custom] == [
        ("eager", "8", "1024", 2e-5),
        ("graph", "8", "1024", 5e-6),
    ]
    attn = list(csv.DictReader((base / "attention.csv").open()))  # llama-3.1-8b's heads at TP 1; bf16 KV
    assert [(r["phase"], r["q_len"], r["kv_len"], float(r["seconds"])) for r in attn] == [
        ("prefill", "1024", "1024", 1e-4),
        ("decode", "1", "4096", 5e-5),
    ]
    nccl = list(csv.DictReader((base / "nccl_allreduce.csv").open()))
    assert [(r["degree"], r["elements"], float(r["seconds"])) for r in nccl] == [("4", "2048", 1e-5)]
    moe = list(csv.DictReader((base / "moe.csv").open()))
    assert moe == [{"dtype": "bf16", "kernel": "triton", "hidden": "4096", "inter": "14336", "topk": "2",
                    "experts": "8", "tp": "2", "tokens": "64", "seconds": "0.0005"}]  # fmt: skip
    assert not (tmp_path / "out" / "h200" / "aiconfigurator" / "moe.csv").exists()
    sources = (base / "SOURCES.md").read_text()
    assert "h100_sxm/moe/vllm/0.24.0/moe_perf.parquet" in sources
    assert "aiconfigurator-core` 9.9.9" in sources
    assert "h100_sxm/gemm/vllm/0.24.0/gemm_perf.parquet" in sources
    assert "h100_sxm/comm/nccl/2.27.3/nccl_perf.parquet" in sources and "GPU h100_sxm" in sources
    # the package's own folder, its systems/ or its data folder alike
    assert (
        import_aiconfigurator(pkg / "systems" / "data", tmp_path / "again")
        and (tmp_path / "again" / "b200" / "aiconfigurator" / "gemm.csv").read_text()
        == (tmp_path / "out" / "b200" / "aiconfigurator" / "gemm.csv").read_text()
    )


def test_sim_kernels_json_and_table(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The command's plumbing (the fits themselves are tested above): JSON, the tables, --write."""
    fits = {"gpus": {"H200": {"kernel_fixed_s": 1e-5}}, "pooled": {"kernel_fixed_s": 1e-5}}
    monkeypatch.setattr(studies_kernels, "fit_kernel_gpus", lambda ratio_rows=None: fits)
    monkeypatch.setattr(
        studies_kernels, "leave_one_gpu_out", lambda dataset, ratios=None: leave_one_gpu_out_stub
    )
    res = CliRunner().invoke(app, ["kernels", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) == {
        "fits",
        "held_out",
        "allreduce",
        "allreduce_vidur",
        "attention",
        "chunking",
        "steps",
        "moe_held_out",
        "serving_ratios",
        "mla",
    }
    assert set(out["held_out"]) == {"aiconfigurator", "profiles"}
    res = CliRunner().invoke(app, ["kernels", "--write", str(tmp_path / "k.toml")])
    assert res.exit_code == 0 and "left out" in res.output and "Sarathi" in res.output, res.output
    assert tomllib.loads((tmp_path / "k.toml").read_text())["pooled"] == {"kernel_fixed_s": 1e-5}
    res = CliRunner().invoke(app, ["kernels", "--import-vidur", "/nonexistent"])
    assert res.exit_code == 2 and "error:" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["kernels", "--import-aiconfigurator", str(tmp_path)])
    assert res.exit_code == 2 and "aiconfigurator_core" in res.output and "Traceback" not in res.output


def test_chunked_prefill_overhead_near_sarathis_measurement() -> None:
    """Yi-34B TP 2, 512-token chunks over unchunked (Sarathi-Serve artifact, figure 9, every prompt length):
    +15.2 / +18.9 / +11.7 / -0.5% at 2K / 4K / 8K / 16K. The kernel model, each chunk re-reading the KV before
    it and paying the step's weights and fixed costs, with the A100's aiconfigurator fits: +15.0 / +18.5 /
    +19.3 / +18.1%; the engine's roofline, its GEMMs filling the A100's tiles (93 tokens): +12.7 / +15.8 /
    +16.8 / +16.3%. The long prompts' miss is their unchunked baseline: against it the kernel model drifts
    from -11.5% to -31.8%, against the same prompts in chunks of 2,048 it stays at -11 to -13% (a PCIe
    A100 costed as the catalog's SXM part). Over chunks of 2,048, 512-token chunks measure +15.3 / +16.1 /
    +19.2 / +23.6% and the model gives +15.0 / +14.6 / +13.7 / +12.4%: short chunks over a long cached
    prefix cost more than modelled."""
    rows = chunking_table()
    assert [int(r["prompt"]) for r in rows] == [2047, 4095, 8191, 16383]
    gaps = [r["kernel_pct"] - r["measured_pct"] for r in rows]
    assert abs(gaps[0]) < 1.5 and abs(gaps[1]) < 1.5 and 0 < gaps[2] < 8 and 15 < gaps[3] < 22
    engine = [r["roofline_pct"] - r["measured_pct"] for r in rows]
    assert abs(engine[0]) < 4 and abs(engine[1]) < 4 and 0 < engine[2] < 6 and 14 < engine[3] < 20
    wide = [r["kernel_wide_err_pct"] for r in rows]
    whole = [r["kernel_whole_err_pct"] for r in rows]
    assert all(-14 < e < -10 for e in wide) and whole[2] < -20 and whole[3] < -30
    under = [r["kernel_wide_pct"] - r["measured_wide_pct"] for r in rows]
    assert abs(under[0]) < 1 and under[1] > -2 and under[2] < -5 and under[3] < -10
    spec, g = load_model("yi-34b"), get_gpu("A100-80GB")
    cost = KernelCostModel(spec, g, 2, calibration=KernelCalibration.load(gpu=g))
    second = cost.step_time(np.array([512]), np.array([512]))[0]
    assert second > cost.step_time(np.array([512]), np.array([0]))[0]  # the later chunk reads the earlier KV
    assert chunked_prefill_seconds(cost, 1024, 512) == pytest.approx(
        cost.step_time(np.array([512]), np.array([0]))[0] + second
    )


def test_h200_graphed_decode_and_long_prefill_steps_are_the_kernels_they_contain() -> None:
    """Whole steps (steps.csv): graphed decode at batch <= 128 within 5% of the kernel model's GPU time, with
    graph_kernel_fixed_s fitted to them; eager prefill of 2K and 8K tokens within 10%."""
    cal = KernelCalibration.load(gpu=get_gpu("H200"))
    assert cal.graph_kernel_fixed_s == pytest.approx(
        tomllib.loads(SHIPPED.read_text())["gpus"]["H200"]["graph_kernel_fixed_s"]
    )
    rows = steps_table(cal)
    decode = [r for r in rows if r["phase"] == "decode"]
    prefill = [r for r in rows if r["phase"] == "prefill"]
    assert len(decode) == 10 and all(r["graph"] and r["batch"] <= 128 for r in decode)
    assert all(abs(r["error_pct"]) < 5 for r in decode), decode  # type: ignore[arg-type]
    assert len(prefill) == 2 and all(abs(r["error_pct"]) < 10 for r in prefill), prefill  # type: ignore[arg-type]
    # with the end-to-end in-graph fixed cost the batch-128 steps at 2,048 cached tokens come out 5.7% slow
    old = steps_table(replace(cal, graph_kernel_fixed_s=KernelCalibration().graph_kernel_fixed_s))
    assert max(r["error_pct"] for r in old if r["phase"] == "decode") > 5  # type: ignore[type-var]
