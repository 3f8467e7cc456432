"""Workload: arrival processes, length distributions, prefixes, traces, determinism and errors."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import re
import tomllib
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from sim.config.workload import WorkloadConfig, parse_workload
from sim.core.request import Request
from sim.io.errors import SimError
from sim.workload.generator import Workload
from sim.workload.lengths import LengthSampler, TimeSampler

AZURE_CONV = Path(__file__).parent / "data" / "traces" / "splitwise_conv_head200.csv"
FIXED_LENGTHS = {"prompt": {"kind": "fixed", "value": 100}, "output": {"kind": "fixed", "value": 10}}


def make(arrival: dict[str, Any], seed: int = 0, base_dir: Path = Path("."), **extra: Any) -> Workload:
    table = {"arrival": arrival, **FIXED_LENGTHS, **extra}
    return Workload(parse_workload(table, "test.toml"), seed, base_dir)


def times(w: Workload, **limits: Any) -> np.ndarray:
    return np.array([r.arrival for r in w.open_loop(**limits)])


# --- arrivals -----------------------------------------------------------------------------------------


def test_poisson_rate_and_exponential_gaps() -> None:
    t = times(make({"kind": "poisson", "rate": 20.0}), max_requests=50_000)
    assert len(t) / t[-1] == pytest.approx(20.0, rel=0.03)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert stats.kstest(gaps, "expon", args=(0, 1 / 20.0)).pvalue > 0.001


def test_gamma_rate_and_cv() -> None:
    t = times(make({"kind": "gamma", "rate": 5.0, "cv": 3.0}), max_requests=100_000)
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert 1 / gaps.mean() == pytest.approx(5.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.05)


def test_deterministic_is_evenly_spaced_from_zero() -> None:
    t = times(make({"kind": "deterministic", "rate": 4.0}), horizon_s=10.0)
    np.testing.assert_allclose(t, np.arange(40) / 4.0)


def test_staged_exact_counts_per_stage() -> None:
    w = make({"kind": "staged", "stages": [[8, 60], [20, 60], [0, 10], [2.5, 10]], "exact_count": True})
    t = times(w)  # finite: no limit needed
    assert np.all(np.diff(t) > 0)
    counts = np.histogram(t, bins=[0, 60, 120, 130, 140])[0]
    assert counts.tolist() == [480, 1200, 0, 25]  # round(2.5 * 10) = 25 (banker's rounding of 25.0)


def test_staged_poisson_rates() -> None:
    t = times(make({"kind": "staged", "stages": [[50, 100], [200, 100]]}, seed=3))
    counts = np.histogram(t, bins=[0, 100, 200])[0]
    assert counts[0] == pytest.approx(5000, rel=0.05)
    assert counts[1] == pytest.approx(20000, rel=0.05)
    assert t[-1] < 200


def test_limits_whichever_first_and_ids() -> None:
    w = make({"kind": "poisson", "rate": 100.0})
    by_count = list(w.open_loop(max_requests=10, horizon_s=1e9))
    assert [r.id for r in by_count] == list(range(10))
    by_time = list(w.open_loop(max_requests=10**9, horizon_s=2.0))
    assert by_time[-1].arrival < 2.0 and 150 < len(by_time) < 250
    assert [r.id for r in by_time] == list(range(len(by_time)))
    assert list(w.open_loop(max_requests=0)) == []
    # A limit does not change the requests before it.
    assert [r.arrival for r in by_time[:10]] == [r.arrival for r in by_count]


def test_open_loop_is_lazy_and_memory_bounded() -> None:
    w = make({"kind": "poisson", "rate": 1000.0})
    it = w.open_loop(max_requests=10**9)
    assert isinstance(it, Iterator) and not isinstance(it, list)
    first = next(it)
    assert isinstance(first, Request) and first.id == 0
    tracemalloc.start()
    n = sum(1 for _ in itertools.islice(w.open_loop(max_requests=10**9), 30_000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == 30_000
    assert peak < 4 * 2**20  # a few chunks (~1 MB), not 30k requests (~8 MB)


def test_closed_loop() -> None:
    think = {"kind": "exponential", "mean": 2.0}
    w = make({"kind": "closed_loop", "users": 4, "think_time_s": think, "ramp_s": 8.0})
    cl = w.closed_loop
    assert cl is not None and cl.users == 4
    np.testing.assert_allclose(cl.start_times(), [0, 2, 4, 6])
    assert np.mean([cl.think_time() for _ in range(20_000)]) == pytest.approx(2.0, rel=0.04)
    reqs = [cl.new_request(1.5) for _ in range(300)]
    assert [r.id for r in reqs] == list(range(300))
    assert reqs[0].arrival == 1.5 and reqs[0].prompt_len == 100 and reqs[0].output_len == 10
    with pytest.raises(SimError, match="closed"):
        w.open_loop(max_requests=1)


def test_closed_loop_offline_batch() -> None:
    cl = make({"kind": "closed_loop", "users": 8, "think_time_s": 0}).closed_loop
    assert cl is not None
    assert cl.start_times().tolist() == [0.0] * 8
    assert cl.think_time() == 0.0
    assert make({"kind": "poisson", "rate": 1.0}).closed_loop is None


# --- traces -------------------------------------------------------------------------------------------


def test_trace_csv_replay(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_len\n"
        "0.5,100,20,0,64\n0.0,50,5,-1,0\n2.0,300,40,1,64\n"
    )
    table = {"arrival": {"kind": "trace", "path": "t.csv", "time_scale": 0.5}}
    w = Workload(parse_workload(table), 0, tmp_path)
    reqs = list(w.open_loop())  # finite: no limit needed
    assert [(r.id, r.arrival, r.prompt_len, r.output_len) for r in reqs] == [
        (0, 0.0, 50, 5),
        (1, 0.25, 100, 20),
        (2, 1.0, 300, 40),
    ]
    assert [(r.prefix_group, r.prefix_len) for r in reqs] == [(-1, 0), (0, 64), (1, 64)]
    assert [r.max_tokens for r in reqs] == [5, 20, 40]  # unset max_tokens: replay exactly
    assert len(list(w.open_loop(horizon_s=0.5))) == 2


def test_trace_jsonl_and_caps(tmp_path: Path) -> None:
    rows = [{"arrival_s": i * 0.1, "prompt_tokens": 10 + i, "output_tokens": 100 * i + 1} for i in range(5)]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    table = {"arrival": {"kind": "trace", "path": "t.jsonl"}, "max_tokens": 150}
    reqs = list(Workload(parse_workload(table), 0, tmp_path).open_loop())
    assert [r.prompt_len for r in reqs] == [10, 11, 12, 13, 14]
    assert [r.output_len for r in reqs] == [1, 101, 150, 150, 150]


def test_trace_without_output_column_uses_distribution(tmp_path: Path) -> None:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens\n0,10\n1,20\n")
    table = {"arrival": {"kind": "trace", "path": "t.csv"}, "output": {"kind": "fixed", "value": 7}}
    assert [r.output_len for r in Workload(parse_workload(table), 0, tmp_path).open_loop()] == [7, 7]
    with pytest.raises(SimError, match="output_tokens"):
        Workload(parse_workload({"arrival": {"kind": "trace", "path": "t.csv"}}), 0, tmp_path)


def test_azure_trace_replays_directly() -> None:
    """The Azure trace's own column names replay as is; expectations read with the csv module."""
    with AZURE_CONV.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    table = {"arrival": {"kind": "trace", "path": str(AZURE_CONV)}}
    reqs = list(Workload(parse_workload(table), 0, Path(".")).open_loop())
    assert len(reqs) == len(rows) == 200
    assert (reqs[0].arrival, reqs[0].prompt_len, reqs[0].output_len) == (0.0, 374, 44)
    assert (reqs[1].arrival, reqs[1].prompt_len, reqs[1].output_len) == (4.314579, 396, 109)
    assert [r.output_len for r in reqs] == [int(row["num_decode_tokens"]) for row in rows]
    assert [r.arrival for r in reqs] == sorted(float(row["arrived_at"]) for row in rows)


