"""The `slora` policy: S-LoRA's router (S-LoRA/S-LoRA at c1ddf48, slora/server/router/) by hand; its runs."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sim.catalog.models import load_model
from sim.config.policies import SLoraConfig
from sim.config.scenario import validate_scenario
from sim.core.request import Request
from sim.cost.lora import adapter_bytes
from sim.cost.memory import KvBudget
from sim.engine.schedulers.slora import SLoraScheduler, SLoraStep
from sim.io.errors import SimError
from sim.studies.run import run_policy


def _router(cells: int, wait: int = 2, **knobs: Any) -> SLoraScheduler:
    config = SLoraConfig(max_total_token_num=cells, max_new_tokens="output", max_wait_tokens=wait, **knobs)
    router = SLoraScheduler(config, KvBudget(1000, 16, 2048))
    router.serve_adapters(lambda _a: 8)  # rank 2 on q/k/v/o: 4 x 2 cells (infer_adapter.py line 142)
    return router


def _req(i: int, prompt: int, output: int, adapter: int, arrival: float = 0.0) -> Request:
    return Request(i, arrival, prompt, 512, output, adapter=adapter)


def _run_step(router: SLoraScheduler, now: float) -> tuple[SLoraStep, list[Request]]:
    plan = router.schedule(now)
    assert plan is not None
    return plan.payload, router.update(plan, now + 1.0)


def test_admission_counts_the_batchs_adapters_in_the_pool() -> None:
    """req_queue.py lines 22-57 by hand, pool of 60 cells, adapters of 8 cells, prompts of 10, outputs of 3.

    A: entries [(11, 2)], adapters 8 cells: peak 2·1 + 11 = 13 < 60 - 8; admitted. B: [(11, 2), (11, 2)],
    16 cells: peak max(13, 2·2 + 22) = 26 < 44; admitted. C: three entries, 24 cells: peak 2·3 + 33 = 39,
    not below 36: C waits (it would fit were the adapters' cells not counted: 39 < 60). A and B decode twice,
    finish at the second decode and their adapters are dropped with the batch (manager.py lines 306-339);
    then C is admitted alone and its adapter loaded (lines 182-196)."""
    router = _router(60)
    a, b, c = _req(0, 10, 3, 0), _req(1, 10, 3, 1), _req(2, 10, 3, 2)
    for r in (a, b, c):
        assert router.add(r, 0.0)
    step, _ = _run_step(router, 0.0)
    assert step.prefill == [a, b] and step.loaded == [0, 1] and list(router.waiting) == [c]
    assert router.pool.kv == 20 and router.pool.adapters == 16
    step, done = _run_step(router, 1.0)
    assert step.decode == [a, b] and not done and router.pool.kv == 22
    step, done = _run_step(router, 2.0)
    assert done == [a, b] and router.pool.kv == 0 and router.pool.adapters == 0 and not router.pool.resident
    step, _ = _run_step(router, 3.0)
    assert step.prefill == [c] and step.loaded == [2] and router.pool.adapters == 8


def test_a_batch_mixes_any_number_of_adapters() -> None:
    """No max_loras: eight requests of eight adapters run in one batch when the pool holds them."""
    router = _router(10_000)
    reqs = [_req(i, 10, 3, i) for i in range(8)]
    for r in reqs:
        router.add(r, 0.0)
    step, _ = _run_step(router, 0.0)
    assert step.prefill == reqs and step.loaded == list(range(8))
    step, _ = _run_step(router, 1.0)
    assert len({r.adapter for r in step.decode}) == 8


def test_a_mini_batch_waits_for_max_wait_tokens_decodes_and_stalls_the_batch() -> None:
    """manager.py lines 213-249: a request arriving while a batch runs is admitted only after
    `max_wait_tokens` decode steps, in a prefill-only step, while the running request waits (its next gap
    spans that step). An adapter still in use is not loaded again."""
    router = _router(10_000, wait=2)
    a, b = _req(0, 10, 8, 0), _req(1, 10, 4, 0, arrival=0.5)
    router.add(a, 0.0)
    _run_step(router, 0.0)  # A's prefill
    router.add(b, 0.5)
    kinds = []
    for t in range(1, 5):
        step, _ = _run_step(router, float(t))
        kinds.append("prefill" if step.prefill else "decode")
        if step.prefill:
            assert step.prefill == [b] and step.loaded == []  # adapter 0 is resident: A uses it
    assert kinds == ["decode", "decode", "prefill", "decode"]
    assert a.stalls is not None and len(a.stalls) == 1  # A sat out B's prefill


def test_a_finish_drops_the_adapters_no_running_request_uses() -> None:
    """infer_adapter.py lines 186-254: after a decode step that finishes a request, every resident adapter
    outside the remaining batch is freed."""
    router = _router(10_000)
    short, long = _req(0, 10, 2, 0), _req(1, 10, 5, 1)
    router.add(short, 0.0)
    router.add(long, 0.0)
    _run_step(router, 0.0)
    assert set(router.pool.resident) == {0, 1}
    _, done = _run_step(router, 1.0)
    assert done == [short] and set(router.pool.resident) == {1}


def test_prefetch_loads_the_queues_adapters_off_the_step() -> None:
    """manager.py lines 215-225: with prefetch, the 1st decode step after `max_wait_tokens // 2` loads the
    queue's head's adapters, and the mini-batch's prefill then loads nothing."""
    router = _router(10_000, wait=2, prefetch=True)
    a, b = _req(0, 10, 8, 0), _req(1, 10, 4, 5)
    router.add(a, 0.0)
    _run_step(router, 0.0)
    router.add(b, 0.5)
    _run_step(router, 1.0)  # wait_tokens 0: a decode
    _run_step(router, 2.0)  # wait_tokens 1 = 2 // 2: prefetch adapter 5
    assert 5 in router.pool.resident
    step, _ = _run_step(router, 3.0)
    assert step.prefill == [b] and step.loaded == []


def _scenario(**policy: Any) -> dict[str, Any]:
    return {
        "name": "slora-test",
        "seed": 3,
        "model": {"name": "llama-2-7b", "gpu": "A100-80GB", "max_model_len": 2048},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 8.0},
            "prompt": {"kind": "uniform", "low": 8, "high": 256},
            "output": {"kind": "uniform", "low": 8, "high": 64},
            "lora": {"adapters": 200, "popularity": "uniform", "rank": 8},
        },  # fmt: skip
        "horizon": {"max_requests": 150, "drain": True},
        "policies": {"s": {"scheduler": "slora", **policy}},
    }


