"""Asynchronous scheduling (vLLM's default since 0.14): step k+1 is formed while step k runs, so a request
that arrives during step k is first scheduled in step k+2; an idle engine schedules an arrival at once."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from sim.config.policies import VllmConfig
from sim.config.speculative import SpeculativeConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.vllm.scheduler import VllmScheduler

STEP_S = 1.0


def _constant_step(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
    return STEP_S, False


def _run(requests: list[Request], async_scheduling: bool) -> dict[int, Request]:
    sched = VllmScheduler(VllmConfig(async_scheduling=async_scheduling), KvBudget(1000, 16, 4096), fast=True)
    simulate(sched, _constant_step, Horizon(max_requests=len(requests)), open_loop=iter(requests))
    return {r.id: r for r in requests}


def test_an_arrival_during_a_step_waits_for_the_step_after_the_next() -> None:
    """Request 0 runs steps [0, 1), [1, 2), ...; request 1 arrives at 1.5, during step [1, 2). Step [2, 3)
    was formed at 1.0, before it came: it is first scheduled in step [3, 4) and its first token (a one-step
    prefill) comes at 4.0; synchronously it would be scheduled at 2.0 with its first token at 3.0."""
    asynchronous = _run([Request(0, 0.0, 16, 10, 10), Request(1, 1.5, 16, 3, 3)], async_scheduling=True)
    assert asynchronous[1].scheduled_at == 3.0 and asynchronous[1].first_token_at == 4.0
    synchronous = _run([Request(0, 0.0, 16, 10, 10), Request(1, 1.5, 16, 3, 3)], async_scheduling=False)
    assert synchronous[1].scheduled_at == 2.0 and synchronous[1].first_token_at == 3.0
    # The running request is not held back: one token a step either way.
    assert asynchronous[0].first_token_at == synchronous[0].first_token_at == 1.0
    assert asynchronous[0].finished_at == synchronous[0].finished_at == 10.0


def test_an_idle_engine_schedules_an_arrival_at_once() -> None:
    reqs = _run([Request(0, 0.0, 16, 2, 2), Request(1, 7.25, 16, 2, 2)], async_scheduling=True)
    assert reqs[0].scheduled_at == 0.0 and reqs[0].finished_at == 2.0
    assert reqs[1].scheduled_at == 7.25 and reqs[1].first_token_at == 8.25


def test_an_arrival_during_the_last_step_of_the_running_ones_is_scheduled_when_it_ends() -> None:
    """The step formed at 1.0 had nothing to run (request 0 ends in step [1, 2)), so vLLM forms it again when
    step [1, 2) ends, and the request that arrived at 1.5 runs at 2.0: it is never held past an empty step."""
    reqs = _run([Request(0, 0.0, 16, 2, 2), Request(1, 1.5, 16, 2, 2)], async_scheduling=True)
    assert reqs[0].finished_at == 2.0
    assert reqs[1].scheduled_at == 2.0 and reqs[1].first_token_at == 3.0


def test_held_arrivals_count_as_waiting() -> None:
    sched = VllmScheduler(VllmConfig(), KvBudget(1000, 16, 4096))
    sched.add(Request(0, 0.0, 16, 5, 5), 0.0)
    plan = sched.schedule(0.0)
    assert plan is not None
    sched.add(Request(1, 0.5, 16, 5, 5, n=2), 0.5)
    assert sched.num_waiting == 2 and {r.id for r in sched.in_flight()} == {0, 1}
    sched.update(plan, 1.0)
    plan = sched.schedule(1.0)  # formed at 0.0: request 1 not yet seen
    assert plan is not None and plan.batch_size == 1 and sched.num_waiting == 2
    sched.update(plan, 2.0)
    plan = sched.schedule(2.0)
    assert plan is not None and plan.batch_size == 3 and sched.num_waiting == 0


def test_on_by_default_and_off_with_draft_or_ngram_speculation_as_in_vllm() -> None:
    assert VllmConfig().async_scheduling
    eagle = SpeculativeConfig(method="eagle", num_speculative_tokens=3, head_layers=1, acceptance_rate=0.7)
    assert VllmConfig(speculative=eagle).async_scheduling
    ngram = SpeculativeConfig(method="ngram", num_speculative_tokens=3, acceptance_rate=0.7)
    assert not VllmConfig(speculative=ngram).async_scheduling
    with pytest.raises(ValidationError, match="async_scheduling: vLLM schedules asynchronously only"):
        VllmConfig(speculative=ngram, async_scheduling=True)