# --- lengths ------------------------------------------------------------------------------------------

LENGTH_MEANS = [
    ({"kind": "fixed", "value": 37}, 37.0),
    ({"kind": "uniform", "low": 10, "high": 90}, 50.0),
    ({"kind": "normal", "mean": 500, "std": 50}, 500.0),
    ({"kind": "lognormal", "mean": 400, "cv": 1.5}, 400.0),
    ({"kind": "gamma", "mean": 300, "cv": 0.5}, 300.0),
    ({"kind": "exponential", "mean": 200}, 200.0),
    ({"kind": "geometric", "mean": 20}, 20.0),
]


def _lengths(spec: dict[str, Any], n: int = 100_000, base_dir: Path = Path(".")) -> np.ndarray:
    table = {"arrival": {"kind": "poisson", "rate": 1}, "prompt": spec, "ignore_eos": True}
    dist = WorkloadConfig.model_validate(table).prompt
    assert dist is not None
    return LengthSampler(dist, base_dir)(np.random.default_rng(1), n)


@pytest.mark.parametrize(("spec", "mean"), LENGTH_MEANS, ids=[s["kind"] for s, _ in LENGTH_MEANS])
def test_length_means(spec: dict[str, Any], mean: float) -> None:
    x = _lengths(spec)
    assert x.dtype == np.int64 and x.min() >= 1
    assert x.mean() == pytest.approx(mean, rel=0.03)


