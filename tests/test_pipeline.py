"""Pipeline parallelism in the engine (sim/engine/pipeline.py): up to `pp` batches in flight, end to end.

The theory (issue: "PP with one batch in flight costs the sum of its stages. With `pp` batches in flight, its
throughput is within 2% of 1 / (slowest stage)"), and the bubbles when fewer batches than stages can run, each
measured on a replica run by the engine over the vllm policy and a placement's stage costs; and vLLM 0.6's
virtual engines (sim/engine/virtual_engines.py), the `vllm-v0` policy's pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.policies import VllmConfig, VllmV0Config
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.cost.parallel import ParallelCost
from sim.cost.placement import Placement
from sim.cost.roofline import CostModel
from sim.engine.replica import Horizon, simulate
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.engine.schedulers.vllm_v0 import VllmV0Scheduler
from sim.engine.virtual_engines import VirtualEngines, engine_budgets

ROOT = Path(__file__).resolve().parents[1]
H100 = get_gpu("H100-SXM")
MODEL = load_model("llama-3.1-70b")


class LoggedCost(ParallelCost):
    """A placement's cost that keeps each batch's stage times, in the order the batches were scheduled."""

    def __init__(self, pp: int) -> None:
        super().__init__(CostModel(MODEL, H100, 4), MODEL, H100, Placement(tp=4, pp=pp))
        self.log: list[tuple[list[float], float, bool]] = []

    def stage_seconds(
        self, new_tokens: Any, context: Any, ranks: Any = None
    ) -> tuple[list[float], float, bool]:
        got = super().stage_seconds(new_tokens, context, ranks)
        self.log.append(got)
        return got


def run(pp: int, requests: int, budget: int) -> tuple[LoggedCost, Any]:
    """`requests` requests of 16 prompt and 200 output tokens, all at t = 0, on one replica at tp 4 x pp."""
    cost = LoggedCost(pp)
    sched = VllmScheduler(VllmConfig(max_num_batched_tokens=budget, max_num_seqs=1024),
                          KvBudget(20_000, 16, 4096), fast=True)  # fmt: skip
    reqs = [Request(i, 0.0, 16, 200, 200) for i in range(requests)]
    res = simulate(sched, cost.step_time, Horizon(drain=True), open_loop=iter(reqs))
    return cost, res


def in_flight(steps: pl.DataFrame) -> int:
    """The most batches in flight at once (a batch: from its scheduling to leaving the last stage)."""
    start, end = steps["start"].to_numpy(), (steps["start"] + steps["duration"]).to_numpy()
    return int(max(np.sum((start <= t) & (end > t)) for t in start))


@pytest.mark.parametrize("pp", [2, 4])
def test_one_batch_costs_its_stages_and_pp_batches_reach_the_slowest_stage(pp: int) -> None:
    # One request: one batch in flight; each step costs the sum of its stages and the pp - 1 sends.
    cost, res = run(pp, 1, 32)
    steps = res.recorder.steps_frame()
    assert len(steps) == 200 == len(cost.log) and in_flight(steps) == 1
    sums = [sum(stages) + (pp - 1) * send for stages, send, _ in cost.log]
    assert steps["duration"].to_list() == pytest.approx(sums, rel=1e-12)

    # Saturated: 128 requests, 32 tokens a batch, so far more than pp batches can run: pp in flight, and
    # batches leave the last stage at the rate of the slowest stage (the middle half of the run).
    cost, res = run(pp, 128, 32)
    steps = res.recorder.steps_frame()
    assert in_flight(steps) == pp
    assert res.recorder.requests_frame()["generated_tokens"].to_list() == [200] * 128
    ends = (steps["start"] + steps["duration"]).to_numpy()
    i, j = len(ends) // 4, 3 * len(ends) // 4
    measured = (j - i) / (ends[j] - ends[i])
    window = cost.log[i + 1 : j + 1]
    slowest = float(np.mean([max(stages) for stages, _, _ in window]))
    assert measured == pytest.approx(1 / slowest, rel=0.02)
    # equal stages: pp times what the same batches would give one at a time
    one = 1 / float(np.mean([sum(stages) + (pp - 1) * send for stages, send, _ in window]))
    assert measured == pytest.approx(pp * one, rel=0.02)


def test_fewer_runnable_batches_than_stages_leave_bubbles() -> None:
    """pp = 4 with two requests: each batch holds one (the other's token is in flight), two batches run at
    once, and the stages idle half the time: two batches per sum of stages, half of 1 / slowest stage."""
    cost, res = run(4, 2, 16)
    steps = res.recorder.steps_frame()
    assert steps["batch_size"].to_list() == [1] * 400 and in_flight(steps) == 2
    tail = cost.log[4:]  # after the first batches (the second waited for stage 0 behind the first)
    sums = [sum(stages) + 3 * send for stages, send, _ in tail]
    assert steps["duration"].to_list()[4:] == pytest.approx(sums, rel=1e-12)
    ends = (steps["start"] + steps["duration"]).to_numpy()
    rate = (398 - 4) / (ends[398] - ends[4])  # whole cycles: as many batches of each request
    assert rate == pytest.approx(2 / float(np.mean(sums)), rel=1e-3)
    slowest = float(np.mean([max(stages) for stages, _, _ in tail]))
    assert rate == pytest.approx(0.5 / slowest, rel=0.01)


def test_a_row_in_flight_is_not_scheduled_again() -> None:
    """vLLM's rule: a sequence whose scheduled tokens are all in flight has none to schedule; a prompt's next
    chunk may follow its previous one into the next batch."""
    sched = VllmScheduler(VllmConfig(max_num_batched_tokens=64), KvBudget(1000, 16, 4096), fast=True)
    assert sched.pipeline(2) and not sched.fast
    long, short = Request(0, 0.0, 100, 4, 4), Request(1, 0.0, 8, 4, 4)
    sched.add(long, 0.0)
    sched.add(short, 0.0)
    first = sched.schedule(0.0)
    assert first is not None and first.new_tokens.tolist() == [64]  # the long prompt's first chunk
    second = sched.schedule(0.0)
    assert second is not None and second.new_tokens.tolist() == [36, 8]  # its next chunk, then the short one
    assert sched.schedule(0.0) is None  # both prompts wholly in flight
    sched.update(first, 1.0)
    assert sched.schedule(1.0) is None  # the long prompt's last chunk is still in flight
    sched.update(second, 2.0)
    third = sched.schedule(2.0)
    assert third is not None and third.new_tokens.tolist() == [1, 1]  # both decode


def test_a_sequence_preempted_in_flight_keeps_its_token_and_may_end_in_the_queue() -> None:
    """As vLLM's `update_from_output`: a batch's token is appended to a request preempted while the batch
    was in flight, and a request that so ends leaves the waiting queue (two usable KV blocks of 16 slots)."""
    config = VllmConfig(max_num_batched_tokens=64, async_scheduling=False)
    sched = VllmScheduler(config, KvBudget(3, 16, 64), fast=True)
    assert sched.pipeline(2)
    a, b = Request(0, 0.0, 16, 3, 3), Request(1, 0.0, 15, 1, 1)
    sched.add(a, 0.0)
    p0 = sched.schedule(0.0)  # a's prompt: one block
    sched.add(b, 0.0)
    p1 = sched.schedule(0.0)  # b's prompt (its one output token): the other block
    assert p0 is not None and p1 is not None and p1.new_tokens.tolist() == [15]
    assert sched.update(p0, 1.0) == []
    p2 = sched.schedule(1.0)  # a's first decode needs a block: b, in flight, is preempted
    assert p2 is not None and p2.preempted == 1 and sched.num_waiting == 1
    assert sched.update(p1, 2.0) == [b] and b.num_generated == 1 and sched.num_waiting == 0
    assert sched.update(p2, 3.0) == []
    now = 3.0
    while (plan := sched.schedule(now)) is not None:
        now += 1.0
        sched.update(plan, now)
    assert a.num_generated == 3 and sched.in_flight() == [] and sched.kv.allocated == 0


def test_a_pp_group_runs_batches_in_flight_end_to_end(tmp_path: Path) -> None:
    """`sim run` with a `[[cluster.groups]]` placed at tp 4 x pp 2: its steps overlap (two in flight)."""
    sets = ["model.name='llama-3.1-70b'", "model.gpu='H100-SXM'", "horizon.duration_s=20",
            "workload.arrival={kind='poisson', rate=4.0}", "cluster.groups=[{tp=4, pp=2}]"]  # fmt: skip
    args = ["run", str(ROOT / "scenarios" / "rag-chatbot.toml"), "--policy", "vllm", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args + [a for s in sets for a in ("--set", s)])
    assert res.exit_code == 0, res.output
    files = sorted(tmp_path.rglob("steps*.parquet"))
    assert files, sorted(p.name for p in tmp_path.rglob("*"))
    steps = pl.read_parquet(files[0])
    assert in_flight(steps) == 2


def engines(pp: int, blocks: int = 1001, max_num_seqs: int = 256) -> VirtualEngines:
    budgets = engine_budgets(KvBudget(blocks, 16, 4096), pp)
    config = VllmV0Config(max_num_seqs=max_num_seqs, max_num_batched_tokens=4096)
    return VirtualEngines([VllmV0Scheduler(config, b) for b in budgets], budgets)


def test_each_virtual_engine_takes_its_share_of_blocks_and_the_least_loaded_arrival() -> None:
    ves = engines(2)
    assert [e.num_blocks for e in ves.engines] == [500, 500]  # vLLM's num_gpu_blocks // pp
    assert ves.pipeline(2) and not ves.pipeline(3)
    reqs = [Request(i, 0.0, 32, 4, 4) for i in range(5)]
    for r in reqs:
        assert ves.add(r, 0.0)
    assert ves.engine_of == {0: 0, 1: 1, 2: 0, 3: 1, 4: 0} and ves.num_waiting == 5
    first = ves.schedule(0.0)  # engine 0's prompts alone
    second = ves.schedule(0.0)  # engine 1's
    assert first is not None and second is not None and ves.schedule(0.0) is None  # one batch each
    assert [s.req.id for s in first.payload.prefill] == [0, 2, 4]
    assert [s.req.id for s in second.payload.prefill] == [1, 3]
    assert first.kv.capacity == 1000 * 16 and first.kv.allocated == 3 * 2 * 16  # the replica's KV
    assert second.kv.allocated == 5 * 2 * 16
    assert ves.update(second, 1.0) == []
    third = ves.schedule(1.0)  # engine 1 again (engine 0's batch is still in flight): its decodes
    assert third is not None and [s.req.id for s in third.payload.decode] == [1, 3]
    assert ves.schedule(1.0) is None


def test_a_request_finishing_frees_its_own_engine() -> None:
    ves = engines(2)
    short, long = Request(0, 0.0, 16, 1, 1), Request(1, 0.0, 16, 3, 3)
    ves.add(short, 0.0)
    ves.add(long, 0.0)
    a, b = ves.schedule(0.0), ves.schedule(0.0)
    assert a is not None and b is not None
    assert ves.update(a, 1.0) == [short] and ves.unfinished == [0, 1]
    assert ves.schedule(1.0) is None  # engine 0 has nobody left, engine 1's batch is in flight
    late = Request(2, 1.0, 16, 2, 2)
    ves.add(late, 1.0)  # the engine with fewer unfinished requests
    assert ves.engine_of[2] == 0
    plan = ves.schedule(1.0)
    assert plan is not None and [s.req.id for s in plan.payload.prefill] == [2]


def test_virtual_engines_keep_pp_batches_in_flight_and_finish_every_request() -> None:
    pp = 2
    cost = ParallelCost(CostModel(MODEL, H100, 4), MODEL, H100, Placement(tp=4, pp=pp))
    ves = engines(pp, blocks=20_000)
    reqs = [Request(i, 0.0, 16, 50, 50) for i in range(8)]
    res = simulate(ves, cost.step_time, Horizon(drain=True), open_loop=iter(reqs))
    steps = res.recorder.steps_frame()
    assert in_flight(steps) == pp
    # each engine: one prefill-only step of its four prompts, then its four decode together
    assert steps["batch_size"].to_list() == [4] * (2 * 50)
    assert steps["prefill_tokens"].to_list()[:2] == [64, 64]
    assert res.recorder.requests_frame()["generated_tokens"].to_list() == [50] * 8
    # one batch at a time would take the sum of both engines' steps; in flight, about half
    total = float((steps["start"] + steps["duration"]).max())
    assert total < 0.6 * float(steps["duration"].sum())
    assert np.all(steps["kv_capacity"].to_numpy() == 2 * 10_000 * 16)


def test_a_vllm_v0_pp_group_runs_its_virtual_engines_end_to_end(tmp_path: Path) -> None:
    """`sim run` with the `vllm-v0` policy on a tp 4 x pp 2 group: batches of two virtual engines overlap."""
    scenario = tmp_path / "v0.toml"
    scenario.write_text(
        (ROOT / "scenarios" / "rag-chatbot.toml").read_text() + '\n[policies.v0]\nscheduler = "vllm-v0"\n'
    )
    sets = ["model.name='llama-3.1-70b'", "model.gpu='H100-SXM'", "horizon.duration_s=20",
            "workload.arrival={kind='poisson', rate=4.0}", "cluster.groups=[{tp=4, pp=2}]"]  # fmt: skip
    args = ["run", str(scenario), "--policy", "v0", "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(app, args + [a for s in sets for a in ("--set", s)])
    assert res.exit_code == 0, res.output
    files = sorted((tmp_path / "out").rglob("steps*.parquet"))
    assert files, sorted(p.name for p in tmp_path.rglob("*"))
    assert in_flight(pl.read_parquet(files[0])) == 2
