"""What a LoRA run reports: the records' LoRA columns, the summary's `lora` block, and the slots' memory for
`sim capacity --max-loras` (the model itself is sim/engine/lora.py)."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import polars as pl

from sim.catalog.model import ModelSpec
from sim.cost.memory import KvMemory
from sim.engine.lora import (
    LORA_BYTES,
    LoraConfig,
    LoraRun,
    LoraStepTime,
    lora_memory,
    module_shapes,
    per_gpu_widths,
    slot_bytes,
)
from sim.io.errors import SimError
from sim.records.recorder import Recorder
from sim.records.sinks import RecordSink

# --- records ------------------------------------------------------------------------------------------

STEP_COLUMNS = ("lora_adapters", "lora_loads", "lora_disk_loads")


class LoraRecorder(Recorder):
    """`Recorder` with an `adapter` column per request and, per step, the adapters in the batch, the
    copies to the GPU and reads from disk, and their seconds (`lora_load_s`)."""

    EXTRA_COLUMNS = ("adapter",)

    def __init__(self, timer: LoraStepTime, sink: RecordSink | None = None) -> None:
        self._timer = timer
        self._lora_ints = array("q")
        self._lora_load = array("d")
        super().__init__(sink)

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


def lora_recorder(run: LoraRun, sink: RecordSink | None = None) -> Any:
    """A recorder that keeps the LoRA columns of `run`'s steps and requests."""
    return LoraRecorder(run.step_time, sink)


def lora_summary(run: LoraRun, steps: pl.DataFrame | pl.LazyFrame) -> dict[str, Any]:
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


# --- `sim capacity --max-loras` -----------------------------------------------------------------------


def lora_capacity(model: ModelSpec, kv: KvMemory, config: LoraConfig, typical_len: int) -> dict[str, Any]:
    """KV blocks and concurrent sequences without and with `max_loras` slots (JSON-ready)."""
    reduced = lora_memory(kv, model, config)
    slot = slot_bytes(model, config.max_lora_rank, kv.tp)
    return {
        "max_loras": config.max_loras,
        "max_lora_rank": config.max_lora_rank,
        "slot_bytes": slot,
        "slots_bytes": slot * config.max_loras,
        "kv_blocks_without_slots": kv.num_blocks,
        "kv_blocks_with_slots": reduced.num_blocks,
        "typical_len": typical_len,
        "max_seqs_without_slots": kv.max_seqs(typical_len),
        "max_seqs_with_slots": reduced.max_seqs(typical_len),
    }


def lora_capacity_report(
    model_name: str, gpu: str, tp: int, util: float, weight_dtype: str | None, kv_dtype: str | None,
    max_loras: int, max_lora_rank: int, typical_len: int, as_json: bool,
) -> None:  # fmt: skip
    """Print what `max_loras` slots of `max_lora_rank` take from one model's KV cache."""
    import json

    from pydantic import ValidationError
    from rich.console import Console
    from rich.table import Table

    from sim.catalog.gpus import get_gpu
    from sim.catalog.model import load_model
    from sim.cost.memory import kv_memory

    try:
        config = LoraConfig(max_loras=max_loras, max_lora_rank=max_lora_rank)
    except ValidationError as err:
        raise SimError(f"--max-lora-rank: {err.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    model = load_model(model_name)
    kv = kv_memory(model, get_gpu(gpu), tp, util, weight_dtype, kv_dtype)
    out = lora_capacity(model, kv, config, typical_len)
    if as_json:
        print(json.dumps({"model": model.name, "gpu": kv.gpu, "tp": tp, "lora": out}))
        return
    shapes = module_shapes(model)
    t = Table(title=f"LoRA slots: {max_loras} x rank {max_lora_rank} on {model.name}, {kv.gpu} x{tp}")
    t.add_column("quantity")
    t.add_column("without slots", justify="right")
    t.add_column("with slots", justify="right")
    t.add_column("arithmetic")
    widths = sum(a + b for a, b in (per_gpu_widths(model, n, s, tp) for n, s in shapes.items()))
    names = ",".join(n.removesuffix("_proj") for n in shapes)
    t.add_row("slot bytes", "", f"{out['slot_bytes']:,} B",
              f"{model.num_layers} layers x rank {max_lora_rank} x {widths:,} (in + out of {names}) "
              f"x {LORA_BYTES} B")  # fmt: skip
    t.add_row("slots", "", f"{out['slots_bytes'] / 1e9:,.2f} GB", f"{max_loras} x slot bytes")
    t.add_row("KV blocks", f"{kv.num_blocks:,}", f"{out['kv_blocks_with_slots']:,}",
              f"(KV available - slots) / {kv.block_bytes:,} B per block")  # fmt: skip
    per_seq = kv.blocks_per_seq(typical_len)
    t.add_row(f"max seqs @ {typical_len:,}", f"{out['max_seqs_without_slots']:,}",
              f"{out['max_seqs_with_slots']:,}", f"blocks / {per_seq} blocks per seq")  # fmt: skip
    Console(width=160).print(t)