@pytest.mark.parametrize(("spec", "_mean"), LENGTH_MEANS, ids=[s["kind"] for s, _ in LENGTH_MEANS])
def test_length_clamps(spec: dict[str, Any], _mean: float) -> None:
    x = _lengths({**spec, "min": 30, "max": 60}, n=20_000)
    assert x.min() >= 30 and x.max() <= 60


def test_normal_is_clipped_to_one() -> None:
    assert _lengths({"kind": "normal", "mean": 2, "std": 10}).min() == 1


def test_empirical_from_csv(tmp_path: Path) -> None:
    (tmp_path / "lens.csv").write_text("a,tokens\n0,10\n0,20\n0,60\n")
    x = _lengths({"kind": "empirical", "path": "lens.csv", "column": "tokens"}, base_dir=tmp_path)
    assert set(np.unique(x).tolist()) == {10, 20, 60}
    assert x.mean() == pytest.approx(30.0, rel=0.02)
    with pytest.raises(SimError, match=r"lens\.csv.*'nope'"):
        _lengths({"kind": "empirical", "path": "lens.csv", "column": "nope"}, base_dir=tmp_path)
    with pytest.raises(SimError, match=r"missing\.csv.*not found"):
        _lengths({"kind": "empirical", "path": "missing.csv", "column": "tokens"}, base_dir=tmp_path)


def test_empirical_negative_values_are_refused(tmp_path: Path) -> None:
    """A negative length was silently drawn as 1 token, a negative think time as 0 s."""
    (tmp_path / "lens.csv").write_text("tokens\n10\n-5\n")
    with pytest.raises(SimError, match=r"lens\.csv: line 3: column 'tokens': expected a number >= 0"):
        _lengths({"kind": "empirical", "path": "lens.csv", "column": "tokens"}, base_dir=tmp_path)
    think = {"kind": "empirical", "path": "lens.csv", "column": "tokens"}
    cfg = parse_workload({"arrival": {"kind": "closed_loop", "users": 1, "think_time_s": think},
                          "prompt": {"kind": "fixed", "value": 1}, "ignore_eos": True})  # fmt: skip
    with pytest.raises(SimError, match=r"line 3: column 'tokens': expected a number >= 0"):
        TimeSampler(cfg.arrival.think_time_s, tmp_path)  # type: ignore[union-attr]


def test_think_time_sampler_allows_zero() -> None:
    cfg = WorkloadConfig.model_validate(
        {
            "arrival": {
                "kind": "closed_loop",
                "users": 1,
                "think_time_s": {"kind": "normal", "mean": 0.1, "std": 1},
            }
        }
        | FIXED_LENGTHS
    ).arrival
    x = TimeSampler(cfg.think_time_s, Path("."))(np.random.default_rng(0), 1000)  # type: ignore[union-attr]
    assert x.min() == 0.0 and x.dtype == np.float64


def test_output_capped_at_max_tokens() -> None:
    w = make({"kind": "poisson", "rate": 1.0}, output={"kind": "exponential", "mean": 100}, max_tokens=64)
    out = np.array([r.output_len for r in w.open_loop(max_requests=5000)])
    assert out.max() == 64 and out.min() >= 1
    assert np.mean(out == 64) == pytest.approx(np.exp(-64 / 100), abs=0.03)
    assert all(r.max_tokens == 64 for r in w.open_loop(max_requests=10))


def test_ignore_eos_generates_max_tokens() -> None:
    table = {"arrival": {"kind": "poisson", "rate": 1}, "prompt": {"kind": "fixed", "value": 8}}
    w = Workload(parse_workload({**table, "ignore_eos": True, "max_tokens": 77, "n": 2}), 0, Path("."))
    reqs = list(w.open_loop(max_requests=20))
    assert all(r.output_len == 77 == r.max_tokens and r.n == 2 for r in reqs)


