"""Speculative decoding: acceptance, scheduling (budget, KV), cost, records and the latency crossover."""

from __future__ import annotations

import copy
import json
import math
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.config.calibration import Calibration
from sim.config.policies import VllmConfig
from sim.config.scenario import validate_scenario
from sim.config.speculative import SpeculativeConfig
from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.draft import build_drafter, kv_blocks_with_draft
from sim.cost.memory import KvBudget
from sim.cost.roofline import CostModel
from sim.engine.schedulers.registry import load_all
from sim.engine.schedulers.vllm.spec import SpeculativeScheduler
from sim.engine.speculative import Acceptance, DraftWork, SpeculativeTiming, accepted_drafts
from sim.io.errors import SimError
from sim.studies.run import run_manifest, run_policy

ROOT = Path(__file__).resolve().parents[1]

BASE: dict[str, Any] = {
    "name": "spec-test",
    "seed": 5,
    "model": {"name": "llama-3.1-8b", "gpu": "H100-SXM", "tp": 1, "max_model_len": 8192},
    "workload": {
        "arrival": {"kind": "poisson", "rate": 0.5},
        "prompt": {"kind": "fixed", "value": 64},
        "output": {"kind": "fixed", "value": 400},
        "max_tokens": 400,
    },
    "horizon": {"max_requests": 20, "drain": True},
    "policies": {"vllm": {"scheduler": "vllm"}},
}


def scenario(spec: dict[str, Any] | None = None, **workload: Any) -> Any:
    data = copy.deepcopy(BASE)
    data["workload"].update(workload)
    if spec is not None:
        data["policies"]["spec"] = {"scheduler": "vllm", "speculative": spec}
    return validate_scenario(data, "test")


def expected_tokens(alpha: float, k: int) -> float:
    """E[a + 1] with P(a = i) = alpha^i (1 - alpha) for i < k and alpha^k for i = k, summed term by term."""
    return sum((i + 1) * alpha**i * (1 - alpha) for i in range(k)) + (k + 1) * alpha**k


def variance_tokens(alpha: float, k: int) -> float:
    second = sum((i + 1) ** 2 * alpha**i * (1 - alpha) for i in range(k)) + (k + 1) ** 2 * alpha**k
    return second - expected_tokens(alpha, k) ** 2


# --- acceptance -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1.0])
def test_accepted_drafts_tail_is_alpha_to_the_i(alpha: float) -> None:
    k = 6
    u = (np.arange(20000) + 0.5) / 20000  # evenly spread uniforms: the empirical tail is exact to 1/20000
    a = np.array([accepted_drafts(float(x), alpha, k) for x in u])
    for i in range(k + 1):
        assert (a >= i).mean() == pytest.approx(alpha**i, abs=1e-4)
    assert a.max() <= k


@pytest.mark.parametrize(("alpha", "k"), [(0.5, 4), (0.8, 3), (0.9, 8), (0.3, 2)])
def test_mean_tokens_per_verification_step_matches_leviathan(alpha: float, k: int) -> None:
    sc = scenario({"method": "ngram", "num_speculative_tokens": k, "acceptance_rate": alpha})
    spec = run_policy(sc, "spec", ROOT).summary["speculative"]
    steps = spec["verification_steps"]
    assert steps > 1000
    leviathan = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens(alpha, k) == pytest.approx(leviathan)
    tolerance = 4 * math.sqrt(variance_tokens(alpha, k) / steps)  # four standard errors of the mean
    assert abs(spec["mean_tokens_per_step"] - leviathan) < tolerance
    assert spec["per_token_acceptance"] == pytest.approx(alpha, abs=0.03)


def test_beta_acceptance_has_the_given_mean_and_spread() -> None:
    cfg = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, acceptance="beta", acceptance_rate=0.6,
        acceptance_concentration=8.0,
    )  # fmt: skip
    acc = Acceptance(cfg, seed=11)
    draws = np.array([acc.alpha(i) for i in range(4000)])
    var = 0.6 * 0.4 / (8.0 + 1)  # Beta(m k, (1 - m) k) variance
    assert draws.mean() == pytest.approx(0.6, abs=4 * math.sqrt(var / draws.size))
    assert draws.var() == pytest.approx(var, rel=0.1)
    assert acc.alpha(17) == Acceptance(cfg, seed=11).alpha(17)  # drawn per request from the seed alone


