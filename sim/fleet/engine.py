"""Many replicas on one SimPy clock: an arrival process (or closed-loop users, as in `engine.replica`) routes
each request to a replica, and for disaggregated serving a prefilled request's KV moves over a link to a
decode replica.

Each replica is the single-replica engine's `Replica` running its `run` loop in the shared environment; the
fleet only submits requests to it and listens to `Replica.on_finish`.

Disaggregated prefill/decode: a request runs on a prefill replica as a one-token request (its prompt's
prefill and its first token), then its KV (prompt tokens x KV bytes per token per GPU) crosses the link in
`Link.transfer_s` seconds, each transfer on its own (no contention between transfers), and it joins a decode
replica, which admits it when its blocks are free (`DecodeScheduler`). Its first token reaches the user when
the transfer ends: TTFT includes the transfer. A one-token request ends at its prefill, with no transfer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import polars as pl
import simpy

from sim.catalog.links import Link
from sim.core.request import Request
from sim.core.step import StepPlan
from sim.engine.closed_loop import ClosedLoopSource, ClosedLoopUsers
from sim.engine.horizon import Horizon
from sim.engine.lora import LoraRun
from sim.engine.lora_records import LoraRecorder
from sim.engine.replica import Environment, Replica, StepTime
from sim.engine.schedulers.base import Scheduler
from sim.fleet.routing import NO_ADAPTERS, ReplicaReport, Router, Snapshot
from sim.records.columns import CHUNK_ROWS, FINISHED, IN_FLIGHT
from sim.records.overload import requests_backlog_trend
from sim.records.recorder import Recorder
from sim.records.sinks import RecordSink

MIN_CHUNK_ROWS = 4096  # the smallest chunk a replica hands its sink


class FleetRecorder(Recorder):
    """A replica's recorder that also keeps its latest KV share for the router's reports."""

    def __init__(self, sink: RecordSink | None = None, chunk_rows: int = CHUNK_ROWS) -> None:
        super().__init__(sink, chunk_rows)
        self.kv_fraction = 0.0

    def step(self, start: float, duration: float, plan: StepPlan, compute_bound: bool, waiting: int) -> None:
        super().step(start, duration, plan, compute_bound, waiting)
        kv = plan.kv
        self.kv_fraction = kv.allocated / kv.capacity if kv.capacity else 0.0


class LoraFleetRecorder(LoraRecorder, FleetRecorder):
    """A LoRA replica's recorder (its adapter columns) that also keeps its latest KV share."""


class PrefillRecorder(FleetRecorder):
    """A prefill replica's recorder: a finished prefill is not the request's end (the decode replica records
    it); a rejected or unfinished one is recorded here with its own lengths restored."""

    def __init__(
        self,
        lengths: dict[int, tuple[int, int]],
        sink: RecordSink | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        super().__init__(sink, chunk_rows)
        self.lengths = lengths

    def request(self, req: Request, state: str) -> None:
        if state == FINISHED:
            return
        if req.id in self.lengths:
            req.output_len, req.max_tokens = self.lengths.pop(req.id)
        super().request(req, state)


@dataclass(slots=True)
class ReplicaSpec:
    name: str
    group: str
    role: str  # both, prefill or decode
    scheduler: Scheduler
    step_time: StepTime
    kv_bytes_per_token: int = 0  # per GPU (prefill replicas: what a transfer moves per prompt token)
    lora: LoraRun | None = None  # its LoRA parts (its own adapter cache, and `step_time` is their timer)


class ReplicaAdapters:
    """A LoRA replica's adapters as its report shows them: those in its GPU slots, and those the requests
    it holds name (`held`: adapter -> requests), which it loads when it runs them."""

    __slots__ = ("held", "slots")

    def __init__(self, slots: Collection[int]) -> None:
        self.held: dict[int, int] = {}
        self.slots = slots  # the live GPU slots of its adapter cache (`LoraCache.gpu`)

    def __contains__(self, adapter: object) -> bool:
        return adapter in self.held or adapter in self.slots

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.held.keys() | set(self.slots)))

    def __len__(self) -> int:
        return len(self.held.keys() | set(self.slots))

    def add(self, adapter: int) -> None:
        if adapter >= 0:
            self.held[adapter] = self.held.get(adapter, 0) + 1

    def remove(self, adapter: int) -> None:
        if adapter >= 0:
            left = self.held[adapter] - 1
            if left:
                self.held[adapter] = left
            else:
                del self.held[adapter]


