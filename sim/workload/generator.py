"""The `[workload]` table: arrival processes, length distributions, shared prefixes, trace replay.

Configs are pydantic models tagged by `kind`; each arrival kind is one class plus one `ARRIVALS` entry
(length kinds live in `sim.config.lengths.DISTRIBUTIONS`). `Workload` turns a validated config and a seed into
requests: `open_loop()` yields them lazily in numpy chunks; `closed_loop` serves a fixed user population.

Random streams are independent children of the seed (arrivals, prompt, output, prefix, think time), so
changing one distribution does not shift the draws of the others.

Example::

    [workload]
    max_tokens = 512                 # cap on generated tokens (default 1024; traces: the trace's own)
    arrival = { kind = "poisson", rate = 12.0 }
    prompt = { kind = "lognormal", mean = 450, cv = 0.8, max = 4000 }   # the question after any prefix
    output = { kind = "exponential", mean = 200 }                       # stop length, capped at max_tokens
    prefix = { groups = 9, prefix_len = 100, users_per_group = 5 }

`prefix = {groups, prefix_len, prompts_per_group}` makes the prompts a fixed pool instead, as load
generators' shared-prefix datasets are: `groups` system prompts, each followed by `prompts_per_group`
questions drawn once; requests take the pool's prompts in one shuffled order, cycling, so each whole
prompt recurs every `groups * prompts_per_group` requests (and the prefix cache may hold all of it).

Other arrivals: `gamma {rate, cv}`, `deterministic {rate}`, `staged {stages = [[rate, s], ...],
exact_count}`, `closed_loop {users, think_time_s, ramp_s}`, `trace {path, format, time_scale}`.
`shared_prefix = {system_prompt_len, question_len, output_len, num_unique_system_prompts,
num_users_per_system_prompt}` replaces prompt, output and prefix with the load generator's profile of the
calibration runs: a pool of `num_unique_system_prompts` x `num_users_per_system_prompt` fixed prompts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from sim.config.lengths import MAX_CV, MIN_CV, DistConfig, FixedDist, LengthSampler, TimeSampler, resolve
from sim.core.request import Request
from sim.engine.lora import AdapterSampler, LoraWorkload
from sim.io.errors import SimError
from sim.io.limits import (
    MAX_COUNT,
    MAX_ID,
    MAX_PARALLEL_SAMPLES,
    MAX_RATE,
    MAX_SECONDS,
    MAX_TOKENS,
)
from sim.io.tables import Table, read_table

CHUNK = 8192  # requests generated per numpy batch
DEFAULT_MAX_TOKENS = 1024


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# --- arrival configs ----------------------------------------------------------------------------------


class PoissonArrival(_Config):
    """Exponential gaps at `rate` requests per second."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(gt=0, le=MAX_RATE)


class GammaArrival(_Config):
    """Gamma-distributed gaps: mean 1/rate, coefficient of variation `cv` (> 1 is bursty)."""

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(gt=0, le=MAX_RATE)
    cv: float = Field(ge=MIN_CV, le=MAX_CV)


class DeterministicArrival(_Config):
    """One request every 1/rate seconds, the first at t = 0."""

    kind: Literal["deterministic"] = "deterministic"
    rate: float = Field(gt=0, le=MAX_RATE)


Stage = tuple[Annotated[float, Field(ge=0, le=MAX_RATE)], Annotated[float, Field(gt=0, le=MAX_SECONDS)]]


class StagedArrival(_Config):
    """Poisson stages `[[rate, duration_s], ...]` run back to back; finite.

    With `exact_count`, each stage holds exactly round(rate × duration) requests: exponential gaps
    rescaled to span the stage (the inference-perf load shape of the calibration runs).
    """

    kind: Literal["staged"] = "staged"
    stages: list[Stage] = Field(min_length=1)
    exact_count: bool = False


def _number_as_fixed(v: Any) -> Any:
    if isinstance(v, int | float) and not isinstance(v, bool):
        return {"kind": "fixed", "value": v}
    return v


