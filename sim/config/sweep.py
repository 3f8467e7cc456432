"""The `[sweep]` table: the rates and parameters `sim sweep` runs, replications, the capacity search."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.config.capacity import CapacityConfig
from sim.config.validation import format_validation_error
from sim.io.errors import SimError


class RateRange(BaseModel):
    """`{start, stop, num}` (evenly spaced, both ends included) or `{start, stop, step}`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    start: float = Field(gt=0)
    stop: float = Field(gt=0)
    num: int | None = Field(None, ge=1)
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_spacing(self) -> RateRange:
        if (self.num is None) == (self.step is None):
            raise ValueError("give exactly one of num and step")
        if self.stop < self.start:
            raise ValueError(f"stop ({self.stop:g}) is below start ({self.start:g})")
        return self

    def values(self) -> list[float]:
        if self.num is not None:
            return [float(x) for x in np.linspace(self.start, self.stop, self.num)]
        assert self.step is not None
        count = math.floor((self.stop - self.start) / self.step + 1e-9) + 1
        return [round(self.start + i * self.step, 12) for i in range(count)]


class SweepConfig(BaseModel):
    """The `[sweep]` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    rates: list[float] | RateRange | None = None
    policies: list[str] | None = Field(None, min_length=1)
    replications: int = Field(1, ge=1, le=1000)
    params: dict[str, list[Any]] = Field(default_factory=dict)
    capacity_steps: int = Field(3, ge=0, le=30, description="Bisection runs per policy (--find-capacity).")
    capacity: CapacityConfig | None = Field(
        None, description="The rule --find-capacity judges by (sim/config/capacity.py); default: [slo]."
    )
    variants: list[dict[str, Any]] = Field(
        default_factory=list, description="Sets of dotted keys set together; one more grid axis."
    )

    def rate_values(self) -> list[float | None]:
        if self.rates is None:
            return [None]
        values = self.rates.values() if isinstance(self.rates, RateRange) else [float(r) for r in self.rates]
        return sorted(set(values))

    def param_grid(self) -> list[dict[str, Any]]:
        keys = sorted(self.params)
        grid = [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.params[k] for k in keys))
        ]
        if self.variants:  # each variant's keys over each params point
            grid = [{**point, **variant} for point in grid for variant in self.variants]
        return grid


def parse_sweep(raw: dict[str, Any] | None, source: str) -> SweepConfig:
    try:
        cfg = SweepConfig.model_validate(raw or {})
    except ValidationError as err:
        raise SimError(format_validation_error(err, raw or {}, source, root="sweep")) from None
    if isinstance(cfg.rates, list) and (not cfg.rates or any(r <= 0 for r in cfg.rates)):
        raise SimError(f"{source}: sweep.rates: give positive rates (got {cfg.rates})")
    for key, values in cfg.params.items():
        if not values:
            raise SimError(f"{source}: sweep.params.{key}: give at least one value")
        if key == "sweep" or key.startswith("sweep."):
            raise SimError(f"{source}: sweep.params.{key}: the sweep cannot sweep itself")
    for i, variant in enumerate(cfg.variants):
        clash = sorted(k for k in variant if k in cfg.params or k == "sweep" or k.startswith("sweep."))
        if not variant or clash:
            what = (
                f"{clash[0]} is a sweep.params key or the sweep itself" if clash else "give at least one key"
            )
            raise SimError(f"{source}: sweep.variants[{i}]: {what}")
    return cfg
