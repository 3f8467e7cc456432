"""Samplers of token lengths and think times: numpy draws from a validated distribution config.

A sampler draws `n` floats from a numpy Generator; `LengthSampler` rounds them to whole tokens and clamps
them to `[max(min, 1), max]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.lengths import (
    Distribution,
    EmpiricalDist,
    ExponentialDist,
    FixedDist,
    GammaDist,
    GeometricDist,
    LogNormalDist,
    NormalDist,
    UniformDist,
    resolve,
)
from sim.io.errors import SimError
from sim.io.limits import MAX_SECONDS, MAX_TOKENS
from sim.io.tables import read_column

Sampler = Callable[[np.random.Generator, int], np.ndarray]


def _fixed(c: FixedDist, _: Path) -> Sampler:
    return lambda rng, n: np.full(n, c.value)


def _uniform(c: UniformDist, _: Path) -> Sampler:
    return lambda rng, n: rng.uniform(c.low, c.high, n)


def _normal(c: NormalDist, _: Path) -> Sampler:
    return lambda rng, n: np.maximum(rng.normal(c.mean, c.std, n), 0.0)


def _lognormal(c: LogNormalDist, _: Path) -> Sampler:
    sigma = math.sqrt(math.log1p(c.cv**2))
    mu = math.log(c.mean) - sigma**2 / 2
    return lambda rng, n: rng.lognormal(mu, sigma, n)


def _gamma(c: GammaDist, _: Path) -> Sampler:
    shape = 1.0 / c.cv**2
    return lambda rng, n: rng.gamma(shape, c.mean / shape, n)


def _exponential(c: ExponentialDist, _: Path) -> Sampler:
    return lambda rng, n: rng.exponential(c.mean, n)


def _geometric(c: GeometricDist, _: Path) -> Sampler:
    return lambda rng, n: rng.geometric(1.0 / c.mean, n).astype(np.float64)


def _empirical(c: EmpiricalDist, base_dir: Path) -> Sampler:
    values = read_column(resolve(c.path, base_dir), c.column, low=0.0)
    return lambda rng, n: values[rng.integers(0, values.size, n)]


# A sampler factory `build(config, base_dir) -> Sampler` per distribution kind (`sim.config.lengths`).
SAMPLERS: dict[str, Callable[[Any, Path], Sampler]] = {
    "fixed": _fixed,
    "uniform": _uniform,
    "normal": _normal,
    "lognormal": _lognormal,
    "gamma": _gamma,
    "exponential": _exponential,
    "geometric": _geometric,
    "empirical": _empirical,
}


def build_sampler(config: Distribution, base_dir: Path) -> Sampler:
    """The raw (unclamped) sampler for a distribution config."""
    return SAMPLERS[config.kind](config, base_dir)  # type: ignore[attr-defined]


class TimeSampler:
    """Draws non-negative floats (seconds), clamped to the config's min/max and to MAX_SECONDS."""

    def __init__(self, config: Distribution, base_dir: Path) -> None:
        self._sample = build_sampler(config, base_dir)
        self._lo = max(config.min or 0.0, 0.0)
        self._hi = MAX_SECONDS if config.max is None else min(config.max, MAX_SECONDS)

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(self._sample(rng, n), self._lo, self._hi)


class LengthSampler:
    """Draws token counts: rounded to integers, clamped to [max(min, 1), max] and to MAX_TOKENS."""

    def __init__(self, config: Distribution, base_dir: Path) -> None:
        self._sample = build_sampler(config, base_dir)
        self.low = max(1, math.ceil(config.min or 1))
        self.high = MAX_TOKENS if config.max is None else min(math.floor(config.max), MAX_TOKENS)
        if self.high < self.low:
            raise SimError(f"length clamps allow no value: min {config.min}, max {config.max}")

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(self._sample(rng, n))
        return np.clip(x, self.low, self.high).astype(np.int64)
