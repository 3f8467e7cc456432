"""Fidelity regression: a few ground-truth rows at reduced scale, pinned against their documented errors.

The pinned figures are the signed % errors listed under "Regression rows" in docs/fidelity.md (stages ×0.05,
the shipped calibration). A cost-model or calibration change that moves any of these rows further from the
measurement than the tolerance fails here; one that improves them passes (then re-pin and re-document).
"""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from sim.config.calibration import Calibration
from sim.studies.validate import FRONTEND_KEY, errors, load_frontend, load_rows, predict

SCALE = 0.05
# Allowed growth of |error| over the pinned one, in percentage points.
TOLERANCE = {"e2e_mean": 2.0, "ttft_mean": 4.0, "itl_mean": 2.0}
# exp_key prefix -> signed % error (E2E mean, TTFT mean, ITL mean) at stages ×SCALE.
PINNED: dict[str, tuple[float, float, float]] = {
    "17-llama-4-scout": (-5.1, -4.7, -5.2),  # FP8 MoE, TP2
    "62-mistral": (3.2, 11.0, 3.1),  # TP2
    "64-qwen": (-1.2, -4.3, -1.2),  # TP1, GQA
    "20260217-231439": (0.7, -5.4, 0.8),  # Llama-2-7B at 8 then 20 req/s, CPU offload on
    "20260217-202857": (-8.1, -43.5, -7.4),  # Llama-2-70B TP4 at 20 req/s, blocks from memory
    "60-llama-3-1": (0.4, 9.7, 0.3),  # TP4
}
METRICS = tuple(TOLERANCE)
ROWS = load_rows()


def signed_errors(prefix: str, calibration: dict[str, float] | None = None) -> dict[str, float]:
    (row,) = [r for r in ROWS if r.exp_key.startswith(prefix)]
    pred = predict(row, SCALE, calibration)
    measured = row.measured()
    return {m: errors(pred.predicted[m], measured[m])[1] for m in METRICS}


def misses(got: dict[str, float], pinned: tuple[float, float, float]) -> list[str]:
    return [
        f"{m} {got[m]:+.1f}% (pinned {p:+.1f}%)"
        for m, p in zip(METRICS, pinned, strict=True)
        if not abs(got[m]) <= abs(p) + TOLERANCE[m]
    ]


@pytest.mark.parametrize("prefix", list(PINNED))
def test_row_is_no_further_from_the_measurement_than_documented(prefix: str) -> None:
    got = signed_errors(prefix)
    assert not misses(got, PINNED[prefix]), got


def test_a_worse_cost_model_fails_the_check() -> None:
    """The check bites: weight reads 15% slower than calibrated push E2E and ITL past the tolerance."""
    worse = asdict(replace(Calibration.load(), bandwidth_eff=Calibration.load().bandwidth_eff * 0.85))
    worse[FRONTEND_KEY] = load_frontend()
    got = signed_errors("64-qwen", worse)
    assert misses(got, PINNED["64-qwen"])
