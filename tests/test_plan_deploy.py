"""`sim plan`'s answer as a team launches it (`vllm serve` per group), its throughput front, and the
aggregated-versus-disaggregated comparison."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import app
from sim.config.scenario import load_scenario
from sim.report.plan_deploy import launch_plan
from sim.report.plan_front import comparison, comparison_sentences, throughput_chart, throughput_points

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "scenarios" / "plan-llama70b-chat.toml"

# vLLM's engine arguments, as `vllm serve --help` names them: `EngineArgs` fields of
# vllm/engine/arg_utils.py (vllm-project/vllm), `--` + the field name with dashes, and the `--no-` form its
# boolean flags take (argparse.BooleanOptionalAction, vLLM's engine-args documentation).
VLLM_SERVE_FLAGS = {
    "--tensor-parallel-size", "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
    "--gpu-memory-utilization", "--block-size", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--quantization", "--kv-cache-dtype",
    "--kv-transfer-config",
}  # fmt: skip
# The placement's: EngineArgs' pipeline_parallel_size, enable_expert_parallel, data_parallel_size,
# data_parallel_size_local and distributed_executor_backend.
VLLM_PLACEMENT_FLAGS = {
    "--pipeline-parallel-size", "--enable-expert-parallel", "--data-parallel-size",
    "--data-parallel-size-local", "--distributed-executor-backend",
}  # fmt: skip
DEEPSEEK = ROOT / "scenarios" / "deepseek-v3-placement.toml"


def _flags(argv: tuple[str, ...]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


def test_launch_lines_use_only_vllm_flags_and_give_each_role_its_own_tp() -> None:
    groups = (
        "cluster.groups=[{name='prefill',count=6,role='prefill',tp=2},"
        "{name='decode',count=1,role='decode',tp=4}]"
    )
    sc = load_scenario(
        PLAN, [groups, "cluster.link='infiniband-ndr'", "policies.vllm.max_num_batched_tokens=4096"]
    )
    launches, routing = launch_plan(sc, "vllm")
    pre, dec = launches
    assert (pre.role, pre.count, pre.tp, dec.role, dec.count, dec.tp) == ("prefill", 6, 2, "decode", 1, 4)
    for g in launches:
        assert g.argv[:3] == ("vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct")
        assert _flags(g.argv) <= VLLM_SERVE_FLAGS, _flags(g.argv) - VLLM_SERVE_FLAGS
        assert shlex.split(g.command) == list(g.argv)
        kv = json.loads(g.argv[g.argv.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        assert g.argv[g.argv.index("--max-num-batched-tokens") + 1] == "4096"
        assert g.argv[g.argv.index("--max-num-seqs") + 1] == "256"
    assert pre.argv[pre.argv.index("--tensor-parallel-size") + 1] == "2"
    assert dec.argv[dec.argv.index("--tensor-parallel-size") + 1] == "4"
    assert "6 prefill instances" in routing and "1 decode" in routing and "infiniband-ndr" in routing


def test_launch_line_carries_quantisation_kv_dtype_and_chunking() -> None:
    sc = load_scenario(PLAN, [
        "model.weight_dtype='fp8'", "model.kv_dtype='fp8'", "policies.vllm.enable_chunked_prefill=false",
        "policies.vllm.max_num_batched_tokens=8192", "policies.vllm.enable_prefix_caching=true",
    ])  # fmt: skip
    (only,), routing = launch_plan(sc, "vllm")
    argv = only.argv
    assert _flags(argv) <= VLLM_SERVE_FLAGS
    assert (
        argv[argv.index("--quantization") + 1] == "fp8" and argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    )
    assert "--no-enable-chunked-prefill" in argv and "--enable-prefix-caching" in argv
    assert "--kv-transfer-config" not in argv and "2 replicas" in routing


def _row(config: str, mode: str, gpus: int, tokens: float, tpot: float, ok: bool, cost: float) -> dict:
    return {"config": config, "mode": mode, "gpus": gpus, "output_tokens_per_s": tokens, "tpot_p50": tpot,
            "meets_slo": ok, "verdict": "meets" if ok else "fails", "cost_per_hour": cost}  # fmt: skip


def test_throughput_front_and_comparison_by_hand() -> None:
    rows = [
        _row("a", "colocated", 4, 4000.0, 0.02, True, 4.0),  # 1000 tok/s/GPU, 50 tok/s/user
        _row("b", "pd", 4, 4800.0, 0.025, True, 4.0),  # 1200, 40
        _row("c", "colocated", 8, 6400.0, 0.025, True, 8.0),  # 800, 40: beaten by b on both
        _row("d", "pd", 2, 1000.0, 0.01, False, 2.0),  # 500, 100
    ]
    pts = throughput_points(rows)
    assert dict(zip(pts["config"], pts["on_front"], strict=True)) == {
        "a": True,
        "b": True,
        "c": False,
        "d": True,
    }
    throughput_chart(pts).to_dict(validate=True)
    cmp = comparison(rows)
    assert cmp["cheapest"]["colocated"]["config"] == "a" and cmp["cheapest"]["pd"]["config"] == "b"
    (four,) = cmp["equal_gpus"]
    assert four["gpus"] == 4 and four["pd_gain"] == pytest.approx(1.2)
    # the verdict's margins, side by side (at one rate both serve about the same tokens)
    rows[0] |= {"metric_mean": 0.95, "metric": "judged attainment"}
    rows[1] |= {"metric_mean": 0.99, "metric": "judged attainment"}
    (four,) = comparison(rows)["equal_gpus"]
    assert (four["colocated_margin"], four["pd_margin"]) == (0.95, 0.99)
    assert "judged attainment: 0.95 against 0.99." in comparison_sentences(comparison(rows))[-1]


def test_plan_files_carry_the_launch_and_the_comparison(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    res = runner.invoke(
        app, ["plan", str(PLAN), "--rate", "2", "--gpus", "H100-SXM", "--tp", "4", "--max-gpus", "8",
              "--modes", "colocated,pd", "--replications", "1", "--max-replications", "1", "--jobs", "1",
              "--set", "horizon.duration_s=40", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    info = json.loads((out / "plan.json").read_text())
    assert info["best"] is not None
    (group,) = info["deploy"]["groups"]
    assert group["command"].startswith(
        "vllm serve meta-llama/Llama-3.1-70B-Instruct --tensor-parallel-size 4"
    )
    assert "aggregated_vs_disaggregated" in info and "cheapest" in info["aggregated_vs_disaggregated"]
    html = (out / "index.html").read_text()
    assert "vllm serve meta-llama/Llama-3.1-70B-Instruct" in html and 'data-chart="throughput"' in html
    assert "Cheapest aggregated (colocated) meeting the SLO" in html
    assert "launch 1 x g0 (both): vllm serve" in res.output


def _value(argv: tuple[str, ...], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_launch_lines_carry_the_placement_as_vllm_flags() -> None:
    """EP 16 with DP attention over two nodes of 8: --enable-expert-parallel, --data-parallel-size 16 and 8
    ranks a node, a line each node runs; TP 8 x PP 2 over two nodes: one instance over a Ray cluster; TP 4 x
    PP 2 on one node: the stages alone. Every flag is one of vLLM's engine arguments."""
    ep = load_scenario(DEEPSEEK, ["cluster.groups=[{name='ep16', tp=1, dp=16, ep=16}]"])
    (g,) = launch_plan(ep, "vllm")[0]
    assert _flags(g.argv) <= VLLM_SERVE_FLAGS | VLLM_PLACEMENT_FLAGS, _flags(g.argv) - VLLM_SERVE_FLAGS
    assert g.argv[:3] == ("vllm", "serve", "deepseek-ai/DeepSeek-V3")
    assert "--enable-expert-parallel" in g.argv and _value(g.argv, "--tensor-parallel-size") == "1"
    assert (
        _value(g.argv, "--data-parallel-size") == "16" and _value(g.argv, "--data-parallel-size-local") == "8"
    )
    assert "--pipeline-parallel-size" not in g.argv and g.placement == "DP16 EP16 (2 nodes)"
    assert (
        "spans 2 nodes" in g.notes[0]
        and "--headless --data-parallel-start-rank 8 on the second" in g.notes[0]
    )
    pp = load_scenario(DEEPSEEK, ["cluster.groups=[{name='pp', tp=8, pp=2}]"])
    (g,) = launch_plan(pp, "vllm")[0]
    assert _flags(g.argv) <= VLLM_SERVE_FLAGS | VLLM_PLACEMENT_FLAGS
    assert (
        _value(g.argv, "--pipeline-parallel-size") == "2" and _value(g.argv, "--tensor-parallel-size") == "8"
    )
    assert _value(g.argv, "--distributed-executor-backend") == "ray" and "Ray cluster" in g.notes[0]
    assert not {"--enable-expert-parallel", "--data-parallel-size"} & _flags(g.argv)
    one = load_scenario(PLAN, ["cluster.groups=[{tp=4, pp=2}]"])
    (g,) = launch_plan(one, "vllm")[0]
    assert _value(g.argv, "--pipeline-parallel-size") == "2" and not g.notes and g.placement == "PP2"
    assert "--distributed-executor-backend" not in g.argv and "--data-parallel-size-local" not in g.argv
    plain = load_scenario(PLAN)
    (g,) = launch_plan(plain, "vllm")[0]
    assert not _flags(g.argv) & VLLM_PLACEMENT_FLAGS and "placement" not in g.as_dict()
