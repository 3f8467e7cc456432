"""A run's requests, drawn from a validated `[workload]` table (`sim.config.workload`) and a seed.

`Workload.open_loop()` yields them lazily in numpy chunks, from the arrival process of the table's kind
(`ARRIVALS`); `closed_loop` serves a fixed user population. Random streams are independent children of the
seed (arrivals, prompt, output, prefix, think time), so changing one distribution does not shift the draws
of the others.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from sim.config.workload import DEFAULT_MAX_TOKENS, ClosedLoopArrival, StagedArrival, WorkloadConfig
from sim.core.request import Request
from sim.io.errors import SimError
from sim.workload.adapters import AdapterSampler
from sim.workload.arrivals import ArrivalProcess, DeterministicProcess, RenewalProcess, StagedProcess
from sim.workload.lengths import LengthSampler, TimeSampler
from sim.workload.sampling import SamplingDraws
from sim.workload.traces import TRACE_COLUMNS, TraceProcess

# --- arrival configs ----------------------------------------------------------------------------------


# --- arrival processes --------------------------------------------------------------------------------


# --- prefixes and the workload table ------------------------------------------------------------------


# --- runtime ------------------------------------------------------------------------------------------

_STREAMS = ("arrival", "prompt", "output", "prefix", "think", "lora", "sampling")


class _Draws:
    """Per-request attributes (lengths, prefix groups) drawn in batches from independent streams."""

    def __init__(
        self,
        c: WorkloadConfig,
        seeds: dict[str, np.random.SeedSequence],
        prompt: LengthSampler | None,
        output: LengthSampler | None,
        sampling: SamplingDraws,
    ) -> None:
        self.c = c
        self.sampling = sampling
        self.rng = {k: np.random.default_rng(s) for k, s in seeds.items()}
        self.prompt = prompt
        self.output = output
        self.adapters = AdapterSampler(c.lora) if c.lora is not None else None
        self._pool: tuple[np.ndarray, np.ndarray] | None = None  # (order, question lengths), drawn once
        self._pool_next = 0  # requests drawn from the pool so far

    def _pool_prompts(self, n: int) -> np.ndarray:
        """Positions in the prompt pool of the next n requests: one shuffled order of the pool, cycling."""
        p = self.c.prefix
        assert p is not None and p.prompts_per_group is not None and self.prompt is not None
        if self._pool is None:
            size = p.groups * p.prompts_per_group
            self._pool = (self.rng["prefix"].permutation(size), self.prompt(self.rng["prompt"], size))
        order = self._pool[0]
        k = (self._pool_next + np.arange(n, dtype=np.int64)) % order.size
        self._pool_next += n
        return order[k]

    def draw(self, n: int, cols: Mapping[str, np.ndarray], first_user: int | None = None) -> dict[str, Any]:
        """Arrays of length n: prompt, output, max_tokens, group, prefix_len (trace columns win)."""
        c = self.c
        p = c.prefix
        pool = None
        if p is not None and p.prompts_per_group is not None:  # a generated workload (traces refused)
            pool = self._pool_prompts(n)
            group = pool // p.prompts_per_group
        elif "prefix_group" in cols:
            group = cols["prefix_group"]
        elif p is not None:
            group = self.rng["prefix"].integers(0, p.groups, n)
        else:
            group = np.full(n, -1, dtype=np.int64)
        if "prefix_len" in cols:
            plen = cols["prefix_len"]
        else:
            plen = np.where(group >= 0, p.prefix_len if p is not None else 0, 0)
        if pool is not None:
            assert self._pool is not None
            prompt = plen + self._pool[1][pool]
        elif "prompt" in cols:
            prompt = cols["prompt"]
        elif self.prompt is not None:
            prompt = plen + self.prompt(self.rng["prompt"], n)
        else:
            raise SimError("workload.prompt: the trace has no prompt column, so a distribution is required")
        if c.max_tokens is not None:
            max_tokens = np.full(n, c.max_tokens, dtype=np.int64)
        elif "output" in cols:
            max_tokens = cols["output"]  # replay exactly: each request may generate what it did
        else:
            max_tokens = np.full(n, DEFAULT_MAX_TOKENS, dtype=np.int64)
        if c.ignore_eos:
            output = max_tokens
        elif "output" in cols:
            output = np.minimum(cols["output"], max_tokens)
        elif self.output is not None:
            output = np.minimum(self.output(self.rng["output"], n), max_tokens)
        else:
            raise SimError("workload.output: the trace has no output column, so a distribution is required")
        out = {"prompt": prompt, "output": output, "max_tokens": max_tokens, "group": group, "plen": plen}
        if pool is not None:
            out["prompt_id"] = pool
        if "adapter" in cols or c.lora is not None:
            out["adapter"] = cols["adapter"] if "adapter" in cols else self.adapters(self.rng["lora"], n)
        rows = self.sampling(self.rng["sampling"], n, cols)
        if rows is not None:
            out["sampling"] = rows
        return out


class ClosedLoop:
    """A fixed population of `users`; the engine asks for each user's next request and think time."""

    def __init__(self, c: ClosedLoopArrival, draws: _Draws, seed: np.random.SeedSequence, base_dir: Path):
        self.users = c.users
        self.ramp_s = c.ramp_s
        self._draws = draws
        self._think = TimeSampler(c.think_time_s, base_dir)
        self._think_rng = np.random.default_rng(seed)
        self._think_buf: list[float] = []
        self._buf: list[tuple[int, int, int, int, int, int, int, int]] = []
        self._next_id = 0

    def start_times(self) -> np.ndarray:
        """When each user sends its first request: spread evenly over [0, ramp_s), all at 0 without a ramp."""
        return np.arange(self.users, dtype=np.float64) * (self.ramp_s / self.users)

    def think_time(self) -> float:
        """Seconds a user waits after a response before sending its next request."""
        if not self._think_buf:
            self._think_buf = self._think(self._think_rng, 256).tolist()[::-1]
        return self._think_buf.pop()

    def new_request(self, arrival: float, user: int | None = None) -> Request:
        """The next request (ids 0, 1, 2, ...); `user` pins its prefix group to `user % groups`."""
        if not self._buf:
            d = self._draws.draw(256, {})
            adapter = d["adapter"].tolist() if "adapter" in d else [-1] * 256
            pids = d["prompt_id"].tolist() if "prompt_id" in d else [-1] * 256
            sampling = d["sampling"].tolist() if "sampling" in d else [-1] * 256
            columns = [d[k].tolist() for k in ("prompt", "output", "max_tokens", "group", "plen")]
            rows = zip(*columns, adapter, pids, sampling, strict=True)
            self._buf = list(rows)[::-1]
        prompt, output, max_tokens, group, plen, adapter, pid, sampling_row = self._buf.pop()
        p = self._draws.c.prefix
        if user is not None and p is not None and pid < 0:  # a pool's prompt keeps its own group
            group = user % p.groups
        rid = self._next_id
        self._next_id += 1
        req = Request(rid, arrival, prompt, max_tokens, output, self._draws.c.n, group, plen)
        req.adapter = adapter
        req.prompt_id = pid
        req.sampling = sampling_row
        return req


