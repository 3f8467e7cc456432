"""Run manifests: every run records what it came from, is written as one unit, and `sim report` refuses to
compare runs of different scenarios; a damaged sweep point is redone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

import sim
from sim.cli import app
from sim.config.scenario import load_scenario
from sim.io.errors import SimError
from sim.report.build import build_report
from sim.report.inputs import load_inputs
from sim.studies import sweep
from sim.studies.run import run_policy, write_result

TINY = """
name = "tiny"
description = "two policies, a few seconds"
seed = 5

[model]
name = "llama-2-7b"
gpu = "A100-80GB"

[workload]
arrival = { kind = "poisson", rate = 2.0 }
prompt = { kind = "lognormal", mean = 128, cv = 1.0, min = 8, max = 512 }
output = { kind = "lognormal", mean = 32, cv = 1.0, min = 2, max = 128 }
max_tokens = 128

[horizon]
duration_s = 10

[slo]
ttft_s = 0.5
tpot_s = 0.05

[policies.static]
scheduler = "static"
max_batch_size = 8

[policies.continuous]
scheduler = "continuous"
max_num_seqs = 8
"""
RUN_FILES = ("manifest.json", "requests.parquet", "steps.parquet", "summary.json")
runner = CliRunner()


def scenario_file(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    return path


def sim_run(*args: str) -> Any:
    result = runner.invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    return result


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_each_run_writes_a_manifest_of_what_it_came_from(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    sim_run(str(path), "--set", "workload.arrival.rate=3", "--out", str(tmp_path / "out"))
    for policy in ("static", "continuous"):
        assert sorted(p.name for p in (tmp_path / "out" / policy).iterdir()) == sorted(RUN_FILES)
        manifest = json.loads((tmp_path / "out" / policy / "manifest.json").read_text())
        assert manifest["policy"] == policy and manifest["scheduler"] == policy
        assert manifest["scenario"] == "tiny" and manifest["seed"] == 5
        assert manifest["servesim"] == sim.__version__
        assert manifest["as_run"]["workload"]["arrival"]["rate"] == 3  # the override is recorded
        assert len(manifest["scenario_hash"]) == 64
    assert not (tmp_path / "out" / "scenario.json").exists()  # no record outside the run folders


def test_identical_runs_write_identical_files_including_the_manifest(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    for name in ("a", "b"):
        sim_run(str(path), "--out", str(tmp_path / name))
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_scenario_hash_covers_what_runs_share_and_nothing_else(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    base = load_scenario(path)

    def manifest(overrides: list[str], policy: str = "static") -> dict[str, Any]:
        from sim.studies.run import run_manifest

        return run_manifest(load_scenario(path, overrides), policy)

    same = manifest([])["scenario_hash"]
    assert manifest(["workload.arrival.rate=2"])["scenario_hash"] == same  # 2 and 2.0 are one rate
    assert manifest(["description='other words'"])["scenario_hash"] == same
    assert manifest(["policies.static.max_batch_size=4"])["scenario_hash"] == same  # each run's own table
    assert manifest([], "continuous")["scenario_hash"] == same
    for changed in ("workload.arrival.rate=3", "seed=6", "horizon.duration_s=11", "slo.ttft_s=1.0"):
        assert manifest([changed])["scenario_hash"] != same, changed
    assert base.seed == 5


def test_readme_sequence_of_mixed_runs_is_refused_naming_the_difference(tmp_path: Path) -> None:
    """Run both policies, re-run one at another rate into the same folder: the report must not compare
    a 3 req/s run with a 1 req/s one, and must say which setting differs."""
    path = scenario_file(tmp_path)
    out = tmp_path / "reports" / "tiny"
    sim_run(str(path), "--set", "workload.arrival.rate=1", "--out", str(out))
    second = sim_run(
        str(path), "--set", "workload.arrival.rate=3", "--policy", "continuous", "--out", str(out)
    )
    assert "sim report" in second.output and "workload.arrival.rate" in second.output  # warned at once
    result = runner.invoke(app, ["report", str(out), "--no-png"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and not (out / "index.html").exists()
    message = result.output
    assert "different scenarios" in message and "workload.arrival.rate" in message
    assert "3.0 in continuous" in message and "1.0 in static" in message

    # Re-running the other policy with the same settings makes the folder consistent again.
    sim_run(str(path), "--set", "workload.arrival.rate=3", "--policy", "static", "--out", str(out))
    result = runner.invoke(app, ["report", str(out), "--no-png"])
    assert result.exit_code == 0, result.output
    html = (out / "index.html").read_text()
    assert "At 3 req/s" in html and "At 1 req/s" not in html


def test_report_refuses_a_run_without_manifest_or_with_missing_files(tmp_path: Path) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    sim_run(str(path), "--out", str(out))
    (out / "static" / "steps.parquet").unlink()
    with pytest.raises(SimError, match=r"static: incomplete run \(steps.parquet missing\)"):
        load_inputs(out)
    sim_run(str(path), "--policy", "static", "--out", str(out))
    (out / "continuous" / "manifest.json").unlink()
    with pytest.raises(SimError, match="manifest.json missing"):
        load_inputs(out)


@pytest.mark.parametrize("records", ["requests.parquet", "steps.parquet"])
def test_report_refuses_records_without_the_columns_it_reads(tmp_path: Path, records: str) -> None:
    """Parquet files of another shape (say, a user's own) were a polars ColumnNotFoundError traceback."""
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    sim_run(str(path), "--out", str(out))
    pl.DataFrame({"a": [1]}).write_parquet(out / "static" / records)
    result = runner.invoke(app, ["report", str(out), "--no-png"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"static/{records}: not the records of `sim run` (no column " in result.output


def test_an_interrupted_run_leaves_the_previous_results_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    sim_run(str(path), "--out", str(out))
    before = snapshot(out)
    original = pl.DataFrame.write_parquet
    calls = 0

    def killed_midway(self: pl.DataFrame, file: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:  # requests.parquet is written; the process dies writing steps.parquet
            raise KeyboardInterrupt
        original(self, file, *args, **kwargs)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", killed_midway)
    sc = load_scenario(path, ["workload.arrival.rate=3"])
    with pytest.raises(KeyboardInterrupt):
        write_result(run_policy(sc, "static", tmp_path), out)
    assert snapshot(out) == before  # old results untouched
    assert sorted(p.name for p in out.iterdir()) == ["continuous", "static"]  # no temporary folder left


def test_a_run_killed_while_simulating_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sim.studies.run

    def dies(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(sim.studies.run, "simulate", dies)
    result = runner.invoke(app, ["run", str(scenario_file(tmp_path)), "--out", str(tmp_path / "out")])
    assert result.exit_code != 0
    assert not (tmp_path / "out").exists()  # nothing written before the results exist


def test_run_does_not_replace_a_folder_it_did_not_write(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "static").mkdir(parents=True)
    (out / "static" / "notes.txt").write_text("mine")
    args = ["run", str(scenario_file(tmp_path)), "--policy", "static", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "not one of our output folders" in result.output
    assert (out / "static" / "notes.txt").read_text() == "mine"


def test_report_notes_when_sweep_and_runs_differ_beyond_the_rate(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, TINY + '\n[sweep]\nrates = [1, 2]\npolicies = ["continuous"]\n')
    out = tmp_path / "out"
    sweep.run_sweep(path, ["horizon.duration_s=6"], jobs=1, out=out)
    sim_run(str(path), "--set", "workload.arrival.rate=3", "--out", str(out))
    inputs = load_inputs(out)
    assert len(inputs.notes) == 1 and "horizon.duration_s" in inputs.notes[0]
    assert "6.0 in the sweep, 10.0 in the runs" in inputs.notes[0]
    assert "workload.arrival.rate" not in inputs.notes[0]  # the swept axis may differ
    build_report(out, png=False)
    assert 'class="note"' in (out / "index.html").read_text()

    sim_run(str(path), "--set", "horizon.duration_s=6", "--out", str(out))
    assert load_inputs(out).notes == []


def test_a_truncated_sweep_point_is_redone(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, TINY + "\n[sweep]\nrates = [1, 2]\n")
    first = sweep.run_sweep(path, jobs=1, out=tmp_path)
    points = tmp_path / "sweep" / "points"
    victim = sorted(points.iterdir())[0]
    whole = victim.read_bytes()
    victim.write_bytes(whole[: len(whole) // 2])
    again = sweep.run_sweep(path, jobs=1, out=tmp_path)
    assert (again.ran, again.resumed) == (1, first.ran - 1)
    assert pl.read_parquet(victim).height == 1
    assert again.points.sort("point_key").equals(first.points.sort("point_key"))


def test_terminate_signal_lets_the_clean_up_run(tmp_path: Path) -> None:
    import os
    import signal

    from sim.io.outputs import exit_on_terminate, replace_folder

    target = tmp_path / "static"
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(SystemExit) as stop,
        exit_on_terminate(),
        replace_folder(target, lambda p: True) as tmp,
    ):
        (tmp / "requests.parquet").write_bytes(b"half")
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.code == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []  # neither the target nor the temporary folder
    assert signal.getsignal(signal.SIGTERM) is before


def test_interrupt_hooks_run_when_the_signal_arrives_before_anything_unwinds() -> None:
    """`on_interrupt`: a hook runs at the signal, while the block is still running (a dask client's loggers
    are quieted before its futures are cancelled), and no longer once its block is left."""
    import os
    import signal

    from sim.io.outputs import exit_on_terminate, on_interrupt

    seen: list[str] = []
    hook = on_interrupt(lambda: seen.append("hook"))
    with pytest.raises(KeyboardInterrupt), exit_on_terminate(), hook:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        finally:
            seen.append("unwound")
    assert seen == ["hook", "unwound"]
    with pytest.raises(SystemExit), exit_on_terminate():
        os.kill(os.getpid(), signal.SIGTERM)
    assert seen == ["hook", "unwound"]


def test_a_run_beside_a_sweep_of_the_same_scenario_is_not_called_a_different_scenario(
    tmp_path: Path,
) -> None:
    """`sim sweep` then `sim run` of one scenario into one folder: the sweep's folder is no run folder, and
    its manifest (the scenario as written, defaults left out) read as a run's said `calibration: None there,
    {} here` and that `sim report` would refuse, which it does not."""
    path = scenario_file(tmp_path, TINY + '\n[sweep]\nrates = [1, 2]\npolicies = ["continuous"]\n')
    out = tmp_path / "out"
    sweep.run_sweep(path, jobs=1, out=out)
    result = sim_run(str(path), "--out", str(out))
    assert "different scenario" not in result.output and "note:" not in result.output, result.output
    inputs = load_inputs(out)
    assert [r.policy for r in inputs.runs] == ["continuous", "static"] and inputs.notes == []


def test_run_and_report_name_the_same_differences_of_a_sweep_beside_the_runs(tmp_path: Path) -> None:
    """A sweep of another horizon beside the runs: `sim run` says what `sim report` then notes (the same
    comparison, on validated values, the swept rate left out), and does not claim the report will refuse."""
    path = scenario_file(tmp_path, TINY + '\n[sweep]\nrates = [1, 2]\npolicies = ["continuous"]\n')
    out = tmp_path / "out"
    sweep.run_sweep(path, ["horizon.duration_s=6"], jobs=1, out=out)
    result = sim_run(str(path), "--set", "workload.arrival.rate=3", "--out", str(out))
    assert "horizon.duration_s: 6.0 in the sweep, 10.0 in the runs" in result.output, result.output
    assert "refuse" not in result.output and "workload.arrival.rate" not in result.output
    (note,) = load_inputs(out).notes
    assert "horizon.duration_s: 6.0 in the sweep, 10.0 in the runs" in note


def test_run_warns_of_exactly_the_run_folders_the_report_refuses(tmp_path: Path) -> None:
    """The warning of `sim run` and the refusal of `sim report` come from one comparison of the same run
    folders: a hidden folder or the report's own `charts/` is in neither."""
    path = scenario_file(tmp_path)
    out = tmp_path / "out"
    sim_run(str(path), "--policy", "static", "--out", str(out))
    for name in (".old", "charts"):
        (out / name).mkdir()
        (out / name / "manifest.json").write_text("{}")
    second = sim_run(str(path), "--set", "seed=6", "--policy", "continuous", "--out", str(out))
    assert "  static: seed: 5 there, 6 here" in second.output, second.output
    assert "charts:" not in second.output and ".old:" not in second.output
    with pytest.raises(SimError, match=r"runs of continuous and static come from different scenarios \(seed"):
        load_inputs(out)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_the_next_run_removes_what_a_killed_run_left_beside_its_output(tmp_path: Path) -> None:
    """SIGKILL runs no clean-up: a killed `sim run` leaves its hidden temporary folder (`.static.new-...`)
    beside the output, and a killed sweep a half-written point file. The next run into the same folder
    removes them; a temporary of a writer still running is left alone."""
    import os

    out = tmp_path / "out"
    dead, live = _dead_pid(), os.getpid()
    killed = out / f".static.new-{dead}-0123abcd"
    (killed / "static").mkdir(parents=True)
    (killed / "static" / "requests.parquet").write_bytes(b"half")
    running = out / f".continuous.new-{live}-89abcdef"
    running.mkdir()
    sim_run(str(scenario_file(tmp_path)), "--out", str(out))
    assert not killed.exists() and running.is_dir()
    points = out / "sweep" / "points"
    points.mkdir(parents=True)
    half = points / f".static__rate=1.0__rep=0.parquet.tmp-{dead}-4567cdef"
    half.write_bytes(b"PAR1 half")
    sweep_table = "\n[sweep]\nrates = [1]\nreplications = 1\n"
    path = scenario_file(tmp_path, TINY.replace("duration_s = 10", "duration_s = 2") + sweep_table)
    result = runner.invoke(app, ["sweep", str(path), "--jobs", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert not half.exists()
