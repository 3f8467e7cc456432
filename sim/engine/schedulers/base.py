"""The contract between the engine and a scheduling policy (the step it plans: `sim.core.step.StepPlan`).

A scheduler is a pure state machine, as in vLLM's v1 scheduler: it never sees SimPy.
The engine loop is::

    plan = scheduler.schedule(now)            # None: nothing runnable
    now += cost_model.step_time(plan.new_tokens, plan.context)
    finished = scheduler.update(plan, now)    # tokens emitted at `now`, requests finished

A request arrives through `add`, which may reject it (the reason is stored on the request).

Under pipeline parallelism (sim/engine/pipeline.py) the engine may `schedule` again before the earlier plans
are `update`d, up to `pp` plans in flight, if the policy says it can: `pipeline(in_flight) -> bool`, called
before any request, True when its `schedule` passes over rows in flight (the vllm policy's). A policy without
it runs one plan at a time.
"""

from __future__ import annotations

from typing import Protocol

from sim.core.request import Request
from sim.core.step import StepPlan


class Scheduler(Protocol):
    """What every policy implements."""

    def add(self, request: Request, now: float) -> bool:
        """Queue an arriving request. Return False (and set `request.reject_reason`) to reject it."""
        ...

    def schedule(self, now: float) -> StepPlan | None:
        """Decide the next step, or None when nothing can run now."""
        ...

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        """Apply a finished step at time `now`: emit tokens, free memory; return requests that finished."""
        ...

    def wake_at(self, now: float) -> float | None:
        """When idle: a time at which `schedule` may have work without a new arrival (a batch timeout)."""
        ...

    def in_flight(self) -> list[Request]:
        """Requests admitted or queued but not finished (read at the horizon)."""
        ...

    @property
    def num_waiting(self) -> int:
        """Requests (or sequences) queued and not running: admission control and the step records."""
        ...
