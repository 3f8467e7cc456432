"""The SimPy engine: one process per replica loops over engine steps.

The engine step is the event: there is no process per request or per token. An idle replica sleeps until the
next arrival (or the scheduler's own timer, e.g. a batch timeout); it never polls. A step that ends before any
other scheduled event runs inline, without a SimPy event: the order of events, so every result, is the same.

Open-loop arrivals are read by the replica loop itself, in the order a separate arrival process would have
delivered them (see `Replica.run_open`); closed-loop users are SimPy processes.

The clock shortcuts use SimPy internals (`_now`, `_queue`, `_eid`, `Event._ok`).
`tests/test_engine_reference.py` runs a plain-SimPy loop (public API only, `yield env.timeout(step)`) on the
same requests and requires identical request and step records, so a SimPy release that changes those
internals fails there.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import simpy
from simpy.core import NORMAL

from sim.core.request import Request
from sim.core.step import StepPlan
from sim.engine.closed_loop import ClosedLoopSource, ClosedLoopUsers
from sim.engine.horizon import Horizon
from sim.engine.pipeline import attach, deliver
from sim.engine.schedulers.base import Scheduler
from sim.records.columns import FINISHED, IN_FLIGHT, QUEUE_FULL, REJECTED
from sim.records.recorder import Recorder

StepTime = Callable[[np.ndarray, np.ndarray], tuple[float, bool]]


@dataclass(slots=True)
class RunOutput:
    recorder: Recorder
    end_time: float
    overloaded: bool  # requests piled up over the arrival period (`Recorder.backlog_trend`)


class Environment(simpy.Environment):
    """A SimPy environment whose clock a process may advance itself when no event can come first."""

    def advance(self, delay: float) -> bool:
        """Move the clock `delay` ahead, as `yield timeout(delay)` would, if that timeout would be the next
        event (every scheduled event comes strictly later); else change nothing and return False."""
        at = self._now + delay
        if at < self.peek():
            self._now = at
            return True
        return False

    def jump(self, at: float) -> bool:
        """Move the clock to exactly `at` if every scheduled event comes strictly later; else return False."""
        if at < self.peek():
            self._now = at
            return True
        return False

    def at(self, at: float) -> simpy.Event:
        """An event that fires at exactly `at` (no `now + (at - now)` rounding)."""
        event = simpy.Event(self)
        event._ok = True
        event._value = None
        heapq.heappush(self._queue, (at, NORMAL, next(self._eid), event))  # type: ignore[attr-defined]
        return event


class Replica:
    """One model replica: a scheduler, a step-time function, and the loop that drives them."""

    def __init__(self, env: Environment, scheduler: Scheduler, step_time: StepTime, recorder: Recorder):
        self.env = env
        self.scheduler = scheduler
        self.step_time = step_time
        self.recorder = recorder
        self.on_finish: Callable[[Request], None] | None = None
        self._wakeup = env.event()
        self.in_system = 0  # admitted and not finished
        self.arrivals_open = True
        self.max_waiting: int | None = None  # admission control: reject arrivals when this many wait
        self.pipeline = attach(scheduler, step_time)  # pp > 1: batches in flight (engine/pipeline.py)

    def close_arrivals(self) -> None:
        """No more requests will arrive: the loop ends once the replica is empty."""
        self.arrivals_open = False
        self._poke()

    def _poke(self) -> None:
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def submit(self, req: Request) -> None:
        """A request arrives now."""
        if self._admit(req, self.env.now):
            self._poke()

    def _admit(self, req: Request, now: float) -> bool:
        """Record an arrival at `now` and queue it (True) or reject it (False)."""
        rec = self.recorder
        rec.arrive(req)
        if self.max_waiting is not None and self.scheduler.num_waiting >= self.max_waiting:
            req.reject_reason = QUEUE_FULL
        elif self.scheduler.add(req, now):
            self.in_system += 1
            return True
        rec.request(req, REJECTED)
        if self.on_finish is not None:
            self.on_finish(req)
        return False

    def _timer(self) -> Callable[[StepPlan], tuple[float, bool]]:
        """(seconds, compute_bound) of a plan: from its integer sums when the plan has them and the step-time
        function is a cost model's (`step_time_totals`), else from its row arrays."""
        step_time = self.step_time
        plan_time = getattr(step_time, "plan_time", None)  # reads the whole plan (LoRA, speculative decoding)
        if plan_time is not None:
            return plan_time  # type: ignore[no-any-return]
        cost = getattr(step_time, "__self__", None)
        if getattr(cost, "ranked", False):  # DP attention: a plan names the rows each rank runs

            def ranked(plan: StepPlan) -> tuple[float, bool]:
                return step_time(plan.new_tokens, plan.context, getattr(plan, "rank_sizes", None))  # type: ignore[no-any-return]

            return ranked
        totals_timer = getattr(cost, "totals_timer", None)  # the same seconds, its constants computed once
        totals_time = totals_timer() if totals_timer is not None else getattr(cost, "step_time_totals", None)

        def timer(plan: StepPlan) -> tuple[float, bool]:
            if totals_time is not None and (totals := getattr(plan, "totals", None)) is not None:
                timed = totals_time(*totals)
                if timed is not None:
                    return timed
            return step_time(plan.new_tokens, plan.context)

        return timer

    def _quiet_runner(self) -> Callable[[float, float, Callable[..., None] | None], bool] | None:
        """What advances a scheduler's decode-only steps at once (`quiet_steps`) in `run_open`, or None where
        the scheduler has none, the step time reads more than the plan's totals, or the recorder records a
        step in its own way."""
        sched, rec, env = self.scheduler, self.recorder, self.env
        quiet_steps = getattr(sched, "quiet_steps", None)
        if quiet_steps is None or getattr(self.step_time, "plan_time", None) is not None:
            return None
        cost = getattr(self.step_time, "__self__", None)
        totals_time = getattr(cost, "step_time_totals", None)
        if totals_time is None or type(rec).step is not Recorder.step:
            return None
        advance, record = sched.advance_quiet, rec.quiet_steps  # type: ignore[attr-defined]
        blind = getattr(sched, "blind_to_held", None)  # the step after an arrival's may not see it either
        decode_timer = getattr(cost, "decode_timer", None)  # the same seconds, its constants computed once
        timers: dict[int, tuple[Callable[[int], tuple[float, bool]], float]] = {}

        def timer_of(rows: int) -> tuple[Callable[[int], tuple[float, bool]], float]:
            """(seconds of a step of `rows` decode rows on Σq, the largest max_end it is valid for)."""
            got = timers.get(rows)
            if got is None:
                got = timers[rows] = decode_timer(rows)  # type: ignore[misc]
            return got

        def run(limit: float, event_at: float, deliver: Callable[..., None] | None) -> bool:
            """The steps of `quiet_steps` that end before `limit` (the next arrival or scheduled event), each
            costed from its own totals, as `timer` costs its plan, and recorded as `step` records it. With
            `deliver` (the limit is the next arrival), the step that arrival lands in is taken too when it
            ends before the next scheduled event (`event_at`): `deliver(end)` queues the arrivals up to its
            end before it is applied, as `run_open` queues a step's; and the step after it, when the scheduler
            will not see those arrivals in it (`blind_to_held`: asynchronous scheduling). True when the last
            step taken finished requests (recorded here) or had arrivals: the next steps may be quiet too."""
            quiet = quiet_steps()
            if quiet is None:
                return False
            rows, ctx, max_end = quiet.rows, quiet.ctx, quiet.max_end
            start = now = env._now
            durations: list[float] = []
            ends: list[float] = []
            compute: list[bool] = []
            seconds_of, window = timer_of(rows) if decode_timer is not None else (None, 0.0)
            waiting = sched.num_waiting  # until the first arrival is delivered
            tail: list[int] = []  # the waiting after each step from the spanning one on
            spanned = after = False  # the step the next arrival lands in taken; the step after it too
            for _ in range(quiet.steps):
                if max_end <= window:
                    seconds, bound = seconds_of(ctx)  # type: ignore[misc]
                else:
                    timed = totals_time(rows, rows, rows, ctx, rows, ctx, max_end)
                    if timed is None:  # a sliding window may be reached: the step's rows decide
                        break
                    seconds, bound = timed
                end = now + seconds
                if not end < limit:
                    if deliver is None or not end < event_at:
                        break
                    spanned = True
                durations.append(seconds)
                ends.append(end)
                compute.append(bound)
                now = end
                if spanned:
                    assert deliver is not None
                    deliver(end, True, after)  # the step after was scheduled after the latest delivery
                    tail.append(sched.num_waiting)
                    step_start = ends[-2] if len(ends) > 1 else start
                    if after or blind is None or not blind(step_start):
                        break
                    after, limit = True, event_at
                ctx += rows
                max_end += 1
            if not durations:
                return False
            env._now = now  # type: ignore[attr-defined]
            finished = advance(start, ends)
            record(start, durations, ends, compute, quiet, waiting, tail)
            if finished:
                self._finished(finished)
            return spanned or bool(finished)

        return run

    def _finished(self, finished: list[Request]) -> None:
        rec, on_finish = self.recorder, self.on_finish
        for req in finished:
            self.in_system -= 1
            rec.request(req, FINISHED)
            if on_finish is not None:
                on_finish(req)

    @property
    def drained(self) -> bool:
        """No more arrivals can come and no request is in the system: the run is over."""
        return not self.arrivals_open and self.in_system == 0

    def idle(self) -> Iterator[simpy.Event]:
        """Sleep until an arrival wakes the replica (`submit`) or the scheduler's own timer is due."""
        env = self.env
        self._wakeup = env.event()
        wake = self.scheduler.wake_at(env.now)
        if wake is None:
            yield self._wakeup
        else:
            yield self._wakeup | env.timeout(max(wake - env.now, 0.0))

    def run(self) -> Iterator[simpy.Event]:
        if self.pipeline is not None:
            yield from self.pipeline.run(self)
            return
        env, sched, rec = self.env, self.scheduler, self.recorder
        timer = self._timer()
        while True:
            plan = sched.schedule(env.now)
            if plan is None:
                if self.drained:
                    return
                yield from self.idle()
                continue
            start = env.now
            seconds, compute_bound = timer(plan)
            if not env.advance(seconds):  # run the step inline when nothing else can happen before it ends
                yield env.timeout(seconds)
            finished = sched.update(plan, env.now)
            rec.step(start, seconds, plan, compute_bound, sched.num_waiting)
            if finished:
                self._finished(finished)

    def run_open(self, requests: Iterator[Request], stop: float = math.inf) -> Iterator[simpy.Event]:
        """`run` with open-loop arrivals read inline, delivered exactly as an arrival process would have.

        Such a process wakes at `t + (arrival - t)` after its previous arrival at `t` (at once when the
        arrival is not later), so arrivals at one instant come together. An arrival during a step, or at its
        end, is queued before the step is applied, except a timed one at exactly the end whose previous
        arrival came after the step was scheduled (its timer then fires after the step's). Nothing arrives
        at or after `stop`, where the run ends.
        """
        env, sched, rec = self.env, self.scheduler, self.recorder
        schedule, update, record, admit = sched.schedule, sched.update, rec.step, self._admit
        timer = self._timer()
        queue = env._queue  # type: ignore[attr-defined]
        inf = math.inf
        source = iter(requests)
        clock = 0.0  # the arrival process's clock: when it delivered its latest arrival
        nxt = next(source, None)
        nxt_at = inf if nxt is None else max(clock, nxt.arrival)  # its delivery time; inf: none left
        timed = nxt is not None and nxt.arrival > clock  # delivered by a timer, not with the previous one
        fresh = False  # an arrival was queued since the latest `schedule`

        def deliver(end: float, stepping: bool = True, scheduled: bool = False) -> None:
            """Queue the arrivals up to `end`: before the step in progress (`stepping`) that ends then is
            applied, or on waking idle at `end`; `scheduled`: that step was scheduled after the latest
            delivery."""
            nonlocal nxt, nxt_at, timed, fresh, clock
            if scheduled:
                fresh = False
            while nxt_at <= end and nxt_at < stop:
                if timed and fresh and nxt_at == end and stepping:
                    break
                assert nxt is not None
                admit(nxt, nxt_at)
                fresh = True
                clock = nxt_at
                nxt = next(source, None)
                if nxt is None:
                    nxt_at, timed = inf, False
                elif nxt.arrival > clock:
                    nxt_at, timed = clock + (nxt.arrival - clock), True
                else:
                    nxt_at, timed = clock, False

        quiet_run = self._quiet_runner()
        while True:
            while quiet_run is not None:  # decode-only steps before the next arrival or event, at once
                event_at = queue[0][0] if queue else inf
                limit = nxt_at if nxt_at < stop else inf
                fresh = False  # each quiet step is scheduled at its start
                if limit < event_at:
                    more = quiet_run(limit, event_at, deliver)
                else:
                    more = quiet_run(event_at, event_at, None)
                if not more:
                    break
            plan = schedule(env._now)
            fresh = False
            if plan is None:
                if nxt is None and self.in_system == 0:
                    self.arrivals_open = False
                    return
                now = env._now
                wake = sched.wake_at(now)
                t = nxt_at if wake is None else min(nxt_at, now + max(wake - now, 0.0))
                if t == inf:
                    self._wakeup = env.event()
                    yield self._wakeup  # nothing will ever come
                if not env.jump(t):
                    yield env.at(t)
                deliver(t, False)
                continue
            start = env._now
            seconds, compute_bound = timer(plan)
            end = start + seconds
            if nxt_at <= end:
                deliver(end)  # queued before the step is applied
            if not queue or end < queue[0][0]:  # `env.advance(seconds)`, inline
                env._now = end
            else:
                yield env.timeout(seconds)
            finished = update(plan, end)
            record(start, seconds, plan, compute_bound, sched.num_waiting)
            if finished:
                self._finished(finished)


