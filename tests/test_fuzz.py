"""Fuzzing the command line with generated scenario (sampling tables among them), trace and config.json files
(with quantization_config tables, and a generation_config.json beside them), well-formed and broken,
and with generated output paths: symbolic link loops, links to nothing, names and paths too long for the
file system, the empty path, files in the way, odd names.

Every outcome is exit 0 or exit 2 with only `error: ...` lines: never a traceback, never a negative or NaN
latency, never a file outside the output folder. Horizons are a few dozen requests so that each example
takes milliseconds; the examples are derandomized so that CI runs the same ones every time.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.io import tomltext

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CONFIG = json.loads((ROOT / "sim" / "catalog" / "models" / "llama-2-7b.json").read_text())
OPT_CONFIG = json.loads((ROOT / "sim" / "catalog" / "models" / "opt-13b.json").read_text())

settings.register_profile(
    "fuzz", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
FUZZ = settings.get_profile("fuzz")

# Values that break a field in every way a file can: wrong types, signs, zero, the float extremes and the
# integer edges of what the simulator represents. Only edges, never mid-sized numbers, so that a value
# that is accepted still makes a small run.
WEIRD: list[Any] = [
    -1, 0, 1, 0.5, -0.0, 1e-300, 1e308, math.inf, -math.inf, math.nan, 2**24, 2**24 + 1, 2**53 + 1,
    2**63 - 1, -(2**63), "", "x", "12", True, [], [1, "a"], {}, {"kind": "fixed"}, {"kind": "nope"},
]  # fmt: skip
weird = st.sampled_from(WEIRD).map(copy.deepcopy)
# Hypothesis draws the ends of an integer range far more often than the middle: a middle value marks
# the rare branches (raw bytes instead of a well-formed file).
RARE = 7  # a copy: mutations must not change WEIRD itself


# --- files ----------------------------------------------------------------------------------------------


def _leaves(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths to every value of a nested dict / list (the containers themselves included)."""
    if prefix:
        yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _leaves(child, (*prefix, key))


@st.composite
def mutated(draw: st.DrawFn, data: Any, max_changes: int = 3) -> Any:
    """`data` with up to `max_changes` values replaced by weird ones, keys deleted or unknown keys added."""
    data = json.loads(json.dumps(data))
    changes = draw(st.sampled_from([0, 0, 0, 0, 0, 1, 1, 2, max_changes]))  # most of them well-formed
    for _ in range(changes):
        paths = sorted(_leaves(data), key=len, reverse=True)  # deepest first: draws favour the first
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        op = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if op == "replace":
            parent[path[-1]] = draw(weird)
        elif op == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["bogus", "kind", "rate", "path"]))] = draw(weird)
    return data


small_float = st.floats(0.05, 40.0)
tokens = st.integers(1, 300)
seconds = st.floats(0, 2)
users = st.integers(1, 8)
lengths = st.one_of(
    st.builds(lambda v: {"kind": "fixed", "value": v}, tokens),
    st.builds(lambda a, b: {"kind": "uniform", "low": a, "high": a + b}, tokens, st.integers(0, 200)),
    st.builds(lambda m, s: {"kind": "normal", "mean": m, "std": s}, tokens, st.integers(0, 100)),
    st.builds(lambda m, c: {"kind": "lognormal", "mean": m, "cv": c, "max": 2048}, tokens, small_float),
    st.builds(lambda m, c: {"kind": "gamma", "mean": m, "cv": c}, tokens, st.floats(0.1, 4)),
    st.builds(lambda m: {"kind": "exponential", "mean": m}, tokens),
    st.builds(lambda m: {"kind": "geometric", "mean": m}, tokens),
    st.just({"kind": "empirical", "path": "trace.csv", "column": "prompt_tokens"}),
)  # fmt: skip
arrivals = st.one_of(
    st.builds(lambda r: {"kind": "poisson", "rate": r}, small_float),
    st.builds(lambda r, c: {"kind": "gamma", "rate": r, "cv": c}, small_float, st.floats(0.1, 4)),
    st.builds(lambda r: {"kind": "deterministic", "rate": r}, small_float),
    st.builds(
        lambda s, e: {"kind": "staged", "stages": s, "exact_count": e},
        st.lists(st.tuples(st.floats(0, 20), st.floats(0.1, 3)).map(list), min_size=1, max_size=3),
        st.booleans(),
    ),
    st.builds(lambda u, t: {"kind": "closed_loop", "users": u, "think_time_s": t}, users, seconds),
    st.builds(
        lambda p: {"kind": "trace", "path": p}, st.sampled_from(["trace.csv", "trace.jsonl", "config.json"])
    ),
)  # fmt: skip
policies = st.dictionaries(
    st.sampled_from(["c", "s", "v", "c2", "s2", "v2", "c3", "v3", "s3", "c4", "../up"]),
    st.one_of(
        st.builds(lambda n: {"scheduler": "continuous", "max_num_seqs": n}, st.integers(1, 64)),
        st.builds(lambda n: {"scheduler": "static", "max_batch_size": n}, st.integers(1, 64)),
        st.builds(lambda n: {"scheduler": "vllm", "max_num_seqs": n}, st.integers(1, 64)),
    ),
    min_size=1,
    max_size=2,
)
horizons = st.one_of(
    st.builds(lambda n, d: {"max_requests": n, "drain": d}, st.integers(1, 30), st.booleans()),
    st.builds(lambda s, d: {"duration_s": s, "drain": d}, st.floats(0.1, 3.0), st.booleans()),
)
models = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["llama-2-7b", "opt-13b", "mixtral-8x7b", "in/config.json"]),
        "gpu": st.sampled_from(["A100-80GB", "H100", "H200", "H800", "L40S", "B200", "L4", "A100-80G"]),
        "num_kv_blocks": st.integers(8, 3000),
        "max_model_len": st.sampled_from([256, 2048, 4096]),
    }
)


