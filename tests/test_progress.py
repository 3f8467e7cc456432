"""What `sim run` says on screen: a progress bar on a terminal (fed at a coarse interval, not at all
elsewhere), one line per run, one line per reason requests were rejected, and how many requests each
latency of its table covers; progress of replay and validation."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from rich.console import Console
from test_manifest import TINY
from typer.testing import CliRunner

import sim.studies.run
from sim.cli import app
from sim.config.scenario import load_scenario
from sim.io import progress
from sim.studies import replay
from sim.studies.run import PROGRESS_EVERY, run_policy
from sim.studies.validate import load_rows, predict_all

ROOT = Path(__file__).resolve().parents[1]
ORACLE = ROOT / "tests" / "data" / "oracle"
runner = CliRunner()


def terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=120)


def test_off_a_terminal_the_engine_gets_no_progress_hook_and_one_line_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_progress_wanted(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("progress work off a terminal")

    monkeypatch.setattr(sim.studies.run, "_reporting", no_progress_wanted)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    for policy in ("static", "continuous"):
        arrived = pl.read_parquet(tmp_path / "out" / policy / "requests.parquet").height
        line = rf"^{policy}: {arrived} requests over 10 s simulated in \d+\.\d s$"
        assert re.search(line, result.output, re.M), result.output


def test_on_a_terminal_progress_follows_simulated_time_and_changes_no_result(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.replace("duration_s = 10", "duration_s = 60"))
    sc = load_scenario(path)
    calls: list[tuple[float, int]] = []
    screen = terminal()
    with progress.run_progress("static", 60.0, None, screen) as hook:
        assert hook is not None

        def record(t: float, n: int) -> None:
            calls.append((t, n))
            hook(t, n)

        with_bar = run_policy(sc, "static", tmp_path, progress=record)
    plain = run_policy(sc, "static", tmp_path)
    assert with_bar.requests.equals(plain.requests) and with_bar.steps.equals(plain.steps)
    arrived = plain.summary["requests"]["arrived"]
    assert calls[-1] == (60.0, arrived)  # the last call closes the bar at the horizon
    assert [n for _, n in calls[:-1]] == list(range(PROGRESS_EVERY, arrived + 1, PROGRESS_EVERY))
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:], strict=False))
    assert "s simulated" in screen.file.getvalue()  # type: ignore[attr-defined]
    with progress.run_progress("static", 60.0, None, Console(file=io.StringIO())) as off:
        assert off is None


def test_rejections_are_shown_one_line_per_reason(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    text = TINY.replace("rate = 2.0 }", "rate = 40.0 }").replace("duration_s = 10", "duration_s = 5")
    path.write_text(text.replace("[slo]", "max_waiting = 4\n\n[slo]"))  # in [horizon]
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(path), "--set", "model.max_model_len=200", "--out", str(out)])
    assert result.exit_code == 0, result.output
    counts = {
        policy: dict(
            pl.read_parquet(out / policy / "requests.parquet")
            .filter(pl.col("state") == "rejected")
            .group_by("reject_reason")
            .len()
            .iter_rows()
        )
        for policy in ("static", "continuous")
    }
    reasons = sorted(set(counts["static"]) | set(counts["continuous"]))
    assert "queue full" in reasons and "prompt + max_tokens exceeds max_model_len" in reasons
    shown = re.findall(r"^  (static|continuous) +([\d,]+)  (.+)$", result.output, re.M)
    expected = [(p, f"{n:,}", r) for p in ("static", "continuous") for r, n in sorted(counts[p].items())]
    assert shown == expected, result.output


def test_replay_reports_finished_requests_and_replays_the_same_steps() -> None:
    trace = replay.load_trace(ORACLE / "preempt.trace.json")
    config = replay.config_from(replay.read_steps(ORACLE / "preempt.steps.jsonl.gz")[0])
    seen: list[int] = []
    steps = replay.replay(trace, config, progress=seen.append)
    assert steps == replay.replay(trace, config)
    assert len(seen) == len(steps) // 256 and seen == sorted(seen) and 0 < seen[-1] <= len(trace)


def test_validation_reports_each_finished_row() -> None:
    rows = [r for r in load_rows() if "62-mistral" in r.exp_key]
    seen: list[int] = []
    preds = predict_all(rows, 0.02, None, 1, seen.append)
    assert seen == list(range(1, len(rows) + 1)) and len(preds) == len(rows)


def table_rows(output: str) -> dict[str, list[str]]:
    """The rows of a rich table on screen: label -> cells."""
    rows = {}
    for line in output.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line)[1:-1]]
        if len(cells) > 1:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_run_table_says_how_many_requests_each_latency_covers(tmp_path: Path) -> None:
    """At 40 req/s most requests never finish. The table printed their TTFT, TPOT and E2E, computed over the
    finished requests only, and the queue wait, over those ever scheduled, without saying so: a row before
    the latencies now states what each covers, counted from the records."""
    path = tmp_path / "tiny.toml"
    text = TINY.replace("rate = 2.0 }", "rate = 40.0 }")
    path.write_text(text.replace("duration_s = 10", "duration_s = 5"))
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(path), "--out", str(out)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    scheduled, finished = [], []
    for policy in ("static", "continuous"):
        req = pl.read_parquet(out / policy / "requests.parquet")
        n, queued = req.height, int(req["queue_wait"].is_not_null().sum())
        done = int((req["state"] == "finished").sum())
        assert done < queued < n  # overloaded: some never scheduled, more never finished
        scheduled.append(f"{queued:,} of {n:,} ({n - queued:,} never scheduled)")
        finished.append(f"{done:,} of {n:,} ({n - done:,} unfinished)")
    rows = table_rows(result.output)
    assert rows["overloaded"] == ["YES", "YES"]
    assert rows["queue_wait covers"] == scheduled, result.output
    assert rows["ttft, tpot, itl, e2e cover"] == finished, result.output
    labels = list(rows)
    assert labels.index("ttft, tpot, itl, e2e cover") < labels.index("queue_wait p50 (ms)")


def test_a_sweep_off_a_terminal_says_what_it_starts(tmp_path: Path) -> None:
    from sim.studies import sweep

    path = tmp_path / "tiny.toml"
    path.write_text(TINY + "\n[sweep]\nrates = [1]\n")
    screen = Console(file=io.StringIO(), width=120)
    sweep.run_sweep(path, jobs=1, out=tmp_path, console=screen)
    sweep.run_sweep(path, ["sweep.rates=[1, 2]"], jobs=1, out=tmp_path, console=screen)
    lines = screen.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines == ["running 2 points (0 already done)…", "running 2 points (2 already done)…"]


def test_a_closed_loop_run_with_a_progress_bar_gives_the_same_results(tmp_path: Path) -> None:
    """The closed-loop request factory is wrapped for progress; the wrapper passes the user on, so each
    user's prefix group (and every record) is as without the bar."""
    path = tmp_path / "closed.toml"
    path.write_text(
        TINY.replace(
            '{ kind = "poisson", rate = 2.0 }', '{ kind = "closed_loop", users = 4, think_time_s = 0.5 }'
        )
    )
    sc = load_scenario(path)
    calls: list[int] = []
    with_bar = run_policy(sc, "continuous", tmp_path, progress=lambda t, n: calls.append(n))
    plain = run_policy(sc, "continuous", tmp_path)
    assert with_bar.requests.equals(plain.requests) and with_bar.steps.equals(plain.steps)
    assert len(calls) >= 2 and calls[-1] == plain.summary["requests"]["arrived"]


