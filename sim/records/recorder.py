"""Per-request and per-step records, kept as a run goes (the summary read from them: sim/records/summary.py).

Records are kept in flat typed columns (`array.array`), never as per-token objects, and handed on in chunks
of `CHUNK_ROWS` rows as polars frames (to memory, or to Parquet as the run goes: `sim.records.sinks`), so the
memory a run holds does not grow with its number of requests. The summary reads them back one figure's
columns at a time (`summarize`, which takes frames or lazy scans of the written files).

Inter-token latency, as vLLM's benchmark measures it: each token's gap is the time since the same request's
previous token. A request that emits in every step from its first token to its last has the durations of those
steps as its gaps. A request that sat out steps (behind a prefill-only step of `vllm-v0`, while preempted,
when others spent the token budget, or before a decode replica admitted it) has one gap for each wait instead,
from its previous token to the one that ended it: the scheduler calls `Request.stall`, and the steps of the
wait are taken out of the request's range and the wait's gap put in (`window_quantiles.stall_windows`). Mean
and max are exact (`Request.emit`). The p50/p99 of requests without a wait are computed for `ITL_BATCH`
recorded requests at once (`window_quantiles`), those of requests with one each on its own; the rows wait for
them before they are handed on, and the steps they read are kept until then.

The run's pooled ITL quantiles (`summary._itl_stats`) weight each step's duration by its decode tokens; the
waits correct that pool (`itl_gaps`): each wait's gap with weight +1, and its last step's duration with
weight -1 where that step counted the token among its decode tokens. Tokens a step emits beyond one per
request (speculative decoding's accepted drafts) keep that step's duration as their gap, as before, and
so do the tokens of a request with `n > 1`, whose sequences advance each on its own.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_right

import numpy as np
import polars as pl

from sim.core.request import Request
from sim.core.step import QuietSteps, StepPlan
from sim.records.columns import CHUNK_ROWS, FINISHED, STATE_CODE, STEP_STORED_INTS, WAITING_INDEX
from sim.records.int_rows import IntRows
from sim.records.overload import BacklogTrend, requests_backlog_trend
from sim.records.request_rows import RequestRow, RequestRows
from sim.records.run_rows import RunRows
from sim.records.sinks import MemorySink, RecordSink
from sim.records.step_rows import steps_frame, unshared
from sim.records.window_quantiles import stall_windows, window_quantiles

ITL_BATCH = 256  # recorded rows whose ITL quantiles are computed together


class Recorder:
    """Collects request and step records during a run, in flat typed buffers (no per-record objects), and
    hands them to `sink` in chunks of `chunk_rows` rows as the run goes (by default kept in memory).

    Request rows go out in id order: a row waits until every request that arrived (`arrive`) with a lower
    id has been recorded. Requests recorded without `arrive`, or ids that do not rise with arrival, are
    sorted by id at `finish` instead. Step durations are kept only as far back as a request still in flight
    needs them (its ITL quantiles are read over the steps since its first token).
    """

    EXTRA_COLUMNS: tuple[str, ...] = ()  # integer request columns a subclass adds after the standard ones

    def _request_extras(self, req: Request) -> tuple[int, ...]:
        """The `EXTRA_COLUMNS` of `req`'s row, read when it is recorded."""
        return ()

    def __init__(self, sink: RecordSink | None = None, chunk_rows: int = CHUNK_ROWS) -> None:
        if chunk_rows < 1:
            raise ValueError("chunk_rows must be positive")
        self.sink: RecordSink = MemorySink() if sink is None else sink
        self.chunk_rows = chunk_rows
        self.arrived = 0
        # requests
        self._active: dict[int, Request] = {}  # id(request) -> request, arrived and not recorded
        self._active_ids: list[tuple[int, int]] = []  # heap of (request id, id(request)), lazily pruned
        self._held: list[tuple[int, int, RequestRow]] = []  # heap of recorded rows waiting for their turn
        self._held_seq = 0
        self._last_id: int | None = None  # the id of the latest row handed on
        self._unsorted = False
        # recorded rows whose ITL quantiles are not filled in yet: (row floats, waits)
        self._pending: list[tuple[list[float], list[tuple[int, int, float]] | None]] = []
        # the waits' corrections of the pooled ITL (see the module doc): durations and their weights
        self._gap_values = array("d")
        self._gap_weights = array("q")
        self._new_request_chunk()
        self._request_chunks = 0
        # steps: durations and ends of steps from `_win_start` on (global step numbers)
        self._ends = array("d")
        self._durations = array("d")
        self._win_start = 0
        self._flushed_steps = 0  # steps handed to the sink
        self._prev_end = math.nan  # the end of the step before the current chunk
        self._last_end = math.nan
        self._step_starts: dict[int, float] = {}  # step -> start, for steps not starting at the previous end
        self._step_capacity: dict[int, int] = {}  # step -> KV capacity, where it differs from the previous
        self._capacity: int | None = None
        self._step_ints = IntRows(len(STEP_STORED_INTS))
        self._runs = RunRows()
        self._step_compute = bytearray()
        self._trim = True  # whether step durations no request in flight needs may be dropped
        self._finished = False

    # --- steps -------------------------------------------------------------------------------------------
    def step(self, start: float, duration: float, plan: StepPlan, compute_bound: bool, waiting: int) -> None:
        end = start + duration
        index = self._flushed_steps + len(self._step_compute)
        if start != self._last_end:
            self._step_starts[index] = start
        self._last_end = end
        try:
            self._ends.append(end)
        except BufferError:
            self._ends = unshared(self._ends, end)
        try:
            self._durations.append(duration)
        except BufferError:
            self._durations = unshared(self._durations, duration)
        kv = plan.kv
        if kv.capacity != self._capacity:
            self._capacity = self._step_capacity[index] = kv.capacity
        rows = self._step_ints
        values = (
            plan.batch_size, plan.num_prefill_tokens, plan.num_decode_tokens, kv.used, kv.allocated,
            plan.preempted, waiting,
        )  # fmt: skip
        try:
            rows.data.extend(values)
        except OverflowError:
            data = rows.data
            del data[len(data) - len(data) % rows.width :]  # the part of this row that fitted
            rows.extend(values)
        self._step_compute.append(compute_bound)
        if len(self._step_compute) >= self.chunk_rows:
            self._flush_steps()

    def quiet_steps(
        self,
        start: float,
        durations: list[float],
        ends: list[float],
        compute: list[bool],
        quiet: QuietSteps,
        waiting: int,
        tail: list[int],
    ) -> None:
        """The first `len(durations)` of `quiet`'s steps, back to back from `start` (step j ends at `ends[j]`,
        its start plus its duration), recorded as `step` records each of them: `waiting` requests after each,
        but after each of the last `len(tail)` steps (with arrivals during them) the number in `tail`. The
        rows are made when their chunk is handed on (`RunRows`); a run that crosses the chunk's end is split
        there."""
        count = len(self._step_compute)
        total, room = len(durations), self.chunk_rows - count
        if total > room:
            first = tail[: max(0, room - (total - len(tail)))]  # the tail's rows within this chunk
            self.quiet_steps(start, durations[:room], ends[:room], compute[:room], quiet, waiting, first)
            later = quiet.after(room)
            self.quiet_steps(ends[room - 1], durations[room:], ends[room:], compute[room:], later, waiting,
                             tail[len(first) :])  # fmt: skip
            return
        self._runs.add(count, total, quiet, waiting, tail)
        try:
            self._ends.extend(ends)
        except BufferError:
            self._ends = unshared(self._ends, *ends)
        try:
            self._durations.extend(durations)
        except BufferError:
            self._durations = unshared(self._durations, *durations)
        index = self._flushed_steps + count
        if start != self._last_end:
            self._step_starts[index] = start
        if quiet.capacity != self._capacity:
            self._capacity = self._step_capacity[index] = quiet.capacity
        self._step_compute.extend(compute)
        self._last_end = ends[-1]
        if count + total >= self.chunk_rows:
            self._flush_steps()

    @property
    def num_steps(self) -> int:
        return self._flushed_steps + len(self._step_compute)

    def step_waiting(self, index: int) -> int:
        """Requests waiting after step `index`."""
        local = index - self._flushed_steps
        if local < 0:
            return int(self.sink.lazy("steps").select(pl.col("waiting").get(index)).collect().item())
        plain = self._runs.plain_before(local)
        if plain is None:
            return self._runs.waiting_at(local)
        data = self._step_ints
        return data.data[plain * data.width + WAITING_INDEX]

    def _steps_chunk(self) -> pl.DataFrame:
        """The steps not yet handed on, as a frame (with their global step numbers)."""
        ints = self._runs.columns(self._step_ints, len(self._step_compute))
        return steps_frame(
            self._flushed_steps, self._win_start, self._prev_end, self._ends, self._durations,
            self._step_starts, self._step_capacity, ints, self._step_compute,
        )  # fmt: skip

    def _flush_steps(self) -> None:
        n = len(self._step_compute)
        if n == 0 and self._flushed_steps:
            return
        self.sink.write("steps", self._steps_chunk())
        self._flushed_steps += n
        if n:
            self._prev_end = self._ends[self._flushed_steps - 1 - self._win_start]
        self._step_starts = {}
        self._step_capacity = {self._flushed_steps: self._capacity} if self._capacity is not None else {}
        self._step_ints = IntRows(len(STEP_STORED_INTS))
        self._runs = RunRows()
        self._step_compute = bytearray()
        self._trim_steps()

    def _trim_steps(self) -> None:
        """Drop the step durations no request in flight can need any more."""
        if not self._trim:
            return
        self._resolve()  # the rows waiting for their quantiles need their steps
        keep = self._flushed_steps
        firsts = [r.first_token_at for r in self._active.values() if r.num_generated > 0]
        if firsts:
            keep = min(keep, self._win_start + bisect_right(self._ends, min(firsts)))
        drop = keep - self._win_start
        if drop > 0:
            # New arrays rather than resizing: a numpy view of the old ones may still be alive (a frame held
            # by a profiler, as dask's workers keep), and an array exporting its buffer cannot be resized.
            self._ends = self._ends[drop:]
            self._durations = self._durations[drop:]
            self._win_start = keep

    # --- requests ----------------------------------------------------------------------------------------
    def arrive(self, req: Request) -> None:
        """A request arrived: its record, and those of later ids, wait until it is recorded."""
        self.arrived += 1
        key = id(req)
        self._active[key] = req
        heapq.heappush(self._active_ids, (req.id, key))
        if self._last_id is not None and req.id < self._last_id:
            self._unsorted = True

    def request(self, req: Request, state: str) -> None:
        """Record a request once, when it finishes, is rejected, or is still in flight at the horizon.

        Its ITL p50/p99 are those of the step durations over its token range, read now (see the module doc).
        """
        nan = math.nan
        gaps = req.num_generated > 1
        finished_at = req.finished_at if state == FINISHED else nan
        floats = [req.arrival, req.scheduled_at, req.first_token_at, req.last_token_at, finished_at, nan, nan,
                  req.itl_max if gaps else nan]  # fmt: skip
        if gaps:
            self._pending.append((floats, self._waits(req.stalls) if req.stalls else None))
        row = (
            floats,
            (req.prompt_len, req.output_len, req.max_tokens, req.n, req.num_generated, req.preemptions,
             req.prefix_group, req.prefix_hit_tokens, req.prefix_query_tokens),
            STATE_CODE[state],
            req.reject_reason,
            self._request_extras(req),
        )  # fmt: skip
        if self._active.pop(id(req), None) is None:
            self._trim = False  # recorded without `arrive`: its steps cannot be told apart; keep them all
        self._held_seq += 1
        heapq.heappush(self._held, (req.id, self._held_seq, row))
        if not self._pending:
            self._release()
        elif len(self._pending) >= ITL_BATCH:
            self._resolve()

    def _waits(self, stalls: list[tuple[float, float, bool]]) -> list[tuple[int, int, float]]:
        """A request's waits (`Request.stalls`) as (first step, last step, gap), global step numbers: the
        steps after its previous token up to the one that emitted the next; each added to the pooled
        corrections (`itl_gaps`)."""
        ends, durations, first = self._ends, self._durations, self._win_start
        values, weights = self._gap_values, self._gap_weights
        out = []
        for prev, at, counted in stalls:
            a, r = bisect_right(ends, prev), bisect_right(ends, at) - 1
            gap = at - prev
            values.append(gap)
            weights.append(1)
            if counted:
                values.append(durations[r])
                weights.append(-1)
            out.append((first + a, first + r, gap))
        return out

    def itl_gaps(self) -> pl.DataFrame:
        """The waits' corrections of the pooled ITL quantiles (see the module doc): `duration` with weight
        `decode_tokens`, to be pooled with the steps' own; ends the recording."""
        self.finish()
        return pl.DataFrame(
            {
                "duration": np.frombuffer(self._gap_values, np.float64).copy(),
                "decode_tokens": np.frombuffer(self._gap_weights, np.int64).copy(),
            },
            schema={"duration": pl.Float64, "decode_tokens": pl.Int64},
        )

    def _resolve(self) -> None:
        """Fill in the ITL p50, p99 and max of the recorded rows that wait for them (`window_quantiles`,
        all at once), then hand on the rows whose turn it is."""
        pending = self._pending
        if pending:
            size = len(pending)
            durations = np.frombuffer(self._durations, np.float64)
            ends = np.frombuffer(self._ends, np.float64)
            # each row's steps: those ending after its first token, up to the one that ended with its last
            lo = np.searchsorted(ends, np.fromiter((p[0][2] for p in pending), np.float64, size), "right")
            n = np.searchsorted(ends, np.fromiter((p[0][3] for p in pending), np.float64, size), "right") - lo
            waited = np.fromiter((p[1] is not None for p in pending), bool, size)
            steps = n > 0
            plain = np.flatnonzero(~waited & steps)
            if len(plain):
                p50, p99, top = window_quantiles(durations, lo[plain], n[plain])
                figures = zip(plain.tolist(), p50.tolist(), p99.tolist(), top.tolist(), strict=True)
                for k, a, b, m in figures:
                    floats = pending[k][0]
                    floats[5], floats[6], floats[7] = a, b, max(floats[7], m)
            for k in np.flatnonzero(waited & steps).tolist():
                floats, waits = pending[k]
                assert waits is not None
                gaps = stall_windows(durations, int(lo[k]), int(n[k]), waits, self._win_start)
                a, b = np.quantile(gaps, (0.5, 0.99)).tolist()
                floats[5], floats[6], floats[7] = a, b, max(floats[7], float(gaps.max()))
            self._pending = []
        self._release()

    def _release(self) -> None:
        """Hand on the held rows whose ids come before every request still in flight."""
        active, ids, held = self._active, self._active_ids, self._held
        while ids:
            rid, key = ids[0]
            r = active.get(key)
            if r is not None and r.id == rid:
                break
            heapq.heappop(ids)  # recorded already
        bound = ids[0][0] if ids else None
        while held and (bound is None or held[0][0] < bound):
            rid, _, row = heapq.heappop(held)
            self._append_request(rid, row)

    def _append_request(self, rid: int, row: RequestRow) -> None:
        if self._last_id is not None and rid < self._last_id:
            self._unsorted = True
        self._last_id = rid
        self._rows.append(rid, row)
        if len(self._rows) >= self.chunk_rows:
            self._flush_requests()

    def _new_request_chunk(self) -> None:
        self._rows = RequestRows(self.EXTRA_COLUMNS)

    def _flush_requests(self) -> None:
        if not self._rows and self._request_chunks:
            return
        self.sink.write("requests", self._rows.frame())
        self._request_chunks += 1
        self._new_request_chunk()

    # --- the end -----------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Hand on every record still held (the run is over); later calls do nothing."""
        if self._finished:
            return
        self._finished = True
        self._active.clear()
        self._active_ids.clear()
        self._resolve()
        self._flush_requests()
        self._flush_steps()
        self.sink.finish("requests", sort_by="id" if self._unsorted else None)
        self.sink.finish("steps")

    def requests_lazy(self) -> pl.LazyFrame:
        self.finish()
        return self.sink.lazy("requests")

    def steps_lazy(self) -> pl.LazyFrame:
        self.finish()
        return self.sink.lazy("steps")

    def requests_frame(self) -> pl.DataFrame:
        return self.requests_lazy().collect()

    def steps_frame(self) -> pl.DataFrame:
        return self.steps_lazy().collect()

    def backlog_trend(self, rate_steps: tuple[float, ...] = ()) -> BacklogTrend | None:
        """`backlog_trend` of every request recorded (see `backlog_inputs`); ends the recording."""
        cols = self.requests_lazy().select("arrival", "finished_at", "state", "reject_reason").collect()
        return requests_backlog_trend(cols, rate_steps)