# Sampling parameters (`[workload.sampling]`), each key drawn from accepted values and a few edges; the
# scenario's mutations then break some of them.
_SAMPLING_KEYS = {
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 1e-6]),
    "top_p": st.sampled_from([0.9, 1.0, 1e-9]),
    "top_k": st.sampled_from([-1, 0, 1, 50]),
    "min_p": st.sampled_from([0.0, 0.05, 1.0]),
    "repetition_penalty": st.sampled_from([1.0, 1.2, 2.0]),
    "presence_penalty": st.sampled_from([-2.0, 0.0, 0.5]),
    "frequency_penalty": st.sampled_from([0.0, 2.0]),
    "logprobs": st.sampled_from([0, 5, 20]),
    "seed": st.integers(0, 10),
    "structured_output": st.sampled_from(["json", "regex", "grammar", "choice"]),
}
sampling_tables = st.fixed_dictionaries(
    {},
    optional={
        **_SAMPLING_KEYS,
        "profiles": st.lists(
            st.fixed_dictionaries({"share": st.floats(0.1, 5.0)}, optional=_SAMPLING_KEYS),
            min_size=1,
            max_size=3,
        ),
    },
)

# Every placement key of [[cluster.groups]] (PLACEMENT_KEYS in sim/config/cluster.py), well- and ill-formed.
PLACEMENT_DRAWS = {
    "pp": st.one_of(st.integers(0, 4), st.just(100)),
    "ep": st.sampled_from([1, 2, 3, 4, 8, 16]),
    "dp": st.integers(0, 4),
    "nodes": st.integers(0, 3),
    "gpus_per_node": st.sampled_from([0, 1, 4, 8]),
    "expert_skew": st.one_of(st.floats(0.0, 2.0), st.just(-1.0)),
    "intra_node_link": st.sampled_from(["nvlink-4", "nvlink-4-h800", "pigeon"]),
    "inter_node_link": st.sampled_from(["infiniband-ndr", "ethernet-100g"]),
    "two_batch_overlap": st.one_of(st.booleans(), st.just("yes")),
    "ep_all_to_all": st.sampled_from(
        ["per_expert", "deepep_normal", "deepep_low_latency", "deepep_auto", "nccl"]
    ),
    "ep_dispatch_dtype": st.sampled_from(["bf16", "fp8", "fp4"]),
    "ep_redundant_experts": st.one_of(st.sampled_from([0, 2, 8, 24]), st.just(-1)),
}
placement_groups = st.fixed_dictionaries({"tp": st.sampled_from([1, 2, 3, 8])}, optional=PLACEMENT_DRAWS)


