"""Records streamed in chunks (to memory or to Parquet part files) against the plain reference loop, which
records every request and step in one piece and sorts at the end; and the summary read from the files
against the summary of frames in memory."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from test_engine_reference import COST, HORIZONS, _requests, _requests_copy, _scheduler, reference

from sim.core.request import Request
from sim.core.step import KvUsage, QuietSteps
from sim.engine.replica import Horizon, simulate
from sim.records.columns import FINISHED
from sim.records.recorder import Recorder
from sim.records.sinks import PARTS, ParquetSink
from sim.records.summary import Slo, summarize


def _streamed(policy: str, h: Horizon, reqs: list[Request], recorder: Recorder) -> Recorder:
    out = simulate(
        _scheduler(policy), COST.step_time, h, open_loop=iter(_requests_copy(reqs)), recorder=recorder
    )
    return out.recorder


@pytest.mark.parametrize("policy", ["static", "continuous", "vllm"])
@pytest.mark.parametrize("horizon", sorted(HORIZONS))
@pytest.mark.parametrize("chunk_rows", [1, 7, 64])
def test_records_in_chunks_match_the_reference_in_one_piece(
    policy: str, horizon: str, chunk_rows: int
) -> None:
    h = HORIZONS[horizon]
    stop = h.duration_s if h.duration_s is not None else math.inf
    reqs = [r for r in _requests(150, 6.0, seed=len(policy) + chunk_rows) if r.arrival < stop]
    rec = _streamed(policy, h, reqs, Recorder(chunk_rows=chunk_rows))
    ref = reference(_scheduler(policy), h, requests=_requests_copy(reqs))
    assert rec.num_steps > 8 * chunk_rows  # many chunks of each
    assert_frame_equal(rec.requests_frame(), ref.requests_frame())
    assert_frame_equal(rec.steps_frame(), ref.steps_frame())


def test_parquet_parts_join_into_the_same_records_and_summary(tmp_path: Path) -> None:
    """Streamed to part files and joined, the records equal the reference's, and the summary of the files
    is the summary of the reference's frames, to every digit; no part file is left behind."""
    h = HORIZONS["drain"]
    reqs = _requests(150, 6.0, seed=4)
    rec = _streamed("vllm", h, reqs, Recorder(ParquetSink(tmp_path), chunk_rows=50))
    ref = reference(_scheduler("vllm"), h, requests=_requests_copy(reqs))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["requests.parquet", "steps.parquet"]
    assert not (tmp_path / PARTS).exists()
    files = pl.read_parquet(tmp_path / "requests.parquet"), pl.read_parquet(tmp_path / "steps.parquet")
    assert_frame_equal(files[0], ref.requests_frame())
    assert_frame_equal(files[1], ref.steps_frame())
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    from_files = summarize(rec.requests_lazy(), rec.steps_lazy(), 40.0, slo, False)
    in_memory = summarize(ref.requests_frame(), ref.steps_frame(), 40.0, slo, False)
    assert json.dumps(from_files, sort_keys=True) == json.dumps(in_memory, sort_keys=True)


def test_ids_out_of_arrival_order_are_sorted() -> None:
    """A trace whose ids do not rise with arrival: the records still come out sorted by id."""
    reqs = _requests(60, 6.0, seed=9)
    ids = np.random.default_rng(2).permutation(60)
    shuffled = [
        Request(int(i), r.arrival, r.prompt_len, r.max_tokens, r.output_len)
        for i, r in zip(ids, reqs, strict=True)
    ]
    rec = _streamed("continuous", Horizon(max_requests=60), shuffled, Recorder(chunk_rows=5))
    frame = rec.requests_frame()
    assert frame["id"].to_list() == list(range(60))
    by_id = {int(i): r.arrival for i, r in zip(ids, reqs, strict=True)}
    assert frame["arrival"].to_list() == [by_id[i] for i in range(60)]


class _ExtraRecorder(Recorder):
    """Two integer columns per request, read from the request when it is recorded."""

    EXTRA_COLUMNS = ("twice_prompt", "output_plus_id")

    def _request_extras(self, req: Request) -> tuple[int, ...]:
        return (2 * req.prompt_len, req.output_len + req.id)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_extra_columns_follow_their_rows_in_id_order(chunk: int) -> None:
    """A subclass's extra columns stay with their own rows though rows are held for lower ids and cut into
    chunks; a run with no request still has the columns."""
    reqs = _requests(60, 6.0, seed=4)
    rec = _streamed("vllm", Horizon(max_requests=60), reqs, _ExtraRecorder(chunk_rows=chunk))
    frame = rec.requests_frame()
    assert frame["twice_prompt"].to_list() == [2 * p for p in frame["prompt_len"].to_list()]
    assert frame["output_plus_id"].to_list() == (frame["output_len"] + frame["id"]).to_list()
    empty = _ExtraRecorder().requests_frame()
    assert empty.height == 0 and empty.columns[-2:] == ["twice_prompt", "output_plus_id"]


