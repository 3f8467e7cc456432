"""Placements beyond TP (sim/cost/parallel.py): keys and checks, and the theory of PP, EP and DP costs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.links import get_link
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.scenario import load_scenario
from sim.cost.parallel import (
    ParallelCost,
    Placement,
    all_to_all_seconds,
    check_placement,
    expert_loads,
    pipeline_seconds,
    rank_memory,
    stage_layers,
    wrap_step_time,
)
from sim.cost.roofline import CostModel
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
    loads = expert_loads(256, 16, 1.0)
    assert loads.sum() == pytest.approx(1.0) and loads[0] == loads.max() > 1 / 16


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


def test_two_batch_overlap_hides_up_to_the_smaller_of_communication_and_compute() -> None:
    """Two micro-batches: each pays its own compute (alternate rows) and its own all-to-all of half the bytes;
    a stage saves min(communication, compute) and costs no less than the larger of the two."""
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
        assert tbo.overlap_s == pytest.approx([min(comm, compute)])
        assert tbo.seconds == pytest.approx(compute + comm - min(comm, compute))
        assert tbo.seconds >= max(comm, compute) and plain.overlap_s == []
    # decode at a small batch: the second micro-batch reads the weights again and the overlap does not pay
    c, q = _rows(64, 2000)
    small = [ParallelCost(base, ds, H100, Placement(dp=16, ep=16, two_batch_overlap=t)).breakdown(c, q)
             for t in (False, True)]  # fmt: skip
    assert small[1].seconds > small[0].seconds


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