@st.composite
def scenario_files(draw: st.DrawFn, placement: bool = False) -> bytes:
    workload: dict[str, Any] = {"arrival": draw(arrivals), "prompt": draw(lengths), "output": draw(lengths)}
    if draw(st.booleans()):
        workload["max_tokens"] = draw(st.integers(1, 512))
    if draw(st.booleans()):
        workload["prefix"] = {"groups": draw(st.integers(1, 4)), "prefix_len": draw(st.integers(1, 64))}
    if draw(st.integers(0, 2)) == 0:
        workload["sampling"] = draw(sampling_tables)
    data = {
        "name": "fuzz",
        "seed": draw(st.integers(0, 100)),
        "model": draw(models),
        "workload": workload,
        "horizon": draw(horizons),
        "policies": draw(policies),
        "slo": {"ttft_s": 1.0, "tpot_s": 0.1},
    }
    if placement:  # one replica group placed over pp, ep, dp and nodes (sim/cost/parallel.py)
        data["cluster"] = {"groups": [draw(placement_groups)]}
        data["model"]["tp"] = data["cluster"]["groups"][0]["tp"]
        data["model"]["name"] = draw(st.sampled_from(["mixtral-8x7b", "llama-2-7b"]))
        workload["arrival"] = {"kind": "poisson", "rate": draw(st.floats(0.5, 8.0))}
    data = draw(mutated(data))
    if draw(st.integers(0, 19)) == RARE:
        return draw(st.binary(max_size=200))
    return tomltext.dumps(data).encode()


TRACE_COLUMNS = [
    "arrival_s",
    "arrived_at",
    "prompt_tokens",
    "output_tokens",
    "prefix_group",
    "prefix_len",
    "temperature",
    "top_p",
    "top_k",
    "logprobs",
    "x",
]
cells = st.one_of(
    st.integers(0, 400),
    st.floats(0, 50),
    st.sampled_from(["", "abc", "1e400", "nan", "-3", "2.5", str(2**63 - 1)]),
)


@st.composite
def trace_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    well_formed = draw(st.booleans())
    columns = draw(st.lists(st.sampled_from(TRACE_COLUMNS), min_size=1, max_size=5, unique=True))
    if well_formed:
        columns = list(dict.fromkeys(["arrival_s", "prompt_tokens", "output_tokens", *columns]))
    rows = []
    for i in range(draw(st.integers(0, 12))):
        row: dict[str, Any] = {}
        for col in columns:
            if well_formed:
                if col in ("arrival_s", "arrived_at"):
                    row[col] = i * 0.1
                elif col in ("temperature", "top_p"):
                    row[col] = draw(st.sampled_from([0.0, 0.5, 1.0]))
                elif col in ("top_k", "logprobs"):
                    row[col] = draw(st.integers(0, 20))
                else:
                    row[col] = draw(st.integers(1, 300))
            else:
                row[col] = draw(cells)
        rows.append(row)
    return rows