@dataclass(slots=True, eq=False)
class Member:
    """A replica of the fleet, and the live report the router reads (`ReplicaReport`)."""

    index: int
    spec: ReplicaSpec
    replica: Replica
    recorder: FleetRecorder
    inbound: int = 0  # transfers on their way to it
    lora_adapters: ReplicaAdapters | None = None  # serving LoRA: the adapters it has or will load

    @property
    def outstanding(self) -> int:
        return self.replica.in_system + self.inbound

    @property
    def waiting(self) -> int:
        return self.spec.scheduler.num_waiting

    @property
    def kv_fraction(self) -> float:
        return self.recorder.kv_fraction

    @property
    def adapters(self) -> Collection[int]:
        return NO_ADAPTERS if self.lora_adapters is None else self.lora_adapters


@dataclass(slots=True)
class Handoff:
    """Where a disaggregated request's time went."""

    prefill_replica: int
    prefill_end: float
    decode_replica: int = -1
    transfer_s: float = math.nan


@dataclass(slots=True)
class FleetOutput:
    members: list[Member]
    end_time: float
    overloaded: bool
    handoffs: dict[int, Handoff] = field(default_factory=dict)
    admitted_at: dict[int, float] = field(default_factory=dict)  # decode start, by request id
    routed: list[int] = field(default_factory=list)  # requests sent to each replica by the entry router


