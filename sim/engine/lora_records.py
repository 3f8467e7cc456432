"""What a LoRA run reports: the records' LoRA columns and the summary's `lora` block (the run-time model
itself is sim/engine/lora.py)."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import polars as pl

from sim.engine.lora import LoraRun, LoraStepTime
from sim.engine.slora import SLoraRun, SLoraStepTime
from sim.records.columns import CHUNK_ROWS
from sim.records.recorder import Recorder
from sim.records.sinks import RecordSink

# --- records ------------------------------------------------------------------------------------------

STEP_COLUMNS = ("lora_adapters", "lora_loads", "lora_disk_loads")


class LoraRecorder(Recorder):
    """`Recorder` with an `adapter` column per request and, per step, the adapters in the batch, the
    copies to the GPU and reads from disk, and their seconds (`lora_load_s`)."""

    EXTRA_COLUMNS = ("adapter",)

    def __init__(
        self,
        timer: LoraStepTime | SLoraStepTime,
        sink: RecordSink | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self._timer = timer
        self._lora_ints = array("q")
        self._lora_load = array("d")
        super().__init__(sink, chunk_rows)

    def _request_extras(self, req: Any) -> tuple[int, ...]:
        return (req.adapter,)

    def step(self, start: float, duration: float, plan: Any, compute_bound: bool, waiting: int) -> None:
        last = self._timer.last
        self._lora_ints.extend((last.adapters, last.loads, last.disk_loads))
        self._lora_load.append(last.seconds)
        super().step(start, duration, plan, compute_bound, waiting)

    def _steps_chunk(self) -> pl.DataFrame:
        frame = super()._steps_chunk()
        n = frame.height
        ints = np.frombuffer(self._lora_ints, np.int64, count=3 * n).reshape(n, 3).T
        cols = {name: ints[i].copy() for i, name in enumerate(STEP_COLUMNS)}
        cols["lora_load_s"] = np.frombuffer(self._lora_load, np.float64, count=n).copy()
        return frame.with_columns(**{k: pl.Series(v) for k, v in cols.items()})

    def _flush_steps(self) -> None:
        super()._flush_steps()
        self._lora_ints = array("q")
        self._lora_load = array("d")


def lora_recorder(run: LoraRun | SLoraRun, sink: RecordSink | None = None) -> Any:
    """A recorder that keeps the LoRA columns of `run`'s steps and requests."""
    return LoraRecorder(run.step_time, sink)


def lora_summary(run: LoraRun | SLoraRun, steps: pl.DataFrame | pl.LazyFrame) -> dict[str, Any]:
    """The summary's `lora` block."""
    s = steps.lazy().select(
        pl.len().alias("count"),
        pl.col("duration").sum().alias("busy"),
        pl.col("lora_adapters").mean().alias("distinct"),
        pl.col("lora_adapters").sum().alias("activations"),
        pl.col("lora_loads").sum().alias("loads"),
        pl.col("lora_disk_loads").sum().alias("disk_loads"),
        pl.col("lora_load_s").sum().alias("load_s"),
    ).collect().row(0, named=True)  # fmt: skip
    activations, loads = int(s["activations"] or 0), int(s["loads"] or 0)
    busy = float(s["busy"] or 0.0)
    wl = run.workload
    return {
        "adapters": 0 if wl is None else wl.adapters,
        "popularity": None if wl is None else wl.popularity,
        "rank": None if wl is None else wl.rank,
        **run.info(),
        "kv_blocks_taken": run.blocks_without - run.blocks_with,
        "distinct_per_step_mean": float(s["distinct"]) if s["count"] else 0.0,
        "gpu_hit_rate": (activations - loads) / activations if activations else None,
        "loads": loads,
        "disk_loads": int(s["disk_loads"] or 0),
        "load_s": float(s["load_s"] or 0.0),
        "load_time_share": float(s["load_s"] or 0.0) / busy if busy > 0 else 0.0,
    }
