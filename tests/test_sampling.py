"""Sampling parameters per request: the table, trace columns, generation_config.json defaults, and a sampler
cost that follows each batch's stages as vLLM V1's sampler runs them (sim/cost/sampler.py)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog.generation import generation_defaults
from sim.catalog.gpus import get_gpu
from sim.config.calibration import Calibration
from sim.config.scenario import validate_scenario
from sim.core.sampling import SamplingParams
from sim.cost.sampler import BatchSampling, RowSampler, SamplerCost, resolve
from sim.io.errors import SimError
from sim.studies.run import run_policy
from sim.workload.generator import Workload

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 128_256  # Llama-3.1-8B

BASE: dict[str, Any] = {
    "name": "sampling-test",
    "seed": 7,
    "model": {"name": "llama-3.1-8b", "gpu": "H100-SXM", "max_model_len": 2048},
    "workload": {
        "arrival": {"kind": "poisson", "rate": 20.0},
        "prompt": {"kind": "fixed", "value": 100},
        "output": {"kind": "fixed", "value": 60},
    },
    "horizon": {"max_requests": 60},
    "policies": {"vllm": {"scheduler": "vllm"}},
}


def _scenario(sampling: dict[str, Any] | None, **model: Any) -> Any:
    data = copy.deepcopy(BASE)
    data["model"].update(model)
    if sampling is not None:
        data["workload"]["sampling"] = sampling
    return validate_scenario(data, "test")


def _sampler() -> SamplerCost:
    cal = Calibration()
    return SamplerCost(VOCAB, get_gpu("H100-SXM").hbm_bandwidth * cal.bandwidth_eff, cal.sampler_s_per_entry)


def _batch(*rows: SamplingParams, tokens: int = 0) -> BatchSampling:
    b = BatchSampling()
    for p in rows:
        b.add(resolve(p, {}), tokens)
    return b


# --- the sampler's stages, by hand --------------------------------------------------------------------


def test_greedy_is_an_argmax_and_top_p_the_fitted_sort() -> None:
    s, cal = _sampler(), Calibration()
    byte_s = 1.0 / (get_gpu("H100-SXM").hbm_bandwidth * cal.bandwidth_eff)
    greedy = _batch(*[SamplingParams(temperature=0.0)] * 128)
    assert s.seconds(greedy) == pytest.approx(128 * VOCAB * (6 + 4) * byte_s, rel=1e-12)  # cast + argmax
    top_p = _batch(*[SamplingParams(temperature=0.7, top_p=0.9)] * 128)
    expected = 128 * VOCAB * ((6 + 44) * byte_s + cal.sampler_s_per_entry)
    assert s.seconds(top_p) == pytest.approx(expected, rel=1e-12)
    assert s.seconds(top_p) > 30 * s.seconds(greedy)  # the sort dominates: ~5 ms a step at batch 128


def test_a_batch_pays_for_its_most_expensive_stage_on_every_row() -> None:
    """One top-p row among 127 greedy ones: vLLM sorts the whole batch's logits, and runs both the argmax
    and the random draw over every row."""
    s, cal = _sampler(), Calibration()
    mixed = _batch(SamplingParams(temperature=0.7, top_p=0.9), *[SamplingParams(temperature=0.0)] * 127)
    assert mixed.greedy and mixed.random and mixed.top_p
    byte_s = 1.0 / (get_gpu("H100-SXM").hbm_bandwidth * cal.bandwidth_eff)
    expected = 128 * VOCAB * ((6 + 4 + 44) * byte_s + cal.sampler_s_per_entry)
    assert s.seconds(mixed) == pytest.approx(expected, rel=1e-12)


def test_greedy_rows_drop_top_p_and_top_k_as_vllm_does() -> None:
    p = resolve(SamplingParams(temperature=0.0, top_p=0.5, top_k=40, min_p=0.1), {})
    assert (p.top_p, p.top_k, p.min_p) == (1.0, 0, 0.0)
    assert not _batch(SamplingParams(temperature=0.0, top_p=0.5)).top_p


def test_penalties_read_the_output_history_and_logprobs_add_a_gather() -> None:
    s = _sampler()
    plain = s.seconds(_batch(SamplingParams(temperature=1.0), tokens=1000))
    short = s.seconds(_batch(SamplingParams(temperature=1.0, repetition_penalty=1.2), tokens=100))
    long = s.seconds(_batch(SamplingParams(temperature=1.0, repetition_penalty=1.2), tokens=100_000))
    assert plain < short < long  # the penalties' passes, then a read of every token so far
    assert s.seconds(_batch(SamplingParams(temperature=1.0, logprobs=5))) > plain
    assert s.seconds(_batch(SamplingParams(temperature=1.0, seed=3))) > plain  # its own generator launch
    assert s.seconds(_batch(SamplingParams(temperature=1.0, structured_output="json"))) > plain


def test_top_k_alone_selects_without_a_sort() -> None:
    s = _sampler()
    top_k = s.seconds(_batch(SamplingParams(temperature=1.0, top_k=50)))
    both = s.seconds(_batch(SamplingParams(temperature=1.0, top_k=50, top_p=0.9)))
    assert s.seconds(_batch(SamplingParams(temperature=1.0))) < top_k < both


# --- end to end ---------------------------------------------------------------------------------------


def _tpot(sc: Any, policy: str = "vllm") -> float:
    return float(run_policy(sc, policy, ROOT).summary["latency"]["tpot"]["mean"])


def test_greedy_requests_decode_faster_than_top_p_and_the_default_keeps_its_figures() -> None:
    none = run_policy(_scenario(None), "vllm", ROOT).summary
    top_p = _tpot(_scenario({"temperature": 0.7, "top_p": 0.9}))
    greedy = _tpot(_scenario({"temperature": 0.0}))
    assert greedy < none["latency"]["tpot"]["mean"] < top_p  # the default charges the sort (as before)
    again = run_policy(_scenario(None), "vllm", ROOT).summary
    assert json.dumps(again, sort_keys=True) == json.dumps(none, sort_keys=True)


def test_profiles_are_drawn_by_share_and_deterministic() -> None:
    sc = _scenario(
        {"temperature": 0.7, "profiles": [{"share": 3, "top_p": 0.9}, {"share": 1, "temperature": 0}]}
    )
    w = Workload(sc.workload, 7, ROOT)
    rows = [r.sampling for r in w.open_loop(4000, None)]
    table = w.sampling.table
    assert table[0] == SamplingParams(temperature=0.7, top_p=0.9)
    assert table[1] == SamplingParams(temperature=0.0)
    assert np.mean(np.array(rows) == 0) == pytest.approx(0.75, abs=0.03)
    again = Workload(sc.workload, 7, ROOT)
    assert [r.sampling for r in again.open_loop(4000, None)] == rows
    # the other draws are untouched by the sampling stream
    plain = Workload(_scenario(None).workload, 7, ROOT)
    assert [r.arrival for r in plain.open_loop(50, None)] == [
        r.arrival for r in Workload(sc.workload, 7, ROOT).open_loop(50, None)
    ]


def test_a_trace_column_sets_each_requests_temperature(tmp_path: Path) -> None:
    lines = ["arrival_s,prompt_tokens,output_tokens,temperature,top_p"]
    lines += [f"{i * 0.05:.2f},100,40,{0.0 if i % 2 else 0.8},0.9" for i in range(40)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    data = copy.deepcopy(BASE)
    data["workload"] = {"arrival": {"kind": "trace", "path": str(tmp_path / "t.csv")}}
    sc = validate_scenario(data, "test")
    w = Workload(sc.workload, 1, tmp_path)
    reqs = list(w.open_loop(None, None))
    got = [w.sampling.table[r.sampling] for r in reqs[:2]]
    assert got == [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=0.0, top_p=0.9)]
    assert run_policy(sc, "vllm", tmp_path).summary["requests"]["finished"] == 40


def test_generation_config_sets_the_defaults(tmp_path: Path) -> None:
    """A checkpoint whose generation_config.json sets temperature 0 decodes greedily when the requests set
    none; a request's own temperature still wins."""
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(ROOT / "sim" / "catalog" / "models" / "llama-3.1-8b.json", folder / "config.json")
    path = str(folder / "config.json")
    flat = _tpot(_scenario(None, name=path))
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "top_p": 0.9}))
    greedy = _tpot(_scenario(None, name=path))
    assert greedy < flat
    assert _tpot(_scenario({"temperature": 0.6}, name=path)) > greedy  # top_p 0.9 from the file: a sort
    (folder / "generation_config.json").write_text(json.dumps({"temperature": "hot"}))
    with pytest.raises(SimError, match=r"generation_config\.json: temperature: expected a number"):
        run_policy(_scenario(None, name=path), "vllm", ROOT)