def test_trace_column_sets_each_requests_acceptance(tmp_path: Path) -> None:
    rows = ["arrival_s,prompt_tokens,output_tokens,acceptance_rate"]
    rows += [f"{i * 0.5},32,120,{0.0 if i % 2 else 1.0}" for i in range(10)]
    (tmp_path / "trace.csv").write_text("\n".join(rows) + "\n")
    data = copy.deepcopy(BASE)
    data["workload"] = {"arrival": {"kind": "trace", "path": "trace.csv"}}
    data["horizon"] = {"max_requests": 10, "drain": True}
    spec = {"method": "ngram", "num_speculative_tokens": 3, "acceptance": "trace"}
    data["policies"]["spec"] = {"scheduler": "vllm", "speculative": spec}
    req = run_policy(validate_scenario(data, "test"), "spec", tmp_path).requests
    assert isinstance(req, pl.DataFrame)
    none = req.filter(pl.col("id") % 2 == 1)
    every = req.filter(pl.col("id") % 2 == 0)
    assert (none["spec_accepted_tokens"] == 0).all()  # alpha = 0: one token per step
    assert (none["spec_steps"] == 119).all()  # 120 tokens: the prefill's, then one per step
    assert (every["spec_accepted_tokens"] == every["spec_drafted_tokens"]).all()  # alpha = 1
    assert (every["spec_steps"] == math.ceil(119 / 4)).all()  # 4 tokens per step


# --- scheduling -----------------------------------------------------------------------------------------


def _spec_scheduler(
    blocks: int, budget: int, k: int, alpha: float, max_len: int = 4096
) -> SpeculativeScheduler:
    cfg = VllmConfig(
        max_num_batched_tokens=budget,
        speculative=SpeculativeConfig(method="ngram", num_speculative_tokens=k, acceptance_rate=alpha),
    )
    sched = load_all()["vllm"].build(cfg, KvBudget(blocks, 16, max_len))
    assert isinstance(sched, SpeculativeScheduler)
    sched.attach(Acceptance(cfg.speculative, seed=3))  # type: ignore[arg-type]
    return sched


def _drive(sched: SpeculativeScheduler, reqs: list[Request], check: Any) -> int:
    for r in reqs:
        assert sched.add(r, 0.0)
    now, steps = 0.0, 0
    while True:
        plan = sched.schedule(now)
        if plan is None:
            return steps
        now += 0.01
        check(plan)
        sched.update(plan, now)
        check_after = getattr(check, "after", None)
        if check_after is not None:
            check_after(sched)
        steps += 1


def test_rejected_tokens_slots_are_freed_after_each_step() -> None:
    sched = _spec_scheduler(blocks=400, budget=4096, k=7, alpha=0.6)
    reqs = [Request(i, 0.0, 30 + 7 * i, 300, 150 + 20 * i) for i in range(6)]
    usable = 400 - 1
    seen = {"steps": 0}

    def check(plan: Any) -> None:
        pass

    def after(s: SpeculativeScheduler) -> None:
        held = 0
        for seq in s.running:
            # everything but the last sampled token is computed; the blocks hold exactly those tokens
            assert seq.num_computed == seq.req.prompt_len + seq.num_generated - 1
            assert len(seq.kv_blocks or ()) == math.ceil(seq.num_computed / 16)
            held += len(seq.kv_blocks or ())
        assert s.kv.num_free == usable - held
        assert s.kv.waste == sum(len(q.kv_blocks or ()) * 16 - q.num_computed for q in s.running)
        seen["steps"] += 1

    check.after = after  # type: ignore[attr-defined]
    _drive(sched, reqs, check)
    assert all(r.num_generated == r.output_len for r in reqs)
    assert seen["steps"] > 20
    assert sched.kv.num_free == usable