@st.composite
def trace_files(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(CSV, JSON lines) of one generated trace, or raw bytes for both."""
    if draw(st.integers(0, 9)) == RARE:
        raw = draw(st.binary(max_size=200))
        return raw, raw
    rows = draw(trace_rows())
    columns = list(dict.fromkeys(k for row in rows for k in row)) or ["arrival_s"]
    csv = (
        ",".join(columns) + "\n" + "".join(",".join(str(r.get(c, "")) for c in columns) + "\n" for r in rows)
    )
    jsonl = "".join(json.dumps(r) + "\n" for r in rows)
    return csv.encode(), jsonl.encode()


ignore_lists = st.lists(
    st.sampled_from([
        "lm_head", "model.layers.0.mlp.down_proj", "re:.*down_proj", "re:model\\.layers\\.1\\..*", "re:([",
        "model.layers.3.self_attn.q_proj", "down_proj", "vision_tower", "model.layers.99.mlp.up_proj",
    ]),
    max_size=3,
)  # fmt: skip
bits = st.sampled_from([4, 8, 0, 3, "four", 4.0])
group_sizes = st.sampled_from([-1, 0, 32, 128, 7, 1.5, "abc", 8192])


def _gptq(b: Any, g: Any, i: Any) -> dict[str, Any]:
    return {"quant_method": "gptq", "bits": b, "group_size": g, "modules_to_not_convert": i}


def _compressed(n: Any, t: Any, g: Any, a: Any, i: Any) -> dict[str, Any]:
    group = {
        "targets": ["Linear"],
        "input_activations": a,
        "weights": {"num_bits": n, "type": t, "group_size": g},
    }
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": i,
            "config_groups": {"group_0": group}}  # fmt: skip


quant_configs = st.one_of(
    st.builds(_gptq, bits, group_sizes, ignore_lists),
    st.builds(lambda b, g: {"quant_method": "awq", "w_bit": b, "q_group_size": g}, bits, group_sizes),
    st.builds(lambda i: {"quant_method": "fp8", "ignore": i}, ignore_lists),
    st.builds(
        _compressed, st.sampled_from([4, 8, 16, "eight"]), st.sampled_from(["int", "float", 3]), group_sizes,
        st.sampled_from([None, {"num_bits": 8}, {"num_bits": "8"}, 8]), ignore_lists,
    ),
    st.builds(lambda w: {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": w}}},
              weird),
)  # fmt: skip


@st.composite
def config_files(draw: st.DrawFn) -> bytes:
    choice = draw(st.integers(0, 14))
    if choice == RARE:
        return draw(st.binary(max_size=100))
    if choice == RARE + 1:
        return json.dumps(draw(weird)).encode()
    config = dict(LLAMA_CONFIG)
    if choice < 5:
        config["quantization_config"] = draw(quant_configs)
    return json.dumps(draw(mutated(config))).encode()


@st.composite
def generation_files(draw: st.DrawFn) -> bytes | None:
    """A generation_config.json beside the generated config.json (or none)."""
    choice = draw(st.integers(0, 9))
    if choice < 4:
        return None
    if choice == RARE:
        return draw(st.binary(max_size=60))
    keys = {k: _SAMPLING_KEYS[k] for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")}
    data = draw(st.fixed_dictionaries({}, optional={**keys, "do_sample": st.booleans()}))
    return json.dumps(draw(mutated(data))).encode()


@st.composite
def inconsistent_configs(draw: st.DrawFn) -> tuple[bytes, str]:
    """A config.json whose head shapes no checkpoint has, and the key its refusal must name: more KV heads
    than heads, KV heads that split the heads unevenly, or (no head_dim) a hidden size not a multiple of the
    heads, in Llama's or OPT's family."""
    heads = draw(st.sampled_from([8, 12, 32, 40, 64]))
    kind = draw(st.sampled_from(["more_kv_heads", "uneven_kv_heads", "hidden", "opt_hidden"]))
    data = dict(OPT_CONFIG if kind == "opt_hidden" else LLAMA_CONFIG)
    data["num_attention_heads"] = heads
    data["hidden_size"] = heads * draw(st.sampled_from([64, 128]))
    key = "num_key_value_heads"
    if kind == "more_kv_heads":
        data[key] = heads * draw(st.integers(2, 8))
    elif kind == "uneven_kv_heads":
        data[key] = draw(st.integers(1, heads - 1).filter(lambda n: heads % n != 0))
    else:
        key = "hidden_size"
        data[key] += draw(st.integers(1, heads - 1))
        if kind == "hidden":
            data["num_key_value_heads"] = draw(st.sampled_from([n for n in (1, 2, 4, 8) if heads % n == 0]))
    return json.dumps(data).encode(), key


@st.composite
def replay_traces(draw: st.DrawFn) -> bytes:
    rows = [
        {"id": f"r{i}", "arrival_step": draw(st.integers(0, 20)), "prompt_len": draw(st.integers(1, 200)),
         "max_tokens": draw(st.integers(1, 20))}
        for i in range(draw(st.integers(0, 6)))
    ]  # fmt: skip
    return json.dumps(draw(mutated(rows))).encode()


# --- the invariants -------------------------------------------------------------------------------------


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def _run_cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(args)
            code: Any = 0
        except SystemExit as stop:
            code = stop.code
    return (code if isinstance(code, int) else 0), out.getvalue(), err.getvalue()


def _check_outcome(code: int, out: str, err: str) -> None:
    assert code in (0, 2), (code, out, err)
    assert "Traceback" not in out + err
    if code == 2:
        lines = err.splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), err


def _check_latencies(out_dir: Path) -> None:
    """No negative or NaN latency, in the summaries and in the per-request records."""
    for summary in out_dir.glob("*/summary.json"):
        latency = json.loads(summary.read_text())["latency"]
        for metric, stats in latency.items():
            for name, value in stats.items():
                if isinstance(value, float):
                    assert math.isfinite(value) and value >= 0, (summary, metric, name, value)
    for records in out_dir.glob("*/requests.parquet"):
        frame = pl.read_parquet(records)
        for column in ("queue_wait", "ttft", "tpot", "e2e"):
            if column in frame.columns:
                values = frame[column].drop_nulls().to_numpy().astype(np.float64)
                finished = values[~np.isnan(values)]
                assert (finished >= 0).all(), (records, column)


def _check_counts(out_dir: Path) -> None:
    """No request is lost: the summary's arrived = finished + rejected + in flight, each count matching
    the request records' states, and each rejection has a reason."""
    for summary in out_dir.glob("*/summary.json"):
        data = json.loads(summary.read_text())
        counts = data["requests"]
        assert counts["arrived"] == counts["finished"] + counts["rejected"] + counts["in_flight"], counts
        assert sum(data["rejected_reasons"].values()) == counts["rejected"], data["rejected_reasons"]
        frame = pl.read_parquet(summary.parent / "requests.parquet")
        states = frame["state"].cast(pl.String).to_list()
        assert len(states) == counts["arrived"]
        for state in ("finished", "rejected", "in_flight"):
            assert states.count(state) == counts[state], (summary, state)
        reasons = frame.filter(pl.col("state").cast(pl.String) == "rejected")["reject_reason"]
        assert reasons.null_count() == 0 and not (reasons == "").any()


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    """A fresh folder, made the working folder so that any stray relative write lands where it is seen."""
    before = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(before)


@settings(FUZZ, max_examples=250)
@given(scenario=scenario_files(), trace=trace_files(), config=config_files(), generation=generation_files())
def test_fuzz_run(
    scenario: bytes, trace: tuple[bytes, bytes], config: bytes, generation: bytes | None
) -> None:
    with _workdir() as root:
        inputs = root / "in"
        inputs.mkdir()
        (inputs / "s.toml").write_bytes(scenario)
        (inputs / "trace.csv").write_bytes(trace[0])
        (inputs / "trace.jsonl").write_bytes(trace[1])
        (inputs / "config.json").write_bytes(config)
        if generation is not None:
            (inputs / "generation_config.json").write_bytes(generation)
        given_files = _files(root)
        out_dir = root / "out"
        code, out, err = _run_cli(["run", str(inputs / "s.toml"), "--out", str(out_dir)])
        _check_outcome(code, out, err)
        assert {p for p in _files(root) - given_files if out_dir not in p.parents} == set()
        _check_latencies(out_dir)
        _check_counts(out_dir)


def test_every_placement_key_is_fuzzed() -> None:
    from sim.config.cluster import PLACEMENT_KEYS

    assert set(PLACEMENT_KEYS) <= set(PLACEMENT_DRAWS)


@settings(FUZZ, max_examples=40)
@given(scenario=scenario_files(placement=True))
def test_fuzz_run_placement(scenario: bytes) -> None:
    """A replica group placed beyond TP runs, or exits 2 with `error:` lines; no request is lost."""
    with _workdir() as root:
        (root / "s.toml").write_bytes(scenario)
        code, out, err = _run_cli(["run", str(root / "s.toml"), "--out", str(root / "out")])
        _check_outcome(code, out, err)
        _check_latencies(root / "out")
        _check_counts(root / "out")


@settings(FUZZ, max_examples=150)
@given(config=config_files(), gpu=st.sampled_from(["A100-80GB", "H100", "A100-80G"]))
def test_fuzz_capacity(config: bytes, gpu: str) -> None:
    with _workdir() as root:
        (root / "config.json").write_bytes(config)
        code, out, err = _run_cli(["capacity", str(root / "config.json"), "--gpu", gpu, "--json"])
        _check_outcome(code, out, err)
        assert _files(root) == {root / "config.json"}


@settings(FUZZ, max_examples=60)
@given(config=inconsistent_configs(), command=st.sampled_from(["capacity", "step"]))
def test_fuzz_inconsistent_head_shapes_are_refused(config: tuple[bytes, str], command: str) -> None:
    """A config.json with impossible head shapes exits 2 with one `error:` line naming the key."""
    data, key = config
    with _workdir() as root:
        (root / "config.json").write_bytes(data)
        args = [command, str(root / "config.json"), "--gpu", "H200"]
        code, out, err = _run_cli([*args, "--prefill", "8"] if command == "step" else args)
        assert code == 2, (out, err)
        _check_outcome(code, out, err)
        assert len(err.splitlines()) == 1 and f"config.json: {key}: " in err, err


@settings(FUZZ, max_examples=150)
@given(trace=replay_traces(), out_name=st.sampled_from(["steps.jsonl", "missing/steps.jsonl", "."]))
def test_fuzz_replay_steps(trace: bytes, out_name: str) -> None:
    with _workdir() as root:
        (root / "t.json").write_bytes(trace)
        code, out, err = _run_cli(["replay-steps", str(root / "t.json"), "--out", str(root / out_name)])
        _check_outcome(code, out, err)
        assert _files(root) <= {root / "t.json", root / "steps.jsonl"}


# --- output paths -----------------------------------------------------------------------------------------

SMALL_RUN = tomltext.dumps(
    {
        "name": "paths",
        "seed": 1,
        "model": {"name": "llama-2-7b", "gpu": "H100"},
        "workload": {
            "arrival": {"kind": "poisson", "rate": 5.0},
            "prompt": {"kind": "fixed", "value": 16},
            "output": {"kind": "fixed", "value": 4},
        },
        "horizon": {"max_requests": 4},
        "policies": {"c": {"scheduler": "continuous", "max_num_seqs": 4}},
    }
)
OUT_KINDS = [
    "name", "nested", "dot", "existing folder", "symlink loop", "inside a symlink loop", "dangling symlink",
    "inside a dangling symlink", "symlink to a folder", "long name", "long path", "empty", "file",
    "inside a file", "read-only folder",
]  # fmt: skip
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00/"), min_size=1, max_size=12
)


