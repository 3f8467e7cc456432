"""`sim sweep`: grid expansion, seeds, resume and --force, atomic point files, executors, capacity, CLI."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from rich.console import Console
from test_manifest import TINY
from typer.testing import CliRunner

from sim.cli import app, main
from sim.config import sweep as sweep_config
from sim.config.scenario import validate_scenario
from sim.io.errors import SimError
from sim.studies import points, sweep

# The tests' two-policy scenario, with this module's seed and a shorter horizon.
SCENARIO = TINY.replace("seed = 5", "seed = 3").replace("duration_s = 10", "duration_s = 8")

SWEEP = """
[sweep]
rates = [1, 4]
replications = 2
"""


def write(tmp_path: Path, sweep_table: str = SWEEP) -> Path:
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "tiny.toml"
    path.write_text(SCENARIO + sweep_table)
    return path


def point_files(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "sweep" / "points").iterdir())


# --- grid ---------------------------------------------------------------------------------------------


def test_rate_forms_and_param_grid() -> None:
    cfg = sweep_config.parse_sweep({"rates": {"start": 1, "stop": 3, "num": 5}}, "f")
    assert cfg.rate_values() == [1.0, 1.5, 2.0, 2.5, 3.0]
    cfg = sweep_config.parse_sweep({"rates": {"start": 0.5, "stop": 2, "step": 0.5}}, "f")
    assert cfg.rate_values() == [0.5, 1.0, 1.5, 2.0]
    cfg = sweep_config.parse_sweep({"rates": [4, 1, 4], "params": {"b": [1, 2], "a": ["x", "y", "z"]}}, "f")
    assert cfg.rate_values() == [1.0, 4.0]
    grid = cfg.param_grid()
    assert len(grid) == 6 and grid[0] == {"a": "x", "b": 1} and grid[-1] == {"a": "z", "b": 2}
    assert sweep_config.parse_sweep(None, "f").rate_values() == [None]
    assert sweep_config.parse_sweep(None, "f").param_grid() == [{}]


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"rate": [1]}, "f: sweep.rate: Extra inputs are not permitted"),
        ({"rates": {"start": 1, "stop": 2, "num": 2, "step": 1}}, "sweep.rates"),
        ({"rates": {"start": 3, "stop": 2, "num": 2}}, "sweep.rates"),
        ({"rates": [1, -2]}, "sweep.rates"),
        ({"replications": 0}, "sweep.replications"),
        ({"params": {"horizon.duration_s": []}}, "sweep.params.horizon.duration_s"),
        ({"params": {"horizon.duration_s": 5}}, "sweep.params.horizon.duration_s"),
    ],
)
def test_sweep_table_errors_name_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(SimError, match=message.replace(".", r"\.")):
        sweep_config.parse_sweep(table, "f")


def test_rate_axis_per_arrival_kind(tmp_path: Path) -> None:
    import tomllib

    raw = tomllib.loads(SCENARIO)
    sc = validate_scenario(raw, "f")
    assert points.apply_rate(raw, sc, 5.0, "f")["workload"]["arrival"]["rate"] == 5.0
    raw["workload"]["arrival"] = {"kind": "staged", "stages": [[1.0, 10.0], [3.0, 30.0]]}
    sc = validate_scenario(raw, "f")
    stages = points.apply_rate(raw, sc, 5.0, "f")["workload"]["arrival"]["stages"]
    assert stages == [[pytest.approx(2.0), 10.0], [pytest.approx(6.0), 30.0]]  # mean 2.5 -> 5, same shape
    raw["workload"]["arrival"] = {"kind": "closed_loop", "users": 4}
    sc = validate_scenario(raw, "f")
    assert points.apply_rate(raw, sc, 16.0, "f")["workload"]["arrival"]["users"] == 16
    with pytest.raises(SimError, match="sweep.rates: closed_loop sweeps users"):
        points.apply_rate(raw, sc, 2.5, "f")


def test_point_key_is_a_stable_distinct_file_name() -> None:
    key = points.point_key("static", 2.0, {}, 1)
    assert key == "static__rate=2.0__rep=1"
    assert points.point_key("static", None, {}, 0) == "static__rep=0"
    a = points.point_key("p", 1.0, {"x.y": 1, "z": "a"}, 0)
    assert a == points.point_key("p", 1.0, {"z": "a", "x.y": 1}, 0)
    assert a != points.point_key("p", 1.0, {"x.y": 2, "z": "a"}, 0)
    assert "/" not in points.point_key("a/b c", 1.0, {}, 0)
    assert points.point_path(Path("d"), key) == Path("d/static__rate=2.0__rep=1.parquet")


# --- runs ---------------------------------------------------------------------------------------------


def test_sweep_writes_the_point_contract_and_aggregate(tmp_path: Path) -> None:
    res = sweep.run_sweep(write(tmp_path), jobs=1, out=tmp_path)
    assert (res.ran, res.resumed) == (8, 0)
    files = point_files(tmp_path)
    assert len(files) == 8 and "continuous__rate=4.0__rep=1.parquet" in files
    row = pl.read_parquet(tmp_path / "sweep/points/continuous__rate=4.0__rep=1.parquet")
    assert row.height == 1 and list(row.schema) == list(points.POINT_SCHEMA)
    r = row.row(0, named=True)
    assert (r["policy"], r["scheduler"], r["rate"], r["replication"]) == ("continuous", "continuous", 4.0, 1)
    assert (r["seed_entropy"], r["spawn_key"], r["params"]) == ("3", [1], "{}")
    assert r["arrived"] > 0 and r["ttft_p99"] > 0
    agg = pl.read_parquet(tmp_path / "sweep/aggregate.parquet")
    assert {"policy", "scheduler", "rate", "params", "metric", "mean", "ci_low", "ci_high", "n"} == set(
        agg.columns
    )
    ttft = agg.filter(policy="continuous", rate=4.0, metric="ttft_p99").row(0, named=True)
    assert ttft["n"] == 2 and ttft["ci_low"] <= ttft["mean"] <= ttft["ci_high"]
    assert not list((tmp_path / "sweep/points").glob(".*"))  # no temporary files left behind


def test_replications_differ_and_policies_share_a_stream(tmp_path: Path) -> None:
    res = sweep.run_sweep(write(tmp_path), jobs=1, out=tmp_path)
    pts = res.points
    reps = pts.filter(policy="static", rate=4.0).sort("replication")
    assert reps["arrived"][0] != reps["arrived"][1] or reps["ttft_mean"][0] != reps["ttft_mean"][1]
    for rep in (0, 1):  # common random numbers: same arrivals for every policy
        assert pts.filter(rate=4.0, replication=rep)["arrived"].n_unique() == 1
    children = np.random.SeedSequence(3).spawn(2)
    assert sorted(pts["spawn_key"].to_list())[-1] == list(children[1].spawn_key)


def test_same_numbers_with_one_or_two_jobs(tmp_path: Path) -> None:
    path = write(tmp_path)
    one = sweep.run_sweep(path, jobs=1, out=tmp_path / "one").points.sort("point_key")
    two = sweep.run_sweep(path, jobs=2, out=tmp_path / "two").points.sort("point_key")
    assert one.equals(two)


def test_resume_skips_finished_points_and_force_redoes_them(tmp_path: Path) -> None:
    path = write(tmp_path)
    first = sweep.run_sweep(path, jobs=1, out=tmp_path)
    again = sweep.run_sweep(path, jobs=1, out=tmp_path)
    assert (again.ran, again.resumed) == (0, 8)
    assert again.points.sort("point_key").equals(first.points.sort("point_key"))
    more = sweep.run_sweep(path, ["sweep.rates=[1, 4, 8]"], jobs=1, out=tmp_path)
    assert (more.ran, more.resumed) == (4, 8)
    forced = sweep.run_sweep(path, jobs=1, force=True, out=tmp_path)
    assert (forced.ran, forced.resumed) == (8, 0)
    assert len(point_files(tmp_path)) == 8  # --force drops points no longer in the grid
    with pytest.raises(SimError, match="different scenario.*--force"):
        sweep.run_sweep(path, ["horizon.duration_s=5"], jobs=1, out=tmp_path)


def test_points_of_another_simulator_are_made_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an upgrade or a new calibration the kept points would mix two cost models: they are redone,
    with a note, and the next run of the same simulator reads them back."""
    path = write(tmp_path)
    sweep.run_sweep(path, jobs=1, out=tmp_path)
    monkeypatch.setattr(sweep, "simulator_fingerprint", lambda: "another simulator")
    screen = Console(file=io.StringIO(), width=200)
    again = sweep.run_sweep(path, jobs=1, out=tmp_path, console=screen)
    assert (again.ran, again.resumed) == (8, 0)
    assert "made by another version of the simulator: redoing them" in screen.file.getvalue()  # type: ignore[attr-defined]
    assert sweep.run_sweep(path, jobs=1, out=tmp_path).resumed == 8


