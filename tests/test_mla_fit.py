"""vLLM's measured MLA module against the kernel model's, the module's other kernels fitted per GPU, and both
step models charging them (sim/cost/mla_fit.py, `sim.cost.kernels.mla_rest_seconds`)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from sim.catalog.gpus import get_gpu
from sim.catalog.kernel_gpus import kernel_gpu_params
from sim.catalog.models import load_model
from sim.config.calibration import KernelCalibration
from sim.cost.kernel_model import KernelCostModel
from sim.cost.kernels import MLA_PHASES, MLA_TERMS, mla_key, mla_rest_seconds, mla_rest_terms
from sim.cost.mla_fit import fit_mla, mla_data, mla_gpus, mla_params, mla_table, module_seconds
from sim.cost.roofline import CostModel


def test_the_listed_kernels_miss_vllms_module_and_the_fitted_rest_closes_it() -> None:
    """The projections and attention kernel alone come out 20-50% under vLLM's measured module of 300 µs and
    more on the H100, in both phases and configurations. With the rest fitted the Hoppers' own fits are
    within 8% (median |error|) and each predicts the other within 13%; every fit is closer than the listed
    kernels were where they came out under (the B200's bf16 prompts come out 5% over: nothing to add)."""
    rows = {(r["gpu"], r["phase"], r["config"]): r for r in mla_table()}
    assert mla_gpus() == ["h200", "h100", "l40s", "b200"]  # no MLA table for the A100 in the package
    for p in MLA_PHASES:
        for c in ("bf16", "fp8"):
            assert -50 < float(rows[("h100", p, c)]["long_median_pct"]) < -20  # type: ignore[arg-type]
    for (gpu, _, _), r in rows.items():
        own, held = float(r["own_abs_pct"]), float(r["held_out_abs_pct"])  # type: ignore[arg-type]
        listed = float(r["median_pct"])  # type: ignore[arg-type]
        if gpu in ("h100", "h200"):
            assert own < 8.0 and held < 13.0
        assert own < 13.0 and (listed > 0 or own < -listed)
    assert rows[("h100", "decode", "fp8")]["from"] == "h200"


def test_a_gpu_without_a_table_takes_its_generations_terms_else_all() -> None:
    """The A100 (capability 8) takes the L40S's bf16 terms and, the L40S having no FP8 modules, the FP8 terms
    of every table; the H800 (no table) the Hoppers' pool, as the shipped table's transfer rule gives it."""
    a100, l40s, every = mla_params(["a100"]), fit_mla(["l40s"]), fit_mla(mla_gpus())
    assert l40s is not None and every is not None
    assert mla_key("decode", "fixed_s", True) not in l40s
    for p in MLA_PHASES:
        for t in MLA_TERMS:
            assert a100[mla_key(p, t, False)] == l40s[mla_key(p, t, False)]
            assert a100[mla_key(p, t, True)] == every[mla_key(p, t, True)]
    h800 = kernel_gpu_params(get_gpu("H800-SXM"))[0]
    hoppers = fit_mla(["h200", "h100"])
    assert hoppers is not None
    key = mla_key("decode", "fixed_s", True)
    assert h800[key] == pytest.approx(hoppers[key], rel=1e-3)


def test_both_step_models_charge_the_module_rest_and_dense_models_nothing() -> None:
    """DeepSeek-V3 on the H100: the kernel model's `mla_rest` kernel is the layers times
    `mla_rest_seconds` and the roofline adds the same seconds to its step; a mixed step pays both paths'
    fixed costs; a dense model is charged none."""
    spec, g = load_model("deepseek-v3"), get_gpu("H100-SXM")
    cal = KernelCalibration.load(gpu=g)
    kernel = KernelCostModel(spec, g, 8, calibration=cal)
    terms = mla_rest_terms(vars(cal), True)  # DeepSeek-V3's weights are FP8 blocks
    assert kernel.mla_terms == terms and all(v >= 0 for v in terms) and terms[3] > 1e-5
    c, q = np.array([1] * 64 + [2000]), np.array([2000] * 64 + [0])
    rest = {k.name: k.seconds for k in kernel.step(c, q).kernels}["mla_rest"]
    layer = mla_rest_seconds(terms, 2000, 64, 128 / 8)
    assert rest == pytest.approx(spec.num_layers * layer)
    assert layer == pytest.approx(terms[0] + terms[3] + 2000 * (terms[1] * 16 + terms[2])
                                  + 64 * (terms[4] * 16 + terms[5]))  # fmt: skip
    roof = CostModel(spec, g, 8)
    bare = copy.copy(roof)
    bare.mla_terms = ()
    with_rest, without = roof.step_time(c, q)[0], bare.step_time(c, q)[0]
    assert with_rest - without == pytest.approx(roof.mla_rest(2064, 2000)) and roof.mla_rest(2064, 2000) > 0
    assert roof.step(c, q).seconds == with_rest
    dense = CostModel(load_model("llama-3.1-8b"), g)
    assert dense.mla_terms == () and dense.mla_rest(100, 50) == 0.0


def test_module_rest_is_the_measured_module_less_the_listed_kernels() -> None:
    """On the H100's FP8 decode at 256 sequences over 2,048 tokens (a measured module), the listed kernels
    and the fitted rest add up to within 10% of the measurement."""
    row = next(r for r in mla_data("h100") if (r["phase"], r["config"], r["heads"], r["batch"], r["length"])
               == ("decode", "fp8", "128", "256", "2048"))  # fmt: skip
    g = get_gpu("H100-SXM")
    cal = KernelCalibration.load(gpu=g)
    cost = KernelCostModel(load_model("deepseek-v3"), g, 1, None, "fp8", calibration=cal)
    listed = module_seconds(cost, "decode", 256, 2048, rest=False)
    whole = module_seconds(cost, "decode", 256, 2048)
    measured = float(row["seconds"])
    assert listed < 0.7 * measured
    assert whole == pytest.approx(measured, rel=0.10)
