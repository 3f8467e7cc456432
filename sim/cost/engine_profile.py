"""A policy's step costs on an engine profile (sim/catalog/engines.toml) instead of today's calibration.

The profile's form is DistServe's estimator (simdistserve/estimators/time_estimator.py), in milliseconds. A
step's rows with more than one new token are its prefill rows (c tokens on q cached), the others its decode
rows (one token on q cached):

- prefill: `p0 + p1 * sum(c) + p2 * (sum(c^2) + 2 * sum(c * q))`: a chunk's pairs with its cached tokens
  cost as its own causal pairs do (c^2 counts about twice a chunk's own pairs);
- decode: `d0 + d1 * sum(q + 1) + d2 * rows`, its coefficients by the number of decode rows;
- a step with both pays both, its fixed cost once (the larger of p0 and d0);
- per step: `step_ms + step_ms_per_token * sum(q + c)`.

On the model, GPU and tp a fit was made for, a step takes the profile's time. Elsewhere the transfer rule
holds: the step takes today's roofline time on its own setup times the profile's ratio to today's roofline
on the fit's setup, for the same rows (`EngineProfile.reference_for` names that fit). The roofline decides
whether a step is compute-bound."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from sim.catalog.engines import EngineFit
from sim.cost.kernels import step_arrays
from sim.cost.roofline import CostModel, StepCost


def fit_ms(fit: EngineFit, prefill: float, squares: float, cached_pairs: float, decode_rows: int,
           decode_context: float, context: float) -> float:  # fmt: skip
    """The fit's milliseconds of a step with `prefill` prompt tokens (Σc over prefill rows), `squares` Σc²
    and `cached_pairs` Σc·q over them, `decode_rows` decode rows on `decode_context` Σ(q + 1), and
    `context` Σ(q + c) over every row."""
    fixed, ms = 0.0, 0.0
    if prefill > 0:
        p = fit.prefill
        fixed = p[0]
        ms += p[1] * prefill + p[2] * (squares + 2.0 * cached_pairs)
    if decode_rows > 0:
        d = fit.decode_small if decode_rows < fit.large_batch else fit.decode_large
        fixed = max(fixed, d[0])
        ms += d[1] * decode_context + d[2] * decode_rows
    return fixed + ms + fit.step_ms + fit.step_ms_per_token * context


def fit_seconds(fit: EngineFit, new_tokens: Any, context: Any) -> float:
    """The fit's seconds of one step, from its rows (c new tokens on q cached)."""
    c, q = step_arrays(new_tokens, context)
    if c.size == 0 or c.sum() <= 0:
        return 0.0
    pre = c > 1
    cp, qp = c[pre].astype(np.float64), q[pre].astype(np.float64)
    decode_rows = int(c.size - pre.sum())
    decode_context = float((q[~pre] + 1).sum())
    ms = fit_ms(fit, float(cp.sum()), float((cp * cp).sum()), float((cp * qp).sum()), decode_rows,
                decode_context, float((c + q).sum()))  # fmt: skip
    return ms / 1000.0


def totals_seconds(
    fit: EngineFit, rows: int, tokens: int, ones: int, cq: int, cc: int, ctx: int
) -> float | None:
    """`fit_seconds` from the rows' integer sums (`CostModel.step_time_totals`), or None when the sums do not
    tell the decode rows' context from the prefill rows' (a mixed step whose prefill rows have cached
    tokens)."""
    if rows <= 0 or tokens <= 0:
        return 0.0
    decode_rows, prefill = ones, tokens - ones
    if decode_rows == rows:
        decode_q, cached_pairs = ctx, 0
    elif decode_rows == 0:
        decode_q, cached_pairs = 0, cq
    elif cq == ctx:  # Σ(c - 1)·q = 0 over prefill rows: they have no cached tokens
        decode_q, cached_pairs = ctx, 0
    else:
        return None
    ms = fit_ms(fit, float(prefill), float(cc - ones), float(cached_pairs), decode_rows,
                float(decode_q + decode_rows), float(ctx + tokens))  # fmt: skip
    return ms / 1000.0


class ProfiledCost(CostModel):
    """`CostModel` whose steps take an engine profile's time: the fit's own on its setup (`reference` None),
    else today's roofline here times the fit's ratio to `reference`, today's roofline on the fit's setup."""

    def __init__(self, *args: Any, fit: EngineFit, engine: str, reference: CostModel | None = None,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.fit, self.engine, self.reference = fit, engine, reference

    def _scaled(self, profile_s: float, here_s: float, ref_s: float) -> float:
        if self.reference is None:
            return profile_s
        return here_s * profile_s / ref_s if ref_s > 0 else here_s

    def step_time(self, new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        here, bound = super().step_time(new_tokens, context)
        if here <= 0:
            return 0.0, False
        ref = self.reference.step_time(new_tokens, context)[0] if self.reference is not None else 0.0
        return self._scaled(fit_seconds(self.fit, new_tokens, context), here, ref), bound

    def step_time_totals(
        self, rows: int, tokens: int, ones: int, cq: int, cc: int, ctx: int, max_end: int
    ) -> tuple[float, bool] | None:
        timed = super().step_time_totals(rows, tokens, ones, cq, cc, ctx, max_end)
        if timed is None:
            return None
        here, bound = timed
        if here <= 0:
            return 0.0, False
        profile = totals_seconds(self.fit, rows, tokens, ones, cq, cc, ctx)
        if profile is None:
            return None
        ref = 0.0
        if self.reference is not None:
            got = self.reference.step_time_totals(rows, tokens, ones, cq, cc, ctx, max_end)
            if got is None:
                return None
            ref = got[0]
        return self._scaled(profile, here, ref), bound

    def decode_timer(self, rows: int) -> tuple[Callable[[int], tuple[float, bool]], float]:
        """`step_time_totals` of `rows` decode rows as a function of Σq, valid up to the sliding windows of
        this model and the reference's."""
        window = super().decode_timer(rows)[1]
        if self.reference is not None:
            window = min(window, self.reference.decode_timer(rows)[1])

        def seconds(ctx: int) -> tuple[float, bool]:
            got = self.step_time_totals(rows, rows, rows, ctx, rows, ctx, 0)
            assert got is not None  # decode rows only, inside the windows
            return got

        return seconds, window

    def step(self, new_tokens: np.ndarray, context: np.ndarray) -> StepCost:
        """The roofline's breakdown, its seconds the profile's."""
        cost = super().step(new_tokens, context)
        return replace(cost, seconds=self.step_time(new_tokens, context)[0]) if cost.seconds > 0 else cost