def test_a_step_never_exceeds_the_token_budget_counting_spec_tokens() -> None:
    budget, k = 37, 8  # four rows of 1 + 8 leave one token: the fifth decodes without drafts
    sched = _spec_scheduler(blocks=2000, budget=budget, k=k, alpha=0.7)
    reqs = [Request(i, 0.0, 20, 200, 200) for i in range(12)]
    totals: list[int] = []
    trimmed = []
    verifying: list[int] = []  # tokens of the decoding rows (context past the 20-token prompt) with drafts
    plain: list[int] = []  # decoding rows cut to one token

    def check(plan: Any) -> None:
        c, q = np.asarray(plan.new_tokens), np.asarray(plan.context)
        totals.append(int(c.sum()))
        trimmed.extend(int(x) for x in c if 1 < x < k + 1)
        verifying.extend(int(x) for x, ctx in zip(c, q, strict=True) if ctx >= 20 and x > 1)
        plain.extend(int(x) for x, ctx in zip(c, q, strict=True) if ctx >= 20 and x == 1)

    _drive(sched, reqs, check)
    assert max(totals) <= budget
    assert totals.count(budget) > 10  # the budget binds ...
    assert trimmed  # ... and cuts some rows' drafts short
    # a decoding row cut to one token verifies nothing: only rows with drafts count as verification steps
    assert plain
    assert sched.counts.steps == len(verifying)
    assert sched.counts.drafted == sum(x - 1 for x in verifying)


def test_spec_tokens_stop_at_max_model_len() -> None:
    sched = _spec_scheduler(blocks=200, budget=4096, k=6, alpha=1.0, max_len=100)
    req = Request(0, 0.0, 80, 100, 100)
    ends: list[int] = []
    _drive(sched, [req], lambda plan: ends.append(int(plan.context[0] + plan.new_tokens[0])))
    assert max(ends) <= 100 - 1  # never a position past max_model_len - 1
    assert req.num_generated == 20  # output capped at max_model_len - prompt


# --- cost, memory, records ------------------------------------------------------------------------------


def test_step_time_is_the_verification_plus_k_draft_passes() -> None:
    target = CostModel(load_model("llama-3.1-70b"), get_gpu("H100-SXM"), 4)
    cfg = SpeculativeConfig(
        method="draft", draft_model="qwama-0.5b-instruct", draft_tensor_parallel_size=1,
        num_speculative_tokens=4, acceptance_rate=0.5,
    )  # fmt: skip
    drafter = build_drafter(cfg, target)
    greedy = replace(Calibration(), sampler_s_per_entry=0.0)  # drafts are argmax: no sampler
    draft = CostModel(load_model("qwama-0.5b-instruct"), get_gpu("H100-SXM"), 1, calibration=greedy)
    # one sequence verifying 4 drafts at context 1000, one prefill chunk of 300 finishing its prompt
    work = DraftWork([5, 300], [1000, 0], [1005, 300])
    timing = SpeculativeTiming(target, drafter, lambda info: work, lambda: 4)
    seconds, _ = timing.plan_time(_plan([5, 300], [1000, 0]))
    by_hand = target.step(np.array([5, 300]), np.array([1000, 0])).seconds
    # the rejection sampler's top-k/top-p at the 4 drafted positions, beside the one per row in the step
    verify = 4 * target.model.vocab_size * target.cal.sampler_s_per_entry
    by_hand += verify
    by_hand += draft.step(np.array([5, 300]), np.array([1000, 0])).seconds  # the draft catches up
    for i in range(3):  # then 3 more single-token passes for the 2 sampling rows
        by_hand += draft.step(np.array([1, 1]), np.array([1005 + i, 300 + i])).seconds
    assert seconds == pytest.approx(by_hand, rel=1e-12)
    assert timing.draft_s == pytest.approx(
        by_hand - verify - target.step(np.array([5, 300]), np.array([1000, 0])).seconds
    )


def _plan(counts: list[int], contexts: list[int]) -> StepPlan:
    return StepPlan(np.array(counts), np.array(contexts), 0, 0, KvUsage(0, 0, 1))


def test_ngram_costs_only_host_time() -> None:
    target = CostModel(load_model("llama-3.1-8b"), get_gpu("H100-SXM"))
    cfg = SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, acceptance_rate=0.5, ngram_s_per_row=2e-5
    )
    work = DraftWork([4, 4, 4], [9, 9, 9], [1, 2, 3])  # 3 rows verifying 3 drafts each
    timing = SpeculativeTiming(target, build_drafter(cfg, target), lambda info: work, lambda: 9)
    seconds, _ = timing.plan_time(_plan([4, 4, 4], [9, 9, 9]))
    # the lookups on the host, and the sampler at the 9 drafted positions: no GPU pass of a proposer
    verify = 9 * 128_256 * target.cal.sampler_s_per_entry
    expected = 3 * 2e-5 + verify
    assert seconds - target.step_time(np.array([4, 4, 4]), np.array([9, 9, 9]))[0] == pytest.approx(expected)


