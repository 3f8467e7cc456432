"""Distributions for token lengths and think times: the pydantic config of each kind.

Each kind is one config class (a `kind` literal tag) listed in `DISTRIBUTIONS`, and one sampler factory in
`sim.workload.lengths.SAMPLERS` under the same tag.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.io.limits import MAX_TOKENS
from sim.io.tables import read_column

# Coefficients of variation a distribution (or arrival process) may have: below MIN_CV the gamma shape
# 1 / cv^2 overflows, above MAX_CV nearly every draw is zero.
MIN_CV = 1e-3
MAX_CV = 100.0


class Distribution(BaseModel):
    """Fields shared by every distribution: optional clamps applied after sampling."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    min: float | None = Field(None, ge=0, le=MAX_TOKENS, description="lower clamp (lengths: at least 1)")
    max: float | None = Field(None, ge=0, le=MAX_TOKENS, description="upper clamp")

    @model_validator(mode="after")
    def _min_le_max(self) -> Distribution:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) must be <= max ({self.max:g})")
        return self


class FixedDist(Distribution):
    """Always `value`."""

    kind: Literal["fixed"] = "fixed"
    value: float = Field(ge=0, le=MAX_TOKENS)


class UniformDist(Distribution):
    """Uniform on [low, high] (lengths round to the nearest integer)."""

    kind: Literal["uniform"] = "uniform"
    low: float = Field(ge=0, le=MAX_TOKENS)
    high: float = Field(ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _low_le_high(self) -> UniformDist:
        if self.low > self.high:
            raise ValueError(f"low ({self.low:g}) must be <= high ({self.high:g})")
        return self


class NormalDist(Distribution):
    """Normal(mean, std), clipped at zero (and at min/max)."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(ge=0, le=MAX_TOKENS)
    std: float = Field(ge=0, le=MAX_TOKENS)


class LogNormalDist(Distribution):
    """Log-normal given by its mean and coefficient of variation (std / mean)."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    cv: float = Field(ge=MIN_CV, le=MAX_CV)


class GammaDist(Distribution):
    """Gamma given by its mean and coefficient of variation (cv=1 is exponential)."""

    kind: Literal["gamma"] = "gamma"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    cv: float = Field(ge=MIN_CV, le=MAX_CV)


class ExponentialDist(Distribution):
    """Exponential with the given mean."""

    kind: Literal["exponential"] = "exponential"
    mean: float = Field(gt=0, le=MAX_TOKENS)


class GeometricDist(Distribution):
    """Geometric on 1, 2, 3, ... with the given mean (p = 1 / mean)."""

    kind: Literal["geometric"] = "geometric"
    mean: float = Field(ge=1, le=MAX_TOKENS)


class EmpiricalDist(Distribution):
    """Values of one CSV column (each >= 0), resampled with replacement."""

    kind: Literal["empirical"] = "empirical"
    path: str = Field(min_length=1)
    column: str = Field(min_length=1)


# The distribution kinds, by their `kind` tag.
DISTRIBUTIONS = (FixedDist, UniformDist, NormalDist, LogNormalDist, GammaDist, ExponentialDist, GeometricDist,
                 EmpiricalDist)  # fmt: skip

# The TOML shape: a table tagged by `kind`, one of the registered distributions.
DistConfig = Annotated[
    Union[DISTRIBUTIONS],  # type: ignore[valid-type]  # noqa: UP007
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
