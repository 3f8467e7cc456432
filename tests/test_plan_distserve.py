"""DistServe's motivating example (`scenarios/distserve-opt13b.toml`) at 28 req/s within 4 A100s: 3 GPUs
serve it neither colocated nor as 2 prefill + 1 decode (the one decode GPU cannot keep the TPOT bound), 4
colocated fail it, and `sim plan` answers the 2 prefill + 2 decode split at the same price."""

from __future__ import annotations

from pathlib import Path

from sim.studies import plan

SCENARIO = Path(__file__).parent.parent / "scenarios" / "distserve-opt13b.toml"


def test_plan_finds_the_disaggregated_split_when_it_is_the_better_one() -> None:
    result = plan.search(SCENARIO, [], 28.0, ["A100-80GB"], max_gpus=4, jobs=1, tps=[1])
    assert result.best is not None
    assert (result.best["mode"], result.best["counts"]) == ("pd", [2, 2])
    verdicts = {r["config"]: r["verdict"] for r in result.rows}
    assert verdicts["4x A100-80GB TP1"] != "meets"  # same cost, the colocated fleet does not serve it
    assert verdicts["3x A100-80GB TP1"] == "fails"
    assert verdicts["2P+1D x A100-80GB TP1"] == "fails"  # one decode GPU: the split on 3 GPUs fails too
