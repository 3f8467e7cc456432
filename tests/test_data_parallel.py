"""A DP-attention replica: each rank a scheduler with its own KV blocks and limits, requests balanced over
the ranks as vLLM's front end balances them, the ranks stepping together, the step costed by rank."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.policies import VllmConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.cost.parallel import ParallelCost
from sim.cost.placement import Placement
from sim.cost.roofline import CostModel
from sim.engine.data_parallel import DataParallelRanks, RankedPlan, rank_budgets
from sim.engine.schedulers.vllm.scheduler import VllmScheduler

ROOT = Path(__file__).resolve().parent.parent


def _replica(dp: int, blocks: int, **config: object) -> DataParallelRanks:
    budgets = rank_budgets(KvBudget(blocks, 16, 1024), dp)
    vllm = VllmConfig(async_scheduling=False, **config)  # type: ignore[arg-type]
    return DataParallelRanks([VllmScheduler(vllm, b) for b in budgets], budgets)


def test_blocks_split_evenly_over_the_ranks() -> None:
    assert [b.num_blocks for b in rank_budgets(KvBudget(10, 16, 256), 4)] == [3, 3, 2, 2]


def test_arrivals_go_to_the_rank_of_least_waiting_x4_plus_running() -> None:
    dp = _replica(2, 400)
    outputs = [1, 8, 8, 8]  # the first ends with its prefill
    for i, out in enumerate(outputs):  # ranks 0, 1, then ties to the lowest: 0, 1
        assert dp.add(Request(i, 0.0, 32, out, out), 0.0)
    assert [dp.rank_of[i] for i in range(4)] == [0, 1, 0, 1]
    plan = dp.schedule(0.0)
    assert isinstance(plan, RankedPlan) and plan.rank_sizes == (2, 2)
    assert [r.id for r in dp.update(plan, 0.1)] == [0]  # rank 0 runs one, rank 1 two
    dp.add(Request(4, 0.1, 32, 8, 8), 0.1)  # scores 1 and 2: rank 0, now 4 x 1 waiting + 1 running = 5
    dp.add(Request(5, 0.1, 32, 8, 8), 0.1)  # 5 against 2: rank 1, though both hold two requests now
    assert dp.rank_of[4] == 0 and dp.rank_of[5] == 1
    assert dp.num_waiting == 2 and dp.in_system == [2, 3]


def test_each_rank_holds_its_own_kv_and_runs_its_own_max_num_seqs() -> None:
    # 2 ranks of 10 blocks (160 tokens): a 300-token prompt fits the replica's blocks, not a rank's.
    dp = _replica(2, 20, max_num_seqs=2, max_num_batched_tokens=512)
    big = Request(0, 0.0, 300, 4, 4)
    assert not dp.add(big, 0.0) and big.reject_reason
    for i in range(1, 7):
        dp.add(Request(i, 0.0, 16, 4, 4), 0.0)
    plan = dp.schedule(0.0)
    assert plan is not None and plan.rank_sizes == (2, 2)  # two a rank: max_num_seqs is each rank's
    assert plan.batch_size == 4 and plan.num_prefill_tokens == 4 * 16
    assert plan.kv.capacity == sum(r.capacity for r in dp.ranks)


def test_every_request_finishes_on_its_rank() -> None:
    dp = _replica(3, 300, max_num_seqs=4)
    rng = np.random.default_rng(1)
    outs = rng.integers(1, 20, 30)
    reqs = [Request(i, 0.0, int(rng.integers(8, 100)), int(outs[i]), int(outs[i])) for i in range(30)]
    now, done = 0.0, []
    for req in reqs:
        assert dp.add(req, now)
    while (plan := dp.schedule(now)) is not None:
        now += 0.01
        done += dp.update(plan, now)
    assert sorted(r.id for r in done) == list(range(30)) and not dp.in_flight()
    assert dp.in_system == [0, 0, 0] and not dp.rank_of


def test_the_step_waits_for_the_rank_its_rows_name() -> None:
    ds, h100 = load_model("deepseek-v3"), get_gpu("H100")
    pc = ParallelCost(CostModel(ds, h100, 1), ds, h100, Placement(dp=2, ep=2))
    c, q = np.array([1, 1, 1, 2000]), np.array([500, 500, 500, 0])
    b = pc.breakdown(c, q, ranks=(3, 1))  # rank 0 decodes three rows, rank 1 has the prompt
    assert b.rank_s == [pc.rank_base.step_time(c[:3], q[:3])[0], pc.rank_base.step_time(c[3:], q[3:])[0]]
    assert b.rank_s[1] > b.rank_s[0]
    assert sum(b.stage_s) == pytest.approx(b.rank_s[1] + ds.num_moe_layers * (b.dispatch_s + b.combine_s))
    assert pc.step_time(c, q, (3, 1))[0] == b.seconds
    assert pc.breakdown(c, q).rank_s == pc.breakdown(c, q, ranks=None).rank_s  # round robin without ranks


def test_a_dp_replica_runs_end_to_end_and_is_deterministic(tmp_path: Path) -> None:
    runner = CliRunner()
    sets = ["horizon.duration_s=4", "workload.arrival={kind='poisson', rate=3.0}"]
    outs = []
    for k in range(2):
        out = tmp_path / str(k)
        args = ["run", str(ROOT / "scenarios" / "deepseek-v3-placement.toml"), "--out", str(out)]
        res = runner.invoke(app, args + [a for s in sets for a in ("--set", s)])
        assert res.exit_code == 0, res.output
        outs.append((out / "vllm" / "requests.parquet").read_bytes())
    assert outs[0] == outs[1]
