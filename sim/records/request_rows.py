"""A chunk of recorded request rows in flat typed buffers, and the frame made of it (with the derived columns:
TTFT, E2E, TPOT, mean ITL, normalised latency)."""

from __future__ import annotations

from array import array

import numpy as np
import polars as pl

from sim.records.columns import REQ_STORED_FLOATS, REQ_STORED_INTS, STATES
from sim.records.int_rows import IntRows

# A recorded request row: stored floats, stored ints, state code, reject reason, extra ints.
RequestRow = tuple[list[float], tuple[int, ...], int, "str | None", tuple[int, ...]]


class RequestRows:
    """Request rows in the order they are appended; `extra_columns` are integer columns after the standard
    ones, given by each row's last field."""

    def __init__(self, extra_columns: tuple[str, ...] = ()) -> None:
        self.extra_columns = extra_columns
        self.ids = array("q")
        self.ints = IntRows(len(REQ_STORED_INTS))
        self.floats = array("d")
        self.states = bytearray()
        self.reasons: dict[int, str] = {}  # row -> reject reason, for the rows that have one
        self.extra = array("q")  # the rows' extra columns, row after row

    def __len__(self) -> int:
        return len(self.states)

    def append(self, rid: int, row: RequestRow) -> None:
        floats, ints, state, reason, extras = row
        self.floats.extend(floats)
        if extras:
            self.extra.extend(extras)
        self.ids.append(rid)
        self.ints.extend(ints)
        if reason is not None:
            self.reasons[len(self.states)] = reason
        self.states.append(state)

    def frame(self) -> pl.DataFrame:
        f = np.frombuffer(self.floats, dtype=np.float64).reshape(-1, len(REQ_STORED_FLOATS)).T
        arrival, scheduled, first, last, finished, p50, p99, itl_max = f
        i = dict(zip(REQ_STORED_INTS, self.ints.columns(), strict=True))
        generated, n = i["num_generated"], i["n"]
        gaps = generated - 1
        has_gaps = gaps > 0
        nan = np.full(len(gaps), np.nan)
        ttft = first - arrival
        e2e = finished - arrival  # NaN unless finished
        emitted = generated * n
        cols: dict[str, object] = {
            "id": np.frombuffer(self.ids, dtype=np.int64),
            "prompt_len": i["prompt_len"],
            "output_len": i["output_len"],
            "max_tokens": i["max_tokens"],
            "n": n,
            "generated_tokens": emitted,
            "preemptions": i["preemptions"],
            "prefix_group": i["prefix_group"],
            "prefix_hit_tokens": i["prefix_hit_tokens"],
            "prefix_query_tokens": i["prefix_query_tokens"],
            "arrival": arrival,
            "scheduled_at": scheduled,
            "first_token_at": first,
            "finished_at": finished,
            "queue_wait": scheduled - arrival,
            "ttft": ttft,
            "e2e": e2e,
            "tpot": np.divide(e2e - ttft, gaps, out=nan.copy(), where=has_gaps),
            "itl_mean": np.divide(last - first, gaps, out=nan.copy(), where=has_gaps),
            "itl_p50": p50,
            "itl_p99": p99,
            "itl_max": itl_max,
            "normalized_latency": np.divide(e2e, emitted, out=nan.copy(), where=emitted != 0),
        }
        cols["state"] = pl.Series([STATES[c] for c in self.states], dtype=pl.Categorical)
        reasons = self.reasons
        cols["reject_reason"] = pl.Series([reasons.get(r) for r in range(len(self.states))], dtype=pl.String)
        frame = pl.DataFrame(cols).with_columns(pl.col(pl.Float64).fill_nan(None))
        if self.extra_columns:
            names, rows = self.extra_columns, frame.height
            shape = (rows, len(names))
            extra = np.frombuffer(self.extra, np.int64, count=rows * len(names)).reshape(shape).T
            frame = frame.with_columns(pl.Series(name, extra[j].copy()) for j, name in enumerate(names))
        return frame