def test_a_sweep_on_a_terminal_shows_the_capacity_search_as_its_own_bar_with_time_left(
    tmp_path: Path,
) -> None:
    """The grid bar keeps the grid's total (it used to grow when the search added points); the search has
    its own bar and total; each bar shows an ETA."""
    from sim.studies import sweep

    path = tmp_path / "tiny.toml"
    path.write_text(TINY + "\n[sweep]\nrates = [0.5, 2, 16, 64]\ncapacity_steps = 2\n")
    screen = terminal()
    res = sweep.run_sweep(
        path, ["horizon.duration_s=5"], jobs=1, find_capacity=True, out=tmp_path, console=screen
    )
    searched = res.points.height - 8
    assert searched > 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.file.getvalue())  # type: ignore[attr-defined]
    final = text.split("\r")[-1] if "\r" in text else text
    grid = re.findall(r"grid points .*? (\d+)/(\d+) .*?ETA", final)
    search = re.findall(r"capacity search.*? (\d+)/(\d+) .*?ETA", final)
    assert grid and grid[-1] == ("8", "8"), final
    assert search and search[-1] == (str(searched), str(searched)), final


def test_a_run_on_a_gpu_without_kernel_tables_says_whose_efficiencies_it_is_charged(tmp_path: Path) -> None:
    """An L4 has no measured kernel tables: the run says it is costed by the L40S's (the transfer rule); an
    A100-80GB, which has its own, says nothing of the kind."""
    for gpu, said in (("L4", True), ("A100-80GB", False)):
        path = tmp_path / f"{gpu}.toml"
        path.write_text(TINY.replace('gpu = "A100-80GB"', f'gpu = "{gpu}"'))
        result = runner.invoke(app, ["run", str(path), "--out", str(tmp_path / gpu)])
        assert result.exit_code == 0, result.output
        text = " ".join(result.output.split())
        assert ("L4 has no kernel tables of its own" in text) is said, text
        if said:
            assert "measured on the L40S's kernel profile" in text and "(transfer rule)" in text
