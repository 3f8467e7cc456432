"""DistServe's motivating example (`scenarios/distserve-opt13b.toml`): at a rate 3 colocated A100s cannot
serve within the SLO, `sim plan` answers the 2 prefill + 1 decode split on the same 3 GPUs."""

from __future__ import annotations

from pathlib import Path

from sim.studies import plan

SCENARIO = Path(__file__).parent.parent / "scenarios" / "distserve-opt13b.toml"


def test_plan_finds_the_disaggregated_split_when_it_is_the_better_one() -> None:
    result = plan.search(SCENARIO, [], 28.0, ["A100-80GB"], max_gpus=3, jobs=1, tps=[1])
    assert result.best is not None
    assert (result.best["mode"], result.best["counts"]) == ("pd", [2, 1])
    verdicts = {r["config"]: r["verdict"] for r in result.rows}
    assert verdicts["3x A100-80GB TP1"] != "meets"  # same cost, the colocated fleet does not serve it