class ClosedLoopArrival(_Config):
    """`users` clients, each sending its next request `think_time_s` after the previous one finished.

    `think_time_s = 0` with `ramp_s = 0` is an offline batch: every user sends at t = 0.
    """

    kind: Literal["closed_loop"] = "closed_loop"
    users: int = Field(gt=0, le=MAX_COUNT)
    think_time_s: Annotated[DistConfig, BeforeValidator(_number_as_fixed)] = FixedDist(value=0.0)
    ramp_s: float = Field(0.0, ge=0, le=MAX_SECONDS)


class TraceArrival(_Config):
    """Replay a CSV / JSON-lines trace: `arrival_s, prompt_tokens, output_tokens[, prefix_group, prefix_len]`.

    The Azure trace names `arrived_at, num_prefill_tokens, num_decode_tokens` are accepted too.
    Arrival times are multiplied by `time_scale` (0.5 replays twice as fast).
    """

    kind: Literal["trace"] = "trace"
    path: str = Field(min_length=1)
    format: Literal["csv", "jsonl"] | None = None
    time_scale: float = Field(1.0, gt=0, le=1e6)


# --- arrival processes --------------------------------------------------------------------------------


@dataclass(slots=True)
class Chunk:
    """Arrival times (sorted, seconds) and, for traces, per-request columns that override sampling."""

    times: np.ndarray
    columns: dict[str, np.ndarray] = field(default_factory=dict)


class ArrivalProcess:
    """An open-loop arrival process: `chunks(rng)` yields sorted arrival times in batches."""

    finite: bool = False
    columns: frozenset[str] = frozenset()  # per-request columns a trace provides

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        raise NotImplementedError


class _Renewal(ArrivalProcess):
    """Independent gaps drawn by `gaps(rng, n)`, starting from t = 0."""

    def __init__(self, gaps: Callable[[np.random.Generator, int], np.ndarray]) -> None:
        self._gaps = gaps

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        t = 0.0
        while True:
            times = t + np.cumsum(self._gaps(rng, CHUNK))
            t = float(times[-1])
            yield Chunk(times)


class _Deterministic(ArrivalProcess):
    def __init__(self, rate: float) -> None:
        self._rate = rate

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        start = 0
        while True:
            yield Chunk(np.arange(start, start + CHUNK, dtype=np.float64) / self._rate)
            start += CHUNK


class _Staged(ArrivalProcess):
    finite = True

    def __init__(self, config: StagedArrival) -> None:
        self._c = config

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        t0 = 0.0
        for rate, duration in self._c.stages:
            end = t0 + duration
            if rate > 0 and self._c.exact_count:
                n = round(rate * duration)
                if n > 0:
                    cum = np.cumsum(rng.exponential(1.0, n + 1))
                    times = t0 + cum[:-1] * (duration / cum[-1])
                    for i in range(0, n, CHUNK):
                        yield Chunk(times[i : i + CHUNK])
            elif rate > 0:
                t = t0
                while t < end:
                    times = t + np.cumsum(rng.exponential(1.0 / rate, CHUNK))
                    t = float(times[-1])
                    keep = times[times < end]
                    if keep.size:
                        yield Chunk(keep)
            t0 = end


