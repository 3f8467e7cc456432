"""A plan's finished runs on disk, so that a killed `sim plan` re-run finishes the same plan byte for byte.

Each run (a configuration's replication, or a single-replica capacity run) is written, once finished, to
`<out>/runs/<key>.json`, where the key is a hash of everything the run depends on: its kind, the scenario
at the planned rate, the policy, the configuration's overrides (seed and horizon included) and the folder
relative paths resolve against. A re-run reads back the runs it finds and runs only the rest; a damaged
file (a torn write) is run again. Every value, run or read back, passes through JSON, so the search
judges the same numbers either way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

from sim.io.fingerprint import simulator_fingerprint
from sim.io.outputs import atomic_write, remove_leftovers

RUN_FORMAT = 1  # bump when a run's figures change meaning: older files are then not read back


def run_key(kind: str, task: Any) -> str:
    """The file name of one run: a hash of what the run depends on, the simulator's code and data included."""
    body = {
        "format": RUN_FORMAT, "kind": kind, "raw": task.raw, "policy": task.policy,
        "overrides": task.overrides, "base_dir": task.base_dir, "simulator": simulator_fingerprint(),
    }  # fmt: skip
    text = json.dumps(_integral(body), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _integral(value: Any) -> Any:
    """`value` with every whole float as an int, so that `1` and `1.0` (which validate alike) key alike."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_integral(v) for v in value]
    return value


def _normal(value: Any) -> Any:
    """The value as a JSON round trip gives it back (numpy scalars to Python, tuples to lists)."""
    return json.loads(json.dumps(value, default=float))


class RunStore:
    """The finished runs of one plan (`folder` None: nothing kept), counting those run and read back."""

    def __init__(self, folder: Path | None, force: bool = False) -> None:
        self.folder = folder
        self.ran = self.resumed = 0
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            remove_leftovers(folder)  # files a killed plan was writing
            if force:
                for old in folder.glob("*.json"):
                    old.unlink()

    def _path(self, key: str) -> Path | None:
        return None if self.folder is None else self.folder / f"{key}.json"

    def _read(self, key: str) -> tuple[bool, Any]:
        path = self._path(key)
        if path is None or not path.exists():
            return False, None
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False, None
        if not isinstance(body, dict) or body.get("key") != key or "value" not in body:
            return False, None
        return True, body["value"]

    def _write(self, key: str, value: Any) -> None:
        path = self._path(key)
        if path is None:
            return
        text = json.dumps({"key": key, "value": value}, sort_keys=True, default=float) + "\n"
        atomic_write(path, lambda p: Path(p).write_text(text, encoding="utf-8"))

    def map(
        self, kind: str, work: Callable[[Any], Any], tasks: Sequence[Any], pool: Executor | None
    ) -> list[Any]:
        """`work` over `tasks` in task order (on `pool`, or in this process), reading back finished runs
        and writing each new one as it finishes."""
        keys = [run_key(kind, t) for t in tasks]
        values: list[Any] = [None] * len(tasks)
        todo: list[int] = []
        for i, key in enumerate(keys):
            found, value = self._read(key)
            if found:
                values[i] = value
                self.resumed += 1
            else:
                todo.append(i)
        todo_tasks = [tasks[i] for i in todo]
        results = pool.map(work, todo_tasks) if pool is not None else (work(t) for t in todo_tasks)
        for i, value in zip(todo, results, strict=True):
            values[i] = _normal(value)
            self._write(keys[i], values[i])
            self.ran += 1
        return values
