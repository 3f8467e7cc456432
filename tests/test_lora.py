"""Multi-tenant LoRA: adapter sizes, popularity, GPU slots and host cache, the max_loras batching rule,
the slots' KV cost, and runs end to end. Expectations are worked by hand from the model's shapes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.cli import app
from sim.config.lora import LoraConfig
from sim.config.policies import VllmConfig
from sim.config.scenario import validate_scenario
from sim.config.workload import parse_workload
from sim.core.request import Request
from sim.cost.lora import LoraCost, adapter_bytes, lora_memory, slot_bytes
from sim.cost.memory import KvBudget, kv_memory
from sim.cost.roofline import CostModel
from sim.engine.lora import LoraCache, LoraGate, setup_lora
from sim.engine.schedulers.vllm.scheduler import VllmScheduler, build_vllm
from sim.io.errors import SimError
from sim.studies.run import run_policy
from sim.workload.generator import Workload

# Llama-2-7B: hidden 4096, 32 layers, 32 heads of 128 (no GQA), MLP width 11008.
H, L, INTER = 4096, 32, 11008
BLOCK_BYTES = 16 * L * 2 * 32 * 128 * 2  # 16 tokens x layers x (K, V) x heads x head_dim x 2 B


@pytest.fixture(scope="module")
def llama7b():  # type: ignore[no-untyped-def]
    return load_model("llama-2-7b")


def test_adapter_bytes_by_hand_llama7b_rank8(llama7b) -> None:  # type: ignore[no-untyped-def]
    # q, k, v, o: each rank x (4096 + 4096) per layer, 16-bit
    assert adapter_bytes(llama7b, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]) == L * 4 * 8 * (H + H) * 2
    assert adapter_bytes(llama7b, 8, ["q_proj", "k_proj", "v_proj", "o_proj"]) == 16_777_216
    # every module, as a slot holds them: gate and up (4096 + 11008), down (11008 + 4096)
    every = L * 8 * (4 * (H + H) + 3 * (H + INTER)) * 2
    assert slot_bytes(llama7b, 8) == every == 39_976_960
    # TP 2: column-parallel q keeps A (4096 x r) whole and half of B; row-parallel o halves A
    assert adapter_bytes(llama7b, 8, ["q_proj", "o_proj"], tp=2) == L * 8 * ((H + H // 2) + (H // 2 + H)) * 2


def test_modules_a_model_lacks_are_errors() -> None:
    with pytest.raises(SimError, match="no gate_proj module"):
        adapter_bytes(load_model("mixtral-8x7b"), 8, ["gate_proj"])  # MoE experts: not modelled
    with pytest.raises(SimError, match="MLA"):
        adapter_bytes(load_model("deepseek-v2-lite"), 8, ["q_proj"])


def test_zipf_popularity_matches_the_law() -> None:
    n_adapters, n = 20, 100_000
    wl = parse_workload(
        {
            "arrival": {"kind": "poisson", "rate": 1.0},
            "prompt": {"kind": "fixed", "value": 10},
            "output": {"kind": "fixed", "value": 5},
            "lora": {"adapters": n_adapters, "popularity": "zipf", "zipf_s": 1.0},
        }
    )
    ids = np.array([r.adapter for r in Workload(wl, 3, Path(".")).open_loop(max_requests=n)])
    observed = np.bincount(ids, minlength=n_adapters)
    harmonic = sum(1.0 / k for k in range(1, n_adapters + 1))
    expected = np.array([n / (k * harmonic) for k in range(1, n_adapters + 1)])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 43.82  # chi-square critical value, 19 degrees of freedom, p = 0.001
    assert observed[0] / n == pytest.approx(1 / harmonic, abs=0.01)  # the top adapter: 27.8% of requests


def test_uniform_popularity_and_streams_unchanged() -> None:
    base = {"arrival": {"kind": "poisson", "rate": 1.0}, "prompt": {"kind": "uniform", "low": 1, "high": 99},
            "output": {"kind": "fixed", "value": 5}}  # fmt: skip
    plain = list(Workload(parse_workload(base), 5, Path(".")).open_loop(max_requests=2000))
    with_lora = list(
        Workload(parse_workload({**base, "lora": {"adapters": 4}}), 5, Path(".")).open_loop(max_requests=2000)
    )
    # the adapter draw has its own random stream: arrivals and lengths stay the same
    assert [(r.arrival, r.prompt_len) for r in plain] == [(r.arrival, r.prompt_len) for r in with_lora]
    assert all(r.adapter == -1 for r in plain)
    counts = np.bincount([r.adapter for r in with_lora], minlength=4)
    assert counts.min() > 2000 / 4 - 4 * np.sqrt(2000 * 0.25 * 0.75)


def _req(rid: int, adapter: int, prompt: int = 32, output: int = 4) -> Request:
    r = Request(rid, 0.0, prompt, output, output)
    r.adapter = adapter
    return r


def _scheduler(max_loras: int) -> VllmScheduler:
    config = VllmConfig(lora=LoraConfig(max_loras=max_loras))
    return build_vllm(config, KvBudget(1000, 16, 2048))  # type: ignore[return-value]


def test_batch_holds_at_most_max_loras_adapters() -> None:
    sched = _scheduler(2)
    assert not sched.fast  # LoRA switches the bulk decoding off
    adapters = [0, 1, 2, 0, 3, 1, -1]
    for i, a in enumerate(adapters):
        sched.add(_req(i, a), 0.0)
    plan = sched.schedule(0.0)
    assert plan is not None
    # 0 and 1 fill the two places; 2 and 3 are skipped without blocking the queue; the base model passes
    assert [s.req.id for s in plan.payload.seqs] == [0, 1, 3, 5, 6]
    assert [s.req.id for s in sched.waiting] == [2, 4]  # back at the head, in order
    while sched.waiting and {s.req.adapter for s in sched.running} & {0, 1}:
        plan = sched.schedule(0.0)
        assert plan is not None
        assert len({s.req.adapter for s in plan.payload.seqs} - {-1}) <= 2
        sched.update(plan, 0.0)
    plan = sched.schedule(1.0)  # 0 and 1 finished: 2 and 3 get in
    assert plan is not None and {s.req.id for s in plan.payload.seqs} == {2, 4}


def test_gate_counts_running_adapters() -> None:
    gate = LoraGate(1).start([])
    first, other = _req(0, 7), _req(1, 8)

    class S:
        def __init__(self, req: Request) -> None:
            self.req = req

    assert not gate.skip(S(first))
    gate.admit(S(first))
    assert gate.skip(S(other)) and not gate.skip(S(_req(2, 7))) and not gate.skip(S(_req(3, -1)))


def test_miss_pays_pcie_once_and_hit_pays_nothing(llama7b) -> None:  # type: ignore[no-untyped-def]
    gpu = get_gpu("A100-80GB")
    cost = CostModel(llama7b, gpu)
    kv = kv_memory(llama7b, gpu)
    fixed = {"kind": "fixed", "value": 8}
    wl = parse_workload({"arrival": {"kind": "poisson", "rate": 1.0}, "prompt": fixed, "output": fixed,
                         "lora": {"adapters": 10, "rank": 8}}).lora  # fmt: skip
    run, _ = setup_lora(llama7b, gpu, 1, cost, kv, LoraConfig(max_loras=2, max_cpu_loras=4), wl)
    sched = _scheduler(2)
    sched.add(_req(0, 3), 0.0)
    plan = sched.schedule(0.0)
    first, _ = run.step_time.plan_time(plan)
    second, _ = run.step_time.plan_time(plan)  # the same step again: the adapter is resident now
    size = 16_777_216  # rank-8 q, k, v, o (above)
    pcie = 1e-5 + size / 31.5e9  # PCIe Gen4 x16 and its start-up latency (links.toml)
    disk = size / 2e9  # first use: read from disk into host memory
    assert first - second == pytest.approx(pcie + disk, rel=1e-9)
    assert run.step_time.last.loads == 0 and run.step_time.last.adapters == 1


def test_lru_eviction_order() -> None:
    cache = LoraCache(gpu_slots=2, cpu_slots=3, load_s=1.0, disk_s=10.0)
    assert cache.activate([0]).seconds == 11.0  # disk, then PCIe
    assert cache.activate([1]).seconds == 11.0
    assert cache.activate([0]).seconds == 0.0  # hit: touched
    assert cache.activate([2]).seconds == 11.0  # evicts 1, the least recently used GPU slot
    assert list(cache.gpu) == [0, 2]
    assert cache.activate([1]).seconds == 1.0  # still in host memory: PCIe only; evicts 0
    assert list(cache.gpu) == [2, 1]
    assert list(cache.cpu) == [0, 2, 1]
    assert cache.activate([3]).seconds == 11.0  # host cache full: its least recent, 0, goes
    assert list(cache.cpu) == [2, 1, 3]
    out = cache.activate([1, 0])  # never evicts an adapter of the step's own batch
    assert set(cache.gpu) == {1, 0} and out.loads == 1 and out.disk_loads == 1


def test_lora_kernels_read_each_distinct_adapter_once(llama7b) -> None:  # type: ignore[no-untyped-def]
    gpu = get_gpu("A100-80GB")
    cost = CostModel(llama7b, gpu)
    lc = LoraCost(llama7b, gpu, 1, 16, cost)
    slot = L * 16 * (4 * 2 * H + 3 * (H + INTER)) * 2
    # a few decode tokens: memory-bound, so one more distinct adapter adds its slot's bytes at the
    # GEMM bandwidth
    extra = lc.seconds(8, 2) - lc.seconds(8, 1)
    assert extra == pytest.approx(slot / (gpu.hbm_bandwidth * cost.cal.bandwidth_eff), rel=1e-9)
    assert lc.seconds(0, 0) == 0.0
    # 8,192 prefill tokens: the kernels stay memory-bound (rank 16 does ~r FLOPs per activation byte);
    # per token and layer, each module reads x (in), the r-wide buffer, and reads and writes y (2 x out)
    act = 2 * L * (4 * (H + 16 + 2 * H) + 2 * (H + 16 + 2 * INTER) + (INTER + 16 + 2 * H))
    flops = 2 * 8192 * 16 * (4 * 2 * H + 3 * (H + INTER)) * L
    rate = gpu.flops_16bit * min(cost.cal.compute_eff_prefill, cost.cal.compute_eff_decode)
    memory = (slot + 8192 * act) / (gpu.hbm_bandwidth * cost.cal.bandwidth_eff)
    assert memory > flops / rate
    fixed = 2 * L * 4 * 3.068e-06  # shrink and expand of qkv, o, gate_up, down per layer
    assert lc.seconds(8192, 1) == pytest.approx(memory + fixed, rel=1e-9)


def test_kv_blocks_reduced_by_the_slots(llama7b) -> None:  # type: ignore[no-untyped-def]
    kv = kv_memory(llama7b, get_gpu("A100-80GB"))
    assert kv.block_bytes == BLOCK_BYTES
    reduced = lora_memory(kv, llama7b, LoraConfig(max_loras=32, max_lora_rank=16))
    slot16 = L * 16 * (4 * 2 * H + 3 * (H + INTER)) * 2
    assert reduced.num_blocks == (kv.kv_bytes_available - 32 * slot16) // BLOCK_BYTES
    assert reduced.num_blocks < kv.num_blocks


def test_capacity_command_shows_the_slots() -> None:
    out = CliRunner().invoke(app, ["capacity", "llama-2-7b", "--gpu", "A100-80GB", "--max-loras", "32",
                                   "--max-lora-rank", "16", "--json"])  # fmt: skip
    assert out.exit_code == 0, out.output
    lora = json.loads(out.output)["lora"]
    slot16 = L * 16 * (4 * 2 * H + 3 * (H + INTER)) * 2
    assert lora["slot_bytes"] == slot16 == 79_953_920
    assert lora["kv_blocks_without_slots"] - lora["kv_blocks_with_slots"] in (
        32 * slot16 // BLOCK_BYTES,
        32 * slot16 // BLOCK_BYTES + 1,
    )
    text = CliRunner().invoke(app, ["capacity", "llama-2-7b", "--gpu", "A100-80GB", "--max-loras", "4"])
    assert text.exit_code == 0 and "with slots" in text.output


def _scenario(**lora_policy: object) -> dict[str, object]:
    return {
        "name": "lora-test",
        "seed": 3,
        "model": {"name": "llama-2-7b", "gpu": "A100-80GB", "max_model_len": 1024},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 8.0},
            "prompt": {"kind": "uniform", "low": 8, "high": 256},
            "output": {"kind": "uniform", "low": 8, "high": 64},
            "lora": {"adapters": 50, "popularity": "zipf", "rank": 8},
        },  # fmt: skip
        "horizon": {"max_requests": 200, "drain": True},
        "policies": {"p": {"scheduler": "vllm", "lora": {"max_loras": 4, **lora_policy}}},
    }


def test_run_end_to_end_loses_no_request() -> None:
    data = _scenario(max_cpu_loras=8)
    result = run_policy(validate_scenario(data, "t.toml"), "p", Path("."))
    req = result.requests.lazy().collect()
    assert result.summary["requests"]["finished"] == 200 == req.height
    workload = Workload(validate_scenario(data, "t.toml").workload, 3, Path("."))
    drawn = [r.adapter for r in workload.open_loop(max_requests=200)]
    assert req.sort("id")["adapter"].to_list() == drawn
    lora = result.summary["lora"]
    steps = result.steps.lazy().collect()
    assert lora["loads"] == int(steps["lora_loads"].sum()) >= len(set(drawn)) - 0  # each adapter in once
    assert lora["disk_loads"] >= len(set(drawn))  # every adapter read from disk at least once
    assert int(steps["lora_adapters"].max()) <= 4
    assert 0 <= lora["gpu_hit_rate"] <= 1 and lora["load_time_share"] > 0
    budget = result.summary["replica"]["kv_blocks"]
    assert budget == lora["kv_blocks_with_slots"] < lora["kv_blocks_without_slots"]
    again = run_policy(validate_scenario(data, "t.toml"), "p", Path("."))
    assert json.dumps(again.summary, sort_keys=True) == json.dumps(result.summary, sort_keys=True)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda d: d["policies"]["p"].pop("lora"), "policies.p.lora"),
        (lambda d: d["policies"]["p"]["lora"].update(max_lora_rank=7), "policies.p.lora.max_lora_rank"),
        (lambda d: d["workload"]["lora"].update(rank=32), "policies.p.lora.max_lora_rank"),
        (lambda d: d["policies"]["p"]["lora"].update(max_cpu_loras=2), "policies.p.lora.max_cpu_loras"),
        (lambda d: d["policies"]["p"]["lora"].update(host_link="usb"), "policies.p.lora.host_link"),
        (lambda d: d["workload"]["lora"].update(target_modules=["x_proj"]), "workload.lora.target_modules"),
        (lambda d: d["workload"]["lora"].update(adapters=0), "workload.lora.adapters"),
        (lambda d: d["policies"].update(c={"scheduler": "continuous"}), "policies.c.lora"),
        (
            lambda d: d["policies"]["p"].update(
                speculative={"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.5}
            ),
            "policies.p: speculative decoding with LoRA",
        ),
    ],
)
def test_bad_lora_input_names_the_key(change, key) -> None:  # type: ignore[no-untyped-def]
    data = _scenario()
    change(data)
    with pytest.raises(SimError) as err:
        validate_scenario(data, "t.toml")
    assert f"t.toml: {key}" in str(err.value)
    assert "\n" not in str(err.value)


def test_trace_adapter_column(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,adapter\n0,10,5,3\n1,10,5,-1\n2,10,5,1\n")
    wl = {"arrival": {"kind": "trace", "path": str(trace)}, "lora": {"adapters": 4}}
    reqs = list(Workload(parse_workload(wl), 0, tmp_path).open_loop())
    assert [r.adapter for r in reqs] == [3, -1, 1]
    with pytest.raises(SimError, match="workload.lora"):
        Workload(parse_workload({"arrival": wl["arrival"]}), 0, tmp_path)
    with pytest.raises(SimError, match="not below workload.lora.adapters"):
        Workload(parse_workload({**wl, "lora": {"adapters": 2}}), 0, tmp_path)


def test_report_section_over_adapter_counts() -> None:
    import polars as pl

    from sim.report.lora import by_adapters, lora_sections

    key = '{"workload.lora.adapters": %d}'
    points = pl.DataFrame({
        "policy": ["a", "a", "a", "b"], "rate": [4.0, 4.0, 4.0, 4.0],
        "params": [key % 1, key % 1, key % 100, key % 100],
        "requests_per_s": [4.0, 3.0, 2.0, 1.0], "ttft_p99": [0.1, 0.3, 5.0, 9.0],
    })  # fmt: skip
    frame = by_adapters(points)
    got = {(p, a, m): v for p, a, m, v in frame.iter_rows()}
    assert got[("a", 1, "requests_per_s")] == 3.5  # mean of the two replications
    assert got[("a", 1, "ttft_p99")] == pytest.approx(0.2)
    assert got[("b", 100, "ttft_p99")] == 9.0
    assert [s.key for s in lora_sections(points)] == ["lora_adapters"]
    assert lora_sections(points.with_columns(params=pl.lit('{"x": 1}'))) == []
    assert lora_sections(None) == []


def test_mixed_ranks_load_by_their_own_size(llama7b) -> None:  # type: ignore[no-untyped-def]
    gpu = get_gpu("A100-80GB")
    wl = parse_workload({"arrival": {"kind": "poisson", "rate": 1.0}, "prompt": {"kind": "fixed", "value": 8},
                         "output": {"kind": "fixed", "value": 4},
                         "lora": {"adapters": 4, "rank": [8, 32]}}).lora  # fmt: skip
    assert wl is not None and [wl.rank_of(a) for a in range(4)] == [8, 32, 8, 32]
    run, _ = setup_lora(llama7b, gpu, 1, CostModel(llama7b, gpu), kv_memory(llama7b, gpu),
                        LoraConfig(max_loras=2, max_lora_rank=32), wl)  # fmt: skip
    cache = run.step_time.cache
    rank8 = 16_777_216  # q, k, v, o at rank 8 (above); rank 32 is four times that
    assert cache.activate([0]).seconds == pytest.approx(1e-5 + rank8 / 31.5e9 + rank8 / 2e9, rel=1e-12)
    assert cache.activate([1]).seconds == pytest.approx(
        1e-5 + 4 * rank8 / 31.5e9 + 4 * rank8 / 2e9, rel=1e-12
    )
    assert run.adapter_bytes == 4 * rank8
    data = _scenario()
    data["workload"]["lora"]["rank"] = [8, 32]  # type: ignore[index]
    with pytest.raises(SimError, match="policies.p.lora.max_lora_rank: 16 is below the adapters' rank 32"):
        validate_scenario(data, "t.toml")


def test_closed_loop_users_name_adapters_too() -> None:
    fixed = {"kind": "fixed", "value": 8}
    wl = parse_workload({"arrival": {"kind": "closed_loop", "users": 3}, "prompt": fixed, "output": fixed,
                         "lora": {"adapters": 5, "popularity": "uniform"}})  # fmt: skip
    loop = Workload(wl, 1, Path(".")).closed_loop
    assert loop is not None
    ids = [loop.new_request(0.0, u % 3).adapter for u in range(600)]
    assert set(ids) == {0, 1, 2, 3, 4}
    assert max(np.bincount(ids)) < 600 / 5 + 4 * np.sqrt(600 * 0.2 * 0.8)


def test_report_section_over_adapter_counts_says_what_its_latencies_cover() -> None:
    """The p99 TTFT per adapter count covers only the finished requests of those points: the section says
    how many, over the points of the adapter sweep alone."""
    import polars as pl

    from sim.report.lora import lora_sections

    key = '{"workload.lora.adapters": %d}'
    points = pl.DataFrame({
        "policy": ["a", "a", "b"], "rate": [4.0] * 3, "params": [key % 1, key % 100, '{"x": 1}'],
        "requests_per_s": [4.0, 2.0, 1.0], "ttft_p99": [0.1, 5.0, 9.0], "arrived": [100, 100, 100],
        "finished": [100, 60, 10], "overloaded": [False, True, True],
    })  # fmt: skip
    (section,) = lora_sections(points)
    assert (
        "Latencies cover only the requests that finished: over the sweep's 2 runs, 160 of 200 requests "
        "(40 unfinished); 1 of the 2 runs overloaded."
    ) in section.note


def test_report_section_of_runs() -> None:
    import polars as pl

    from sim.report.inputs import PolicyRun
    from sim.report.lora import lora_sections, run_figures

    lora = {"distinct_per_step_mean": 3.5, "gpu_hit_rate": 0.9, "load_time_share": 0.02}
    runs = [
        PolicyRun("a", pl.DataFrame(), pl.DataFrame(), {"lora": lora}),
        PolicyRun("plain", pl.DataFrame(), pl.DataFrame(), {}),
    ]
    figures = {(p, m): v for p, m, v in run_figures(runs).iter_rows()}
    assert figures == {
        ("a", "adapters per step (mean)"): 3.5,
        ("a", "GPU slot hit rate"): 0.9,
        ("a", "share of busy time loading adapters"): 0.02,
    }
    assert [s.key for s in lora_sections(None, runs)] == ["lora_runs"]
    assert lora_sections(None, runs[1:]) == []


def test_slots_come_out_of_the_replicas_own_kv_memory_with_group_scales() -> None:
    """INT4 weights with 32-weight groups: the KV memory the slots are taken from is the one `kv_memory` gives
    for those weights, scales included (not the memory of another weight format)."""
    from sim.catalog.gpus import get_gpu
    from sim.catalog.models import load_model
    from sim.cost.memory import kv_memory

    data = _scenario(max_cpu_loras=8)
    data["model"] = {**data["model"], "weight_dtype": "int4", "weight_group_size": 32}  # type: ignore[dict-item]
    data["horizon"] = {"max_requests": 5, "drain": True}
    result = run_policy(validate_scenario(data, "t.toml"), "p", Path("."))
    model, gpu = load_model("llama-2-7b"), get_gpu("A100-80GB")
    grouped = kv_memory(model, gpu, 1, 0.9, "int4", None, 16, 32).num_blocks
    assert grouped != kv_memory(model, gpu, 1, 0.9, "int4", None, 16).num_blocks  # the scales matter here
    assert result.summary["lora"]["kv_blocks_without_slots"] == grouped


@pytest.mark.parametrize("rank", [600, 0, "8", 2.5, [8, 0], []])
def test_a_bad_rank_is_one_line_naming_the_key_and_the_accepted_ranks(rank: object) -> None:
    data = tomllib.loads(Path("scenarios/multi-tenant-lora.toml").read_text())
    data["workload"]["lora"]["rank"] = rank
    with pytest.raises(SimError) as err:
        validate_scenario(data, "s.toml")
    message = str(err.value)
    assert "\n" not in message and "valid list" not in message
    assert message.startswith(
        "s.toml: workload.lora.rank: expected an adapter rank, a whole number from 1 to 512"
    )
    assert "one of 1, 8, 16, 32, 64, 128, 256, 320, 512" in message
