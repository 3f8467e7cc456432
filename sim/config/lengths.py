"""Distributions for token lengths and think times: pydantic configs and numpy samplers.

Each kind is one config class (a `kind` literal tag) and one `DISTRIBUTIONS` entry mapping the tag to
its class and a factory `build(config, base_dir) -> Sampler`. A sampler draws `n` floats from a numpy
Generator; `LengthSampler` rounds them to whole tokens and clamps them to `[max(min, 1), max]`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.io.errors import SimError
from sim.io.limits import MAX_SECONDS, MAX_TOKENS
from sim.io.tables import read_column

Sampler = Callable[[np.random.Generator, int], np.ndarray]

# Coefficients of variation a distribution (or arrival process) may have: below MIN_CV the gamma shape
# 1 / cv^2 overflows, above MAX_CV nearly every draw is zero.
MIN_CV = 1e-3
MAX_CV = 100.0


class _Dist(BaseModel):
    """Fields shared by every distribution: optional clamps applied after sampling."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    min: float | None = Field(None, ge=0, le=MAX_TOKENS, description="lower clamp (lengths: at least 1)")
    max: float | None = Field(None, ge=0, le=MAX_TOKENS, description="upper clamp")

    @model_validator(mode="after")
    def _min_le_max(self) -> _Dist:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) must be <= max ({self.max:g})")
        return self


class FixedDist(_Dist):
    """Always `value`."""

    kind: Literal["fixed"] = "fixed"
    value: float = Field(ge=0, le=MAX_TOKENS)


class UniformDist(_Dist):
    """Uniform on [low, high] (lengths round to the nearest integer)."""

    kind: Literal["uniform"] = "uniform"
    low: float = Field(ge=0, le=MAX_TOKENS)
    high: float = Field(ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _low_le_high(self) -> UniformDist:
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) must be <= high ({self.high:g})")
        return self


class NormalDist(_Dist):
    """Normal(mean, std), clipped at zero (and at min/max)."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(ge=0, le=MAX_TOKENS)
    std: float = Field(ge=0, le=MAX_TOKENS)


class LogNormalDist(_Dist):
    """Log-normal given by its mean and coefficient of variation (std / mean)."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    cv: float = Field(ge=MIN_CV, le=MAX_CV)


class GammaDist(_Dist):
    """Gamma given by its mean and coefficient of variation (cv=1 is exponential)."""

    kind: Literal["gamma"] = "gamma"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    cv: float = Field(ge=MIN_CV, le=MAX_CV)


class ExponentialDist(_Dist):
    """Exponential with the given mean."""

    kind: Literal["exponential"] = "exponential"
    mean: float = Field(gt=0, le=MAX_TOKENS)


class GeometricDist(_Dist):
    """Geometric on 1, 2, 3, ... with the given mean (p = 1 / mean)."""

    kind: Literal["geometric"] = "geometric"
    mean: float = Field(ge=1, le=MAX_TOKENS)


class EmpiricalDist(_Dist):
    """Values of one CSV column (each >= 0), resampled with replacement."""

    kind: Literal["empirical"] = "empirical"
    path: str = Field(min_length=1)
    column: str = Field(min_length=1)


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


@dataclass(frozen=True, slots=True)
class DistKind:
    config: type[_Dist]
    build: Callable[[Any, Path], Sampler]


DISTRIBUTIONS: dict[str, DistKind] = {
    "fixed": DistKind(FixedDist, _fixed),
    "uniform": DistKind(UniformDist, _uniform),
    "normal": DistKind(NormalDist, _normal),
    "lognormal": DistKind(LogNormalDist, _lognormal),
    "gamma": DistKind(GammaDist, _gamma),
    "exponential": DistKind(ExponentialDist, _exponential),
    "geometric": DistKind(GeometricDist, _geometric),
    "empirical": DistKind(EmpiricalDist, _empirical),
}

# The TOML shape: a table tagged by `kind`, one of the registered distributions.
DistConfig = Annotated[
    Union[tuple(k.config for k in DISTRIBUTIONS.values())],  # type: ignore[valid-type]  # noqa: UP007
    Field(discriminator="kind"),
]


def resolve(path: str, base_dir: Path) -> Path:
    """A config path, relative to the scenario file's folder unless absolute."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir / p


def mean_of(config: Any, base_dir: Path) -> float:
    """The distribution's mean, moved into its [min, max] clamps: an estimate for sizing a run."""
    c = config
    if isinstance(c, FixedDist):
        mean = c.value
    elif isinstance(c, UniformDist):
        mean = (c.low + c.high) / 2
    elif isinstance(c, EmpiricalDist):
        mean = float(read_column(resolve(c.path, base_dir), c.column, low=0.0).mean())
    else:
        mean = c.mean
    return float(min(max(mean, c.min or 0.0), MAX_TOKENS if c.max is None else c.max))


def build_sampler(config: _Dist, base_dir: Path) -> Sampler:
    """The raw (unclamped) sampler for a distribution config."""
    return DISTRIBUTIONS[config.kind].build(config, base_dir)  # type: ignore[attr-defined]


class TimeSampler:
    """Draws non-negative floats (seconds), clamped to the config's min/max and to MAX_SECONDS."""

    def __init__(self, config: _Dist, base_dir: Path) -> None:
        self._sample = build_sampler(config, base_dir)
        self._lo = max(config.min or 0.0, 0.0)
        self._hi = MAX_SECONDS if config.max is None else min(config.max, MAX_SECONDS)

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.clip(self._sample(rng, n), self._lo, self._hi)


class LengthSampler:
    """Draws token counts: rounded to integers, clamped to [max(min, 1), max] and to MAX_TOKENS."""

    def __init__(self, config: _Dist, base_dir: Path) -> None:
        self._sample = build_sampler(config, base_dir)
        self.low = max(1, math.ceil(config.min or 1))
        self.high = MAX_TOKENS if config.max is None else min(math.floor(config.max), MAX_TOKENS)
        if self.high < self.low:
            raise SimError(f"length clamps allow no value: min {config.min}, max {config.max}")

    def __call__(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.rint(self._sample(rng, n))
        return np.clip(x, self.low, self.high).astype(np.int64)
