"""Engine profiles (sim/catalog/engines.toml, sim/cost/engine_profile.py): each reproduces its source's step
times, a policy names its engine, and one scenario compares policies on different engines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sim.catalog.engines import get_engine
from sim.config.scenario import validate_scenario
from sim.cost.engine_fit import point_errors, refit
from sim.cost.engine_profile import ProfiledCost, fit_seconds
from sim.cost.replica import build_cost_and_memory
from sim.cost.roofline import CostModel
from sim.io.errors import SimError
from sim.studies.run import run_policy


def _scenario(policies: dict[str, dict[str, Any]], gpu: str = "A100-80GB", model: str = "opt-13b",
              tp: int = 1, duration: float = 20.0) -> Any:  # fmt: skip
    return validate_scenario(
        {
            "name": "engines",
            "seed": 5,
            "model": {"name": model, "gpu": gpu, "tp": tp, "max_model_len": 2048},
            "workload": {
                "arrival": {"kind": "poisson", "rate": 2.0},
                "prompt": {"kind": "lognormal", "mean": 600, "cv": 0.5, "min": 8, "max": 1500},
                "output": {"kind": "lognormal", "mean": 120, "cv": 0.5, "min": 2, "max": 500},
                "max_tokens": 500,
            },
            "horizon": {"duration_s": duration},
            "slo": {"ttft_s": 0.2, "tpot_s": 0.1},
            "policies": policies,
        },
        "engines.toml",
    )


def _cost(engine: str, **kw: Any) -> CostModel:
    return build_cost_and_memory(_scenario({"p": {"scheduler": "vllm-v0"}}, **kw), engine=engine)[0]


def _ones(n: int) -> np.ndarray:
    return np.ones(n, np.int64)


# DistServe's estimator (simdistserve/estimators/time_estimator.py at 82831f1) with its vLLM OPT-13B tp 1
# coefficients (profiler-a100-80g.vllm.json), plus its simulator's per-step Ray overhead (worker.py,
# add_ray_overhead: 2 ms + 1e-4 ms per context token), written out from the source, in ms.
def _distserve_prefill_ms(lengths: list[int]) -> float:
    a, b, c = 22.052204789310185, 0.14050923870128956, 8.076584822611088e-06
    return a + b * sum(lengths) + c * sum(x * x for x in lengths) + 1.0 + 2.0 + 1e-4 * sum(lengths)


def _distserve_decode_ms(contexts: list[int]) -> float:
    if len(contexts) < 95:
        a, b, c = 23.475041008414784, 0.000592934466077393, 0.060726861260369455
    else:
        a, b, c = 20.206356173691958, 0.0004907727036234946, 0.1200031385587413
    tokens = sum(q + 1 for q in contexts)
    return a + b * tokens + c * len(contexts) + 2.0 + 1e-4 * tokens


@pytest.mark.parametrize("lengths", [[128], [1000], [2000], [300, 700]])
def test_vllm_2023_prefill_is_distserve_estimators_time(lengths: list[int]) -> None:
    cost = _cost("vllm-2023")
    seconds, _ = cost.step_time(np.array(lengths), np.zeros(len(lengths), np.int64))
    assert seconds * 1000 == pytest.approx(_distserve_prefill_ms(lengths), rel=1e-12)


@pytest.mark.parametrize(("rows", "ctx"), [(1, 100), (32, 500), (94, 900), (95, 900), (200, 1200)])
def test_vllm_2023_decode_is_distserve_estimators_time(rows: int, ctx: int) -> None:
    cost = _cost("vllm-2023")
    seconds, _ = cost.step_time(_ones(rows), np.full(rows, ctx))
    assert seconds * 1000 == pytest.approx(_distserve_decode_ms([ctx] * rows), rel=1e-12)
    totals = cost.step_time_totals(rows, rows, rows, rows * ctx, rows, rows * ctx, ctx + 1)
    assert totals is not None and totals[0] == pytest.approx(seconds, rel=1e-12)
    timer, _ = cost.decode_timer(rows)
    assert timer(rows * ctx)[0] == pytest.approx(seconds, rel=1e-12)


def test_sarathi_profile_reproduces_its_measured_steps() -> None:
    """Fitted on every point of figure-2's prefill.csv and decode.csv but the left-out warm-up batch; each
    point within 10% in sample and within 12% fitted without it (leave-one-out)."""
    fit = get_engine("sarathi-serve").fits[0]
    errors = point_errors(fit)
    assert len(errors) == 15 and {e.kind for e in errors} == {"prefill", "decode"}
    assert max(abs(e.error) for e in errors) < 0.10
    assert max(abs(e.held_out_error) for e in errors) < 0.12
    for part, coef in refit(fit).items():  # the shipped coefficients are the fit of the shipped points
        assert coef == pytest.approx(list(getattr(fit, part)), rel=1e-8), part


def test_sarathi_profile_prices_its_own_setup() -> None:
    cost = _cost("sarathi-serve", model="yi-34b", tp=2)
    assert isinstance(cost, ProfiledCost) and cost.reference is None
    assert cost.step_time(np.array([4096]), np.array([0]))[0] * 1000 == pytest.approx(757.6, rel=0.05)
    assert cost.step_time(_ones(128), np.full(128, 1020))[0] * 1000 == pytest.approx(189.3, rel=0.05)


def test_a_setup_without_a_fit_takes_the_ratio_to_todays_calibration() -> None:
    """On A100-40GB (no fit): today's roofline there times the profile's ratio to today's on A100-80GB."""
    here, today_80 = _cost("vllm-2023", gpu="A100-40GB"), _cost("vllm-0.15")
    today_40 = _cost("vllm-0.15", gpu="A100-40GB")
    assert isinstance(here, ProfiledCost) and here.reference is not None
    fit = get_engine("vllm-2023").fit_for("opt-13b", "A100-80GB", 1)
    assert fit is not None
    for c, q in ((np.array([900]), np.array([0])), (_ones(40), np.full(40, 700))):
        ratio = fit_seconds(fit, c, q) / today_80.step_time(c, q)[0]
        assert here.step_time(c, q)[0] == pytest.approx(today_40.step_time(c, q)[0] * ratio, rel=1e-12)
        assert ratio > 1.2  # the 2023 engine is slower than today's at both


