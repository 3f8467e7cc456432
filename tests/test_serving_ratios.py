"""The engine's efficiencies on each GPU: its measured kernels' ratios to the H100-SXM's
(sim.cost.serving_ratios), shipped in sim/catalog/kernel_gpus.toml, and the engine charging them
(`Calibration.on_gpu`, the transfer rule for a GPU without tables)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import serving_scales
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.calibration import Calibration
from sim.cost.roofline import CostModel
from sim.cost.serving_ratios import serving_ratios, vidur_gemm_ratios

SHIPPED = Path(__file__).resolve().parents[1] / "sim" / "catalog" / "kernel_gpus.toml"


def test_serving_ratios_set_each_gpus_efficiencies_against_the_h100s() -> None:
    """aiconfigurator's GEMMs and decode attention, the shapes every GPU has: each GPU's weight streaming and
    KV streaming (a fixed cost + bytes / bandwidth reproduces its memory-bound kernels) and compute
    efficiency, over the H100's. The A100 streams weights at about 0.83 and KV at 0.80 of the H100's
    efficiency, the L40S computes at about 0.77 of it."""
    rows = {r["gpu"]: r for r in serving_ratios()}
    assert set(rows) == {"h200", "h100", "a100", "l40s", "b200"}
    assert rows["h100"]["stream_ratio"] == rows["h100"]["compute_ratio"] == rows["h100"]["kv_ratio"] == 1.0
    for r in rows.values():
        assert 0.3 < r["stream_eff"] <= 1.0 and 0.3 < r["compute_eff"] <= 1.0 and r["fixed_s"] >= 0
        assert 0.3 < r["kv_eff"] <= 1.0 and r["kv_fixed_s"] >= 0 and r["kv_median_err_pct"] < 12
        assert r["stream_median_err_pct"] < 10 and r["stream_shapes"] > 100 and r["compute_shapes"] > 50
        assert r["kv_shapes"] > 20
    assert 0.78 < rows["a100"]["stream_ratio"] < 0.88 and 0.72 < rows["l40s"]["compute_ratio"] < 0.82
    assert 0.75 < rows["a100"]["kv_ratio"] < 0.85
    # Vidur's A100 and H100 GEMM profiles, which the rule is not fitted on, agree on the direction and size
    vidur = vidur_gemm_ratios()
    assert vidur["stream_shapes"] > 200 and vidur["compute_shapes"] > 50
    assert 0.83 < vidur["stream_ratio"] < 0.92 and 0.98 < vidur["compute_ratio"] < 1.08


def test_the_engine_charges_each_gpu_its_h100_efficiencies_times_its_ratios() -> None:
    """The H100-SXM runs at the fitted efficiencies (ratio 1); the A100-80GB decodes slower than its peaks
    alone say, by its weight-streaming ratio; a GPU without tables takes those of the one profiled GPU of
    its compute capability, else its generation's mean."""
    cal = Calibration.load()
    assert cal.on_gpu(get_gpu("H100-SXM")) == cal
    a100 = get_gpu("A100-80GB")
    scales, source = serving_scales(a100)
    assert "A100-80GB" in source and "transfer rule" not in source
    on = cal.on_gpu(a100)
    assert on.bandwidth_eff == pytest.approx(cal.bandwidth_eff * scales["weights"])
    assert on.kv_bandwidth_eff == pytest.approx(cal.kv_bandwidth_eff * scales["kv"])
    assert on.compute_eff_decode == pytest.approx(min(1.0, cal.compute_eff_decode * scales["compute"]))
    assert (on.sampler_s_per_entry, on.step_overhead_s) == (cal.sampler_s_per_entry, cal.step_overhead_s)
    l4_scales, source = serving_scales(get_gpu("L4"))  # Ada, as the L40S
    assert "L40S" in source and l4_scales == tomllib.loads(SHIPPED.read_text())["serving"]["L40S"]
    a10g_scales, source = serving_scales(get_gpu("A10G"))  # capability 8.6: no profiled GPU of its own
    assert "compute capability 8.x" in source
    assert a10g_scales == tomllib.loads(SHIPPED.read_text())["serving_generation"]["8"]
    # a memory-bound decode step on the A100: its weight and KV reads at the scaled efficiencies
    cost = CostModel(load_model("llama-3.1-8b"), a100, calibration=cal)
    s = cost.step(np.array([1] * 8), np.array([1024] * 8))
    assert cost.calibration == cal and cost.cal == on and s.bound == "memory"
    expected = s.weight_bytes / (a100.hbm_bandwidth * cal.bandwidth_eff * scales["weights"]) + (
        s.kv_read_bytes + s.kv_write_bytes
    ) / (a100.hbm_bandwidth * cal.kv_bandwidth_eff * scales["kv"])
    assert s.memory_s == pytest.approx(expected, rel=1e-9)
    # `sim step` says which efficiencies it charged and where their ratios come from
    args = ["step", "llama-3.1-8b", "--gpu", "L4", "--batch", "8", "--context", "512", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    engine = json.loads(res.output)["engine"]
    l4 = cal.on_gpu(get_gpu("L4"))
    assert engine["bandwidth_eff"] == l4.bandwidth_eff and engine["kv_bandwidth_eff"] == l4.kv_bandwidth_eff
    assert "L40S" in engine["efficiency_source"]
