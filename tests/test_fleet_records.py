"""A fleet's records streamed to Parquet as the run goes are the records it keeps in memory."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from sim.config.scenario import load_scenario
from sim.fleet.run import REPLICA_RECORDS
from sim.studies.run import run_policy, run_to_folder

ROOT = Path(__file__).resolve().parents[1]
RAG = ROOT / "scenarios" / "rag-chatbot.toml"
COLOCATED = ["cluster.groups=[{count=3}]", "cluster.router='least_outstanding'"]
DISAGGREGATED = [
    "cluster.groups=[{name='p', count=1, role='prefill'}, {name='d', count=2, role='decode'}]",
    "cluster.link='nvlink-4'",
]


@pytest.mark.parametrize("chunk", [None, 7], ids=["one-chunk", "many-chunks"])
@pytest.mark.parametrize("cluster", [COLOCATED, DISAGGREGATED], ids=["colocated", "disaggregated"])
def test_streamed_fleet_records_equal_the_in_memory_ones(
    tmp_path: Path, cluster: list[str], chunk: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streamed: each replica's records in chunks, merged by id range; kept: one sort in memory. With
    `chunk` rows, the replicas hand on chunks of a few rows and the merge takes many id ranges."""
    if chunk is not None:
        monkeypatch.setattr("sim.fleet.engine.MIN_CHUNK_ROWS", chunk)
        monkeypatch.setattr("sim.fleet.engine.CHUNK_ROWS", chunk)
        monkeypatch.setattr("sim.fleet.run.CHUNK_ROWS", chunk)
    sc = load_scenario(RAG, ["horizon.duration_s=20", *cluster])
    kept = run_policy(sc, "vllm", RAG.parent)
    streamed = run_to_folder(sc, "vllm", tmp_path, RAG.parent)
    folder = tmp_path / "vllm"
    requests = pl.read_parquet(folder / "requests.parquet")
    steps = pl.read_parquet(folder / "steps.parquet")
    assert isinstance(kept.requests, pl.DataFrame) and isinstance(kept.steps, pl.DataFrame)
    assert requests.height > 50 and requests["id"].is_sorted()
    assert requests.equals(kept.requests) and steps.equals(kept.steps)
    assert json.loads((folder / "summary.json").read_text()) == json.loads(json.dumps(kept.summary))
    assert streamed.summary == kept.summary
    assert not (folder / REPLICA_RECORDS).exists()  # the replicas' parts are merged and gone
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "requests.parquet",
        "steps.parquet",
        "summary.json",
    ]
