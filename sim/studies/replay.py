"""Step-level replay of the `vllm` scheduler against vLLM v1 conformance logs (no cost model).

The loop is the oracle's stand-in runner: add the requests that arrived by this step, schedule, emit one token
for each sequence whose computed tokens reach its length, finish those that reached `max_tokens`, next step.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.config.policies import VllmConfig
from sim.core.request import Request
from sim.cost.memory import KvBudget
from sim.engine.schedulers.vllm.plan import Seq
from sim.engine.schedulers.vllm.scheduler import VllmScheduler
from sim.io.errors import SimError
from sim.io.limits import MAX_ID, MAX_PARALLEL_SAMPLES, MAX_TOKENS
from sim.io.outputs import atomic_write
from sim.io.progress import progress

KEYS = (
    "step",
    "arrived",
    "scheduled",
    "new",
    "resumed",
    "total_tokens",
    "preempted",
    "finished",
    "free_blocks_after_schedule",
    "free_blocks_end",
    "num_running",
    "num_waiting",
)


MAX_REPLAY_STEPS = 10_000_000  # a replay that has not finished by then is refused


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Scheduler settings of one replay, named as in the oracle's config line."""

    block_size: int = 16
    num_blocks: int = 1000
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    max_model_len: int = 4096
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    watermark_blocks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class TraceRequest:
    name: str
    arrival_step: int
    request: Request


