"""A published comparison's cells (`scenarios/papers/*.paper.toml`): what the paper reports, and how close the
simulator must come. `sim papers` (sim/studies/papers.py) runs the scenario each file names and judges them.

    scenario = "vllm-fig12.toml"       # beside this file: its [sweep] and [sweep.capacity] give the figures
    paper = "Kwon et al., SOSP'23"
    [[cells]]
    name = "vLLM / Orca (Oracle), capacity"
    figure = "capacity_ratio"          # or capacity_order, batch_size, batch_ratio, speedup, attainment,
                                       # throughput, throughput_ratio
    policies = ["vllm", "orca-oracle"] # numerator, denominator (capacity_order: lowest first)
    # speedup: the first policy's latency over the second's at `rate` (policies = [baseline, faster]),
    # the latency being `metric`'s `stat` (e2e p50 by default); attainment: one policy's share of finished
    # requests within every [slo] bound at `rate`; throughput: one policy's finished requests per second at
    # `rate` (a fixed offered rate, tail included), throughput_ratio: the first's over the second's
    params = { "workload.lora.adapters" = 2000 }   # the sweep point a figure at one rate is read at
    base_params = { "workload.lora.adapters" = 5 } # throughput_ratio: the second's point (default: params)
    low = 1.7                          # the paper's value, or its range low..high
    high = 2.7
    tolerance = 0.25                   # the simulated value may be this share outside low..high
    source = "§6.2, text"              # where the paper states it (an image: say so and how it was read)
    known_gap = "..."                  # set when the cell is known to miss, with the reason (docs/papers.md)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.config.capacity import Metric, Stat
from sim.config.scenario import read_toml
from sim.config.validation import format_validation_error
from sim.io.errors import SimError

Figure = Literal[
    "capacity_order", "capacity_ratio", "batch_size", "batch_ratio", "speedup", "attainment", "throughput",
    "throughput_ratio",
]  # fmt: skip
RATE_FIGURES = ("batch_size", "batch_ratio", "speedup", "attainment", "throughput", "throughput_ratio")
SINGLE = ("batch_size", "attainment", "throughput")  # one policy's figure
Param = int | float | str | bool


class Cell(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    figure: Figure
    policies: list[str] = Field(min_length=1)
    low: float | None = Field(None, gt=0)
    high: float | None = Field(None, gt=0)
    rate: float | None = Field(None, gt=0, description="The sweep rate a batch or speedup figure is read at.")
    metric: Metric = Field("e2e", description="speedup: the latency compared.")
    stat: Stat = Field("p50", description="speedup: the statistic of `metric` compared.")
    params: dict[str, Param] = Field(
        default_factory=dict, description="The sweep.params values of the point a figure is read at."
    )
    base_params: dict[str, Param] | None = Field(
        None, description="throughput_ratio: the second policy's point (default: params)."
    )
    tolerance: float = Field(0.25, ge=0)
    source: str
    known_gap: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> Cell:
        wanted = None if self.figure == "capacity_order" else 1 if self.figure in SINGLE else 2
        if wanted is not None and len(self.policies) != wanted:
            raise ValueError(f"policies: {self.figure} takes {wanted} (got {len(self.policies)})")
        if self.figure == "capacity_order":
            if len(self.policies) < 2:
                raise ValueError("policies: give at least two, lowest capacity first")
        elif self.low is None:
            raise ValueError(f"low: {self.figure} needs the paper's value")
        if self.high is not None and self.low is not None and self.high < self.low:
            raise ValueError(f"high ({self.high:g}) is below low ({self.low:g})")
        if self.figure in RATE_FIGURES and self.rate is None:
            raise ValueError(f"rate: {self.figure} is read at one sweep rate")
        if self.base_params is not None and self.figure != "throughput_ratio":
            raise ValueError("base_params: only a throughput_ratio compares two sweep points")
        return self


class PaperFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    scenario: str
    paper: str
    cells: list[Cell] = Field(min_length=1)

    def needs_capacity(self) -> bool:
        """Whether a cell reads capacities (then the sweep runs `--find-capacity`)."""
        return any(c.figure.startswith("capacity") for c in self.cells)


def load_paper(path: Path) -> PaperFile:
    raw: dict[str, Any] = read_toml(path)
    try:
        return PaperFile.model_validate(raw)
    except ValidationError as err:
        raise SimError(format_validation_error(err, raw, str(path), root="paper")) from None
