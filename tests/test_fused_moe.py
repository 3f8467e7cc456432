"""vLLM's fused-MoE kernel: its fit to aiconfigurator's tables, and the one charge the engine's roofline, the
EP ranks and the kernel model take from it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import kernel_gpu_params
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.kernel_model import KernelCostModel
from sim.cost.kernels import fused_moe, fused_moe_flops, fused_moe_seconds, moe_format
from sim.cost.moe_fit import fit_moe, leave_one_moe_gpu_out, moe_data, predict_moe
from sim.cost.parallel import ParallelCost
from sim.cost.placement import Placement
from sim.cost.roofline import CostModel
from sim.cost.step_model import expected_distinct_experts


def test_fused_moe_seconds_is_its_formula() -> None:
    shape = SimpleNamespace(
        moe_m_half_tokens=32.0, moe_n_half_cols=100.0, moe_overlap_loss=0.5, moe_fixed_s=1e-5
    )
    pairs, touched, h, i = 1000.0, 8.0, 4096.0, 1792.0
    comp = 6 * h * i * (pairs + 8 * 32) * (1 + 100 / i) / 1e15
    mem = (8 * 3 * h * i * 2 + 2 * 2 * pairs * h) / 3e12
    want = max(comp, mem) + 0.5 * min(comp, mem) + 1e-5
    assert fused_moe_seconds(pairs, touched, h, i, 2.0, 1e15, 3e12, shape) == pytest.approx(want, rel=1e-12)
    assert fused_moe_flops(pairs, touched, h, i, 32.0, 100.0) == pytest.approx(comp * 1e15, rel=1e-12)


def test_fit_predicts_aiconfigurators_fused_moe_layers() -> None:
    """Every GPU's own fit within 10% (median over its layers), and the Hoppers each other's within 10%."""
    report = leave_one_moe_gpu_out()
    assert {k.split()[0] for k in report} == {"h200", "h100", "l40s", "b200"}
    for key, rep in report.items():
        assert rep["own"]["all"] <= 10.0, key  # type: ignore[index]
    for key in ("h100 bf16", "h200 bf16", "h100 fp8", "h200 fp8"):
        assert report[key]["held_out"]["all"] <= 10.0, key  # type: ignore[index]


def test_the_fit_is_prefill_slower_than_the_roofline_charged_before() -> None:
    """At 16,384 tokens the measured Triton kernel of 128 x 128-block FP8 experts (DeepSeek-V3's shape) runs
    near a third of the FP8 peak, where the roofline charged its dense 0.748; the fit is 11% over that
    layer."""
    d = moe_data("h100", "fp8")
    assert d is not None
    p = fit_moe(["h100"], "fp8")
    assert p is not None and 0.25 < p["moe_compute_eff"] < 0.45
    big = (d["tokens"] == 16384) & (d["op"] == "7168x2048 top8/256") & (d["inter"] == 2048)
    pred, seen = predict_moe(p, d, "h100", "fp8")[big], d["seconds"][big]
    assert seen.size == 1 and abs(pred[0] / seen[0] - 1) < 0.15
    flops = 6 * 7168 * 2048 * 16384 * 8
    assert flops / seen[0] / get_gpu("H100-SXM").flops_fp8 < 0.4


def test_the_roofline_charges_routed_experts_as_the_fused_moe_kernel() -> None:
    model, gpu = load_model("mixtral-8x7b"), get_gpu("H100-SXM")
    cost = CostModel(model, gpu, 2)
    dense = CostModel(model, gpu, 2)
    fit = fused_moe(kernel_gpu_params(gpu)[0], "bf16")
    tokens = 4096
    touched = expected_distinct_experts(model.num_experts, model.experts_per_token, tokens)
    inter = model.expert_params / (3 * model.hidden_size) / 2
    pairs = tokens * model.experts_per_token
    h, mh, nh = model.hidden_size, fit.moe_m_half_tokens, fit.moe_n_half_cols
    one = fused_moe_flops(pairs, touched, h, inter, mh, nh)
    moe = model.num_moe_layers * one
    step = cost.step(np.array([tokens]), np.array([0]))
    # the experts are charged at the roofline's rate as the kernel's seconds: FLOPs x (0.748 / kernel's eff)
    experts = step.flops_charged - (
        dense.lin_cost_tok * tokens
        + dense.head_cost_row
        + dense.fill_cost
        + dense.attn_cost_pair * (tokens * (tokens + 1) / 2 * model.num_layers)
    )
    assert experts == pytest.approx(moe * cost.cal.compute_eff_prefill / fit.moe_compute_eff, rel=1e-9)
    assert experts / (cost.peak_flops * cost.cal.compute_eff_prefill) == pytest.approx(
        moe / (gpu.flops_16bit * fit.moe_compute_eff), rel=1e-9
    )
    # the experts left the linear FLOPs: none of a layer's dense GEMMs counts them twice
    chosen = 2 * model.num_moe_layers * model.experts_per_token * model.expert_params / 2
    assert cost.lin_cost_tok == pytest.approx(model.linear_flops_per_token / 2 - chosen, rel=1e-12)


FORMAT_CASES = [("mixtral-8x7b", None, "bf16"), ("llama-4-scout-fp8", None, "fp8"),
                ("mixtral-8x7b", "int4", None), ("llama-3.1-8b", None, None)]  # fmt: skip


@pytest.mark.parametrize("name,dtype,want", FORMAT_CASES)
def test_moe_format(name: str, dtype: str | None, want: str | None) -> None:
    m = load_model(name)
    assert moe_format(m, get_gpu("H100-SXM"), dtype or m.default_weight_dtype, None) == want


def test_fast_decode_path_prices_moe_as_the_step() -> None:
    cost = CostModel(load_model("qwen3-30b-a3b"), get_gpu("H100-SXM"), 1)
    timer, _ = cost.decode_timer(48)
    ctx = np.full(48, 700)
    assert timer(int(ctx.sum()))[0] == cost.step_time(np.ones(48, dtype=np.int64), ctx)[0]


def test_an_attention_rank_fills_its_share_of_the_experts() -> None:
    model, gpu = load_model("deepseek-v3"), get_gpu("H100-SXM")
    base = CostModel(model, gpu, 1)
    placed = ParallelCost(base, model, gpu, Placement(tp=1, ep=16, dp=16, gpus_per_node=8, nodes=2))
    assert placed.rank_base.moe_fill_expert == base.moe_fill_expert / 16
    assert placed.rank_base.moe_cost_tok == base.moe_cost_tok


def test_kernel_model_runs_one_fused_moe_kernel_a_layer_and_a_router_gemm() -> None:
    model, gpu = load_model("mixtral-8x7b"), get_gpu("H100-SXM")
    kernels = {k.name: k for k in KernelCostModel(model, gpu, 2, calibration=KernelCalibration.load(gpu=gpu))
               .linear_kernels(4096, 1)}  # fmt: skip
    assert "mlp_up" not in kernels  # Mixtral's dense parameters are its routers only
    assert kernels["router"].count == model.num_moe_layers
    # 8 columns, far narrower than any fitted GEMM: no shape terms (with them it cost 1.3 ms a layer)
    router = kernels["router"]
    assert router.seconds / router.count < 2e-5
    assert kernels["moe_experts"].count == model.num_moe_layers
    cal = KernelCalibration.load(gpu=gpu)
    fit = fused_moe(vars(cal), "bf16")
    touched = expected_distinct_experts(8, 2, 4096)
    one = fused_moe_seconds(4096 * 2, touched, 4096, 14336 / 2, 2.0, gpu.flops_16bit * fit.moe_compute_eff,
                            gpu.hbm_bandwidth * fit.moe_bandwidth_eff, fit)  # fmt: skip
    assert kernels["moe_experts"].seconds == pytest.approx(model.num_moe_layers * one, rel=1e-12)


def test_sim_step_names_the_fused_moe_fit_it_charged() -> None:
    import json

    from typer.testing import CliRunner

    from sim.cli import app

    res = CliRunner().invoke(app, ["step", "mixtral-8x7b", "--gpu", "H100", "--tp", "2", "--prefill", "512",
                                   "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["engine"]["moe_kernel"] == "bf16"
    dense = CliRunner().invoke(app, ["step", "llama-3.1-8b", "--gpu", "H100", "--prefill", "512", "--json"])
    assert json.loads(dense.output)["engine"]["moe_kernel"] is None
    text = CliRunner().invoke(app, ["step", "mixtral-8x7b", "--gpu", "H100", "--tp", "2", "--prefill", "512"])
    assert "fused-MoE kernel's bf16 fit" in " ".join(text.output.split())


def test_kernel_calibration_defaults_are_the_h200_fit() -> None:
    """KernelCalibration's fused-MoE defaults are, as its comment says, the H200's shipped fit."""
    shipped = kernel_gpu_params(get_gpu("H200"))[0]
    defaults = vars(KernelCalibration())
    names = [k for k in defaults if k.startswith("moe_")]
    assert len(names) == 12
    assert {k: defaults[k] for k in names} == {k: shipped[k] for k in names}
