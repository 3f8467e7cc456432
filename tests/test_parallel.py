"""Placements beyond TP (sim/cost/parallel.py): keys and checks, and the theory of PP, EP and DP costs."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.links import get_link
from sim.catalog.model import ModelSpec
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.scenario import load_scenario
from sim.cost.expert_parallel import distinct_destinations, eplb_rank_loads, expert_loads, gate_shares
from sim.cost.parallel import (
    ParallelCost,
    StepBreakdown,
    all_to_all_seconds,
    pipeline_seconds,
    wrap_step_time,
)
from sim.cost.placement import Placement, check_placement, rank_memory, stage_layers
from sim.cost.roofline import CostModel
from sim.cost.step_model import expected_distinct_experts
from sim.io.errors import SimError

ROOT = Path(__file__).resolve().parents[1]
RAG = ROOT / "scenarios" / "rag-chatbot.toml"
runner = CliRunner()
H100 = get_gpu("H100-SXM")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.groups=[{pp=0}]", "cluster.groups[0].pp"),
        ("cluster.groups=[{ep=1.5}]", "cluster.groups[0].ep"),
        ("cluster.groups=[{dp='2'}]", "cluster.groups[0].dp"),
        ("cluster.groups=[{gpus_per_node=0}]", "cluster.groups[0].gpus_per_node"),
        ("cluster.groups=[{tp=8, pp=2, nodes=1}]", "cluster.groups[0].nodes"),
        ("cluster.groups=[{expert_skew=-1.0}]", "cluster.groups[0].expert_skew"),
        ("cluster.groups=[{inter_node_link='pigeon'}]", "cluster.groups[0].inter_node_link"),
        ("cluster.groups=[{intra_node_link='pigeon'}]", "cluster.groups[0].intra_node_link"),
    ],
)
def test_bad_placement_keys_name_the_key(override: str, key: str) -> None:
    with pytest.raises(SimError) as err:
        load_scenario(RAG, [override])
    assert f"rag-chatbot.toml: {key}:" in str(err.value)


@pytest.mark.parametrize(
    ("model", "placement", "key", "words"),
    [
        ("llama-3.1-8b", Placement(tp=3), "g.tp", "divide"),
        ("llama-3.1-8b", Placement(pp=33), "g.pp", "layers"),
        ("llama-3.1-8b", Placement(dp=2, ep=2), "g.ep", "dense"),
        ("llama-3.1-8b", Placement(dp=2), "g.dp", "independent engines"),
        ("deepseek-v3", Placement(tp=2, dp=4, ep=4), "g.ep", "tp x dp"),
        ("deepseek-v3", Placement(tp=1, dp=3, ep=3), "g.ep", "256 experts"),
    ],
)
def test_placement_checked_against_the_model(model: str, placement: Placement, key: str, words: str) -> None:
    with pytest.raises(SimError) as err:
        check_placement(load_model(model), placement, "g")
    assert str(err.value).startswith(f"{key}: ") and words in str(err.value)


def test_stage_layers_as_vllm_splits_them() -> None:
    # vLLM get_pp_indices: 61 layers over 4 stages -> [15, 16, 15, 15]... the remainder before the last
    assert stage_layers(61, 4) == [15, 15, 16, 15]
    assert stage_layers(62, 4) == [15, 16, 16, 15]
    assert stage_layers(80, 2) == [40, 40]
    assert sum(stage_layers(61, 8)) == 61


def test_memory_per_rank_splits_weights_and_names_the_key() -> None:
    ds = load_model("deepseek-v3")
    with pytest.raises(SimError, match=r"^g\.pp: deepseek-v3 does not fit"):
        rank_memory(ds, H100, Placement(tp=8), 0.9, None, None, 16, "g")
    one = rank_memory(ds, H100, Placement(tp=8, pp=2), 0.9, None, None, 16, "g")
    ep = rank_memory(ds, H100, Placement(tp=1, dp=16, ep=16), 0.9, None, None, 16, "g")
    # TP 8 x PP 2 and EP 16: the same 16 GPUs; EP replicates the dense weights on every rank
    assert one.layers == 31 and ep.layers == 61
    assert one.weight_bytes < 0.5 * ds.weight_bytes("fp8") / 8 * 1.05
    assert ep.kv_tokens == 16 * ep.kv_tokens_per_rank


def _rows(n: int, ctx: int = 500) -> tuple[np.ndarray, np.ndarray]:
    return np.ones(n, dtype=np.int64), np.full(n, ctx, dtype=np.int64)


def test_default_placement_keeps_the_base_cost() -> None:
    base = CostModel(load_model("llama-3.1-8b"), H100, 1)
    assert wrap_step_time(base, base.model, H100, Placement()) == base.step_time


def test_one_batch_in_flight_costs_the_sum_of_its_stages() -> None:
    model = load_model("llama-3.1-70b")
    base = CostModel(model, H100, 4)
    pc = ParallelCost(base, model, H100, Placement(tp=4, pp=2))
    c, q = _rows(32)
    b = pc.breakdown(c, q)
    send = get_link("nvlink-4").latency_s + 32 * model.hidden_size * 2 / get_link("nvlink-4").bandwidth
    assert b.pp_send_s == pytest.approx(send)
    assert b.seconds == pytest.approx(sum(b.stage_s) + send)
    assert sum(b.stage_s) == pytest.approx(base.step_time(c, q)[0])
    # the schedule with one batch in flight: every batch pays every stage
    assert pipeline_seconds(b.stage_s, 10, 1) == pytest.approx(10 * sum(b.stage_s))


def test_stages_of_a_replica_over_two_nodes_send_over_the_inter_node_link() -> None:
    """TP 4 x PP 4 on nodes of 8: stages 2 and 3 sit on the second node, so a boundary crosses nodes even
    though no stage fills one; the sends (each at the slowest boundary's link) go over InfiniBand."""
    model = load_model("llama-3.1-70b")
    base = CostModel(model, H100, 4)
    c, q = _rows(32)
    inter = get_link("infiniband-ndr")
    pc = ParallelCost(base, model, H100, Placement(tp=4, pp=4, gpus_per_node=8))
    send = inter.latency_s + 32 * model.hidden_size * 2 / inter.bandwidth
    assert pc.breakdown(c, q).pp_send_s == pytest.approx(send)
    one_node = ParallelCost(base, model, H100, Placement(tp=2, pp=4, gpus_per_node=8))
    intra = get_link("nvlink-4")
    assert one_node.breakdown(c, q).pp_send_s == pytest.approx(
        intra.latency_s + 32 * model.hidden_size * 2 / intra.bandwidth
    )


def test_pp_batches_in_flight_bounded_by_the_slowest_stage() -> None:
    stages = [0.010, 0.014, 0.011, 0.012]
    n = 400
    throughput = n / pipeline_seconds(stages, n, len(stages))
    assert throughput == pytest.approx(1 / max(stages), rel=0.02)
    # fewer runnable batches than stages: bubbles, below the bound
    assert 2 / pipeline_seconds(stages, 2, len(stages)) < 0.6 / max(stages)


def test_all_to_all_is_latency_plus_bytes_over_bandwidth() -> None:
    for name in ("nvlink-4", "infiniband-ndr"):
        link = get_link(name)
        assert all_to_all_seconds(7e6, link) == pytest.approx(link.latency_s + 7e6 / link.bandwidth)


def test_ep_all_to_all_crosses_nodes_on_infiniband() -> None:
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c, q = _rows(256)
    intra = ParallelCost(base, ds, H100, Placement(dp=8, ep=8)).breakdown(c, q)
    inter = ParallelCost(base, ds, H100, Placement(dp=16, ep=16)).breakdown(c, q)
    per_token = ds.experts_per_token * ds.hidden_size * 2
    nv, ib = get_link("nvlink-4"), get_link("infiniband-ndr")
    assert intra.dispatch_s == pytest.approx(all_to_all_seconds(256 / 8 * per_token * 7 / 8, nv))
    assert inter.dispatch_s == pytest.approx(all_to_all_seconds(256 / 16 * per_token * 15 / 16, ib))


def test_balanced_experts_cost_one_rank_and_skew_raises_to_the_busiest() -> None:
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c, q = np.full(8, 2048, dtype=np.int64), np.zeros(8, dtype=np.int64)  # prefill: the GEMMs compute-bound
    pc = ParallelCost(base, ds, H100, Placement(dp=16, ep=16))
    flat = pc.breakdown(c, q)
    one_rank = pc._expert_seconds(c.sum() * ds.experts_per_token / 16)
    assert flat.expert_rank_s == pytest.approx([one_rank] * 16) and flat.skew_s == pytest.approx(0.0)
    skewed_pc = ParallelCost(base, ds, H100, Placement(dp=16, ep=16, expert_skew=1.0))
    skewed = skewed_pc.breakdown(c, q)
    assert skewed.skew_s == pytest.approx(max(skewed.expert_rank_s) - np.mean(skewed.expert_rank_s))
    assert skewed.skew_s > 0 and skewed.seconds > flat.seconds
    loads = expert_loads(256, 8, 16, 1.0)
    assert loads.sum() == pytest.approx(1.0) and loads[0] == loads.max() > 1 / 16
    # the all-to-all ends when the busiest receiver has its tokens: its bytes, max share x ep of the mean's
    ib, moved = get_link("infiniband-ndr"), c.sum() / 16 * ds.experts_per_token * ds.hidden_size * 2 * 15 / 16
    assert flat.dispatch_s == pytest.approx(all_to_all_seconds(moved, ib))
    assert skewed.dispatch_s == pytest.approx(all_to_all_seconds(loads.max() * 16 * moved, ib))


def test_dp_attention_waits_for_the_slowest_rank() -> None:
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c = np.ones(4, dtype=np.int64)
    q = np.array([100, 100, 100, 6000], dtype=np.int64)  # rank 1 of 2 holds the long context
    b = ParallelCost(base, ds, H100, Placement(dp=2, ep=2)).breakdown(c, q)
    assert b.rank_s[1] > b.rank_s[0]
    assert sum(b.stage_s) == pytest.approx(max(b.rank_s) + ds.num_moe_layers * (b.dispatch_s + b.combine_s))


def test_ep_dp_scenario_runs_end_to_end(tmp_path: Path) -> None:
    sets = [
        "model.name='deepseek-v3'", "model.gpu='H100-SXM'", "model.max_model_len=4096",
        "horizon.duration_s=5", "workload.arrival={kind='poisson', rate=2.0}",
        "cluster.groups=[{tp=1, dp=16, ep=16, nodes=2}]",
    ]  # fmt: skip
    args = ["run", str(RAG), "--policy", "vllm-prefix-cache", "--out", str(tmp_path)]
    res = runner.invoke(app, args + [a for s in sets for a in ("--set", s)])
    assert res.exit_code == 0, res.output
    bad = runner.invoke(app, args + [a for s in [*sets[:-1], "cluster.groups=[{tp=1, dp=4, ep=4}]"]
                                     for a in ("--set", s)])  # fmt: skip
    assert bad.exit_code == 2 and "cluster.groups[0].pp: deepseek-v3 does not fit" in bad.output


def test_sim_step_shows_each_rank_and_the_all_to_alls() -> None:
    args = ["step", "deepseek-v3", "--gpu", "H100", "--dp", "16", "--ep", "16", "--prefill", "4096"]
    res = runner.invoke(app, [*args, "--expert-skew", "1.0", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert len(out["attention_rank_s"]) == 16 and len(out["expert_rank_s_per_layer"]) == 16
    assert (
        out["ep_link"] == "infiniband-ndr" and out["dispatch_s_per_layer"] > 0 and out["skew_s_per_layer"] > 0
    )
    table = runner.invoke(app, args)
    assert table.exit_code == 0 and "dispatch all-to-all (infiniband-ndr)" in table.output
    pp = runner.invoke(
        app, ["step", "llama-3.1-70b", "--gpu", "H100", "--tp", "4", "--pp", "2", "--prefill", "512"]
    )
    assert pp.exit_code == 0 and "PP send (nvlink-4)" in pp.output and "stage 1 (40 layers)" in pp.output


def test_sim_capacity_shows_memory_per_rank() -> None:
    res = runner.invoke(app, ["capacity", "deepseek-v3", "--gpu", "H100", "--tp", "8", "--pp", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["layers_per_stage"] == 31 and out["gpus"] == 16 and 0 < out["weights_gb"] < out["budget_gb"]
    bad = runner.invoke(app, ["capacity", "deepseek-v3", "--gpu", "H100", "--dp", "3", "--ep", "3"])
    assert bad.exit_code == 2 and "error: capacity: --ep: 3 must divide the 256 experts" in bad.output


def test_given_kv_blocks_are_checked_against_the_placement(tmp_path: Path) -> None:
    sets = [
        "model.name='deepseek-v3'", "model.gpu='H100-SXM'", "model.max_model_len=4096",
        "horizon.duration_s=2", "workload.arrival={kind='poisson', rate=1.0}",
        "cluster.groups=[{tp=8, pp=2}]", "model.num_kv_blocks=4000000",
    ]  # fmt: skip
    args = ["run", str(RAG), "--policy", "vllm-prefix-cache", "--out", str(tmp_path)]
    res = runner.invoke(app, args + [a for s in sets for a in ("--set", s)])
    assert (
        res.exit_code == 2 and "cluster.groups[0]: model.num_kv_blocks: 4,000,000 blocks exceed" in res.output
    )
    ok = runner.invoke(
        app, args + [a for s in [*sets[:-1], "model.num_kv_blocks=5000"] for a in ("--set", s)]
    )
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "vllm-prefix-cache" / "summary.json").read_text())
    assert summary["cluster"]["groups"]["g0"]["kv_blocks"] == 5000


def test_a_groups_own_tp_is_what_the_run_size_check_places(tmp_path: Path) -> None:
    """A fleet whose group serves at TP 4 a model that `[model]` alone (TP 1) cannot hold runs: the run-size
    estimate costs the group's own placement, not the `[model]` table's."""
    sets = [
        "model.name='llama-3.1-70b'", "model.gpu='H100-SXM'", "horizon.duration_s=2",
        "cluster.groups=[{count=2, tp=4}]",
    ]  # fmt: skip
    args = ["run", str(RAG), "--policy", "vllm-prefix-cache", "--out", str(tmp_path)]
    res = runner.invoke(app, args + [a for s in sets for a in ("--set", s)])
    assert res.exit_code == 0, res.output


def test_options_a_placement_does_not_cost_are_refused_not_ignored() -> None:
    """`sim capacity` and `sim step` with --pp/--ep/--dp refuse the options the placement path does not cost,
    naming them, instead of running without them."""
    cap = runner.invoke(app, ["capacity", "deepseek-v3", "--gpu", "H100", "--dp", "16", "--ep", "16",
                              "--max-model-len", "4096"])  # fmt: skip
    assert cap.exit_code == 2 and "--max-model-len: costed with tensor parallelism only" in cap.output
    calibration = "sim/catalog/calibration.toml"
    step = runner.invoke(app, ["step", "deepseek-v3", "--gpu", "H100", "--dp", "16", "--ep", "16",
                               "--prefill", "512", "--calibration", calibration])  # fmt: skip
    assert step.exit_code == 2 and "--calibration: costed with tensor parallelism only" in step.output


def test_a_placed_groups_gpus_count_every_rank_for_capacity_per_gpu() -> None:
    """A group of 2 replicas at tp 1, pp 2, dp 2 uses 8 GPUs (tp x pp x dp each), as `capacity_per_gpu`
    divides by."""
    from sim.config.scenario import load_scenario
    from sim.studies.sweep import gpu_count

    sc = load_scenario(RAG, ["model.name='deepseek-v3'", "model.gpu='H100-SXM'",
                             "cluster.groups=[{count=2, tp=1, pp=2, dp=2, ep=2}]"])  # fmt: skip
    assert gpu_count(sc) == 8


def _tbo_hidden(pc: ParallelCost, tbo: StepBreakdown, c: np.ndarray, free: float) -> float:
    """What two-batch overlap hides in a one-stage step: each dispatch behind the other micro-batch's
    attention and dense work, each combine behind its expert GEMMs (the mean EP rank's, half the tokens)."""
    ds = pc.model
    routed = c.sum() * ds.experts_per_token
    experts = ds.num_moe_layers * 2 * np.mean([pc._expert_seconds(routed / 2 * x) for x in pc.loads])
    compute = max(tbo.rank_s)
    experts = min(experts, compute)
    return min(ds.num_moe_layers * tbo.dispatch_s * free, compute - experts) + min(
        ds.num_moe_layers * tbo.combine_s * free, experts
    )


def test_two_batch_overlap_hides_each_phases_communication_behind_the_other_micro_batchs_compute() -> None:
    """Two micro-batches: each pays its own compute (alternate rows) and its own all-to-all of half the bytes;
    a dispatch hides behind the other's attention, a combine behind its expert GEMMs, so a stage saves at
    most min(communication, compute) and costs no less than the larger of the two."""
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    ib = get_link("infiniband-ndr")
    for c, q in (_rows(4096, 2000), (np.full(64, 2000, dtype=np.int64), np.zeros(64, dtype=np.int64))):
        plain = ParallelCost(base, ds, H100, Placement(dp=16, ep=16)).breakdown(c, q)
        pc = ParallelCost(base, ds, H100, Placement(dp=16, ep=16, two_batch_overlap=True))
        tbo = pc.breakdown(c, q)
        rows = [(c[r::16], q[r::16]) for r in range(16)]
        rank = pc.rank_base  # one attention rank: 1/dp of the routed-expert bytes (the DP rule)
        halves = [sum(rank.step_time(rc[i::2], rq[i::2])[0] for i in (0, 1)) for rc, rq in rows]
        compute = max(halves)
        assert tbo.rank_s == pytest.approx(halves)
        half = c.sum() * ds.experts_per_token / 16 * ds.hidden_size * 2 * 15 / 16 / 2
        assert tbo.dispatch_s == pytest.approx(2 * (ib.latency_s + half / ib.bandwidth))
        comm = ds.num_moe_layers * (tbo.dispatch_s + tbo.combine_s)
        hidden = _tbo_hidden(pc, tbo, c, 1.0)
        assert tbo.overlap_s == pytest.approx([hidden])
        assert 0 < hidden <= min(comm, compute) * (1 + 1e-12)
        assert tbo.seconds == pytest.approx(compute + comm + ds.num_moe_layers * tbo.skew_s - hidden)
        assert tbo.seconds >= max(comm, compute) * (1 - 1e-12) and plain.overlap_s == []
    # decode at a small batch: the second micro-batch reads the weights again and the overlap does not pay
    c, q = _rows(64, 2000)
    small = [ParallelCost(base, ds, H100, Placement(dp=16, ep=16, two_batch_overlap=t)).breakdown(c, q)
             for t in (False, True)]  # fmt: skip
    assert small[1].seconds > small[0].seconds


def test_two_batch_overlap_under_deepeps_normal_kernels_leaves_the_compute_the_sms_they_do_not_take() -> None:
    """DeepEP's normal kernels run on 24 SMs (its README): while they run the compute has 108 of the H100's
    132, so only 108/132 of each phase's communication can hide; its low-latency kernels take none (the
    receive hook)."""
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c, q = np.full(256, 2000, dtype=np.int64), np.zeros(256, dtype=np.int64)  # 8 prompts a rank
    for mode, taken in (("deepep_normal", 24), ("deepep_low_latency", 0)):
        keys = {"dp": 32, "ep": 32, "ep_all_to_all": mode}
        plain = ParallelCost(base, ds, H100, Placement(**keys)).breakdown(c, q)
        pc = ParallelCost(base, ds, H100, Placement(**keys, two_batch_overlap=True))
        tbo = pc.breakdown(c, q)
        compute = max(tbo.rank_s)
        comm = ds.num_moe_layers * (tbo.dispatch_s + tbo.combine_s)
        hidden = _tbo_hidden(pc, tbo, c, 1 - taken / H100.sms)
        assert tbo.overlap_s == pytest.approx([hidden])
        assert tbo.seconds == pytest.approx(compute + comm + ds.num_moe_layers * tbo.skew_s - hidden)
        assert tbo.seconds >= max(comm, compute + comm * taken / H100.sms) * (1 - 1e-12)
        assert tbo.seconds < plain.seconds
    assert H100.sms == 132


def test_dp_attention_over_tp_sharded_experts_gathers_the_steps_tokens_and_reads_what_they_touch() -> None:
    """vLLM's default for DP without EP: the expert layers a TP group of dp x tp GPUs. Each MoE layer
    all-gathers the step's tokens to every GPU and reduce-scatters them back, (dp - 1) / dp of tokens x hidden
    x 2 B each over the group's link, reads its shard of every expert the step's tokens touch, and runs the
    fused-MoE kernel on that dp-times narrower shard."""
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c, q = _rows(256, 2000)  # 16 decodes a rank
    for dp, link in ((8, get_link("nvlink-4")), (16, get_link("infiniband-ndr"))):  # one node, then two
        pc = ParallelCost(base, ds, H100, Placement(dp=dp))
        b = pc.breakdown(c, q)
        moved = 256 * ds.hidden_size * 2 * (dp - 1) / dp
        assert b.gather_s == pytest.approx(2 * (link.latency_s + moved / link.bandwidth))
        rank = pc.rank_base
        extra = (expected_distinct_experts(ds.num_experts, ds.experts_per_token, 256)
                 - expected_distinct_experts(ds.num_experts, ds.experts_per_token, 256 / dp))  # fmt: skip
        assert b.group_reads_s == pytest.approx(
            extra * rank.expert_bytes_per_layer / (rank.hbm * rank.cal.bandwidth_eff)
        )
        assert b.seconds == pytest.approx(max(b.rank_s) + ds.num_moe_layers * (b.gather_s + b.group_reads_s))
        assert (b.dispatch_s, b.combine_s) == (0.0, 0.0)
    # the experts run on shards dp times narrower: each pair costs what the fused-MoE kernel charges there
    n_half, width = base.moe_n_half_cols, ds.expert_params / (3 * ds.hidden_size)
    assert n_half > 100 and width == 2048
    for dp in (8, 16):
        rank = ParallelCost(base, ds, H100, Placement(dp=dp)).rank_base
        narrow = (1 + n_half / (width / dp)) / (1 + n_half / width)
        assert rank.moe_cost_tok == pytest.approx(base.moe_cost_tok * narrow) and narrow > 1.5
        assert rank.moe_fill_expert == pytest.approx(base.moe_fill_expert / dp * narrow)
    expert_parallel = ParallelCost(base, ds, H100, Placement(ep=16, dp=16)).rank_base
    assert expert_parallel.moe_cost_tok == base.moe_cost_tok  # whole experts on each EP rank
    # a prefill touches every expert on every rank already: only the gather is added
    prompts = ParallelCost(base, ds, H100, Placement(dp=8)).breakdown(*(np.full(8, 4096), np.zeros(8)))
    assert prompts.group_reads_s == pytest.approx(0.0, abs=1e-9) and prompts.gather_s > 0
    # a dense model's DP ranks share no layer: nothing is gathered
    dense = ParallelCost(CostModel(load_model("llama-3.1-8b"), H100, 1), load_model("llama-3.1-8b"), H100,
                         Placement(dp=4)).breakdown(c, q)  # fmt: skip
    assert (dense.gather_s, dense.group_reads_s) == (0.0, 0.0)


def test_two_batch_overlap_needs_ep_and_is_named() -> None:
    with pytest.raises(SimError, match=r"rag-chatbot.toml: cluster.groups\[0\].two_batch_overlap: .*ep > 1"):
        load_scenario(RAG, ["cluster.groups=[{two_batch_overlap=true}]"])
    with pytest.raises(SimError, match=r"g.two_batch_overlap: .*ep > 1"):
        check_placement(load_model("deepseek-v3"), Placement(dp=2, two_batch_overlap=True), "g")
    res = runner.invoke(app, ["step", "deepseek-v3", "--gpu", "H100", "--dp", "16", "--ep", "16",
                              "--prefill", "4096", "--two-batch-overlap"])  # fmt: skip
    assert res.exit_code == 0 and "two-batch overlap: communication hidden" in res.output
    off = runner.invoke(app, ["step", "deepseek-v3", "--gpu", "H100", "--tp", "16", "--batch", "8",
                              "--context", "100", "--two-batch-overlap"])  # fmt: skip
    assert off.exit_code == 2 and "--two-batch-overlap: overlaps the EP all-to-all" in off.output


# The EP all-to-all as DeepEP runs it, FP8 dispatch, EPLB's redundant experts (sim/cost/expert_parallel.py).


def _ungrouped(model: str = "deepseek-v3") -> ModelSpec:
    return dataclasses.replace(load_model(model), expert_groups=0, expert_groups_per_token=0)


def test_config_json_groups_limit_the_nodes_a_token_reaches() -> None:
    """DeepSeek-V3's config.json: n_group 8, topk_group 4. A token's 8 experts lie in 4 of 8 groups; with
    a group a node (8 nodes) it reaches at most 4: 4 x P(a chosen group gets one of 8 draws from 128)."""
    ds = load_model("deepseek-v3")
    assert (ds.expert_groups, ds.expert_groups_per_token) == (8, 4)
    grouped = 4 * (1 - math.comb(96, 8) / math.comb(128, 8))
    assert distinct_destinations(ds, 8) == pytest.approx(grouped) and grouped < 4
    # without the limit: U x (1 - C(E - E/U, k) / C(E, k)), the hypergeometric closed form
    free = _ungrouped()
    for units in (4, 8, 32, 64):
        e = 256 // units
        assert distinct_destinations(free, units) == pytest.approx(
            units * (1 - math.comb(256 - e, 8) / math.comb(256, 8))
        )
    assert distinct_destinations(free, 1) == 1.0 and distinct_destinations(free, 8) > grouped


def test_deepep_normal_sends_a_token_once_per_rank_and_node() -> None:
    """Normal kernels: once per destination rank over NVLink, once per destination node over the inter-node
    link, whatever the experts there; the slower hop bounds the all-to-all."""
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c, q = np.full(8, 2048, dtype=np.int64), np.zeros(8, dtype=np.int64)
    nv, ib = get_link("nvlink-4"), get_link("infiniband-ndr")
    h = ds.hidden_size
    one = ParallelCost(base, ds, H100, Placement(dp=8, ep=8, ep_all_to_all="deepep_normal")).breakdown(c, q)
    per_rank = 2048 * distinct_destinations(ds, 8) * 7 / 8 * h * 2
    assert one.dispatch_s == pytest.approx(all_to_all_seconds(per_rank, nv)) == one.combine_s
    old = ParallelCost(base, ds, H100, Placement(dp=8, ep=8)).breakdown(c, q)
    assert one.dispatch_s < old.dispatch_s  # the per-expert rule sends a token to a rank once per expert
    p = Placement(dp=32, ep=32, ep_all_to_all="deepep_normal", ep_dispatch_dtype="fp8")
    four = ParallelCost(base, ds, H100, p).breakdown(np.full(32, 512, dtype=np.int64), np.zeros(32, np.int64))
    fp8 = 1 + 4 / 128
    nvl = 512 * distinct_destinations(ds, 32) * 31 / 32 * h
    inter = 512 * distinct_destinations(ds, 4) * 3 / 4 * h
    assert four.dispatch_s == pytest.approx(
        max(all_to_all_seconds(nvl * fp8, nv), all_to_all_seconds(inter * fp8, ib))
    )
    assert four.combine_s == pytest.approx(
        max(all_to_all_seconds(nvl * 2, nv), all_to_all_seconds(inter * 2, ib))
    )
    assert four.dispatch_s < four.combine_s  # FP8 dispatch, BF16 combine


def test_deepep_low_latency_sends_each_expert_pair_and_auto_picks_by_step() -> None:
    """Low-latency kernels: one message per (token, expert) pair straight to its rank; the pairs to the node's
    own ranks go over NVLink, the rest over the inter-node link. `deepep_auto`: normal with prompt tokens,
    low-latency for a decode-only step."""
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    nv, ib = get_link("nvlink-4"), get_link("infiniband-ndr")
    c, q = _rows(64 * 128, 2000)
    mode = {m: Placement(dp=64, ep=64, ep_all_to_all=m, ep_dispatch_dtype="fp8") for m in
            ("deepep_low_latency", "deepep_normal", "deepep_auto")}  # fmt: skip
    ll = ParallelCost(base, ds, H100, mode["deepep_low_latency"]).breakdown(c, q)
    pairs = 128 * ds.experts_per_token * ds.hidden_size
    assert ll.dispatch_s == pytest.approx(
        max(
            all_to_all_seconds(pairs * 7 / 64 * (1 + 4 / 128), nv),
            all_to_all_seconds(pairs * 56 / 64 * (1 + 4 / 128), ib),
        )
    )
    assert ll.combine_s == pytest.approx(all_to_all_seconds(pairs * 56 / 64 * 2, ib))
    auto = ParallelCost(base, ds, H100, mode["deepep_auto"])
    assert auto.breakdown(c, q).dispatch_s == ll.dispatch_s
    pc, pq = np.full(64, 2000, dtype=np.int64), np.zeros(64, dtype=np.int64)
    normal = ParallelCost(base, ds, H100, mode["deepep_normal"]).breakdown(pc, pq)
    assert auto.breakdown(pc, pq).dispatch_s == normal.dispatch_s != ll.dispatch_s


@given(
    experts=st.sampled_from([8, 16, 64, 128, 256]),
    top_k=st.integers(1, 8),
    skew=st.floats(0.0, 4.0),
)
def test_the_gate_gives_no_expert_more_than_one_pair_a_token(experts: int, top_k: int, skew: float) -> None:
    """A token routes to top_k distinct experts, so an expert gets at most 1 / top_k of the pairs: the Zipf
    gate is capped there, its shares still a distribution, hottest first, and unchanged where no share
    reaches the cap."""
    shares = gate_shares(experts, top_k, skew)
    assert shares.sum() == pytest.approx(1.0) and shares.max() <= 1.0 / top_k + 1e-12
    assert np.all(np.diff(shares) <= 1e-15)
    zipf = 1.0 / np.arange(1, experts + 1) ** skew
    zipf /= zipf.sum()
    if zipf.max() <= 1.0 / top_k:
        assert shares == pytest.approx(zipf, rel=1e-12)


def test_a_steep_gate_keeps_deepseeks_hottest_expert_at_one_pair_a_token() -> None:
    shares = gate_shares(256, 8, 1.01)  # uncapped, the hottest expert would take 16.7% of the pairs
    assert shares[0] == pytest.approx(1 / 8) and shares[1] < 1 / 8
    assert expert_loads(256, 8, 32, 1.01)[0] == pytest.approx(shares[:8].sum())


def test_eplb_replicates_the_hottest_experts_and_lowers_the_busiest_rank() -> None:
    """EPLB (DeepSeek's eplb.py): each redundant slot to the expert with the most load per replica, then the
    physical experts heaviest first to the least loaded rank with room. Balanced gate: no change; skewed:
    the busiest rank's load falls toward the mean."""
    flat = expert_loads(256, 8, 32, 0.0, 32)
    assert flat == pytest.approx(np.full(32, 1 / 32)) and flat.sum() == pytest.approx(1.0)
    zipf = expert_loads(256, 8, 32, 1.0)
    eplb = expert_loads(256, 8, 32, 1.0, 32)
    assert eplb.sum() == pytest.approx(1.0) and max(eplb) < max(zipf) and max(eplb) >= 1 / 32
    logical = np.array([0.4, 0.3, 0.2, 0.1])
    assert eplb_rank_loads(logical, 2, 2) == pytest.approx(
        [0.5, 0.5]
    )  # 0.4 and 0.3 split: .2 .2 .15 .15 .2 .1
    ds = load_model("deepseek-v3")
    base = CostModel(ds, H100, 1)
    c, q = np.full(32, 2048, dtype=np.int64), np.zeros(32, dtype=np.int64)

    def step(**kw: Any) -> Any:
        return ParallelCost(base, ds, H100, Placement(dp=32, ep=32, **kw)).breakdown(c, q)

    assert (
        step(ep_redundant_experts=32).seconds == step().seconds and step(ep_redundant_experts=32).skew_s == 0
    )
    assert step(expert_skew=1.0, ep_redundant_experts=32).skew_s < step(expert_skew=1.0).skew_s


def test_redundant_experts_admit_ep_72_and_cost_memory() -> None:
    """vLLM spreads the physical experts (routed + redundant) evenly: 256 + 32 = 288 fill EP 72 and EP 144,
    which 256 alone do not divide; each rank holds (E + R) / ep experts."""
    ds = load_model("deepseek-v3")
    with pytest.raises(SimError, match=r"^g.ep: 72 must divide the 256 experts"):
        check_placement(ds, Placement(dp=72, ep=72), "g")
    for ep in (72, 144):
        check_placement(ds, Placement(dp=ep, ep=ep, ep_redundant_experts=32), "g")
    with pytest.raises(SimError, match=r"^g.ep: 64 must divide the 256 \+ 32 redundant experts"):
        check_placement(ds, Placement(dp=64, ep=64, ep_redundant_experts=32), "g")
    with pytest.raises(SimError, match=r"^g.ep_redundant_experts: .*ep > 1"):
        check_placement(ds, Placement(tp=8, ep_redundant_experts=32), "g")
    with pytest.raises(
        SimError, match=r"rag-chatbot.toml: cluster.groups\[0\].ep_redundant_experts: .*ep > 1"
    ):
        load_scenario(RAG, ["cluster.groups=[{ep_redundant_experts=32}]"])
    plain = rank_memory(ds, H100, Placement(dp=32, ep=32), 0.9, None, None, 16, "g")
    more = rank_memory(ds, H100, Placement(dp=32, ep=32, ep_redundant_experts=32), 0.9, None, None, 16, "g")
    experts = ds.routed_expert_params * ds.param_bytes("experts", ds.default_weight_dtype, None) / 32
    assert more.weight_bytes - plain.weight_bytes == pytest.approx(experts * 32 / 256, rel=1e-6)


@pytest.mark.parametrize(
    ("override", "key", "expected"),
    [
        ("cluster.groups=[{ep_all_to_all='nccl'}]", "cluster.groups[0].ep_all_to_all", "'deepep_auto'"),
        (
            "cluster.groups=[{ep_dispatch_dtype='fp4'}]",
            "cluster.groups[0].ep_dispatch_dtype",
            "'bf16' or 'fp8'",
        ),
        (
            "cluster.groups=[{ep_redundant_experts=-1}]",
            "cluster.groups[0].ep_redundant_experts",
            "or equal to 0",
        ),
    ],
)
def test_bad_all_to_all_keys_name_the_key(override: str, key: str, expected: str) -> None:
    with pytest.raises(SimError) as err:
        load_scenario(RAG, [override])
    assert f"rag-chatbot.toml: {key}:" in str(err.value) and expected in str(err.value)


def test_n_group_must_divide_the_experts(tmp_path: Path) -> None:
    data = json.loads((ROOT / "sim" / "catalog" / "models" / "deepseek-v3.json").read_text())
    data["n_group"] = 7
    (tmp_path / "config.json").write_text(json.dumps(data))
    res = runner.invoke(app, ["capacity", str(tmp_path / "config.json"), "--gpu", "H200", "--tp", "8"])
    assert res.exit_code == 2 and "config.json: n_group: 7 groups must divide the 256" in res.output
