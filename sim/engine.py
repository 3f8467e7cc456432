"""The SimPy engine: one process feeds arrivals, one process per replica loops over engine steps.

The engine step is the event: there is no process per request or per token. An idle replica sleeps until the
next arrival (or the scheduler's own timer, e.g. a batch timeout); it never polls. A step that ends before any
other scheduled event runs inline, without a SimPy event: the order of events, so every result, is the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import simpy

from sim.metrics import FINISHED, IN_FLIGHT, REJECTED, Recorder
from sim.request import Request
from sim.schedulers.base import Scheduler

StepTime = Callable[[np.ndarray, np.ndarray], tuple[float, bool]]


@dataclass(slots=True)
class ClosedLoopSource:
    """N users, each sending its next request a think time after its previous one finished."""

    users: int
    think_time: Callable[[], float]
    new_request: Callable[[float], Request]
    ramp_s: float = 0.0


@dataclass(slots=True)
class Horizon:
    duration_s: float | None = None  # arrivals stop here; the run stops here unless `drain`
    max_requests: int | None = None  # arrivals stop after this many
    drain: bool = False  # keep serving after the last arrival until every admitted request ends
    max_waiting: int | None = None  # admission control: reject arrivals when this many already wait


@dataclass(slots=True)
class RunOutput:
    recorder: Recorder
    end_time: float
    overloaded: bool
    extra: dict[str, object] = field(default_factory=dict)


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

    def close_arrivals(self) -> None:
        """No more requests will arrive: the loop ends once the replica is empty."""
        self.arrivals_open = False
        self._poke()

    def _poke(self) -> None:
        if not self._wakeup.triggered:
            self._wakeup.succeed()

    def submit(self, req: Request) -> None:
        self.recorder.arrived += 1
        if not self.scheduler.add(req, self.env.now):
            self.recorder.request(req, REJECTED)
            if self.on_finish is not None:
                self.on_finish(req)
            return
        self.in_system += 1
        self._poke()

    def run(self) -> Iterator[simpy.Event]:
        env, sched, rec = self.env, self.scheduler, self.recorder
        # A cost model's bound `step_time` also takes a plan's integer sums, when the plan has them.
        totals_time = getattr(getattr(self.step_time, "__self__", None), "step_time_totals", None)
        while True:
            plan = sched.schedule(env.now)
            if plan is None:
                if not self.arrivals_open and self.in_system == 0:
                    return
                self._wakeup = env.event()
                wake = sched.wake_at(env.now)
                if wake is None:
                    yield self._wakeup
                else:
                    yield self._wakeup | env.timeout(max(wake - env.now, 0.0))
                continue
            start = env.now
            timed = None
            if totals_time is not None and (totals := getattr(plan, "totals", None)) is not None:
                timed = totals_time(*totals)
            seconds, compute_bound = timed or self.step_time(plan.new_tokens, plan.context)
            if not env.advance(seconds):  # run the step inline when nothing else can happen before it ends
                yield env.timeout(seconds)
            finished = sched.update(plan, env.now)
            rec.step(start, seconds, plan, compute_bound, waiting=getattr(sched, "num_waiting", 0))
            for req in finished:
                self.in_system -= 1
                rec.request(req, FINISHED)
                if self.on_finish is not None:
                    self.on_finish(req)


def _open_loop(
    env: simpy.Environment, replica: Replica, requests: Iterator[Request]
) -> Iterator[simpy.Event]:
    for req in requests:
        if req.arrival > env.now:
            yield env.timeout(req.arrival - env.now)
        replica.submit(req)
    replica.close_arrivals()


def _overloaded(rec: Recorder, end_time: float, in_system: int) -> bool:
    """Overloaded: requests pile up — more than 10% of arrivals (and at least 10) are still waiting or running
    at the horizon, and the waiting queue at the end is longer than at the run's midpoint."""
    steps = rec.num_steps
    if in_system < max(10, 0.1 * rec.arrived) or steps < 2:
        return False
    mid = rec.step_ending_at(end_time / 2)
    return rec.step_waiting(steps - 1) > rec.step_waiting(min(mid, steps - 1))


def simulate(
    scheduler: Scheduler,
    step_time: StepTime,
    horizon: Horizon,
    open_loop: Iterator[Request] | None = None,
    closed_loop: ClosedLoopSource | None = None,
) -> RunOutput:
    """Run one replica to the horizon and return its records."""
    if (open_loop is None) == (closed_loop is None):
        raise ValueError("give exactly one of open_loop and closed_loop")
    env = Environment()
    recorder = Recorder()
    replica = Replica(env, scheduler, step_time, recorder)
    if horizon.max_waiting is not None:
        _wrap_admission_control(replica, horizon.max_waiting)
    if open_loop is not None:
        env.process(_open_loop(env, replica, open_loop))
    else:
        assert closed_loop is not None
        _start_closed_loop(env, replica, closed_loop, horizon)
    engine = env.process(replica.run())
    if horizon.duration_s is not None and not horizon.drain:
        env.run(until=horizon.duration_s)
    else:
        env.run(until=engine)
    end_time = env.now if horizon.duration_s is None or horizon.drain else horizon.duration_s
    in_flight = scheduler.in_flight()
    overloaded = _overloaded(recorder, end_time, len(in_flight))
    for req in in_flight:
        recorder.request(req, IN_FLIGHT)
    return RunOutput(recorder, end_time, overloaded)


def _wrap_admission_control(replica: Replica, max_waiting: int) -> None:
    submit = replica.submit
    sched = replica.scheduler

    def guarded(req: Request) -> None:
        if getattr(sched, "num_waiting", 0) >= max_waiting:
            replica.recorder.arrived += 1
            req.reject_reason = "queue full"
            replica.recorder.request(req, REJECTED)
            if replica.on_finish is not None:
                replica.on_finish(req)
            return
        submit(req)

    replica.submit = guarded  # type: ignore[method-assign]


def _start_closed_loop(
    env: simpy.Environment, replica: Replica, source: ClosedLoopSource, horizon: Horizon
) -> None:
    sent = 0

    def close_at_horizon() -> Iterator[simpy.Event]:
        assert horizon.duration_s is not None
        yield env.timeout(horizon.duration_s)
        replica.close_arrivals()

    def send_at(delay: float) -> Iterator[simpy.Event]:
        nonlocal sent
        if delay > 0:
            yield env.timeout(delay)
        if horizon.max_requests is not None and sent >= horizon.max_requests:
            return
        if horizon.duration_s is not None and env.now >= horizon.duration_s:
            return
        sent += 1
        replica.submit(source.new_request(env.now))
        if horizon.max_requests is not None and sent >= horizon.max_requests:
            replica.close_arrivals()

    def on_finish(_req: Request) -> None:
        env.process(send_at(source.think_time()))

    replica.on_finish = on_finish
    if horizon.duration_s is not None:
        env.process(close_at_horizon())
    for user in range(source.users):
        delay = source.ramp_s * user / source.users if source.ramp_s else 0.0
        env.process(send_at(delay))