def test_a_run_reports_its_adapters_and_loads(tmp_path: Any) -> None:
    scenario = validate_scenario(_scenario(max_new_tokens="output"), "t.toml")
    result = run_policy(scenario, "s", tmp_path)
    lora = result.summary["lora"]
    model = load_model("llama-2-7b")
    size = adapter_bytes(model, 8, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert lora["adapter_bytes"] == size and lora["adapter_cells"] == 32  # 4 x rank, as S-LoRA's a_len
    assert lora["adapter_cells"] == math.ceil(size / (2 * 32 * 4096 * 2))
    assert result.summary["requests"]["finished"] == 150
    assert lora["loads"] > 0 and lora["distinct_per_step_mean"] > 1
    assert {"lora_adapters", "lora_loads", "lora_load_s"} <= set(result.steps.collect_schema().names())


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda d: d["policies"]["s"].update(max_loras=4), "policies.s"),
        (lambda d: d["policies"]["s"].update(max_wait_tokens=0), "policies.s.max_wait_tokens"),
        (lambda d: d["policies"]["s"].update(max_new_tokens="eos"), "policies.s.max_new_tokens"),
        (lambda d: d["policies"]["s"].update(engine="vllm-2023"), "policies.s"),
        (lambda d: d.update(cluster={"groups": [{"count": 2}]}), "policies.s.scheduler"),
    ],
)
def test_bad_slora_input_names_the_key(change: Any, key: str) -> None:
    data = _scenario()
    change(data)
    with pytest.raises(SimError) as err:
        validate_scenario(data, "t.toml")
    assert f"t.toml: {key}" in str(err.value) and "\n" not in str(err.value)


def test_what_slora_cannot_run_is_refused_at_the_run(tmp_path: Any) -> None:
    too_big = validate_scenario(_scenario(max_total_token_num=10_000_000), "t.toml")
    with pytest.raises(SimError, match=r"t.toml: policies.s.max_total_token_num: 10,000,000 cells"):
        run_policy(too_big, "s", tmp_path, source="t.toml")
    data = _scenario()
    data["workload"]["lora"]["target_modules"] = ["q_proj", "gate_proj"]
    with pytest.raises(SimError, match=r"t.toml: workload.lora.target_modules: S-LoRA's adapters adapt q"):
        run_policy(validate_scenario(data, "t.toml"), "s", tmp_path, source="t.toml")