def simulate(
    scheduler: Scheduler,
    step_time: StepTime,
    horizon: Horizon,
    open_loop: Iterator[Request] | None = None,
    closed_loop: ClosedLoopSource | None = None,
    recorder: Recorder | None = None,
    rate_steps: tuple[float, ...] = (),
) -> RunOutput:
    """Run one replica to the horizon and return its records (`recorder`: where they go; by default a
    `Recorder` keeping them in memory). The recording is finished when this returns. `rate_steps`: when
    the offered rate changes (`Workload.rate_steps`), for the overload test."""
    if (open_loop is None) == (closed_loop is None):
        raise ValueError("give exactly one of open_loop and closed_loop")
    env = Environment()
    recorder = Recorder() if recorder is None else recorder
    replica = Replica(env, scheduler, step_time, recorder)
    replica.max_waiting = horizon.max_waiting
    if open_loop is not None:
        stop = horizon.duration_s if horizon.duration_s is not None and not horizon.drain else math.inf
        if replica.pipeline is None:
            engine = env.process(replica.run_open(open_loop, stop))
        else:  # arrivals as a process: the pipeline's loop does not read them inline
            env.process(deliver(env, replica.submit, replica.close_arrivals, open_loop, stop))
            engine = env.process(replica.run())
    else:
        assert closed_loop is not None
        users = ClosedLoopUsers(env, closed_loop, horizon, replica.submit, replica.close_arrivals)
        replica.on_finish = users.ended
        users.start()
        engine = env.process(replica.run())
    if horizon.duration_s is not None and not horizon.drain:
        env.run(until=horizon.duration_s)
    else:
        env.run(until=engine)
    end_time = env.now if horizon.duration_s is None or horizon.drain else horizon.duration_s
    for req in scheduler.in_flight():
        recorder.request(req, IN_FLIGHT)
    trend = recorder.backlog_trend(rate_steps)
    return RunOutput(recorder, end_time, trend is not None and trend.overloaded)