def test_mixed_steps_pay_both_parts_and_totals_agree_with_rows() -> None:
    cost = _cost("vllm-2023")
    c, q = np.array([400, 1, 1, 1]), np.array([0, 300, 500, 700])
    seconds = cost.step_time(c, q)[0]
    assert seconds > cost.step_time(c[:1], q[:1])[0]
    totals = cost.step_time_totals(4, 403, 3, 1500, 160003, 1500, 701)
    assert totals is not None and totals[0] == pytest.approx(seconds, rel=1e-12)
    # The engine's timer of a plan's sums is the profile's, not the roofline's it derives from.
    assert cost.totals_timer()(4, 403, 3, 1500, 160003, 1500, 701) == totals
    # A prefill chunk on cached tokens: the sums cannot split the context, so the rows decide.
    assert cost.step_time_totals(2, 257, 1, 256 * 512 + 300, 256 * 256 + 1, 812, 769) is None


def test_engine_key_is_validated_with_the_known_engines() -> None:
    with pytest.raises(SimError) as err:
        _scenario({"p": {"scheduler": "vllm", "engine": "vllm-2022"}})
    msg = str(err.value)
    assert "engines.toml: policies.p.engine: unknown engine 'vllm-2022'" in msg
    assert "known: distserve-2024, sarathi-serve, vllm-0.15, vllm-2023" in msg
    with pytest.raises(SimError, match=r"policies\.p\.engine: a profile \('vllm-2023'\) is not modelled with "
                       r"speculative decoding"):  # fmt: skip
        _scenario({"p": {"scheduler": "vllm", "engine": "vllm-2023",
                         "speculative": {"method": "ngram", "num_speculative_tokens": 3,
                                         "acceptance_rate": 0.5}}})  # fmt: skip
    s = _scenario({"p": {"scheduler": "vllm", "engine": "vllm-2023"}})
    fp8 = s.model_copy(update={"model": s.model.model_copy(update={"weight_dtype": "fp8"})})
    with pytest.raises(SimError, match="policies.p: model.weight_dtype: engine 'vllm-2023': a profile costs"):
        build_cost_and_memory(fp8, "policies.p", engine="vllm-2023")


def test_todays_engine_named_or_not_is_the_same_run(tmp_path: Path) -> None:
    named = _scenario({"p": {"scheduler": "vllm-v0", "engine": "vllm-0.15"}}, duration=10)
    plain = _scenario({"p": {"scheduler": "vllm-v0"}}, duration=10)
    a, b = run_policy(named, "p", tmp_path), run_policy(plain, "p", tmp_path)
    assert a.steps.equals(b.steps) and a.requests.equals(b.requests)
    assert json.dumps(a.manifest["policy_config"]) == json.dumps(b.manifest["policy_config"])
    assert "engine" not in a.summary["replica"]
    assert type(build_cost_and_memory(named, engine="vllm-0.15")[0]) is CostModel


def test_one_scenario_compares_policies_on_different_engines(tmp_path: Path) -> None:
    scenario = _scenario({"then": {"scheduler": "vllm-v0", "engine": "vllm-2023"},
                          "now": {"scheduler": "vllm-v0"}})  # fmt: skip
    then, now = run_policy(scenario, "then", tmp_path), run_policy(scenario, "now", tmp_path)
    assert then.summary["replica"]["engine"] == "vllm-2023"
    assert then.requests["prompt_len"].equals(now.requests["prompt_len"])  # the same requests
    lat_then, lat_now = then.summary["latency"], now.summary["latency"]
    assert lat_then["tpot"]["p50"] > 1.3 * lat_now["tpot"]["p50"]
    assert lat_then["ttft"]["p50"] > 1.3 * lat_now["ttft"]["p50"]