def test_draft_model_memory_comes_out_of_the_kv_blocks() -> None:
    sc = scenario({"method": "draft", "draft_model": "qwama-0.5b-instruct", "num_speculative_tokens": 2,
                   "acceptance_rate": 0.5})  # fmt: skip
    plain = run_policy(sc, "vllm", ROOT).summary["replica"]
    spec = run_policy(sc, "spec", ROOT).summary
    # by hand: the KV bytes left beside the target, less the draft's 945,630,976 weight bytes (0.47e9 params
    # in bf16), shared by blocks that hold both models' KV (Llama-3.1-8B 131,072 B/token, Qwama 12,288)
    target_block, draft_block = 131072 * 16, 24 * 2 * 2 * 64 * 2 * 16
    available = plain["kv_blocks"] * target_block  # within one block of the replica's KV bytes
    expected = (available - 945630976) / (target_block + draft_block)
    assert spec["replica"]["kv_blocks"] == pytest.approx(expected, abs=1.0)
    assert spec["speculative"]["draft_weight_bytes_per_gpu"] == 945630976
    assert kv_blocks_with_draft(10**9, 1000, build_drafter(
        SpeculativeConfig(method="ngram", num_speculative_tokens=1, acceptance_rate=0.5),
        CostModel(load_model("llama-3.1-8b"), get_gpu("H100-SXM")),
    ), 16) == 10**9 // 16000  # fmt: skip


def test_records_columns_manifest_and_determinism(tmp_path: Path) -> None:
    spec = {"method": "eagle", "head_layers": 1, "num_speculative_tokens": 3, "acceptance": "beta",
            "acceptance_rate": 0.7, "acceptance_concentration": 5.0}  # fmt: skip
    sc = scenario(spec)
    one, two = run_policy(sc, "spec", ROOT), run_policy(sc, "spec", ROOT)
    assert json.dumps(one.summary, sort_keys=True) == json.dumps(two.summary, sort_keys=True)
    assert isinstance(one.requests, pl.DataFrame) and isinstance(two.requests, pl.DataFrame)
    assert one.requests.equals(two.requests)
    other = run_policy(sc, "spec", ROOT, seed=6).requests
    assert isinstance(other, pl.DataFrame)
    assert not other["spec_accepted_tokens"].equals(one.requests["spec_accepted_tokens"])
    req = one.requests
    # every generated token after the first comes from a verification step: a + 1 tokens each, the last
    # step's cut at the output length
    emitted = req["spec_steps"] + req["spec_accepted_tokens"]
    assert (
        (emitted >= req["generated_tokens"] - 1) & (req["spec_steps"] <= req["generated_tokens"] - 1)
    ).all()
    s = one.summary["speculative"]
    assert s["accepted_tokens"] == req["spec_accepted_tokens"].sum()
    assert s["verification_steps"] == req["spec_steps"].sum()
    assert 0 < s["draft_time_share"] < 1
    manifest = run_manifest(sc, "spec")
    assert manifest["policy_config"]["speculative"]["head_layers"] == 1
    assert "speculative" not in run_manifest(sc, "vllm")["policy_config"]  # records without it unchanged
    assert "speculative" not in VllmConfig().model_dump()


# --- the serving result: a gain at low load that turns into a loss -------------------------------------