# --- prefixes -----------------------------------------------------------------------------------------


def test_prefix_groups() -> None:
    w = make(
        {"kind": "poisson", "rate": 1.0},
        prefix={"groups": 5, "prefix_len": 200, "users_per_group": 3},
        prompt={"kind": "uniform", "low": 10, "high": 20},
    )
    reqs = list(w.open_loop(max_requests=10_000))
    groups = np.array([r.prefix_group for r in reqs])
    assert set(groups.tolist()) == set(range(5))
    assert np.bincount(groups).min() > 1800
    assert all(r.prefix_len == 200 and 210 <= r.prompt_len <= 220 for r in reqs)
    assert make({"kind": "poisson", "rate": 1.0}).open_loop(max_requests=1).__next__().prefix_group == -1


def test_shared_prefix_profile() -> None:
    profile = {
        "system_prompt_len": 100,
        "question_len": 447,
        "output_len": 248,
        "num_unique_system_prompts": 9,
        "num_users_per_system_prompt": 5,
    }
    arrival = {"kind": "staged", "stages": [[8, 60], [20, 60]], "exact_count": True}
    cfg = parse_workload({"arrival": arrival, "shared_prefix": profile, "ignore_eos": True})
    assert cfg.max_tokens == 248 and cfg.prefix is not None and cfg.prefix.groups == 9
    assert cfg.prefix.prompts_per_group == 5  # the load generator's pool of 9 x 5 fixed prompts
    reqs = list(Workload(cfg, 7, Path(".")).open_loop())
    assert len(reqs) == 1680
    assert all(r.prompt_len == 547 and r.prefix_len == 100 and r.output_len == 248 for r in reqs)
    assert {r.prefix_group for r in reqs} == set(range(9))
    assert {r.prompt_id for r in reqs} == set(range(45))
    with pytest.raises(SimError, match="remove prompt"):
        parse_workload(
            {"arrival": arrival, "shared_prefix": profile, "prompt": {"kind": "fixed", "value": 1}}
        )


