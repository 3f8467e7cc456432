"""The engine's step time with the sampler following each row's sampling parameters (sim/cost/sampler.py).

Installed only when a run has per-request parameters (`[workload.sampling]`, a trace's sampling columns).
Without them, a checkpoint's generation_config.json makes every row sample alike, which the cost model's
step prices itself (`CostModel.sample_as`), its fast paths included; without either the step keeps the
calibration's flat sampler term. The step's own time (the cost model's, or speculative decoding's or
LoRA's `plan_time`) charges each row `vocab x sampler_s_per_entry`; this timing replaces that term with
the batch's own stages, and, under speculative decoding, does the same at every verified draft position:
vLLM's rejection sampler applies each request's temperature, top-k and top-p at every position it verifies
(greedy requests compare argmaxes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from sim.catalog.generation import generation_defaults
from sim.core.sampling import NOT_GIVEN, SamplingParams
from sim.core.step import StepPlan
from sim.cost.roofline import CostModel
from sim.cost.sampler import BatchSampling, SamplerCost, resolve
from sim.io.errors import SimError
from sim.workload.sampling import SAMPLING_COLUMNS

SAMPLED_SCHEDULERS = ("vllm", "sarathi")


class SampledTiming:
    """`plan_time` of a step: the inner step time, its flat sampler term replaced by the rows' own."""

    def __init__(
        self,
        inner: Any,
        cost: CostModel,
        table: list[SamplingParams],
        defaults: dict[str, float],
        drafts: Callable[[], int] | None = None,
    ) -> None:
        self.inner = inner
        self._inner_plan = getattr(inner, "plan_time", None)
        self._totals = getattr(getattr(inner, "__self__", None), "step_time_totals", None)
        self.cost = cost
        self.table = table  # the workload's table of parameter sets (a trace adds rows as it is read)
        self.defaults = defaults
        self._resolved: dict[int, SamplingParams] = {}  # the rows this replica's requests use, as resolved
        self._default_row = resolve(NOT_GIVEN, defaults)
        cal = cost.cal
        self.sampler = SamplerCost(
            cost.model.vocab_size, cost.hbm * cal.bandwidth_eff, cal.sampler_s_per_entry
        )
        self.flat_row_s = cost.sampler_seconds(1)  # what the inner step charges a row
        self.drafts = drafts
        self.sampler_s = 0.0  # the sampler's seconds over the run, as charged

    def __call__(self, new_tokens: Any, context: Any) -> tuple[float, bool]:
        return self.inner(new_tokens, context)  # type: ignore[no-any-return]

    def _params(self, row: int) -> SamplingParams:
        if row < 0:
            return self._default_row
        got = self._resolved.get(row)
        if got is None:
            got = self._resolved[row] = resolve(self.table[row], self.defaults)
        return got

    def _rows(self, info: Any) -> Iterator[tuple[SamplingParams, int]]:
        params = self._params
        for seq, count, context in zip(info.seqs, info.counts, info.contexts, strict=True):
            yield params(seq.req.sampling), context + count
        if info.bulk:
            step = info.step
            for seq in info.sched.running:
                if seq.bulk_since >= 0:
                    yield params(seq.req.sampling), seq.bulk_ctx + step + 1

    def batch(self, plan: StepPlan) -> BatchSampling:
        """The sampler stages of a plan's rows."""
        b = BatchSampling()
        for params, tokens in self._rows(plan.payload):
            b.add(params, tokens)
        return b

    def plan_time(self, plan: StepPlan) -> tuple[float, bool]:
        if self._inner_plan is not None:
            seconds, bound = self._inner_plan(plan)
        else:
            timed = None
            if self._totals is not None and (totals := getattr(plan, "totals", None)) is not None:
                timed = self._totals(*totals)
            seconds, bound = timed if timed is not None else self.inner(plan.new_tokens, plan.context)
        b = self.batch(plan)
        sampler = self.sampler.seconds(b)
        flat = plan.batch_size * self.flat_row_s
        if self.drafts is not None and (drafted := self.drafts()):
            per_position = self.sampler.vocab * self.sampler.entry_seconds(b)
            sampler += drafted * per_position
            flat += drafted * self.flat_row_s
        self.sampler_s += sampler
        return seconds - flat + sampler, bound


def sampled_step_time(
    scenario: Any,
    workload: Any,
    cost: CostModel,
    step_time: Any,
    kind: str,
    drafts: Callable[[], int] | None,
    policy: str,
    source: str,
) -> Any:
    """`step_time` with the rows' own sampler, when the run has sampling parameters; else unchanged (and
    the checkpoint's generation defaults, if any, priced in the step: `sample_as_checkpoint`)."""
    given = per_request_sampling(scenario, workload)
    if given is None:
        sample_as_checkpoint(cost, scenario.model.name, kind, source)
        return step_time
    defaults = _defaults(scenario.model.name, source) or {}
    if kind not in SAMPLED_SCHEDULERS:
        raise SimError(
            f"{source}: policies.{policy}.scheduler: sampling parameters ({given}) are costed for the "
            f"{' and '.join(SAMPLED_SCHEDULERS)} schedulers, not {kind}"
        )
    return SampledTiming(step_time, cost, workload.sampling.table, defaults, drafts)


def per_request_sampling(scenario: Any, workload: Any) -> str | None:
    """What gives the run's requests their own sampling parameters (`workload.sampling`, else a trace's
    sampling columns), or None."""
    if scenario.workload.sampling is not None:
        return "workload.sampling"
    trace = workload.trace
    if trace is not None and any(k in trace.columns for k in SAMPLING_COLUMNS):
        return "the trace's sampling columns"
    return None


def sample_as_checkpoint(cost: CostModel, model: str, kind: str, source: str) -> None:
    """Price every row's sampler as the checkpoint's generation_config.json makes requests that set no
    parameter sample (`CostModel.sample_as`; a file that sets none leaves vLLM's own defaults), for the
    schedulers whose sampler is vLLM's; the others, and a checkpoint without one, keep the calibration's flat
    term."""
    defaults = _defaults(model, source)
    if defaults is not None and kind in SAMPLED_SCHEDULERS:
        cost.sample_as(resolve(NOT_GIVEN, defaults))


def _defaults(model: str, source: str) -> dict[str, float] | None:
    try:
        return generation_defaults(model)
    except SimError as err:
        raise SimError(f"{source}: model.name: {err}") from None
