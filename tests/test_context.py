"""One definition of a step row for every policy (`StepPlan`): `new_tokens` on `context` cached tokens.

The expectation is vLLM's: after a P-token prompt, the first decode computes 1 token on P computed ones, and
a request with `n > 1` runs as `n` child sequences, each prefilling its own copy of the prompt and decoding
as its own row with its own KV.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.policies import ContinuousConfig, StaticConfig, VllmConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.cost.roofline import CostModel
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.base import Scheduler
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.static import StaticScheduler
from sim.engine.schedulers.vllm.scheduler import VllmScheduler

MEMORY = KvBudget(num_blocks=4_000, block_size=16, max_model_len=4096)
POLICIES = ("static", "continuous", "vllm")


def _scheduler(policy: str) -> Scheduler:
    if policy == "static":
        return StaticScheduler(StaticConfig(), MEMORY)
    if policy == "continuous":
        return ContinuousScheduler(ContinuousConfig(), MEMORY)
    return VllmScheduler(VllmConfig(async_scheduling=False), MEMORY)  # `continuous` sees arrivals at once


def _rows_per_step(policy: str, requests: list[Request]) -> tuple[list[list[tuple[int, int]]], pl.DataFrame]:
    """Each step's rows as sorted (new_tokens, context) pairs, and the step records."""
    seen: list[list[tuple[int, int]]] = []

    def step_time(new_tokens: np.ndarray, context: np.ndarray) -> tuple[float, bool]:
        seen.append(sorted(zip(new_tokens.tolist(), context.tolist(), strict=True)))
        return 0.01, False

    out = simulate(
        _scheduler(policy), step_time, Horizon(max_requests=len(requests)), open_loop=iter(requests)
    )
    return seen, out.recorder.steps_frame()


@pytest.mark.parametrize("policy", POLICIES)
def test_first_decode_after_a_16_token_prompt_is_one_token_on_16(policy: str) -> None:
    rows, _ = _rows_per_step(policy, [Request(0, 0.0, 16, 8, 4)])
    assert rows == [[(16, 0)], [(1, 16)], [(1, 17)], [(1, 18)]]


@pytest.mark.parametrize("policy", POLICIES)
def test_n_sequences_each_prefill_and_decode_their_own_copy(policy: str) -> None:
    rows, steps = _rows_per_step(policy, [Request(0, 0.0, 16, 8, 4, n=3)])
    assert rows == [[(16, 0)] * 3, [(1, 16)] * 3, [(1, 17)] * 3, [(1, 18)] * 3]
    assert steps["prefill_tokens"].to_list() == [48, 0, 0, 0]
    assert steps["decode_tokens"].to_list() == [0, 3, 3, 3]
    assert steps["batch_size"].to_list() == [3, 3, 3, 3]
    # Token states in the cache once each step is done: 3 copies of 16, then one more per sequence and step.
    assert steps["kv_used"].to_list() == [48, 51, 54, 57]
    if policy != "vllm":  # reservations: 3 sequences x (prompt + max_tokens)
        assert steps["kv_allocated"].to_list() == [3 * (16 + 8)] * 4


def _stream(n: int, seed: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.08, n))
    return [
        Request(
            i, float(t), int(rng.integers(4, 300)), 200, int(rng.integers(1, 200)), int(rng.choice([1, 2, 3]))
        )
        for i, t in enumerate(times)
    ]


def test_continuous_runs_n_sequences_as_the_vllm_policy_does() -> None:
    """With room for everything (no token budget or memory limit binds), the `continuous` and `vllm`
    policies schedule the same rows, so a real cost model gives the same steps and latencies."""
    cost = CostModel(load_model("llama-2-7b"), get_gpu("A100-80GB"))
    frames = {}
    for policy in ("continuous", "vllm"):
        reqs = _stream(300, seed=4)
        out = simulate(
            _scheduler(policy), cost.step_time, Horizon(max_requests=len(reqs)), open_loop=iter(reqs)
        )
        frames[policy] = (out.recorder.steps_frame(), out.recorder.requests_frame())
    (cont_steps, cont_req), (vllm_steps, vllm_req) = frames["continuous"], frames["vllm"]
    assert cont_steps["batch_size"].max() > 10 and (cont_steps["prefill_tokens"] > 0).sum() > 100
    columns = [
        "start",
        "duration",
        "batch_size",
        "prefill_tokens",
        "decode_tokens",
        "kv_used",
        "compute_bound",
    ]
    assert_frame_equal(cont_steps.select(columns), vllm_steps.select(columns))
    columns = ["id", "scheduled_at", "first_token_at", "finished_at", "generated_tokens", "itl_mean"]
    assert_frame_equal(cont_req.select(columns), vllm_req.select(columns))


def test_max_num_seqs_counts_sequences() -> None:
    """max_num_seqs = 4: requests of 3 and 2 sequences cannot run together; one of 5 runs alone."""
    reqs = [Request(0, 0.0, 16, 8, 4, n=3), Request(1, 0.0, 16, 8, 4, n=2), Request(2, 0.0, 16, 8, 2, n=5)]
    sched = ContinuousScheduler(ContinuousConfig(max_num_seqs=4), MEMORY)
    out = simulate(sched, lambda c, q: (0.01, False), Horizon(max_requests=3), open_loop=iter(reqs))
    frame = out.recorder.requests_frame()
    assert frame["scheduled_at"].to_list() == pytest.approx([0.0, 0.04, 0.08])
    assert out.recorder.steps_frame()["batch_size"].to_list() == [3] * 4 + [2] * 4 + [5] * 2