def test_prompt_pool_cycles_one_shuffled_order() -> None:
    """Request k sends the pool's prompt at position k mod size of one fixed order: every prompt once per
    cycle, the same order each cycle, its group the prompt's, its question length drawn once."""
    w = make(
        {"kind": "poisson", "rate": 1.0},
        prefix={"groups": 4, "prefix_len": 32, "prompts_per_group": 3},
        prompt={"kind": "uniform", "low": 10, "high": 500},
    )
    reqs = list(w.open_loop(max_requests=12 * 50 + 5))
    ids = [r.prompt_id for r in reqs]
    first = ids[:12]
    assert sorted(first) == list(range(12)) and first != list(range(12))  # a shuffled order
    assert all(ids[k] == first[k % 12] for k in range(len(ids)))
    assert all(r.prefix_group == r.prompt_id // 3 and r.prefix_len == 32 for r in reqs)
    by_id: dict[int, set[int]] = {}
    for r in reqs:
        by_id.setdefault(r.prompt_id, set()).add(r.prompt_len)
    assert all(len(v) == 1 for v in by_id.values())  # one question per pool prompt
    assert len({next(iter(v)) for v in by_id.values()}) > 6  # drawn per prompt, not once for all
    closed = make(
        {"kind": "closed_loop", "users": 5}, prefix={"groups": 2, "prefix_len": 8, "prompts_per_group": 2}
    )
    assert closed.closed_loop is not None
    got = [closed.closed_loop.new_request(0.0, user=u) for u in range(8)]
    assert sorted(r.prompt_id for r in got[:4]) == [0, 1, 2, 3]
    assert all(r.prefix_group == r.prompt_id // 2 for r in got)  # a pool's prompt keeps its own group


def test_prompt_pool_bad_input_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(SimError, match=r"workload\.prefix\.prompts_per_group: .*greater than 0"):
        make({"kind": "poisson", "rate": 1.0}, prefix={"groups": 2, "prefix_len": 8, "prompts_per_group": 0})
    with pytest.raises(SimError, match=r"prompts_per_group: groups x prompts_per_group must be at most"):
        make({"kind": "poisson", "rate": 1.0},
             prefix={"groups": 100_000, "prefix_len": 8, "prompts_per_group": 100_000})  # fmt: skip
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,5,2\n")
    table = {"arrival": {"kind": "trace", "path": "t.csv"},
             "prefix": {"groups": 2, "prefix_len": 4, "prompts_per_group": 2}}  # fmt: skip
    with pytest.raises(
        SimError, match=r"prefix\.prompts_per_group: a trace gives each request its own prompt"
    ):
        parse_workload(table, "t.toml")


def test_closed_loop_user_pins_group() -> None:
    w = make({"kind": "closed_loop", "users": 6}, prefix={"groups": 3, "prefix_len": 10})
    assert w.closed_loop is not None
    assert [w.closed_loop.new_request(0.0, user=u).prefix_group for u in range(6)] == [0, 1, 2, 0, 1, 2]


# --- determinism --------------------------------------------------------------------------------------


def _sig(w: Workload, n: int = 3000) -> list[tuple[float, int, int, int]]:
    return [(r.arrival, r.prompt_len, r.output_len, r.prefix_group) for r in w.open_loop(max_requests=n)]


def test_determinism_and_independent_streams() -> None:
    arrival = {"kind": "gamma", "rate": 3.0, "cv": 2.0}
    lengths = {
        "prompt": {"kind": "lognormal", "mean": 300, "cv": 1},
        "output": {"kind": "exponential", "mean": 50},
        "prefix": {"groups": 4, "prefix_len": 16},
    }
    a = make(arrival, seed=11, **lengths)
    assert _sig(a) == _sig(a) == _sig(make(arrival, seed=11, **lengths))
    seq = np.random.SeedSequence(11)
    assert _sig(make(arrival, seed=seq, **lengths)) == _sig(make(arrival, seed=seq, **lengths))
    assert _sig(make(arrival, seed=12, **lengths)) != _sig(a)
    b = make(arrival, seed=11, **{**lengths, "output": {"kind": "uniform", "low": 1, "high": 9}})
    sa, sb = _sig(a), _sig(b)
    assert [(t, p, g) for t, p, _, g in sa] == [(t, p, g) for t, p, _, g in sb]
    assert [o for *_, o, _ in sa] != [o for *_, o, _ in sb]


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"arrival": {"kind": "poisson", "rate": 0}},
            r"test\.toml: workload\.arrival\.rate: .*greater than 0",
        ),
        ({"arrival": {"kind": "poisson", "rate": 1, "burst": 2}}, r"workload\.arrival\.burst: Extra"),
        ({"arrival": {"kind": "weibull"}}, r"workload\.arrival: .*'weibull'"),
        ({"arrival": {"kind": "gamma", "rate": 1}}, r"workload\.arrival\.cv: Field required"),
        ({"arrival": {"kind": "staged", "stages": [[1, -5]]}}, r"workload\.arrival\.stages\[0\]\[1\]"),
        ({"arrival": {"kind": "closed_loop", "users": 0}}, r"workload\.arrival\.users"),
        (
            {"arrival": {"kind": "closed_loop", "users": 1, "think_time_s": {"kind": "exponential"}}},
            r"workload\.arrival\.think_time_s\.mean: Field required",
        ),
        (
            {"prompt": {"kind": "uniform", "low": 9, "high": 3}},
            r"workload\.prompt: low \(9\) must be <= high",
        ),
        (
            {"prompt": {"kind": "normal", "mean": 9, "std": 3, "min": 9, "max": 3}},
            r"min \(9\) must be <= max",
        ),
        (
            {"prompt": {"kind": "fixed", "value": 0}},
            r"test\.toml: workload\.prompt\.value: a length must be >= 1",
        ),
        (  # was "length clamps allow no value", naming neither file nor key
            {"output": {"kind": "fixed", "value": 5, "min": 1.5, "max": 1.7}},
            r"test\.toml: workload\.output: min 1\.5 and max 1\.7 allow no whole number of tokens",
        ),
        ({"max_tokens": 0}, r"workload\.max_tokens"),
        ({"prefix": {"groups": 2}}, r"workload\.prefix\.prefix_len: Field required"),
    ],
)
def test_config_errors_name_the_key(table: dict[str, Any], message: str) -> None:
    full = {"arrival": {"kind": "poisson", "rate": 1}, **FIXED_LENGTHS, **table}
    with pytest.raises(SimError, match=message):
        parse_workload(full, "test.toml")


