"""`sim papers`' step-cost cells (`step_time`, `request_time`): read from the policy's cost model, they run
nothing; and Splitwise's comparisons, which hold only such cells."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sim.config.papers import Cell, load_paper
from sim.config.scenario import load_scenario
from sim.io.errors import SimError
from sim.report.papers_page import write_papers_page
from sim.studies.paper_steps import policy_cost, step_value, step_values
from sim.studies.papers import judge_value, run_comparison, unexpected

PAPERS = Path(__file__).parent.parent / "scenarios" / "papers"
A100 = PAPERS / "splitwise-a100.toml"


def cell(**fields: Any) -> Cell:
    return Cell.model_validate({"name": "c", "source": "s", "policies": ["vllm"], "low": 1.0, **fields})


def test_a_prompt_step_is_one_step_of_the_batchs_prompts() -> None:
    cost = policy_cost(load_scenario(A100), "vllm", "test")
    prompt = cell(figure="step_time", phase="prompt", batch=4, prompt=512)
    expected = cost.step(np.full(4, 512), np.zeros(4, dtype=np.int64)).seconds * 1e3
    assert step_value(prompt, cost) == pytest.approx(expected)


def test_a_token_step_is_the_mean_over_the_decode_steps_after_the_prompt() -> None:
    cost = policy_cost(load_scenario(A100), "vllm", "test")
    token = cell(figure="step_time", phase="token", batch=2, prompt=100, output=4)
    steps = [cost.step(np.ones(2, dtype=np.int64), np.full(2, c)).seconds for c in (100, 101, 102)]
    assert step_value(token, cost) == pytest.approx(np.mean(steps) * 1e3)


def test_a_request_alone_is_its_prompt_step_then_output_minus_one_token_steps() -> None:
    cost = policy_cost(load_scenario(A100), "vllm", "test")
    ttft, tbt, e2e = (
        step_value(cell(figure="request_time", metric=m, prompt=1020, output=129), cost)
        for m in ("ttft", "tpot", "e2e")
    )
    assert e2e == pytest.approx(ttft + 128 * tbt)
    assert ttft == pytest.approx(step_value(cell(figure="step_time", phase="prompt", prompt=1020), cost))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"figure": "step_time", "prompt": 512}, "phase: step_time times"),
        ({"figure": "step_time", "phase": "token", "prompt": 512}, "output: a token step needs"),
        ({"figure": "request_time", "metric": "e2e", "prompt": 512}, "output: request_time needs"),
        ({"figure": "request_time", "metric": "itl", "prompt": 512, "output": 8}, "metric: request_time"),
        ({"figure": "request_time", "prompt": 512, "output": 8, "batch": 2}, "batch, phase: request_time"),
        ({"figure": "step_time", "phase": "prompt", "prompt": 512, "rate": 1.0}, "rate: step_time is read"),
        ({"figure": "step_time", "phase": "prompt"}, "prompt: step_time needs"),
    ],
)
def test_a_step_cell_says_what_it_lacks(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cell(**fields)


def test_a_step_cell_names_a_policy_of_its_scenario() -> None:
    with pytest.raises(SimError, match="no policy 'other' \\(policies: vllm\\)"):
        step_values([cell(figure="step_time", phase="prompt", prompt=8, policies=["other"])], A100)


@pytest.mark.parametrize("name", ["splitwise-a100", "splitwise-h100"])
def test_splitwise_measured_steps_reduced_form(tmp_path: Path, name: str) -> None:
    """Step-cost cells alone: nothing is swept, and every miss, in the quick form and the full one, is a
    stated gap. The prompt steps of 1,024 and 2,048 tokens (the ones the measured engine's floor and its
    long-prompt growth leave alone) are below the measured engine's, by its TP-8 prompt step's gap to
    today's vLLM (docs/papers.md): 0.59-0.77 of it, not the 0.83-0.99 that a fitted all-reduce, overcharging
    TP 8, gave."""
    comparison = run_comparison(PAPERS / f"{name}.paper.toml", tmp_path / name, 1, True, None)
    assert comparison.sweep is None and not (tmp_path / name).exists()
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    full = [judge_value(v.cell, v.value) for v in comparison.verdicts if v.value is not None]
    assert not [v.cell.name for v in full if v.status == "DIFFERS"]
    verdicts = {v.cell.name: v for v in comparison.verdicts}
    for tokens in (1024, 2048):
        verdict = verdicts[f"prompt step, 1 x {tokens} tokens (ms)"]
        assert verdict.value is not None and 0.55 <= verdict.value / verdict.cell.low <= 0.8, verdict.shown
    assert len(comparison.verdicts) == len(load_paper(PAPERS / f"{name}.paper.toml").cells) == 20
    page = write_papers_page([comparison], tmp_path, quick=True, png=False).read_text()
    assert 'data-chart="c0-cells"' in page


def test_a_cell_on_another_gpu_and_its_ratio_to_a_third() -> None:
    ttft = cell(figure="request_time", metric="ttft", prompt=1020, output=129)
    on_h100 = ttft.model_copy(update={"gpu": "H100-SXM"})
    ratio = on_h100.model_copy(update={"over_gpu": "A100-80GB"})
    a100, h100, h100_over_a100 = step_values([ttft, on_h100, ratio], A100)
    assert h100 < a100 and h100_over_a100 == pytest.approx(h100 / a100)
    with pytest.raises(SimError, match="gpu 'B200-X'.*model.gpu"):
        step_values([ttft.model_copy(update={"gpu": "B200-X"})], A100)


def test_only_a_step_cost_cell_takes_step_keys() -> None:
    with pytest.raises(ValueError, match="gpu: only step_time and request_time cells read step costs"):
        cell(figure="batch_size", rate=1.0, gpu="H100-SXM")
    with pytest.raises(ValueError, match="prompt, batch: only step_time"):
        cell(figure="attainment", rate=1.0, prompt=512, batch=4)


def test_splitwise_table_iv_reduced_form(tmp_path: Path) -> None:
    """Table IV: the TBT and E2E H100 / A100 ratios match within 25%; the TTFT ratios, 0.72-0.75 of the
    table's, are a stated gap (the artifact's H100 prompt step is further from today's vLLM than its A100's).
    Every TTFT is below the table's, within 0.5-1.0 of it; those that miss 25% (the full form's tolerance)
    are stated gaps of the measured engine's TP-8 prompt step (docs/papers.md). TBT and E2E are stated
    gaps."""
    comparison = run_comparison(PAPERS / "splitwise-table4.paper.toml", tmp_path / "t4", 1, True, None)
    assert comparison.sweep is None
    assert not unexpected([comparison]), [(v.cell.name, v.shown) for v in unexpected([comparison])]
    for verdict in comparison.verdicts:
        assert verdict.value is not None and verdict.ratio is not None
        if verdict.cell.over_gpu is not None and "TTFT" in verdict.cell.name:
            assert 0.65 <= verdict.ratio < 0.75 and verdict.cell.known_gap, (verdict.cell.name, verdict.shown)
        elif verdict.cell.over_gpu is not None:
            assert 0.75 <= verdict.ratio <= 1.25, (verdict.cell.name, verdict.shown)
        elif "TTFT" in verdict.cell.name:
            assert 0.5 <= verdict.ratio < 1.0, (verdict.cell.name, verdict.shown)
        else:
            assert verdict.cell.known_gap is not None, verdict.cell.name
    full = [judge_value(v.cell, v.value) for v in comparison.verdicts if v.value is not None]
    assert not [v.cell.name for v in full if v.status == "DIFFERS"]
    assert (
        sum("TTFT" in v.cell.name and v.cell.over_gpu is None and v.passed for v in full) == 2
    )  # the A100s'
    assert sum(v.cell.over_gpu is not None for v in comparison.verdicts) == 6