QWEN25 = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("qwen2.5-7b", QWEN25),
        (
            "Qwen/Qwen2.5-7B-Instruct",
            {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
        ),
        ("qwen3-14b", {"temperature": 0.6, "top_p": 0.95, "top_k": 20}),
        ("llama-3.1-8b-instruct", {"temperature": 0.6, "top_p": 0.9}),
        ("llama-2-7b", None),  # the shipped config.json's revision: its generation config not found
    ],
)
def test_the_catalogue_reads_the_generation_configs_it_ships(
    name: str, expected: dict[str, float] | None
) -> None:
    """A catalogue model, by short name or HF id, takes its sim/catalog/models/NAME.generation_config.json."""
    assert generation_defaults(name) == expected


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    temperature=st.sampled_from([None, 0.0, 0.6, 1.0]),
    top_p=st.sampled_from([None, 0.5, 1.0]),
    top_k=st.sampled_from([None, 0, 20]),
    min_p=st.sampled_from([None, 0.0, 0.1]),
    penalty=st.sampled_from([None, 1.0, 1.05]),
    tokens=st.lists(st.integers(1, 5000), min_size=1, max_size=20),
)
def test_rows_sampling_alike_cost_what_the_per_row_sampler_charges(
    temperature: float | None, top_p: float | None, top_k: int | None, min_p: float | None,
    penalty: float | None, tokens: list[int],
) -> None:  # fmt: skip
    """The cost model's terms for rows that all sample alike (`RowSampler`) give the per-row sampler's
    seconds for any such batch: per row the sort and the stages' bytes, per token the penalties' reads."""
    p = resolve(SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                               repetition_penalty=penalty), {})  # fmt: skip
    cal = Calibration()
    hbm = get_gpu("H100-SXM").hbm_bandwidth
    row = RowSampler.of(p, VOCAB)
    terms = len(tokens) * (
        row.sort_entries * cal.sampler_s_per_entry + row.row_bytes / hbm / cal.bandwidth_eff
    )
    terms += sum(tokens) * row.token_bytes / hbm / cal.bandwidth_eff
    b = BatchSampling()
    for t in tokens:
        b.add(p, t)
    assert terms == pytest.approx(_sampler().seconds(b), rel=1e-12)