def test_a_failing_point_leaves_finished_points_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path)
    real = points.run_policy

    def flaky(scenario: Any, policy: str, base_dir: Path, seed: Any = None) -> Any:
        if policy == "static" and scenario.workload.arrival.rate == 4.0:
            raise RuntimeError("worker died")
        return real(scenario, policy, base_dir, seed=seed)

    monkeypatch.setattr(points, "run_policy", flaky)
    with pytest.raises(RuntimeError, match="worker died"):
        sweep.run_sweep(path, jobs=1, out=tmp_path)
    done = point_files(tmp_path)
    assert done == ["static__rate=1.0__rep=0.parquet", "static__rate=1.0__rep=1.parquet"]

    # A crash while a point file is being written leaves no file under its name.
    monkeypatch.setattr(points, "run_policy", real)
    original = pl.DataFrame.write_parquet

    def torn(self: pl.DataFrame, file: Any, *args: Any, **kwargs: Any) -> None:
        Path(file).write_bytes(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", torn)
    with pytest.raises(SimError, match=r"cannot write .*/sweep/points/.*\.parquet: disk full"):
        sweep.run_sweep(path, jobs=1, out=tmp_path)
    assert point_files(tmp_path) == done
    with pytest.raises(SystemExit) as exit_info:  # from the command line: one error line, exit 2
        main(["sweep", str(path), "--jobs", "1", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert point_files(tmp_path) == done
    monkeypatch.setattr(pl.DataFrame, "write_parquet", original)

    res = sweep.run_sweep(path, jobs=1, out=tmp_path)
    assert (res.ran, res.resumed) == (6, 2)
    assert all(pl.read_parquet(tmp_path / "sweep/points" / f).height == 1 for f in point_files(tmp_path))


def test_params_axis_and_no_rates(tmp_path: Path) -> None:
    table = '[sweep]\npolicies = ["continuous"]\nparams = { "workload.max_tokens" = [16, 64] }\n'
    res = sweep.run_sweep(write(tmp_path, table), jobs=1, out=tmp_path)
    pts = res.points.sort("params")
    assert pts["rate"].to_list() == [None, None]
    assert [json.loads(p) for p in pts["params"]] == [
        {"workload.max_tokens": 16},
        {"workload.max_tokens": 64},
    ]
    assert pts["output_tokens_per_s"][0] < pts["output_tokens_per_s"][1]


def test_find_capacity_brackets_and_bisects(tmp_path: Path) -> None:
    table = "[sweep]\nrates = [0.5, 2, 16, 64]\ncapacity_steps = 2\n"
    res = sweep.run_sweep(
        write(tmp_path, table), ["horizon.duration_s=20"], jobs=1, find_capacity=True, out=tmp_path
    )
    saved = json.loads((tmp_path / "sweep/capacity.json").read_text())
    assert saved == res.capacity and saved["unit"] == "req/s"
    caps = {c["policy"]: c for c in saved["capacities"]}
    cont = caps["continuous"]
    assert cont["status"] == "found", cont
    assert len(cont["refined"]) == 2
    assert cont["last_pass"] <= cont["capacity"] < cont["first_fail"]
    assert res.points.height == 8 + 2 * sum(len(c["refined"]) for c in caps.values()) // 2
    for c in caps.values():  # refinement runs are points too
        for r in c["refined"]:
            assert f"{c['policy']}__rate={r['rate']!r}__rep=0.parquet" in point_files(tmp_path)


def test_dask_executor_matches_in_process(tmp_path: Path) -> None:
    distributed = pytest.importorskip("dask.distributed")  # in the dev extra; skipped only without it
    path = write(tmp_path)
    local = sweep.run_sweep(path, jobs=1, out=tmp_path / "local").points.sort("point_key")
    with distributed.LocalCluster(n_workers=1, processes=False, dashboard_address=None) as cluster:
        res = sweep.run_sweep(path, executor="dask", address=cluster.scheduler_address, out=tmp_path / "dask")
    assert res.points.sort("point_key").equals(local)


# --- errors -------------------------------------------------------------------------------------------


def test_sweep_errors(tmp_path: Path) -> None:
    path = write(tmp_path)
    with pytest.raises(SimError, match="sweep.policies: no policy 'vllm'"):
        sweep.run_sweep(path, ['sweep.policies=["vllm"]'], out=tmp_path)
    with pytest.raises(SimError, match="--find-capacity needs sweep.rates"):
        sweep.run_sweep(write(tmp_path / "bare", ""), find_capacity=True, out=tmp_path)
    with pytest.raises(SimError, match=r"sweep.params.workload.arrival.rate: this is the rates axis"):
        sweep.run_sweep(path, ["sweep.params={'workload.arrival.rate' = [1]}"], out=tmp_path)
    with pytest.raises(
        SimError, match=r"sweep point \(workload.arrival.kind = 'nope', rate = 1.0\): .*workload.arrival"
    ):
        sweep.run_sweep(path, ["sweep.params={'workload.arrival.kind' = ['nope']}"], out=tmp_path)
    with pytest.raises(SimError, match="--address"):
        sweep.run_sweep(path, executor="dask", out=tmp_path)
    with pytest.raises(SimError, match="unknown executor"):
        sweep.run_sweep(path, executor="threads", out=tmp_path)
    with pytest.raises(SimError, match="--jobs"):
        sweep.run_sweep(path, jobs=0, out=tmp_path)


@pytest.mark.parametrize("address", ["foo", "tcp://[::1"])
def test_a_malformed_dask_address_is_a_user_error(tmp_path: Path, address: str) -> None:
    """An --address dask cannot parse is a SimError naming it, not dask's ValueError."""
    pytest.importorskip("dask.distributed")
    with pytest.raises(SimError, match=re.escape(f"--address {address}: ")):
        sweep.run_sweep(write(tmp_path), executor="dask", address=address, out=tmp_path)


def test_cli_prints_errors_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, "[sweep]\nrate = [1]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "sim", "sweep", str(path), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and "sweep.rate" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cli_runs_a_sweep(tmp_path: Path) -> None:
    path = write(tmp_path, "[sweep]\nrates = [2]\n")
    args = [sys.executable, "-m", "sim", "sweep", str(path), "--jobs", "1", "--out", str(tmp_path)]
    proc = subprocess.run([*args, "--find-capacity"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 points (2 run, 0 already done)" in proc.stdout and "capacity" in proc.stdout
    assert (tmp_path / "sweep/capacity.json").exists()


def test_the_sweep_says_how_many_requests_its_latencies_cover(tmp_path: Path) -> None:
    """A sweep judges capacities by latencies over the finished requests only, and said nothing of how many
    that was: it now states how many requests its points' latencies cover (and how many runs were
    overloaded), and each capacity how many its latencies cover, counted from the point files."""
    path = write(tmp_path, "[sweep]\nrates = [2, 40]\n")
    args = ["sweep", str(path), "--jobs", "1", "--find-capacity", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    pts = pl.concat([pl.read_parquet(p) for p in sorted((tmp_path / "sweep" / "points").glob("*.parquet"))])
    arrived, finished = int(pts["arrived"].sum()), int(pts["finished"].sum())
    over, runs = int(pts["overloaded"].sum()), pts.height
    assert over and finished < arrived
    assert (
        f"Latencies cover only the requests that finished: over the sweep's {runs} runs, {finished:,} of "
        f"{arrived:,} requests ({arrived - finished:,} unfinished); {over} of the {runs} runs overloaded."
    ) in " ".join(result.output.split()), result.output
    caps = json.loads((tmp_path / "sweep" / "capacity.json").read_text())["capacities"]
    shown = {}
    for line in result.output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)[1:-1]]
        if len(cells) == 4:
            shown[cells[0]] = cells[3]
    assert shown["policy"] == "latencies at capacity cover"
    found = [c for c in caps if c["capacity"] is not None]
    assert found, caps
    for cap in found:
        at = pts.filter((pl.col("policy") == cap["policy"]) & (pl.col("rate") == cap["capacity"]))
        done, n = int(at["finished"].sum()), int(at["arrived"].sum())
        tail = f"{n - done:,} unfinished" if n > done else "all finished"
        assert shown[cap["policy"]] == f"{done:,} of {n:,} ({tail})", result.output


# --- shipped scenarios --------------------------------------------------------------------------------

SCENARIOS = sorted((Path(__file__).parent.parent / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_validates_and_runs_briefly(path: Path) -> None:
    from sim.config.scenario import load_scenario
    from sim.studies.run import run_policy

    scenario = load_scenario(path, ["horizon.duration_s=4", "horizon.max_requests=24"])
    cfg = sweep_config.parse_sweep(scenario.sweep, str(path))
    assert set(cfg.policies or scenario.policies) <= set(scenario.policies)
    assert path.read_text().startswith("# Question"), "each scenario says which question it answers"
    for policy in scenario.policies:
        summary = run_policy(scenario, policy, path.parent).summary
        assert summary["requests"]["arrived"] > 0


def test_address_without_the_dask_executor_is_refused_before_any_point_runs(tmp_path: Path) -> None:
    """`--address` with the process executor used to be dropped silently; it is refused, writing nothing."""
    with pytest.raises(SimError, match="--address tcp://10.0.0.1:8786 goes with --executor dask"):
        sweep.run_sweep(
            write(tmp_path), executor="process", address="tcp://10.0.0.1:8786", out=tmp_path / "o"
        )
    assert not (tmp_path / "o").exists()