# The arrival process of each open-loop arrival kind (`sim.config.workload.ARRIVAL_KINDS`), built from its
# config and the scenario's folder; closed-loop users are served by `ClosedLoop` instead.
ARRIVALS: dict[str, Callable[[Any, Path], ArrivalProcess]] = {
    "poisson": lambda c, _: RenewalProcess(lambda r, n: r.exponential(1.0 / c.rate, n)),
    "gamma": lambda c, _: RenewalProcess(lambda r, n: r.gamma(1.0 / c.cv**2, c.cv**2 / c.rate, n)),
    "deterministic": lambda c, _: DeterministicProcess(c.rate),
    "staged": lambda c, _: StagedProcess(c),
    "trace": lambda c, base: TraceProcess(c, base),
}


def rate_steps(arrival: BaseModel) -> tuple[float, ...]:
    """Times at which the offered rate changes: the ends of all but the last stage of staged arrivals
    (the overload test judges each stretch of constant rate on its own); none for other arrivals."""
    if not isinstance(arrival, StagedArrival):
        return ()
    ends = np.cumsum([duration for _, duration in arrival.stages])
    return tuple(float(t) for t in ends[:-1])


def _child_seeds(seed: int | np.random.SeedSequence) -> dict[str, np.random.SeedSequence]:
    if isinstance(seed, np.random.SeedSequence):
        # A copy, so the caller's SeedSequence is not advanced and repeated builds agree.
        seed = np.random.SeedSequence(seed.entropy, spawn_key=seed.spawn_key, pool_size=seed.pool_size)
    else:
        seed = np.random.SeedSequence(seed)
    return dict(zip(_STREAMS, seed.spawn(len(_STREAMS)), strict=True))