def test_a_run_says_which_generation_defaults_its_sampler_was_priced_with(tmp_path: Path) -> None:
    """`sim run` prints the checkpoint's sampling defaults under its table (they change the sampler's cost);
    a checkpoint without a generation_config.json gets no such line."""
    from typer.testing import CliRunner

    from sim.catalog.generation import generation_note
    from sim.cli import app

    assert generation_note("llama-2-7b") is None
    note = generation_note("qwen3-14b")
    assert note is not None and "temperature 0.6, top_p 0.95, top_k 20" in note
    lines = [
        'name = "note"', "seed = 1", "[model]", 'name = "qwen3-14b"', 'gpu = "H100-SXM"',
        "max_model_len = 2048", "[workload]", 'arrival = { kind = "poisson", rate = 5.0 }',
        'prompt = { kind = "fixed", value = 64 }', 'output = { kind = "fixed", value = 8 }', "[horizon]",
        "max_requests = 5", "[policies.vllm]", 'scheduler = "vllm"',
    ]  # fmt: skip
    (tmp_path / "s.toml").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "generation_config.json sets temperature 0.6" in " ".join(result.output.split())


@pytest.mark.parametrize("name", ["qwen2.5-7b", "qwen3-14b"])
def test_generation_defaults_price_the_step_as_the_per_request_sampler_does(
    name: str, tmp_path: Path
) -> None:
    """Requests that set nothing under a checkpoint's generation defaults (priced in the cost model's step,
    its fast paths on) cost what the same parameters given per request cost (the per-row sampler), and
    the same as the checkpoint read from a folder; without the file the flat term differs."""
    defaults = generation_defaults(name)
    catalogue = _tpot(_scenario(None, name=name))
    given = _tpot(_scenario(dict(defaults), name=name))
    assert catalogue == pytest.approx(given, rel=1e-9)
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(ROOT / "sim" / "catalog" / "models" / f"{name}.json", folder / "config.json")
    bare = _tpot(_scenario(None, name=str(folder / "config.json")))
    assert bare != pytest.approx(catalogue, rel=1e-6)
    shutil.copy(
        ROOT / "sim" / "catalog" / "models" / f"{name}.generation_config.json",
        folder / "generation_config.json",
    )
    assert _tpot(_scenario(None, name=str(folder / "config.json"))) == catalogue