def make_out(root: Path, kind: str, name: str, size: int) -> str:
    """An output path of `kind` under `root`, made ready (links, files, folders) as the kind needs."""
    if kind in ("symlink loop", "inside a symlink loop"):
        (root / "loop").symlink_to("loop")
    if kind in ("dangling symlink", "inside a dangling symlink"):
        (root / "dangling").symlink_to(root / "missing" / name)
    if kind in ("file", "inside a file"):
        (root / "plain").write_text("")
    paths = {
        "name": str(root / name),
        "nested": str(root / name / name),
        "dot": ".",
        "existing folder": str(root),
        "symlink loop": str(root / "loop"),
        "inside a symlink loop": str(root / "loop" / name),
        "dangling symlink": str(root / "dangling"),
        "inside a dangling symlink": str(root / "dangling" / name),
        "symlink to a folder": str(root / "linked"),
        "long name": str(root / ("n" * size)),
        "long path": str(root / "/".join(["d" * 50] * (size // 10))),
        "empty": "",
        "file": str(root / "plain"),
        "inside a file": str(root / "plain" / name),
        "read-only folder": str(root / "read-only" / name),
    }
    if kind == "symlink to a folder":
        (root / "target").mkdir()
        (root / "linked").symlink_to(root / "target")
    if kind == "read-only folder":
        (root / "read-only").mkdir(mode=0o555)
    return paths[kind]


@settings(FUZZ, max_examples=60)
@given(kind=st.sampled_from(OUT_KINDS), name=names, size=st.integers(240, 600))
def test_fuzz_run_out_paths(kind: str, name: str, size: int) -> None:
    """`sim run --out` on generated output paths: exit 0 with every file under the output folder, or
    exit 2 with only `error:` lines and nothing written. A read-only folder is writable for root (as the
    tests run here), so there its run may succeed; elsewhere it must be refused."""
    with _workdir() as root:
        (root / "s.toml").write_text(SMALL_RUN)
        out = make_out(root, kind, name, size)
        before = _files(root)
        code, stdout, err = _run_cli(["run", str(root / "s.toml"), "--out", out])
        _check_outcome(code, stdout, err)
        new = _files(root) - before
        if code == 2:
            assert new == set(), sorted(map(str, new))
        else:
            folder = Path(out).resolve()
            assert new and all(folder in p.resolve().parents for p in new), (out, sorted(map(str, new)))
            _check_latencies(Path(out))
        if kind == "read-only folder" and os.geteuid() != 0:
            assert code == 2 and "not writable" in err, err
        if kind in ("symlink loop", "inside a symlink loop", "dangling symlink", "empty") or (
            kind == "long name" and size > 255
        ):
            assert code == 2, (kind, err)