def test_a_long_request_keeps_the_steps_it_needs_across_chunks() -> None:
    """One request running through many chunks, beside short ones: its ITL quantiles are those of every
    step it emitted in (a hand count: all decode steps of a lone constant-time run are equal)."""
    reqs = [Request(0, 0.0, 16, 400, 400)] + [Request(i, 0.01 * i, 16, 2, 2) for i in range(1, 40)]
    rec = _streamed("continuous", Horizon(max_requests=40), reqs, Recorder(chunk_rows=3))
    frame = rec.requests_frame().filter(pl.col("state") == FINISHED)
    steps = rec.steps_frame()
    first, last = frame.row(0, named=True)["first_token_at"], frame.row(0, named=True)["finished_at"]
    ends = steps["start"] + steps["duration"]
    window = np.sort(steps.filter((ends > first) & (ends <= last))["duration"].to_numpy())
    row = frame.row(0, named=True)
    assert row["itl_p50"] == pytest.approx(float(np.quantile(window, 0.5)), rel=1e-12)
    assert row["itl_p99"] == pytest.approx(float(np.quantile(window, 0.99)), rel=1e-12)
    assert len(window) == 399


def _close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-12, abs=1e-15)
    return a == b


def test_step_sums_in_slices_agree_with_one_piece_to_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past `CHUNK_ROWS` steps the float sums go slice by slice: the same figures up to summation order."""
    import sim.records.summary

    h = HORIZONS["drain"]
    ref = reference(_scheduler("vllm"), h, requests=_requests_copy(_requests(150, 6.0, seed=4)))
    requests, steps = ref.requests_frame(), ref.steps_frame()
    one_piece = summarize(requests, steps, 40.0, Slo(), False)
    monkeypatch.setattr(sim.records.summary, "CHUNK_ROWS", 37)
    sliced = summarize(requests.lazy(), steps.lazy(), 40.0, Slo(), False)
    assert steps.height > 10 * 37
    assert _close(sliced, one_piece)
    busy = float(steps["duration"].sum())
    assert sliced["steps"]["busy_fraction"] == pytest.approx(busy / sliced["window_s"], rel=1e-12)


@pytest.mark.parametrize("bins", [1, 3, 4096])
def test_weighted_duration_quantiles_are_exact(monkeypatch: pytest.MonkeyPatch, bins: int) -> None:
    """The binned two-pass quantiles against the direct definition: steps sorted by duration, the first
    whose cumulative decode tokens reach q times the total."""
    import sim.records.summary
    from sim.records.columns import QUANTILES
    from sim.records.summary import _weighted_quantiles

    monkeypatch.setattr(sim.records.summary, "QUANTILE_BINS", bins)
    rng = np.random.default_rng(5)
    durations = np.round(rng.lognormal(-3.5, 0.6, 5_000), 4)  # many ties
    durations[:3] = [5.0, 1e-4, 0.3]  # outliers: most steps share a few bins
    tokens = rng.integers(0, 40, 5_000)
    steps = pl.DataFrame({"duration": durations, "decode_tokens": tokens})
    got = _weighted_quantiles(steps.lazy())
    keep = tokens > 0
    order = np.argsort(durations[keep], kind="stable")
    d, w = durations[keep][order], np.cumsum(tokens[keep][order]).astype(np.float64)
    for key, q in QUANTILES.items():
        assert got[key] == d[int(np.searchsorted(w, q * w[-1], side="left"))]


@pytest.mark.parametrize(("group", "short"), [(1, 64), (3, 64), (64, 64), (32, 0), (32, 128), (32, 1000)])
def test_itl_quantiles_of_many_windows_at_once_are_numpys_value_for_value(group: int, short: int) -> None:
    """`window_quantiles` (the recorder's ITL p50/p99/max for a batch of finished requests) gives, bit for
    bit, np.quantile's linear p50 and p99 and the max of each window, whatever the windows' lengths."""
    from sim.records.window_quantiles import window_quantiles

    rng = np.random.default_rng(7)
    durations = np.round(rng.lognormal(-3.0, 0.6, 3000), int(rng.integers(3, 12)))  # ties included
    n = rng.integers(1, 1200, 200)
    n[:7] = (1, 2, 3, 100, 101, 256, 257)
    lo = rng.integers(0, len(durations) - n)
    p50, p99, top = window_quantiles(durations, lo, n, group, short)
    for k in range(len(n)):
        window = durations[lo[k] : lo[k] + n[k]]
        assert p50[k].tobytes() == np.quantile(window, 0.5).tobytes()
        assert p99[k].tobytes() == np.quantile(window, 0.99).tobytes()
        assert top[k] == window.max()


class _ViewKeepingRecorder(Recorder):
    """Keeps a view of the step columns after each resolve, as a finished frame that a sampling profiler
    (dask's workers sample their tasks) still holds keeps the views that were its locals."""

    kept: list[np.ndarray]

    def _resolve(self) -> None:
        super()._resolve()
        self.kept = [*getattr(self, "kept", [])[-2:], np.frombuffer(self._durations, np.float64),
                     np.frombuffer(self._ends, np.float64)]  # fmt: skip


@pytest.mark.parametrize("policy", ["continuous", "vllm"])
def test_a_view_of_the_step_columns_left_alive_does_not_stop_the_run(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lingering view makes an `array` refuse to grow (BufferError); the recorder grows a copy instead,
    and the records are the reference's."""
    monkeypatch.setattr("sim.records.recorder.ITL_BATCH", 4)  # resolve (and keep views) often mid-run
    h = HORIZONS["drain"]
    reqs = _requests(120, 6.0, seed=11)
    rec = _streamed(policy, h, reqs, _ViewKeepingRecorder(chunk_rows=10_000))
    assert rec.kept  # views were alive while later steps were recorded
    ref = reference(_scheduler(policy), h, requests=_requests_copy(reqs))
    assert_frame_equal(rec.requests_frame(), ref.requests_frame())
    assert_frame_equal(rec.steps_frame(), ref.steps_frame())


@pytest.mark.parametrize("chunk_rows", [3, 4, 7, 65_536])
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 11, 23])
@pytest.mark.parametrize("used", [10, 2**31 - 40])
@pytest.mark.parametrize("grow", [(), (2, 0, 1, 3)])
@pytest.mark.parametrize("tail", [[], [9], [9, 12]])
def test_a_run_of_quiet_steps_records_what_step_would_row_by_row(
    chunk_rows: int, steps: int, used: int, grow: tuple[int, ...], tail: list[int]
) -> None:
    """`Recorder.quiet_steps` (a run's steps in one piece, split at the chunks' ends) writes the rows that
    `Recorder.step` writes one step at a time: KV used counting up, allocated growing by each step's blocks,
    the last steps' own waiting, and 64-bit rows once a value needs them."""
    tail = tail[:steps]
    capacity = 2**31 + 10
    quiet = QuietSteps(steps, 5, 100, 40, used, 5, used + 50, capacity, list(grow), 16 if grow else 0)
    durations = [0.01 * (1 + j % 3) for j in range(steps)]
    ends = list(itertools.accumulate(durations, initial=1.0))[1:]
    compute = [j % 2 == 0 for j in range(steps)]
    run, one = Recorder(chunk_rows=chunk_rows), Recorder(chunk_rows=chunk_rows)
    before = SimpleNamespace(batch_size=1, num_prefill_tokens=7, num_decode_tokens=0, preempted=0,
                             kv=KvUsage(7, 16, capacity))  # fmt: skip
    for rec in (run, one):  # a step before, so that the run starts within a chunk
        rec.step(0.5, 0.5, before, False, 2)  # type: ignore[arg-type]
    run.quiet_steps(1.0, durations, ends, compute, quiet, 3, tail)
    allocated = used + 50
    for j in range(steps):
        if grow:
            allocated += grow[j % len(grow)] * 16
        waiting = tail[j - steps + len(tail)] if j >= steps - len(tail) else 3
        plan = SimpleNamespace(batch_size=5, num_prefill_tokens=0, num_decode_tokens=5, preempted=0,
                               kv=KvUsage(used + 5 * j, allocated, capacity))  # fmt: skip
        one.step(ends[j] - durations[j], durations[j], plan, compute[j], waiting)  # type: ignore[arg-type]
    assert_frame_equal(run.steps_frame(), one.steps_frame())


_piece = st.tuples(
    st.integers(0, 9),  # steps of a run (0: one step recorded by `step`)
    st.sampled_from([(), (1,), (2, 0, 1, 3), (0, 0)]),  # the blocks each step of a run allocates
    st.integers(0, 3),  # rows of the run with their own waiting
    st.integers(0, 2**33),  # KV used at the run's first step
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(pieces=st.lists(_piece, min_size=1, max_size=12), chunk_rows=st.sampled_from([2, 5, 16, 65_536]))
@example(pieces=[(3, (), 1, 10), (0, (), 0, 2**32), (2, (1,), 0, 5)], chunk_rows=65_536)  # 64-bit after a run
def test_runs_among_single_steps_record_what_step_would_and_read_back_their_waiting(
    pieces: list[tuple[int, tuple[int, ...], int, int]], chunk_rows: int
) -> None:
    """Runs of quiet steps between steps recorded one at a time, in chunks of any size: the frame is the one
    `Recorder.step` writes step by step, and `step_waiting` reads each step's waiting back."""
    run, one = Recorder(chunk_rows=chunk_rows), Recorder(chunk_rows=chunk_rows)
    now, capacity, waiting_of = 0.0, 2**34, []
    for k, (steps, grow, own, used) in enumerate(pieces):
        if not steps:
            plan = SimpleNamespace(batch_size=3, num_prefill_tokens=40, num_decode_tokens=2, preempted=k % 2,
                                   kv=KvUsage(used, used + 7, capacity))  # fmt: skip
            for rec in (run, one):
                rec.step(now, 0.25, plan, True, k)  # type: ignore[arg-type]
            now += 0.25
            waiting_of.append(k)
            continue
        rows = 1 + k % 4
        tail = [100 + k * 10 + i for i in range(min(own, steps))]
        quiet = QuietSteps(steps, rows, 50, 9, used, rows, used + 30, capacity, list(grow), 16 if grow else 0)
        durations = [0.01 * (1 + (j + k) % 3) for j in range(steps)]
        ends = list(itertools.accumulate(durations, initial=now))[1:]
        compute = [(j + k) % 2 == 0 for j in range(steps)]
        run.quiet_steps(now, durations, ends, compute, quiet, k, tail)
        allocated = used + 30
        for j in range(steps):
            if grow:
                allocated += grow[j % len(grow)] * 16
            waiting = tail[j - steps + len(tail)] if j >= steps - len(tail) else k
            plan = SimpleNamespace(batch_size=rows, num_prefill_tokens=0, num_decode_tokens=rows, preempted=0,
                                   kv=KvUsage(used + rows * j, allocated, capacity))  # fmt: skip
            one.step(ends[j] - durations[j], durations[j], plan, compute[j], waiting)  # type: ignore[arg-type]
            waiting_of.append(waiting)
        now = ends[-1]
    assert [run.step_waiting(i) for i in range(run.num_steps)] == waiting_of
    assert_frame_equal(run.steps_frame(), one.steps_frame())


@pytest.mark.parametrize("chunks", [1, 2, 5])
def test_a_parquet_sink_writes_the_bytes_of_the_whole_frame(tmp_path: Path, chunks: int) -> None:
    """However many chunks it takes (the first held, the later ones written as uncompressed parts and joined),
    the file is the one `write_parquet` writes for the whole frame; `lazy` reads what was written so far,
    and a sort puts rows handed over out of order back in order."""
    rng = np.random.default_rng(3)
    frame = pl.DataFrame({"id": np.arange(1_000), "x": rng.random(1_000), "n": rng.integers(0, 9, 1_000)})
    pieces = [frame.slice(k * 1_000 // chunks, 1_000 // chunks) for k in range(chunks)]
    sink = ParquetSink(tmp_path, row_group_rows=256)
    for k, piece in enumerate(pieces):
        sink.write("steps", piece)
        sink.write("requests", piece.reverse())
        assert_frame_equal(sink.lazy("steps").collect(), pl.concat(pieces[: k + 1]))
    sink.finish("steps")
    sink.finish("requests", sort_by="id")
    groups = 256 if chunks > 1 else None  # one chunk is written as it is, in the writer's own row groups
    frame.write_parquet(tmp_path / "whole.parquet", statistics=False, row_group_size=groups)
    assert (tmp_path / "steps.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    assert_frame_equal(pl.read_parquet(tmp_path / "requests.parquet"), frame)
    assert not (tmp_path / PARTS).exists()