def test_a_fleet_of_one_samples_as_one_replica(tmp_path: Path) -> None:
    """Per-request sampling on a one-replica fleet: the records of the single replica (the table, and a
    trace's sampling columns)."""
    data = copy.deepcopy(BASE)
    mixed = [{"share": 0.5, "temperature": 0.0}, {"share": 0.5, "top_p": 0.9, "repetition_penalty": 1.1}]
    data["workload"]["sampling"] = {"profiles": mixed}
    lines = ["arrival_s,prompt_tokens,output_tokens,temperature,top_p"]
    lines += [f"{i * 0.05:.2f},100,40,{0.0 if i % 2 else 0.8},0.9" for i in range(40)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    traced = copy.deepcopy(BASE)
    traced["workload"] = {"arrival": {"kind": "trace", "path": str(tmp_path / "t.csv")}}
    for d in (data, traced):
        single = run_policy(validate_scenario(d, "test"), "vllm", tmp_path)
        d["cluster"] = {"groups": [{"count": 1}]}
        one = run_policy(validate_scenario(d, "test"), "vllm", tmp_path)
        assert one.requests.drop("replica").equals(single.requests)
        assert one.steps.drop("replica").equals(single.steps)


def test_per_request_sampling_is_refused_where_a_fleet_cannot_price_it() -> None:
    """A pipeline group's replicas have no per-row sampler: sampling parameters there are an error naming
    the group, not a silent flat term."""
    data = copy.deepcopy(BASE)
    data["model"]["name"] = "llama-3.1-70b"
    data["cluster"] = {"groups": [{"count": 1, "tp": 4, "pp": 2}]}
    data["workload"]["sampling"] = {"temperature": 0.7}
    with pytest.raises(SimError, match=r"cluster.groups\[0\]: sampling parameters \(workload.sampling\) are "
                       "costed on tensor-parallel replicas only"):  # fmt: skip
        run_policy(validate_scenario(data, "test"), "vllm", ROOT)


def test_speculative_verification_samples_with_the_requests_parameters() -> None:
    """The rejection sampler at every drafted position: greedy requests compare argmaxes, top-p ones sort;
    the verdict on speculation follows (llama-3.1-8b with a 0.5B draft)."""
    spec = {"method": "draft", "draft_model": "qwama-0.5b-instruct", "num_speculative_tokens": 4,
            "acceptance_rate": 0.6}  # fmt: skip

    def gain(sampling: dict[str, Any]) -> float:
        data = copy.deepcopy(BASE)
        data["workload"]["sampling"] = sampling
        data["workload"]["arrival"]["rate"] = 40.0
        data["policies"]["spec"] = {"scheduler": "vllm", "speculative": spec}
        sc = validate_scenario(data, "test")
        return _tpot(sc, "vllm") / _tpot(sc, "spec")

    assert gain({"temperature": 0.0}) > gain({"temperature": 0.7, "top_p": 0.9})


@pytest.mark.parametrize(
    ("sampling", "policy", "expected"),
    [
        ({"best_of": 2}, "vllm", "workload.sampling.best_of: vLLM V1 (0.15) no longer takes best_of"),
        ({"top_p": 0.0}, "vllm", "workload.sampling.top_p: Input should be greater than 0"),
        ({"logprobs": 21}, "vllm", "workload.sampling.logprobs: Input should be less than or equal to 20"),
        ({"structured_output": "yaml"}, "vllm", "workload.sampling.structured_output: Input should be"),
        ({"profiles": []}, "vllm", "workload.sampling.profiles: List should have at least 1 item"),
        ({"profiles": [{"top_p": 0.5}]}, "vllm", "workload.sampling.profiles[0].share: Field required"),
        (
            {"temperature": 0.0},
            "continuous",
            "policies.vllm.scheduler: workload.sampling is costed for the vllm",
        ),
    ],
)
def test_bad_sampling_tables_name_the_key(sampling: dict[str, Any], policy: str, expected: str) -> None:
    data = copy.deepcopy(BASE)
    data["workload"]["sampling"] = sampling
    data["policies"]["vllm"]["scheduler"] = policy
    with pytest.raises(SimError) as err:
        validate_scenario(data, "test")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"test: {expected}"), err.value