def test_missing_distributions() -> None:
    with pytest.raises(SimError, match=r"workload\.prompt: a length distribution is required"):
        parse_workload({"arrival": {"kind": "poisson", "rate": 1}})
    with pytest.raises(SimError, match="output: .*ignore_eos"):
        parse_workload({"arrival": {"kind": "poisson", "rate": 1}, "prompt": {"kind": "fixed", "value": 1}})


def test_runtime_errors(tmp_path: Path) -> None:
    with pytest.raises(SimError, match="never ends"):
        make({"kind": "poisson", "rate": 1.0}).open_loop()
    with pytest.raises(SimError, match=r"nowhere\.csv: file not found"):
        make({"kind": "trace", "path": "nowhere.csv"}, base_dir=tmp_path)
    (tmp_path / "bad.csv").write_text("time,prompt_tokens\n0,1\n")
    with pytest.raises(SimError, match=r"bad\.csv: no arrival column .*arrival_s"):
        make({"kind": "trace", "path": "bad.csv"}, base_dir=tmp_path)
    (tmp_path / "frac.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1.5,3\n")
    with pytest.raises(SimError, match=r"frac\.csv: line 2: column 'prompt_tokens': expected a whole number"):
        make({"kind": "trace", "path": "frac.csv"}, base_dir=tmp_path)


def test_toml_example_parses() -> None:
    doc = tomllib.loads(
        """
        [workload]
        max_tokens = 512
        arrival = { kind = "closed_loop", users = 16, think_time_s = { kind = "exponential", mean = 1.5 } }
        prompt = { kind = "lognormal", mean = 450, cv = 0.8, max = 4000 }
        output = { kind = "geometric", mean = 200, min = 2 }
        prefix = { groups = 9, prefix_len = 100, users_per_group = 5 }
        """
    )
    w = Workload(parse_workload(doc["workload"], "example.toml"), 0, Path("."))
    assert w.closed_loop is not None and w.closed_loop.users == 16
    r = w.closed_loop.new_request(0.0)
    assert 101 <= r.prompt_len <= 4100 and 2 <= r.output_len <= 512 and r.prefix_len == 100


# --- trace files: bounds and error lines --------------------------------------------------------------


def test_jsonl_trace_lines_and_gzip(tmp_path: Path) -> None:
    """JSON lines skip blank lines, errors count file lines, and a gzipped trace reads like a plain one."""
    rows = (
        '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n\n{"arrival_s": 1, "prompt_tokens": 6}\n'
    )
    (tmp_path / "t.jsonl").write_text(rows)
    with pytest.raises(SimError, match=r"t\.jsonl: line 3: column 'output_tokens': empty"):
        make({"kind": "trace", "path": "t.jsonl"}, base_dir=tmp_path)
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n1,6,3\n0,5,2\n")
    (tmp_path / "t.csv.gz").write_bytes(gzip.compress((tmp_path / "t.csv").read_bytes()))
    table = {"arrival": {"kind": "trace", "path": "t.csv.gz"}}
    reqs = list(Workload(parse_workload(table), 0, tmp_path).open_loop())
    assert [(r.arrival, r.prompt_len, r.output_len) for r in reqs] == [(0.0, 5, 2), (1.0, 6, 3)]


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ("0,1,2,5,6", "line 2: column 'prefix_len': exceeds the prompt length"),
        ("-1,1,2,0,0", "line 2: column 'arrival_s': expected a number in [0, 100000000]"),
        ("0,16777217,2,0,0", "line 2: column 'prompt_tokens': expected a whole number in [1, 16777216]"),
        ("0,1,2,9007199254740993,0", "line 2: column 'prefix_group': expected a whole number in [-1, "),
        ("0,1,0,0,0", "line 2: column 'output_tokens': expected a whole number in [1, "),
    ],
)
def test_trace_values_are_bounded(tmp_path: Path, cells: str, message: str) -> None:
    header = "arrival_s,prompt_tokens,output_tokens,prefix_group,prefix_len\n"
    (tmp_path / "t.csv").write_text(header + cells + "\n")
    with pytest.raises(SimError, match=re.escape(message)):
        make({"kind": "trace", "path": "t.csv"}, base_dir=tmp_path)


