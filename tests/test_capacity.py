"""KV capacity: the hand-checked memory split, the fit error, and the `sim capacity` command."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sim.catalog.gpus import get_gpu
from sim.catalog.models import load_model
from sim.cli import app
from sim.cost.memory import kv_memory, reserve_bytes
from sim.io.errors import SimError

runner = CliRunner()


def test_llama2_7b_on_a100_80gb_by_hand() -> None:
    m, g = load_model("llama-2-7b"), get_gpu("A100-80GB")
    kv = kv_memory(m, g, gpu_memory_utilization=0.9)
    budget = int(84_987_000_000 * 0.9)  # driver-reported total x utilization
    weights = 6_738_415_616 * 2  # Llama-2-7B parameters x fp16
    reserve = int(0.15 * 2**30) + 2048 * 2 * (4096 + 2 * 11008) + 256 * 32_000 * 32
    available = budget - weights - reserve
    per_token = 32 * 2 * 32 * 128 * 2  # layers x (K, V) x KV heads x head_dim x bytes
    blocks = available // (16 * per_token)
    assert (kv.budget_bytes, kv.weight_bytes, kv.reserve_bytes) == (budget, weights, reserve)
    assert kv.kv_bytes_available == available
    assert kv.kv_bytes_per_token == per_token == 524_288
    assert kv.num_blocks == blocks == 7448
    # The seed identity: KV bytes available / KV bytes per token / max_model_len (whole blocks).
    assert kv.max_seqs(4096) == available // per_token // 4096 == 29
    assert kv.max_seqs(1024) == 116


def test_reserve_tracks_vllm_block_counts_on_h100() -> None:
    # Real vLLM (H100, 0.9, 2048 batched tokens) allocated 7,463 blocks for Llama-2-7B, 65,352 for Qwen2.5-7B.
    g = get_gpu("H100")
    assert kv_memory(load_model("llama-2-7b"), g).num_blocks == pytest.approx(7463, rel=0.015)
    assert kv_memory(load_model("qwen2.5-7b"), g).num_blocks == pytest.approx(65_352, rel=0.015)
    assert reserve_bytes(load_model("qwen2.5-7b")) > reserve_bytes(load_model("llama-2-7b"))


def test_tp_shards_weights_and_kv_heads() -> None:
    m, g = load_model("llama-2-70b"), get_gpu("H100")
    kv = kv_memory(m, g, tp=4)
    assert kv.weight_bytes == int(m.weight_bytes() / 4)
    assert kv.kv_bytes_per_token == 327_680 // 4


def test_weights_that_do_not_fit() -> None:
    with pytest.raises(SimError, match=r"by \d+\.\d GB; it fits with --tp 8"):
        kv_memory(load_model("llama-2-70b"), get_gpu("L4"))
    with pytest.raises(SimError, match="--weight-dtype fp8"):
        kv_memory(load_model("llama-3.1-8b"), get_gpu("T4"))


def test_tp_must_divide_heads() -> None:
    with pytest.raises(SimError, match="must divide"):
        kv_memory(load_model("llama-2-7b"), get_gpu("H100"), tp=3)


def test_cli_table_shows_the_arithmetic() -> None:
    r = runner.invoke(app, ["capacity", "llama-2-7b", "--gpu", "A100-80GB", "--max-model-len", "4096"])
    assert r.exit_code == 0, r.output
    for text in ("524,288 B", "7,448", "13.48 GB", "256 blocks per seq", "29"):
        assert text in r.output


def test_cli_json() -> None:
    args = ["capacity", "llama-2-7b", "--gpu", "a100-80gb", "--max-model-len", "4096", "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["num_blocks"] == 7448 and data["max_seqs_at_max_model_len"] == 29
    assert isinstance(data["kv_bytes_available"], int) and data["kv_bytes_per_token"] == 524_288


def test_cli_compare_explains_mha_vs_gqa() -> None:
    r = runner.invoke(app, ["capacity", "--compare", "llama-2-7b", "mistral-7b", "--gpu", "A100-80GB"])
    assert r.exit_code == 0, r.output
    assert "MHA" in r.output and "GQA" in r.output and "4.0x" in r.output
    r = runner.invoke(app, ["capacity", "--compare", "llama-2-7b", "mistral-7b", "--gpu", "H100", "--json"])
    data = json.loads(r.output)
    assert [d["model"] for d in data["models"]] == ["llama-2-7b", "mistral-7b"]
    assert {d["max_model_len"] for d in data["models"]} == {4096}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["capacity", "llama-2-7", "--gpu", "H100"], "unknown model 'llama-2-7'"),
        (["capacity", "llama-2-7b", "--gpu", "H1000"], "unknown GPU 'H1000'"),
        (["capacity", "llama-2-70b", "--gpu", "L4"], "does not fit on L4"),
        (["capacity", "llama-2-7b", "mistral-7b", "--gpu", "H100"], "--compare"),
    ],
)
def test_cli_user_errors_exit_2(args: list[str], message: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert "error: " in r.output and message in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