def test_a_trace_with_a_bad_sampling_column_names_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,top_p\n0,10,10,0.5\n1,10,10,1.5\n")
    data = copy.deepcopy(BASE)
    data["workload"] = {"arrival": {"kind": "trace", "path": str(tmp_path / "t.csv")}}
    with pytest.raises(SimError, match=r"line 3: column 'top_p': expected a number in"):
        Workload(validate_scenario(data, "test").workload, 1, tmp_path)


def test_the_shipped_scenario_compares_greedy_with_top_p() -> None:
    from sim.config.scenario import load_scenario
    from sim.config.sweep import parse_sweep

    path = ROOT / "scenarios" / "sampling-cost.toml"
    variants = parse_sweep(load_scenario(path).sweep, str(path)).variants
    assert [v["workload.sampling.temperature"] for v in variants] == [0.0, 0.7, 0.7]
    tpot = {}
    for t in (0.0, 0.7):
        sc = load_scenario(
            path,
            ["horizon.max_requests=80", "workload.arrival.rate=20", f"workload.sampling.temperature={t}"],
        )
        tpot[t] = _tpot(sc)
    assert tpot[0.0] < 0.9 * tpot[0.7]  # top-p's sort at every step, against greedy's argmax


def test_a_generation_config_that_sets_no_sampling_default_leaves_vllms_own(tmp_path: Path) -> None:
    """A checkpoint whose generation_config.json sets none of the keys vLLM reads samples at vLLM's own
    defaults (temperature 1, no top-p or top-k: no sort), as the same parameters given per request cost;
    not at the flat term a checkpoint without the file keeps. The run's note says so."""
    from sim.catalog.generation import generation_note

    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(ROOT / "sim" / "catalog" / "models" / "qwen2.5-7b.json", folder / "config.json")
    config = str(folder / "config.json")
    bare = _tpot(_scenario(None, name=config))
    (folder / "generation_config.json").write_text('{"bos_token_id": 1, "eos_token_id": 2}\n')
    assert generation_defaults(config) == {}
    quiet = _tpot(_scenario(None, name=config))
    assert quiet == pytest.approx(_tpot(_scenario({"temperature": 1.0}, name=config)), rel=1e-9)
    assert quiet < bare  # no sort over the vocabulary
    note = generation_note(config)
    assert note is not None and "sets no sampling default" in note
