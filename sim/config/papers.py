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

Two figures run nothing: they read the step costs a policy of the scenario pays (its model, GPU, TP and
engine), in milliseconds. `step_time`: a `phase = "prompt"` step of `batch` prompts of `prompt` tokens each,
or the mean `phase = "token"` step of `batch` sequences over the `output - 1` decode steps after such a prompt
(contexts `prompt` to `prompt + output - 2`). `request_time`: one request served alone, `prompt` tokens in and
`output` out: its `metric` is `ttft` (the prompt step), `tpot` (the mean token step, TBT) or `e2e` (TTFT plus
`output - 1` token steps). Either may name a `gpu` in place of the scenario's `model.gpu`, and an `over_gpu`:
the figure is then its ratio to the same figure on that GPU.
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
    "throughput_ratio", "step_time", "request_time",
]  # fmt: skip
RATE_FIGURES = ("batch_size", "batch_ratio", "speedup", "attainment", "throughput", "throughput_ratio")
STEP_FIGURES = ("step_time", "request_time")  # read from the step costs: no sweep
SINGLE = ("batch_size", "attainment", "throughput", *STEP_FIGURES)  # one policy's figure
REQUEST_METRICS = ("ttft", "tpot", "e2e")  # request_time's metrics
STEP_KEYS = ("phase", "prompt", "output", "gpu", "over_gpu")  # step-cost cells' keys (and batch)
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
    phase: Literal["prompt", "token"] | None = Field(None, description="step_time: which step is timed.")
    batch: int = Field(1, ge=1, le=4096, description="step_time: prompts or sequences in the step.")
    prompt: int | None = Field(None, ge=1, le=1_000_000, description="step, request: prompt tokens.")
    output: int | None = Field(None, ge=2, le=1_000_000, description="token step, request: output.")
    gpu: str | None = Field(None, description="step, request: the GPU in place of the scenario's model.gpu.")
    over_gpu: str | None = Field(None, description="step, request: over the same figure on this GPU.")
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
        if self.figure in STEP_FIGURES:
            self._step_shape()
        else:
            given = [k for k in STEP_KEYS if getattr(self, k) is not None]
            if given or self.batch != 1:
                keys = ", ".join(given + (["batch"] if self.batch != 1 else []))
                raise ValueError(f"{keys}: only {' and '.join(STEP_FIGURES)} cells read step costs")
        return self

    def _step_shape(self) -> None:
        if self.rate is not None:
            raise ValueError(f"rate: {self.figure} is read from the step costs, at no rate")
        if self.prompt is None:
            raise ValueError(f"prompt: {self.figure} needs the prompt's tokens")
        if self.figure == "step_time" and self.phase is None:
            raise ValueError('phase: step_time times a "prompt" or a "token" step')
        if (self.figure == "request_time" or self.phase == "token") and self.output is None:
            what = "request_time" if self.figure == "request_time" else "a token step"
            raise ValueError(f"output: {what} needs the output tokens (the decode steps follow from it)")
        if self.figure == "request_time":
            if self.metric not in REQUEST_METRICS:
                raise ValueError(f"metric: request_time reads one of {', '.join(REQUEST_METRICS)}")
            if self.batch != 1 or self.phase is not None:
                raise ValueError("batch, phase: request_time is one request served alone (batch 1, no phase)")


class PaperFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    scenario: str
    paper: str
    cells: list[Cell] = Field(min_length=1)

    def needs_capacity(self) -> bool:
        """Whether a cell reads capacities (then the sweep runs `--find-capacity`)."""
        return any(c.figure.startswith("capacity") for c in self.cells)

    def needs_sweep(self) -> bool:
        """Whether a cell reads the sweep (step-cost cells alone run nothing)."""
        return any(c.figure not in STEP_FIGURES for c in self.cells)


def load_paper(path: Path) -> PaperFile:
    raw: dict[str, Any] = read_toml(path)
    try:
        return PaperFile.model_validate(raw)
    except ValidationError as err:
        raise SimError(format_validation_error(err, raw, str(path), root="paper")) from None