# Column names accepted for each trace field, in order of preference.
TRACE_COLUMNS: dict[str, tuple[str, ...]] = {
    "arrival": ("arrival_s", "arrived_at"),
    "prompt": ("prompt_tokens", "num_prefill_tokens"),
    "output": ("output_tokens", "num_decode_tokens"),
    "prefix_group": ("prefix_group",),
    "prefix_len": ("prefix_len",),
    "adapter": ("adapter",),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


# Each trace column's bounds: token counts within what a request can hold, group ids exact in float64.
TRACE_BOUNDS: tuple[tuple[str, int, int], ...] = (
    ("prompt", 1, MAX_TOKENS),
    ("output", 1, MAX_TOKENS),
    ("prefix_group", -1, MAX_ID),
    ("prefix_len", 0, MAX_TOKENS),
    ("adapter", -1, MAX_ID),
)


class _Trace(ArrivalProcess):
    finite = True

    def __init__(self, config: TraceArrival, base_dir: Path) -> None:
        path = resolve(config.path, base_dir)
        table = read_table(path, config.format)
        found = {
            k: next((n for n in names if n in table.columns), None) for k, names in TRACE_COLUMNS.items()
        }
        if found["arrival"] is None:
            raise SimError(
                f"{path}: no arrival column (expected one of {', '.join(TRACE_COLUMNS['arrival'])})"
            )
        if len(table) == 0:
            raise SimError(f"{path}: trace has no rows")
        times = self._bounded(table, found["arrival"], 0, MAX_SECONDS / config.time_scale, whole=False)
        order = np.argsort(times, kind="stable")
        self._times = times[order] * config.time_scale
        self._cols: dict[str, np.ndarray] = {}
        for key, low, high in TRACE_BOUNDS:
            name = found[key]
            if name is not None:
                self._cols[key] = self._bounded(table, name, low, high, whole=True)[order].astype(np.int64)
        cols = self._cols
        if "prompt" in cols and "prefix_len" in cols:
            over = np.flatnonzero(cols["prefix_len"] > cols["prompt"])
            if over.size:
                line = int(table.lines[order[over[0]]])
                raise SimError(
                    f"{path}: line {line}: column {found['prefix_len']!r}: exceeds the prompt length"
                )
        self.columns = frozenset(self._cols)
        self.lines = table.lines[order]  # each request's line in the file
        self.path = path
        self.column_names = {k: v for k, v in found.items() if v is not None}

    @staticmethod
    def _bounded(table: Table, name: str, low: float, high: float, whole: bool) -> np.ndarray:
        """A column's values, each a number in [low, high] (a whole number if `whole`)."""
        v = table.numbers(name)
        bad = (v < low) | (v > high)
        if whole:
            bad |= v != np.rint(v)
        if bad.any():
            line = int(table.lines[int(np.argmax(bad))])
            kind = "a whole number" if whole else "a number"
            raise SimError(
                f"{table.path}: line {line}: column {name!r}: expected {kind} in [{_num(low)}, {_num(high)}]"
            )
        return v

    def __len__(self) -> int:
        return int(self._times.size)

    def count_before(self, horizon_s: float) -> int:
        """Requests arriving before `horizon_s` (scaled time)."""
        return int(np.searchsorted(self._times, horizon_s, side="left"))

    def column_mean(self, key: str) -> float | None:
        """Mean of a per-request column (`prompt`, `output`, ...), None if the trace has none."""
        values = self._cols.get(key)
        return None if values is None else float(values.mean())

    def chunks(self, rng: np.random.Generator) -> Iterator[Chunk]:
        for i in range(0, self._times.size, CHUNK):
            yield Chunk(self._times[i : i + CHUNK], {k: v[i : i + CHUNK] for k, v in self._cols.items()})


@dataclass(frozen=True, slots=True)
class ArrivalKind:
    config: type[_Config]
    build: Callable[[Any, Path], ArrivalProcess] | None  # None: not an open-loop process


ARRIVALS: dict[str, ArrivalKind] = {
    "poisson": ArrivalKind(
        PoissonArrival, lambda c, _: _Renewal(lambda r, n: r.exponential(1.0 / c.rate, n))
    ),
    "gamma": ArrivalKind(
        GammaArrival,
        lambda c, _: _Renewal(lambda r, n: r.gamma(1.0 / c.cv**2, c.cv**2 / c.rate, n)),
    ),
    "deterministic": ArrivalKind(DeterministicArrival, lambda c, _: _Deterministic(c.rate)),
    "staged": ArrivalKind(StagedArrival, lambda c, _: _Staged(c)),
    "closed_loop": ArrivalKind(ClosedLoopArrival, None),
    "trace": ArrivalKind(TraceArrival, lambda c, base: _Trace(c, base)),
}

ArrivalConfig = Annotated[
    Union[tuple(k.config for k in ARRIVALS.values())],  # type: ignore[valid-type]  # noqa: UP007
    Field(discriminator="kind"),
]


# --- prefixes and the workload table ------------------------------------------------------------------


class PrefixConfig(_Config):
    """`groups` system prompts of `prefix_len` tokens; each request picks a group uniformly at random.

    `users_per_group` records how many users share a prompt; a closed-loop user `u` belongs to group
    `u % groups`. With `prompts_per_group` the prompts are a fixed pool of `groups * prompts_per_group`
    whole prompts (a group's system prompt, then one of its questions, each drawn once) taken in one
    shuffled order, cycling: request k sends the pool's prompt at position k mod the pool's size.
    """

    groups: int = Field(gt=0, le=MAX_COUNT)
    prefix_len: int = Field(gt=0, le=MAX_TOKENS)
    users_per_group: int | None = Field(None, gt=0, le=MAX_COUNT)
    # left out of dumps when absent, so scenarios without a pool keep their manifests and hashes
    prompts_per_group: int | None = Field(None, gt=0, le=MAX_COUNT, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _pool_size(self) -> PrefixConfig:
        if self.prompts_per_group is not None and self.groups * self.prompts_per_group > MAX_COUNT:
            raise ValueError(f"prompts_per_group: groups x prompts_per_group must be at most {MAX_COUNT:,}")
        return self


class SharedPrefixProfile(_Config):
    """The calibration runs' `shared_prefix` profile; expands to `prefix`, fixed `prompt` and `output`."""

    system_prompt_len: int = Field(gt=0, le=MAX_TOKENS)
    question_len: int = Field(gt=0, le=MAX_TOKENS)
    output_len: int = Field(gt=0, le=MAX_TOKENS)
    num_unique_system_prompts: int = Field(gt=0, le=MAX_COUNT)
    num_users_per_system_prompt: int = Field(1, gt=0, le=MAX_COUNT)


class WorkloadConfig(_Config):
    """The `[workload]` table."""

    arrival: ArrivalConfig
    prompt: DistConfig | None = None  # the question; the prompt is prefix_len + this
    output: DistConfig | None = None  # tokens generated before stopping, capped at max_tokens
    max_tokens: int | None = Field(None, gt=0, le=MAX_TOKENS)
    n: int = Field(1, ge=1, le=MAX_PARALLEL_SAMPLES)
    ignore_eos: bool = False
    prefix: PrefixConfig | None = None
    shared_prefix: SharedPrefixProfile | None = None
    # LoRA adapter per request (sim/engine/lora.py); left out of dumps when absent, so records stay as they were
    lora: LoraWorkload | None = Field(None, exclude_if=lambda v: v is None)

    @model_validator(mode="after")
    def _complete(self) -> WorkloadConfig:
        sp = self.shared_prefix
        if sp is not None:
            clash = [k for k in ("prompt", "output", "prefix") if getattr(self, k) is not None]
            if clash:
                raise ValueError(f"shared_prefix sets prompt, output and prefix; remove {', '.join(clash)}")
            self.prefix = PrefixConfig(
                groups=sp.num_unique_system_prompts,
                prefix_len=sp.system_prompt_len,
                users_per_group=sp.num_users_per_system_prompt,
                prompts_per_group=sp.num_users_per_system_prompt,
            )
            self.prompt = FixedDist(value=sp.question_len)
            self.output = FixedDist(value=sp.output_len)
            if self.max_tokens is None:
                self.max_tokens = sp.output_len
        trace = self.arrival.kind == "trace"
        if trace and self.prefix is not None and self.prefix.prompts_per_group is not None:
            raise ValueError(
                "prefix.prompts_per_group: a trace gives each request its own prompt; a fixed prompt pool "
                "needs generated prompts"
            )
        if self.prompt is None and not trace:
            raise ValueError("prompt: a length distribution is required (e.g. {kind = 'fixed', value = 512})")
        if self.output is None and not (trace or self.ignore_eos):
            raise ValueError("output: a length distribution is required unless ignore_eos = true")
        for name in ("prompt", "output"):
            d = getattr(self, name)
            if isinstance(d, FixedDist) and d.value < 1:
                raise ValueError(f"{name}.value: a length must be >= 1 (got {d.value:g})")
            if d is not None and d.max is not None and d.max < 1:
                raise ValueError(f"{name}.max: a length must be >= 1 (got {d.max:g})")
            if d is not None and d.min is not None and d.max is not None and math.ceil(d.min) > d.max:
                raise ValueError(f"{name}: min {d.min:g} and max {d.max:g} allow no whole number of tokens")
        return self


def format_validation_error(err: ValidationError, data: Any, source: str, root: str = "workload") -> str:
    """One line per problem: `source: root.dotted.key: message`, dropping pydantic's union tags."""
    lines = []
    for e in err.errors():
        parts: list[str] = [root] if root else []
        cur: Any = data
        for item in e["loc"]:
            is_tag = isinstance(cur, Mapping) and item not in cur and cur.get("kind") == item
            if is_tag:
                continue  # the discriminator tag pydantic inserts
            if isinstance(item, int):
                parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
                cur = cur[item] if isinstance(cur, list | tuple) and item < len(cur) else None
            else:
                parts.append(item)
                cur = cur.get(item) if isinstance(cur, Mapping) else None
        msg = e["msg"].removeprefix("Value error, ")
        key = re.match(r"([a-z_]+(?:\.[a-z_]+)*): (.*)", msg) if e["type"] == "value_error" else None
        if key:  # a model-level check that names its own sub-key
            parts.append(key[1])
            msg = key[2]
        if e["type"] not in ("missing", "extra_forbidden") and not isinstance(e.get("input"), Mapping):
            msg += f" (got {e.get('input')!r})"
        where = ".".join(parts)
        lines.append(f"{source}: {where}: {msg}" if where else f"{source}: {msg}")
    return "\n".join(lines)


def parse_workload(data: Mapping[str, Any], source: str = "<scenario>") -> WorkloadConfig:
    """Validate a `[workload]` table; SimError naming the file and dotted key on bad input."""
    try:
        return WorkloadConfig.model_validate(data)
    except ValidationError as e:
        raise SimError(format_validation_error(e, data, source)) from None


# --- runtime ------------------------------------------------------------------------------------------

_STREAMS = ("arrival", "prompt", "output", "prefix", "think", "lora")


class _Draws:
    """Per-request attributes (lengths, prefix groups) drawn in batches from independent streams."""

    def __init__(
        self,
        c: WorkloadConfig,
        seeds: dict[str, np.random.SeedSequence],
        prompt: LengthSampler | None,
        output: LengthSampler | None,
    ) -> None:
        self.c = c
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
        self._buf: list[tuple[int, int, int, int, int, int, int]] = []
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
            rows = zip(d["prompt"].tolist(), d["output"].tolist(), d["max_tokens"].tolist(),
                       d["group"].tolist(), d["plen"].tolist(), adapter, pids, strict=True)  # fmt: skip
            self._buf = list(rows)[::-1]
        prompt, output, max_tokens, group, plen, adapter, pid = self._buf.pop()
        p = self._draws.c.prefix
        if user is not None and p is not None and pid < 0:  # a pool's prompt keeps its own group
            group = user % p.groups
        rid = self._next_id
        self._next_id += 1
        req = Request(rid, arrival, prompt, max_tokens, output, self._draws.c.n, group, plen)
        req.adapter = adapter
        req.prompt_id = pid
        return req


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
        kind = ARRIVALS[config.arrival.kind]
        self._process = None if kind.build is None else kind.build(config.arrival, self._base_dir)
        self._check_trace_columns()
        self.closed_loop: ClosedLoop | None = None
        if isinstance(config.arrival, ClosedLoopArrival):
            draws = self._draws()
            self.closed_loop = ClosedLoop(config.arrival, draws, self._seeds["think"], self._base_dir)

    def _draws(self) -> _Draws:
        return _Draws(self.config, self._seeds, self._prompt, self._output)

    def _check_trace_columns(self) -> None:
        if not isinstance(self._process, _Trace):
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

    def _check_trace_prefix(self, trace: _Trace) -> None:
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

    def _check_trace_adapters(self, trace: _Trace) -> None:
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
    def trace(self) -> _Trace | None:
        """The loaded trace of a trace arrival, else None."""
        return self._process if isinstance(self._process, _Trace) else None

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
            for t, prompt, max_tokens, output, group, plen in rows:
                req = Request(rid, t, prompt, max_tokens, output, n_req, group, plen)
                if adapters is not None:
                    req.adapter = next(adapters)
                if pids is not None:
                    req.prompt_id = next(pids)
                yield req
                rid += 1
            left -= k
            if left <= 0 or k < chunk.times.size:
                return