def load_trace(path: Path) -> list[TraceRequest]:
    """Read a JSON list of requests (`id`, `arrival_step`, `prompt_len`, `max_tokens`, prefix fields).

    Errors name the file, the request's index and the field, never the file's contents.
    """
    try:
        rows = json.loads(path.read_bytes())
    except OSError as exc:
        raise SimError(f"{path}: cannot read trace: {exc.strerror or type(exc).__name__}") from None
    except UnicodeDecodeError:
        raise SimError(f"{path}: cannot read trace: not a UTF-8 text file") from None
    except json.JSONDecodeError as exc:
        raise SimError(
            f"{path}: cannot read trace: not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise SimError(f"{path}: cannot read trace: JSON nested too deeply") from None
    if not isinstance(rows, list):
        raise SimError(f"{path}: a trace is a JSON list of requests")
    out = []
    seen: set[str] = set()
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SimError(f"{path}: request {i} is not an object")
        name = str(_field(path, i, row, "id", (str, int), None, 0, MAX_ID))
        if name in seen:
            raise SimError(f"{path}: request {i}: field 'id' repeats an earlier request's id")
        seen.add(name)
        arrival = _field(path, i, row, "arrival_step", int, None, 0, MAX_REPLAY_STEPS - 1)
        prompt = _field(path, i, row, "prompt_len", int, None, 1, MAX_TOKENS)
        max_tokens = _field(path, i, row, "max_tokens", int, None, 1, MAX_TOKENS)
        group = _field(path, i, row, "prefix_group", int, -1, -1, MAX_ID)
        prefix = _field(path, i, row, "prefix_len", int, 0, 0, prompt)
        n = _field(path, i, row, "n", int, 1, 1, MAX_PARALLEL_SAMPLES)  # as workload.n
        req = Request(
            i, float(arrival), prompt, max_tokens, max_tokens, n=n, prefix_group=group, prefix_len=prefix
        )
        out.append(TraceRequest(name, arrival, req))
    return out


def _field(
    path: Path, i: int, row: dict[str, Any], key: str, kind: Any, default: Any, low: int, high: int
) -> Any:
    """A field of type `kind`, a whole number in [low, high]; `default` when absent (None: required)."""
    if key not in row:
        if default is None:
            raise SimError(f"{path}: request {i} lacks field '{key}'")
        return default
    value = row[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = "a string or a whole number" if kind == (str, int) else "a whole number"
        raise SimError(f"{path}: request {i}: field '{key}': expected {expected}")
    if isinstance(value, int) and not low <= value <= high:
        raise SimError(f"{path}: request {i}: field '{key}': expected a whole number in [{low}, {high}]")
    return value


def build(config: ReplayConfig, fast: bool = False) -> VllmScheduler:
    """A `vllm` scheduler with the replay's settings (stepping every row, unless `fast`)."""
    c = config
    if c.block_size < 1 or c.num_blocks < 2 or c.max_model_len < 2 or c.watermark_blocks < 0:
        raise SimError(f"bad replay settings: {config.as_dict()}")
    try:
        knobs = VllmConfig(
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            enable_chunked_prefill=config.enable_chunked_prefill,
            enable_prefix_caching=config.enable_prefix_caching,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            async_scheduling=False,  # the oracle steps vLLM's scheduler synchronously
        )
    except ValueError as exc:
        raise SimError(f"bad replay settings: {exc}") from exc
    budget = KvBudget(config.num_blocks, config.block_size, config.max_model_len)
    return VllmScheduler(knobs, budget, watermark_blocks=config.watermark_blocks, fast=fast)


def seq_name(seq: Seq, names: dict[int, str]) -> str:
    """A sequence's id in vLLM's logs: the request's, or `{child}_{id}` for a child of an `n > 1` request
    (the ids vLLM's front end gives the children it fans such a request out into)."""
    name = names[seq.req.id]
    return name if seq.req.n == 1 else f"{seq.child}_{name}"


def replay(
    trace: list[TraceRequest],
    config: ReplayConfig,
    max_steps: int = MAX_REPLAY_STEPS,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the trace step by step until a step starts with every request finished; one record per step.

    Id lists other than `scheduled` are sorted, as the oracle logs them. `progress(requests finished)`, if
    given, is called every 256 steps.
    """
    sched = build(config)
    pending = sorted(trace, key=lambda t: t.arrival_step)
    names = {t.request.id: t.name for t in trace}
    open_count = 0
    head = 0
    steps: list[dict[str, Any]] = []
    step = 0
    while True:
        idle = head == len(pending) and not open_count  # the oracle logs this last, empty step too
        if step >= max_steps:
            raise SimError(f"replay did not finish within {max_steps} steps")
        arrived = []
        while head < len(pending) and pending[head].arrival_step <= step:
            t = pending[head]
            head += 1
            if not sched.add(t.request, float(step)):
                raise SimError(f"request {t.name} rejected: {t.request.reject_reason}")
            n = t.request.n
            arrived.extend([t.name] if n == 1 else [f"{k}_{t.name}" for k in range(n)])
            open_count += 1
        plan = sched.schedule(float(step))
        info = sched.last
        free_after = sched.kv.num_free
        finished = sched.update(plan, float(step)) if plan is not None else []
        done = [s for s in info.emit if s.num_generated >= s.out_len]
        open_count -= len(finished)
        steps.append(
            {
                "step": step,
                "arrived": arrived,
                "scheduled": [[seq_name(s, names), n] for s, n in info.rows],
                "new": sorted(seq_name(s, names) for s in info.new),
                "resumed": sorted(seq_name(s, names) for s in info.resumed),
                "total_tokens": sum(info.counts),
                "preempted": sorted(seq_name(s, names) for s in info.preempted),
                "finished": sorted(seq_name(s, names) for s in done),
                "free_blocks_after_schedule": free_after,
                "free_blocks_end": sched.kv.num_free,
                "num_running": len(sched.running),
                "num_waiting": len(sched.waiting),
            }
        )
        step += 1
        if progress is not None and step % 256 == 0:
            progress(head - open_count)
        if idle:
            return steps


def write_steps(path: Path, config: ReplayConfig, steps: list[dict[str, Any]]) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(json.dumps({"config": config.as_dict()}) + "\n")
            for rec in steps:
                f.write(json.dumps(rec) + "\n")

    atomic_write(path, write)


def read_steps(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read a steps log (`.jsonl` or `.jsonl.gz`): its config and its step records."""
    lines: list[Any] = []
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    lines.append(_json_line(path, number, line))
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise SimError(f"{path}: cannot read steps log: a cut or damaged gzip file") from None
    except UnicodeDecodeError:
        raise SimError(f"{path}: cannot read steps log: not a UTF-8 text file") from None
    except OSError as exc:
        raise SimError(f"{path}: cannot read steps log: {exc.strerror or type(exc).__name__}") from None
    if not lines or not isinstance(lines[0], dict) or not isinstance(lines[0].get("config"), dict):
        raise SimError(f'{path}: the first line must be {{"config": {{...}}}}')
    config = lines[0]["config"]
    for key in ReplayConfig.__slots__:  # type: ignore[attr-defined]
        flag = key.startswith("enable_")
        value = config.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) != flag):
            expected = "true or false" if flag else "a whole number"
            raise SimError(f"{path}: line 1: config.{key}: expected {expected}")
    for number, rec in enumerate(lines[1:], start=2):
        if not isinstance(rec, dict):
            raise SimError(f"{path}: record {number}: not a JSON object")
    return config, lines[1:]


def _json_line(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise SimError(f"{path}: line {number}: not valid JSON") from None


def overrides(**given: Any) -> dict[str, Any]:
    """The settings given explicitly (not None)."""
    return {k: v for k, v in given.items() if v is not None}


def config_from(expected: dict[str, Any], **given: Any) -> ReplayConfig:
    """Settings from an oracle config line, with explicitly given values taking precedence.

    `watermark` (a fraction of `num_blocks`, as in the `vllm` policy) sets `watermark_blocks`.
    """
    names = ReplayConfig.__slots__  # type: ignore[attr-defined]
    values = {k: expected[k] for k in names if k in expected}
    values.update(overrides(**given))
    fraction = values.pop("watermark", None)
    unknown = set(values) - set(names)
    if unknown:
        raise SimError(f"unknown replay settings: {sorted(unknown)}")
    config = ReplayConfig(**values)
    if fraction is not None:
        if not 0.0 <= fraction < 1.0:
            raise SimError(f"--watermark must be a fraction in [0, 1), got {fraction}")
        config = ReplayConfig(**{**config.as_dict(), "watermark_blocks": int(fraction * config.num_blocks)})
    return config


@dataclass(frozen=True, slots=True)
class Comparison:
    identical: int
    total: int
    first_diff: tuple[dict[str, Any] | None, dict[str, Any] | None] | None

    @property
    def share(self) -> float:
        return self.identical / self.total if self.total else 1.0

    @property
    def differing_keys(self) -> list[str]:
        """The oracle keys on which the first differing pair differs (all of them when a side is missing)."""
        if self.first_diff is None:
            return []
        exp, act = self.first_diff
        if exp is None or act is None:
            return list(KEYS)
        return [k for k in KEYS if exp.get(k) != act.get(k)]

    def report(self) -> list[str]:
        """Lines for the command's output: the share of identical steps, then the first difference in full."""
        lines = [f"identical steps: {self.identical}/{self.total} ({100 * self.share:.2f}%)"]
        if self.first_diff is None:
            return lines
        exp, act = self.first_diff
        step = (exp or act or {}).get("step")
        lines.append(f"first difference at step {step}, in: {', '.join(self.differing_keys)}")
        for label, side in (("expected", exp), ("actual", act)):
            shown = json.dumps(side) if side is not None else f"(no step {step}: this log ends before it)"
            lines.append(f"  {label + ':':9} {shown}")
        return lines


def compare(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> Comparison:
    """Count identical steps (on the oracle's keys) and keep the first pair that differs."""
    total = max(len(expected), len(actual))
    identical = 0
    first = None
    for i in range(total):
        e = expected[i] if i < len(expected) else None
        a = actual[i] if i < len(actual) else None
        if e is not None and a is not None and all(e.get(k) == a.get(k) for k in KEYS):
            identical += 1
        elif first is None:
            first = (e, a)
    return Comparison(identical, total, first)


def run(
    trace_path: Path, out: Path | None, expected_path: Path | None, overrides: dict[str, Any]
) -> tuple[str, int]:
    """The `replay-steps` command: replay, write, compare with an expected log; (report, exit code)."""
    expected: list[dict[str, Any]] | None = None
    base: dict[str, Any] = {}
    if expected_path is not None:
        base, expected = read_steps(expected_path)
    config = config_from(base, **overrides)
    trace = load_trace(trace_path)
    with progress("replaying", len(trace), "requests finished") as update:
        steps = replay(trace, config, progress=update)
    lines = [f"{len(steps)} steps replayed"]
    if out is not None:
        write_steps(out, config, steps)
        lines[0] += f", written to {out}"
    if expected is None:
        return "\n".join(lines), 0
    result = compare(expected, steps)
    lines += result.report()
    return "\n".join(lines), 0 if result.first_diff is None else 1