class Workload:
    """Requests for one run: `open_loop()` for arrival processes and traces, `closed_loop` for users."""

    def __init__(self, config: WorkloadConfig, seed: int | np.random.SeedSequence, base_dir: Path) -> None:
        self.config = config
        self._seeds = _child_seeds(seed)
        self._base_dir = Path(base_dir)
        # Samplers load their files (empirical) now, so errors surface before the run.
        self._prompt = None if config.prompt is None else LengthSampler(config.prompt, self._base_dir)
        self._output = None if config.output is None else LengthSampler(config.output, self._base_dir)
        build = ARRIVALS.get(config.arrival.kind)
        self._process = None if build is None else build(config.arrival, self._base_dir)
        self._check_trace_columns()
        # Each request's sampling parameters: rows of `sampling.table`, one table for every draw of the run.
        self.sampling = SamplingDraws(config.sampling)
        self.closed_loop: ClosedLoop | None = None
        if isinstance(config.arrival, ClosedLoopArrival):
            draws = self._draws()
            self.closed_loop = ClosedLoop(config.arrival, draws, self._seeds["think"], self._base_dir)

    def _draws(self) -> _Draws:
        return _Draws(self.config, self._seeds, self._prompt, self._output, self.sampling)

    def _check_trace_columns(self) -> None:
        if not isinstance(self._process, TraceProcess):
            return
        self._check_trace_adapters(self._process)
        self._check_trace_prefix(self._process)
        for key, dist in (("prompt", self.config.prompt), ("output", self.config.output)):
            if key in self._process.columns or dist is not None:
                continue
            if key == "output" and self.config.ignore_eos:
                continue
            names = " or ".join(repr(n) for n in TRACE_COLUMNS[key])
            raise SimError(f"{self._process.path}: no {names} column and no workload.{key} distribution")

    def _check_trace_prefix(self, trace: TraceProcess) -> None:
        """A trace's prompts hold their shared prefix: each prompt of a prefix group is at least
        `workload.prefix.prefix_len` long (unless the trace has its own prefix_len column)."""
        p, cols = self.config.prefix, trace._cols
        if p is None or "prompt" not in cols or "prefix_len" in cols:
            return
        grouped = cols["prefix_group"] >= 0 if "prefix_group" in cols else True
        short = np.flatnonzero(grouped & (cols["prompt"] < p.prefix_len))
        if short.size:
            raise SimError(
                f"{trace.path}: line {int(trace.lines[short[0]])}: column {trace.column_names['prompt']!r}: "
                f"shorter than workload.prefix.prefix_len ({p.prefix_len}), which it includes"
            )

    def _check_trace_adapters(self, trace: TraceProcess) -> None:
        """A trace's `adapter` column names adapters of `[workload.lora]` (ids below `adapters`)."""
        ids = trace._cols.get("adapter")
        if ids is None:
            return
        lora = self.config.lora
        if lora is None:
            raise SimError(f"{trace.path}: an 'adapter' column needs a [workload.lora] table (rank, modules)")
        if ids.size and int(ids.max()) >= lora.adapters:
            raise SimError(
                f"{trace.path}: column 'adapter': id {int(ids.max())} is not below workload.lora.adapters "
                f"({lora.adapters})"
            )

    @property
    def trace(self) -> TraceProcess | None:
        """The loaded trace of a trace arrival, else None."""
        return self._process if isinstance(self._process, TraceProcess) else None

    @property
    def finite(self) -> bool:
        """True when the arrival process ends by itself (trace, staged)."""
        return self._process is not None and self._process.finite

    def open_loop(self, max_requests: int | None = None, horizon_s: float | None = None) -> Iterator[Request]:
        """Requests in arrival order with ids 0, 1, 2, ...; stops at the first limit reached.

        Generated lazily, CHUNK at a time; restarting gives the same sequence.
        """
        if self._process is None:
            raise SimError(
                f"workload.arrival: kind {self.config.arrival.kind!r} is closed-loop; use .closed_loop"
            )
        if max_requests is None and horizon_s is None and not self._process.finite:
            raise SimError(
                f"workload.arrival: kind {self.config.arrival.kind!r} never ends; "
                "give max_requests or horizon_s"
            )
        if max_requests is not None and max_requests < 0:
            raise SimError(f"max_requests must be >= 0 (got {max_requests})")
        return self._generate(self._process, max_requests, horizon_s)

    def _generate(
        self, proc: ArrivalProcess, max_requests: int | None, horizon_s: float | None
    ) -> Iterator[Request]:
        draws = self._draws()
        arrival_rng = np.random.default_rng(self._seeds["arrival"])
        left = math.inf if max_requests is None else max_requests
        horizon = math.inf if horizon_s is None else horizon_s
        n_req = self.config.n
        rid = 0
        if left <= 0:
            return
        for chunk in proc.chunks(arrival_rng):
            # Draw for the whole chunk so a limit never changes the requests before it.
            d = draws.draw(chunk.times.size, chunk.columns)
            k = int(np.searchsorted(chunk.times, horizon, side="left"))
            k = int(min(k, left))
            rows = zip(chunk.times[:k].tolist(), d["prompt"][:k].tolist(), d["max_tokens"][:k].tolist(),
                       d["output"][:k].tolist(), d["group"][:k].tolist(), d["plen"][:k].tolist(),
                       strict=True)  # fmt: skip
            adapters = iter(d["adapter"][:k].tolist()) if "adapter" in d else None
            pids = iter(d["prompt_id"][:k].tolist()) if "prompt_id" in d else None
            sampling = iter(d["sampling"][:k].tolist()) if "sampling" in d else None
            for t, prompt, max_tokens, output, group, plen in rows:
                req = Request(rid, t, prompt, max_tokens, output, n_req, group, plen)
                if adapters is not None:
                    req.adapter = next(adapters)
                if pids is not None:
                    req.prompt_id = next(pids)
                if sampling is not None:
                    req.sampling = next(sampling)
                yield req
                rid += 1
            left -= k
            if left <= 0 or k < chunk.times.size:
                return