def test_speculation_cuts_latency_at_low_load_and_costs_it_at_high_load() -> None:
    data = tomllib.loads((ROOT / "scenarios" / "speculative-decoding.toml").read_text())
    data["policies"] = {k: v for k, v in data["policies"].items() if k in ("vllm", "draft")}
    gains = {}
    for rate, seconds in ((1.0, 60), (6.0, 30), (28.0, 30)):
        d = copy.deepcopy(data)
        d["workload"]["arrival"]["rate"] = rate
        d["horizon"]["duration_s"] = seconds
        sc = validate_scenario(d, "test")
        lat = {p: run_policy(sc, p, ROOT).summary["latency"] for p in ("vllm", "draft")}
        gains[rate] = {m: lat["vllm"][m]["p50"] / lat["draft"][m]["p50"] for m in ("e2e", "itl", "tpot")}
    assert gains[1.0]["e2e"] > 1.3 and gains[1.0]["tpot"] > 1.3  # speculation pays at low load
    assert gains[1.0]["e2e"] > gains[6.0]["e2e"] > 1.0  # the gain shrinks as the rate grows
    assert gains[28.0]["e2e"] < 1.0 and gains[28.0]["tpot"] < 1.0  # and turns into a loss


# --- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"method": "draft", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative.draft_model"),
        (
            {
                "method": "draft",
                "draft_model": "no-such-model",
                "num_speculative_tokens": 2,
                "acceptance_rate": 0.5,
            },
            "speculative.draft_model",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 0, "acceptance_rate": 0.5},
            "speculative.num_speculative_tokens",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 17, "acceptance_rate": 0.5},
            "speculative.num_speculative_tokens",
        ),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 1.5},
            "speculative.acceptance_rate",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2}, "speculative.acceptance_rate"),
        ({"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative.head_layers"),
        (
            {"method": "ngram", "num_speculative_tokens": 2, "acceptance": "beta", "acceptance_rate": 0.5},
            "speculative.acceptance_concentration",
        ),
        ({"method": "medusa", "num_speculative_tokens": 2, "acceptance_rate": 0.5}, "speculative.method"),
        (
            {
                "method": "ngram",
                "num_speculative_tokens": 2,
                "acceptance_rate": 0.5,
                "draft_model": "llama-3.1-8b",
            },
            "speculative.draft_model",
        ),
        ({"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5, "k": 3}, "speculative.k"),
    ],
)
def test_bad_speculative_tables_name_the_key(spec: dict[str, Any], key: str) -> None:
    with pytest.raises(SimError) as err:
        scenario(spec)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"test: policies.spec.{key}: ")


def test_draft_model_heads_must_split_over_its_tp() -> None:
    sc = scenario({"method": "draft", "draft_model": "qwama-0.5b-instruct", "num_speculative_tokens": 2,
                   "acceptance_rate": 0.5})  # fmt: skip
    data = copy.deepcopy(sc.raw)
    data["model"]["tp"] = 4
    with pytest.raises(SimError, match="draft_tensor_parallel_size"):
        run_policy(validate_scenario(data, "test"), "spec", ROOT)


def test_trace_acceptance_needs_a_trace_arrival() -> None:
    sc = scenario({"method": "ngram", "num_speculative_tokens": 2, "acceptance": "trace"})
    with pytest.raises(SimError, match="arrival kind = 'trace'"):
        run_policy(sc, "spec", ROOT)


# --- report ---------------------------------------------------------------------------------------------


def _point(policy: str, rate: float, e2e: float, tpot: float) -> dict[str, Any]:
    from sim.studies.points import POINT_SCHEMA

    row: dict[str, Any] = {name: None for name in POINT_SCHEMA}
    row.update(point_key=f"{policy}-{rate}", policy=policy, scheduler="vllm", rate=rate, replication=0,
               seed_entropy="1", spawn_key=[0], params="{}", e2e_p50=e2e, tpot_p50=tpot)  # fmt: skip
    return row


def test_report_speedup_is_the_plain_policys_latency_over_the_speculating_ones() -> None:
    from sim.report.speculative import latency_ratios
    from sim.studies.points import POINT_SCHEMA

    rows = [_point("vllm", 1.0, 3.0, 0.02), _point("spec", 1.0, 2.0, 0.01),
            _point("vllm", 8.0, 3.0, 0.02), _point("spec", 8.0, 6.0, 0.05)]  # fmt: skip
    ratios = latency_ratios(pl.DataFrame(rows, schema=POINT_SCHEMA), ["spec"], "vllm")
    got = {(r["latency"], r["rate"]): r["ratio"] for r in ratios.iter_rows(named=True)}
    assert got == pytest.approx(
        {("E2E", 1.0): 1.5, ("E2E", 8.0): 0.5, ("TPOT", 1.0): 2.0, ("TPOT", 8.0): 0.4}
    )


