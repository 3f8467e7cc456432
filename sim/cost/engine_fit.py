"""Fitting an engine profile's coefficients to measured step times, and how well a fit reproduces them.

Each part of the form (prefill; decode below and at or above `large_batch` rows) is a least-squares fit of
the relative error, so a 50 ms and a 4 s step weigh alike. A prefill point is one prompt of c tokens alone
(features 1, c, c^2); a decode point is a batch of b rows at the same cached context, whose per-token and
per-row terms cannot be told apart, so its per-token term is folded into the per-row one (features 1, b).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.catalog.engines import EngineFit
from sim.cost.engine_profile import fit_ms


@dataclass(frozen=True)
class PointError:
    """A measured step against the fit: its kind, size (tokens or rows), measured and fitted ms, and the
    relative error when the point is fitted with the rest (`held_out`: that part refitted without it)."""

    kind: str
    size: int
    measured_ms: float
    fitted_ms: float
    held_out_ms: float

    @property
    def error(self) -> float:
        return self.fitted_ms / self.measured_ms - 1.0

    @property
    def held_out_error(self) -> float:
        return self.held_out_ms / self.measured_ms - 1.0


def relative_lstsq(features: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Coefficients minimising the sum of squared relative errors of `features @ coef` against `measured`."""
    w = 1.0 / measured
    coef, *_ = np.linalg.lstsq(features * w[:, None], measured * w, rcond=None)
    return coef  # type: ignore[no-any-return]


def _prefill_features(sizes: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(sizes), sizes, sizes * sizes], axis=1)


def _decode_features(sizes: np.ndarray) -> np.ndarray:
    return np.stack([np.ones_like(sizes), sizes], axis=1)


def fit_points(
    prefill: list[tuple[int, float]], decode: list[tuple[int, float]], large_batch: int
) -> dict[str, list[float]]:
    """The form's coefficients fitted to `prefill` (tokens, ms) and `decode` (rows, ms) points; decode
    points below `large_batch` rows fit `decode_small`, the others `decode_large` (per-token term 0)."""
    p = np.array(prefill, dtype=np.float64)
    out = {"prefill": [float(v) for v in relative_lstsq(_prefill_features(p[:, 0]), p[:, 1])]}
    d = np.array(decode, dtype=np.float64)
    small = d[:, 0] < large_batch
    for name, part in (("decode_small", d[small]), ("decode_large", d[~small])):
        a, b = relative_lstsq(_decode_features(part[:, 0]), part[:, 1])
        out[name] = [float(a), 0.0, float(b)]
    return out


def _held_out(features: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Each point's fitted value with it left out of the fit (leave-one-out)."""
    out = np.empty_like(measured)
    for i in range(measured.size):
        keep = np.arange(measured.size) != i
        out[i] = features[i] @ relative_lstsq(features[keep], measured[keep])
    return out


def fitted_points(fit: EngineFit) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """The fit's measured (prefill, decode) points less those it leaves out."""
    out = {(kind, size) for kind, size, _ in fit.left_out}
    return (
        [pt for pt in fit.prefill_points if ("prefill", pt[0]) not in out],
        [pt for pt in fit.decode_points if ("decode", pt[0]) not in out],
    )


def refit(fit: EngineFit) -> dict[str, list[float]]:
    """`fit_points` on the fit's own measured points (those it does not leave out)."""
    prefill, decode = fitted_points(fit)
    return fit_points(prefill, decode, fit.large_batch)


def point_errors(fit: EngineFit) -> list[PointError]:
    """Every fitted measured point of `fit` against the step time the fit charges (per-step terms
    included), with its leave-one-out value. A decode point's rows sit at `fit.decode_context` cached tokens
    each."""
    errors: list[PointError] = []
    prefill, decode = fitted_points(fit)
    pre = np.array(prefill, dtype=np.float64)
    if pre.size:
        held = _held_out(_prefill_features(pre[:, 0]), pre[:, 1])
        for (size, ms), h in zip(pre, held, strict=True):
            fitted = fit_ms(fit, size, size * size, 0.0, 0, 0.0, size)
            errors.append(PointError("prefill", int(size), float(ms), fitted, float(h)))
    dec = np.array(decode, dtype=np.float64)
    for part in (dec[dec[:, 0] < fit.large_batch], dec[dec[:, 0] >= fit.large_batch]) if dec.size else ():
        held = _held_out(_decode_features(part[:, 0]), part[:, 1])
        for (rows, ms), h in zip(part, held, strict=True):
            ctx = rows * (fit.decode_context + 1)
            fitted = fit_ms(fit, 0.0, 0.0, 0.0, int(rows), ctx, ctx)
            errors.append(PointError("decode", int(rows), float(ms), fitted, float(h)))
    return errors