def test_trace_prompts_shorter_than_the_prefix_table_are_refused(tmp_path: Path) -> None:
    """A trace's prompt includes its shared prefix; a 10-token prompt in a group of 50-token prefixes was
    accepted, and its prefix silently cut to the prompt."""
    (tmp_path / "t.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_group\n0,60,2,1\n1,10,2,-1\n2,30,2,0\n"
    )
    prefix = {"groups": 2, "prefix_len": 50}
    table = {"arrival": {"kind": "trace", "path": "t.csv"}, "prefix": prefix}
    with pytest.raises(
        SimError, match=re.escape("t.csv: line 4: column 'prompt_tokens': shorter than workload.")
    ):
        Workload(parse_workload(table), 0, tmp_path)
    (tmp_path / "t.csv").write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_group\n0,60,2,1\n1,10,2,-1\n"
    )
    reqs = list(Workload(parse_workload(table), 0, tmp_path).open_loop())  # ungrouped rows may be short
    assert [(r.prompt_len, r.prefix_len) for r in reqs] == [(60, 50), (10, 0)]


def test_trace_with_a_repeated_column_is_refused(tmp_path: Path) -> None:
    """Polars renamed the second `arrival_s` and the first was replayed, whatever the second held."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,arrival_s,output_tokens\n0,5,9,2\n")
    with pytest.raises(SimError, match=re.escape("t.csv: line 1: column 'arrival_s' appears more than once")):
        Workload(parse_workload({"arrival": {"kind": "trace", "path": "t.csv"}}), 0, tmp_path)
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,,\n0,5,2,,\n")  # blank names
    assert len(list(Workload(parse_workload({"arrival": {"kind": "trace", "path": "t.csv"}}), 0, tmp_path)
                    .open_loop())) == 1  # fmt: skip


@pytest.mark.parametrize(
    ("header", "column", "field", "expected"),
    [
        (
            "arrival_s,prompt_len,output_len",
            "prompt_len",
            "prompt",
            "'prompt_tokens' or 'num_prefill_tokens'",
        ),
        (
            "arrival_s,prompt_tokens,output_len",
            "output_len",
            "output",
            "'output_tokens' or 'num_decode_tokens'",
        ),
        ("arrival_s,input_tokens,output_tokens", "input_tokens", "prompt", "'prompt_tokens'"),
        ("arrival_s,prompt_tokens,completion_tokens", "completion_tokens", "output", "'output_tokens'"),
        ("TIMESTAMP,arrival_s,ContextTokens,GeneratedTokens", "ContextTokens", "prompt", "'prompt_tokens'"),
        ("arrival_s,prompt_tokens,GeneratedTokens", "GeneratedTokens", "output", "'output_tokens'"),
    ],
)
def test_trace_length_columns_under_other_names_are_refused(
    tmp_path: Path, header: str, column: str, field: str, expected: str
) -> None:
    """A trace whose lengths sit under a name the replay does not read (`prompt_len`, `completion_tokens`,
    Azure 2023's `ContextTokens`) ran with lengths drawn from `[workload]`, the column ignored without a word;
    it is refused, naming the column found and the ones read."""
    cells = ",".join(str(i + 1) for i in range(header.count(",") + 1))
    (tmp_path / "t.csv").write_text(f"{header}\n{cells}\n")
    table = {
        "arrival": {"kind": "trace", "path": "t.csv"},
        "prompt": {"kind": "fixed", "value": 7},
        "output": {"kind": "fixed", "value": 7},
    }
    with pytest.raises(SimError, match=re.escape(f"column {column!r} looks like {field} lengths")) as e:
        Workload(parse_workload(table), 0, tmp_path)
    assert expected in str(e.value)
    assert f"workload.{field}" in str(e.value)


def test_trace_extra_columns_that_are_not_lengths_replay(tmp_path: Path) -> None:
    """Ids, timestamps, an adapter, an acceptance rate and prefix columns beside the length columns are
    legitimate, as is a length-like column beside a recognised one for that length."""
    (tmp_path / "t.csv").write_text(
        "request_id,timestamp,arrival_s,prompt_tokens,output_tokens,acceptance_rate,prefix_group,prefix_len,"
        "prompt_chars,input_tokens\n7,2024-01-01,0,10,3,0.7,0,4,55,10\n"
    )
    reqs = list(
        Workload(parse_workload({"arrival": {"kind": "trace", "path": "t.csv"}}), 0, tmp_path).open_loop()
    )
    assert [(r.prompt_len, r.output_len, r.prefix_len) for r in reqs] == [(10, 3, 4)]