def test_report_has_the_speculative_sections_only_when_a_policy_speculates(tmp_path: Path) -> None:
    from sim.report.build import build_report
    from sim.studies.run import write_result

    sc = scenario({"method": "ngram", "num_speculative_tokens": 3, "acceptance_rate": 0.6})
    report_dir = tmp_path / "reports" / "spec-test"
    for policy in sc.policies:
        write_result(run_policy(sc, policy, ROOT), report_dir)
    build_report(report_dir, png=False)
    html = (report_dir / "index.html").read_text()
    assert "Speculative decoding: tokens per verification step" in html
    assert "Speculative decoding: speed-up against arrival rate" in html  # with the sweep's hint
    plain = tmp_path / "reports" / "plain"
    write_result(run_policy(scenario(None), "vllm", ROOT), plain)
    build_report(plain, png=False)
    assert "Speculative decoding" not in (plain / "index.html").read_text()


def test_speculation_with_a_cluster_is_refused_at_validation() -> None:
    data = copy.deepcopy(BASE)
    data["policies"]["spec"] = {
        "scheduler": "vllm",
        "speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5},
    }
    data["cluster"] = {"router": "round_robin", "groups": [{"count": 2}]}
    with pytest.raises(SimError, match=r"^test: policies\.spec\.speculative: not modelled with \[cluster\]$"):
        validate_scenario(data, "test")


@pytest.mark.parametrize("seed", range(4))
def test_preemptions_under_speculation_keep_the_kv_accounting(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sched = _spec_scheduler(
        blocks=60, budget=96, k=int(rng.integers(1, 9)), alpha=float(rng.uniform(0.2, 0.95))
    )
    reqs = [
        Request(i, 0.0, int(rng.integers(5, 200)), 400, int(rng.integers(20, 300)), n=int(rng.integers(1, 3)))
        for i in range(16)
    ]
    usable = 60 - 1

    def check(plan: Any) -> None:
        assert int(np.asarray(plan.new_tokens).sum()) <= 96

    def after(s: SpeculativeScheduler) -> None:
        held = sum(len(q.kv_blocks or ()) for q in s.running)
        assert s.kv.num_free == usable - held  # no block lost or held twice (no prefix caching: no sharing)
        for q in s.running:
            assert len(q.kv_blocks or ()) == math.ceil(q.num_computed / 16)
        for q in s.waiting:
            assert q.kv_blocks is None

    check.after = after  # type: ignore[attr-defined]
    _drive(sched, reqs, check)
    assert all(r.num_generated == r.output_len for r in reqs)
    assert sum(r.preemptions for r in reqs) > 0
    assert sched.kv.num_free == usable


@pytest.mark.parametrize(
    ("model", "spec", "expected"),
    [
        (
            {"tp": 1},
            {"draft_tensor_parallel_size": 2},
            "draft_tensor_parallel_size: expected 1 or the target's",
        ),
        (
            {"tp": 4},
            {"draft_tensor_parallel_size": 2},
            "draft_tensor_parallel_size: expected 1 or the target's",
        ),
        (
            {"name": "llama-2-7b"},
            {},
            "draft_model: qwama-0.5b-instruct's vocabulary (128,256 entries) differs",
        ),
        ({}, {"draft_model": "llama-3.1-8b"}, "draft_model: llama-3.1-8b is the target model itself"),
    ],
)
def test_drafts_vllm_refuses_are_refused_naming_the_key(
    model: dict[str, Any], spec: dict[str, Any], expected: str
) -> None:
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    data["policies"]["spec"] = {"scheduler": "vllm", "speculative": {
        "method": "draft", "draft_model": "qwama-0.5b-instruct", "num_speculative_tokens": 2,
        "acceptance_rate": 0.5, **spec}}  # fmt: skip
    with pytest.raises(SimError) as err:
        validate_scenario(data, "test")
    assert str(err.value).startswith(f"test: policies.spec.speculative.{expected}"), err.value
    for tp in (1, 4):  # 1 and the target's own are accepted
        data["model"].update({"name": "llama-3.1-8b", "tp": 4})
        data["policies"]["spec"]["speculative"].update(
            draft_model="qwama-0.5b-instruct", draft_tensor_parallel_size=tp
        )
        validate_scenario(data, "test")
