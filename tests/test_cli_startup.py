"""What a `sim run` process loads and how it ends: the libraries only other commands need stay unloaded,
and the process ends after its exit handlers without tearing down every module (docs/performance.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from test_manifest import TINY

import sim

ROOT = Path(__file__).resolve().parents[1]

# Loaded only by the commands that use them: the HTML report's charts (altair, vl-convert), the fits
# (scipy), dask clusters, the sweep's machinery, the fleet, and rich's progress bar (drawn on a terminal).
NOT_FOR_A_RUN = (
    "altair",
    "vl_convert",
    "scipy",
    "dask",
    "distributed",
    "sim.report.page",
    "sim.report.charts",
    "sim.studies.sweep",
    "sim.studies.executor",
    "sim.studies.points",
    "sim.config.sweep",
    "sim.records.stats",
    "sim.fleet",
    "sim.fleet.run",
    "rich.progress",
)


def python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sim_run_loads_neither_charts_nor_fits_nor_the_sweep(tmp_path: Path) -> None:
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(TINY + '\n[policies.vllm]\nscheduler = "vllm"\nmax_num_seqs = 8\n')
    done = python(
        f"""
        import gc, json, sys
        import sim.config.scenario, sim.studies.run
        from sim.cli import main

        seen = {{}}
        def watched(module, name):
            inner = getattr(module, name)
            def call(*args, **kwargs):
                seen[name] = (gc.isenabled(), gc.get_freeze_count())
                return inner(*args, **kwargs)
            setattr(module, name, call)

        watched(sim.config.scenario, "load_scenario")
        watched(sim.studies.run, "run_to_folder")
        try:
            main(["run", {str(scenario)!r}, "--out", "out"])
        except SystemExit as stop:
            assert stop.code == 0, stop.code
        seen["after"] = (gc.isenabled(), gc.get_freeze_count())
        print(json.dumps([sorted(sys.modules), seen]))
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    modules, seen = json.loads(done.stdout.splitlines()[-1])
    loaded = set(modules)
    assert {"sim.studies.run", "sim.engine.schedulers.vllm.scheduler", "polars"} <= loaded  # it did run
    assert (tmp_path / "out" / "vllm" / "summary.json").is_file()
    assert sorted(loaded & set(NOT_FOR_A_RUN)) == []
    # The collector: off while the scenario is read, on for the runs with start-up's objects frozen, and
    # as it was (on, nothing frozen) after the command.
    assert seen["load_scenario"][0] is False
    assert seen["run_to_folder"][0] is True and seen["run_to_folder"][1] > 10_000
    assert seen["after"] == [True, 0]


def test_entry_runs_exit_handlers_flushes_and_skips_the_teardown(tmp_path: Path) -> None:
    code = """
        import atexit, sys

        class Module:
            def __del__(self):
                print("torn down")

        kept = Module()
        atexit.register(lambda: print("exit handler ran"))
        sys.argv = ["sim", *{args!r}]
        from sim.cli import entry
        entry()
        """
    done = python(code.format(args=["--version"]), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"servesim {sim.__version__}", "exit handler ran"]
    bad = python(code.format(args=["run", "missing.toml"]), tmp_path)
    assert bad.returncode == 2
    assert bad.stdout.splitlines() == ["exit handler ran"]
    assert "error: missing.toml: no such scenario file" in bad.stderr


def test_entry_waits_for_a_live_thread(tmp_path: Path) -> None:
    done = python(
        """
        import importlib, sys, threading, time
        cli = importlib.import_module("sim.cli.app")  # the module; `sim.cli.app` is also the app's name

        command_done = threading.Event()

        def late():  # ends only after the command has: an os._exit then would cut it short
            command_done.wait(timeout=10)
            time.sleep(0.1)
            print("thread finished")

        def main_then_signal(argv=None):
            try:
                command(argv)
            finally:
                command_done.set()

        command, cli.main = cli.main, main_then_signal
        threading.Thread(target=late).start()
        sys.argv = ["sim", "--version"]
        cli.entry()
        """,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"servesim {sim.__version__}", "thread finished"]