class Fleet:
    """Replicas on one clock behind a router. `make_router(n)` builds a router over n replicas (one for the
    entry replicas, one more for the decode replicas of a disaggregated fleet)."""

    def __init__(
        self,
        specs: Sequence[ReplicaSpec],
        make_router: Callable[[int], Router],
        horizon: Horizon,
        link: Link | None = None,
        report_delay_s: float = 0.0,
        sink_for: Callable[[str], RecordSink] | None = None,
    ) -> None:
        """`sink_for(replica name)`: where each replica's records go (default: kept in memory), in chunks
        of `CHUNK_ROWS` rows shared out between the replicas (so the fleet buffers as many rows as one)."""
        self.env = env = Environment()
        self.horizon = horizon
        self.link = link
        self.report_delay_s = report_delay_s
        self.lengths: dict[int, tuple[int, int]] = {}  # prefilling request id -> (output_len, max_tokens)
        self.members: list[Member] = []
        chunk = max(MIN_CHUNK_ROWS, CHUNK_ROWS // max(len(specs), 1))
        for i, spec in enumerate(specs):
            sink = sink_for(spec.name) if sink_for is not None else None
            rec: FleetRecorder
            if spec.role == "prefill":
                rec = PrefillRecorder(self.lengths, sink, chunk)
            elif spec.lora is not None:
                rec = LoraFleetRecorder(spec.lora.step_time, sink, chunk)
            else:
                rec = FleetRecorder(sink, chunk)
            replica = Replica(env, spec.scheduler, spec.step_time, rec)
            replica.max_waiting = horizon.max_waiting
            member = Member(i, spec, replica, rec)
            if spec.lora is not None:
                member.lora_adapters = ReplicaAdapters(spec.lora.step_time.cache.gpu.keys())
            self.members.append(member)
        self.entry = [m for m in self.members if m.spec.role in ("both", "prefill")]
        self.decode = [m for m in self.members if m.spec.role == "decode"]
        if self.decode and link is None:
            raise ValueError("a disaggregated fleet needs a link")
        self.entry_router = make_router(len(self.entry))
        self.decode_router = make_router(len(self.decode)) if self.decode else None
        self.entry_reports: Sequence[ReplicaReport] = self.entry
        self.decode_reports: Sequence[ReplicaReport] = self.decode
        self.handoffs: dict[int, Handoff] = {}
        self.in_transfer: dict[int, Request] = {}
        self.routed = [0] * len(self.members)
        self.pending = 0
        self.arrivals_done = False
        self.done = env.event()
        self.users: ClosedLoopUsers | None = None
        for m in self.members:
            m.replica.on_finish = self._on_prefill if m.spec.role == "prefill" else self._on_end
            if m.lora_adapters is not None:
                m.replica.on_finish = self._lora_end(m.lora_adapters)

    # --- bookkeeping ------------------------------------------------------------------------------------
    def _check_done(self) -> None:
        if self.arrivals_done and self.pending == 0 and not self.done.triggered:
            self.done.succeed()

    def _on_end(self, req: Request) -> None:
        self.pending -= 1
        if self.users is not None:  # the user sends its next request after its think time
            self.users.ended(req)
        self._check_done()

    def _lora_end(self, adapters: ReplicaAdapters) -> Callable[[Request], None]:
        """A LoRA replica's end of a request: its adapter is one fewer request's, then `_on_end`."""

        def ended(req: Request) -> None:
            adapters.remove(req.adapter)
            self._on_end(req)

        return ended

    # --- closed-loop users (`engine.replica`'s, with the router between them and the replicas) ------------
    def _close_arrivals(self) -> None:
        self.arrivals_done = True
        self._check_done()

    def _start_users(self, source: ClosedLoopSource) -> None:
        self.users = ClosedLoopUsers(self.env, source, self.horizon, self._dispatch, self._close_arrivals)
        self.users.start()

    def _refresh_reports(self) -> Iterator[simpy.Event]:
        """Replicas report every `report_delay_s`: the router sees the latest reports, not live state."""

        def snap(ms: list[Member]) -> list[Snapshot]:
            return [Snapshot(m.outstanding, m.waiting, m.kv_fraction, _frozen(m.adapters)) for m in ms]

        while True:
            self.entry_reports, self.decode_reports = snap(self.entry), snap(self.decode)
            yield self.env.timeout(self.report_delay_s)

    def _counted(self, member: Member, index: int, adapter: int = -1) -> None:
        """A delayed report does not see what was just sent: the router counts its own sends meanwhile
        (and, with LoRA, the adapters they name)."""
        reports = self.entry_reports if member.spec.role != "decode" else self.decode_reports
        if isinstance(reports, list) and reports and isinstance(reports[0], Snapshot):
            snapshot = cast(Snapshot, reports[index])
            snapshot.outstanding += 1
            if adapter >= 0 and member.lora_adapters is not None and adapter not in snapshot.adapters:
                snapshot.adapters = snapshot.adapters | {adapter}

    # --- arrivals ----------------------------------------------------------------------------------------
    def _dispatch(self, req: Request) -> None:
        i = self.entry_router.route(req, self.entry_reports)
        member = self.entry[i]
        self._counted(member, i, req.adapter)
        if member.lora_adapters is not None:
            member.lora_adapters.add(req.adapter)
        self.routed[member.index] += 1
        self.pending += 1
        if member.spec.role == "prefill":
            self.lengths[req.id] = (req.output_len, req.max_tokens)
            self.handoffs[req.id] = Handoff(member.index, math.nan)
            req.output_len = req.max_tokens = 1
        member.replica.submit(req)

    def _arrivals(self, requests: Iterator[Request]) -> Iterator[simpy.Event]:
        env = self.env
        for req in requests:
            if req.arrival > env.now:
                yield env.timeout(req.arrival - env.now)
            self._dispatch(req)
        self.arrivals_done = True
        self._check_done()

    # --- disaggregation ----------------------------------------------------------------------------------
    def _on_prefill(self, req: Request) -> None:
        if req.reject_reason is not None:  # recorded as rejected by the prefill recorder
            self.handoffs.pop(req.id, None)
            self._on_end(req)
            return
        req.output_len, req.max_tokens = self.lengths.pop(req.id)
        hand = self.handoffs[req.id]
        hand.prefill_end = req.first_token_at
        if req.output_len <= req.num_generated:  # one token: done at its prefill
            Recorder.request(self.members[hand.prefill_replica].recorder, req, FINISHED)
            self._on_end(req)
            return
        req.finished_at = math.nan
        j = self.decode_router.route(req, self.decode_reports)  # type: ignore[union-attr]
        member = self.decode[j]
        self._counted(member, j)
        member.inbound += 1
        self.routed[member.index] += 1
        hand.decode_replica = member.index
        assert self.link is not None
        hand.transfer_s = self.link.transfer_s(
            req.prompt_len, self.members[hand.prefill_replica].spec.kv_bytes_per_token
        )
        self.in_transfer[req.id] = req
        self.env.process(self._transfer(req, member, hand.transfer_s))

    def _transfer(self, req: Request, member: Member, seconds: float) -> Iterator[simpy.Event]:
        yield self.env.timeout(seconds)
        del self.in_transfer[req.id]
        member.inbound -= 1
        req.first_token_at = req.last_token_at = self.env.now  # the first token reaches the user now
        member.replica.submit(req)

    # --- the run -----------------------------------------------------------------------------------------
    def run(
        self, requests: Iterator[Request] | None = None, closed_loop: ClosedLoopSource | None = None
    ) -> FleetOutput:
        """Run open-loop `requests` or `closed_loop` users to the horizon (give exactly one)."""
        if (requests is None) == (closed_loop is None):
            raise ValueError("give exactly one of requests and closed_loop")
        env, h = self.env, self.horizon
        if closed_loop is not None:
            self._start_users(closed_loop)  # before the replicas, as `engine.replica.simulate` orders them
        for m in self.members:
            env.process(m.replica.run())
        if self.report_delay_s > 0:
            env.process(self._refresh_reports())
        if requests is not None:
            env.process(self._arrivals(requests))
        bounded = h.duration_s is not None and not h.drain
        if bounded:
            env.run(until=h.duration_s)
        else:
            env.run(until=self.done)
        end = h.duration_s if bounded else env.now
        assert end is not None
        for m in self.members:
            for req in m.spec.scheduler.in_flight():
                m.recorder.request(req, IN_FLIGHT)
        for req in self.in_transfer.values():
            req.num_generated = 0
            req.first_token_at = req.last_token_at = math.nan
            member = self.members[self.handoffs[req.id].decode_replica]
            member.recorder.request(req, IN_FLIGHT)
        admitted: dict[int, float] = {}
        for m in self.decode:
            admitted.update(getattr(m.spec.scheduler, "admitted_at", {}))
        out = FleetOutput(self.members, end, False, self.handoffs, admitted, self.routed)
        return out


def _frozen(adapters: Collection[int]) -> frozenset[int]:
    return adapters if isinstance(adapters, frozenset) else frozenset(adapters)


def fleet_overloaded(requests: pl.DataFrame | pl.LazyFrame, rate_steps: tuple[float, ...] = ()) -> bool:
    """The single-replica overload verdict (`backlog_trend`) over the fleet's requests."""
    cols = requests.lazy().select("arrival", "finished_at", "state", "reject_reason").collect()
    if cols.is_empty():
        return False
    trend = requests_backlog_trend(cols, rate_steps)
    return trend is not None and trend.overloaded


def seeded(seed: int | np.random.SeedSequence) -> np.random.Generator:
    """The router's random stream: its own child of the scenario's seed, apart from the workload's."""
    ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    return np.random.default_rng(np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, 0x0F1E)))
