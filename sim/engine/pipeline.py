"""Pipeline parallelism in the engine: up to `pp` batches in flight through a replica's stages.

vLLM v1 runs a PP replica with a batch queue of `max_concurrent_batches` (= `pp`) scheduled batches
(`vllm/v1/engine/core.py`, `EngineCore.step_with_batch_queue`): while the queue is not full it schedules a
new batch and hands it to the executor without waiting; when the queue is full, or nothing more can be
scheduled, it blocks until the oldest batch finishes and updates the scheduler from its output. A request
whose scheduled tokens are all still in flight has no new tokens to schedule, so the scheduler passes over
it (`vllm/v1/core/sched/scheduler.py`: "PP>1 and we have already scheduled all prompt tokens but they are not
finished yet"): a decode waits for its batch; a prompt's next chunk may follow its previous one.

Here (`Pipeline.run`, the loop `Replica.run` hands over to) each batch goes through the stages in order,
first come first served: it enters stage s when it has left stage s - 1 and sent its hidden states
(`ParallelCost.stage_seconds`: each stage's seconds and one send), and when stage s has finished the batch
before it. So stage 0 is free again after the first stage's time, a batch's latency is the sum of its
stages and sends (plus any wait for a busy stage), with `pp` batches runnable the throughput is one batch per
slowest stage, and with fewer runnable batches than stages the stages idle (bubbles). A step is recorded
when its batch leaves the last stage, with its scheduling time as its start, so steps may overlap.

The scheduler keeps the batches apart (`pipeline(in_flight)` on the policy: the vllm policy's, or vLLM 0.6's
virtual engines, sim/engine/virtual_engines.py); a policy without it, or a replica with one stage, runs one
batch at a time as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Protocol

import simpy

from sim.core.request import Request
from sim.core.step import StepPlan
from sim.engine.schedulers.base import Scheduler
from sim.records.recorder import Recorder


class StageTiming(Protocol):
    """A step's cost stage by stage (`sim.cost.parallel.ParallelCost`)."""

    @property
    def pp(self) -> int: ...

    def stage_seconds(
        self, new_tokens: Any, context: Any, ranks: Any = None
    ) -> tuple[list[float], float, bool]: ...


class PipelinedReplica(Protocol):
    """What the loop reads and sets of `sim.engine.replica.Replica`."""

    env: Any  # sim.engine.replica.Environment (its `jump` and `at`)
    scheduler: Scheduler
    recorder: Recorder

    @property
    def drained(self) -> bool: ...

    def idle(self) -> Iterator[simpy.Event]: ...

    def _finished(self, finished: list[Request]) -> None: ...


def attach(scheduler: Scheduler, step_time: Any) -> Pipeline | None:
    """The pipeline of a replica whose step time is a placement's with `pp > 1` and whose scheduler keeps
    batches in flight (told so here, before any request); None otherwise (one batch at a time)."""
    timing = getattr(step_time, "__self__", None)
    pp = getattr(timing, "pp", 1)
    if not isinstance(pp, int) or pp <= 1 or not hasattr(timing, "stage_seconds"):
        return None
    keep = getattr(scheduler, "pipeline", None)
    if keep is None or not keep(pp):
        return None
    return Pipeline(timing, pp)


class Pipeline:
    """The stages of one replica: when each is next free, and the batches in flight."""

    def __init__(self, timing: StageTiming, pp: int) -> None:
        self.timing, self.pp = timing, pp
        self.free = [0.0] * pp  # when each stage has finished the latest batch it took

    def enter(self, plan: StepPlan, now: float) -> tuple[float, bool]:
        """Send `plan` into the pipeline at `now`: (when it leaves the last stage, compute_bound)."""
        ranks = getattr(plan, "rank_sizes", None)  # DP attention: the rows each rank runs
        stages, send, bound = self.timing.stage_seconds(plan.new_tokens, plan.context, ranks)
        free, t = self.free, now
        for s, seconds in enumerate(stages):
            if s:
                t += send
            if free[s] > t:
                t = free[s]
            t += seconds
            free[s] = t
        return t, bound

    def run(self, replica: PipelinedReplica) -> Iterator[simpy.Event]:
        """`Replica.run` with up to `pp` batches in flight (vLLM's `step_with_batch_queue`)."""
        env, sched, rec = replica.env, replica.scheduler, replica.recorder
        batches: deque[tuple[StepPlan, float, float, bool]] = deque()  # (plan, scheduled, done, bound)
        while True:
            if len(batches) < self.pp:
                now = env.now
                plan = sched.schedule(now)
                if plan is not None:
                    done, bound = self.enter(plan, now)
                    batches.append((plan, now, done, bound))
                    continue
            if not batches:  # idle, as `Replica.run`
                if replica.drained:
                    return
                yield from replica.idle()
                continue
            plan, start, done, bound = batches.popleft()  # block until the oldest batch is out
            if not env.jump(done):
                yield env.at(done)
            finished = sched.update(plan, env.now)
            rec.step(start, done - start, plan, bound, sched.num_waiting)
            if finished:
                replica._finished(finished)


def deliver(env: Any, submit: Any, close: Any, requests: Iterator[Request], stop: float) -> Iterator[Any]:
    """Open-loop arrivals as a process (for a pipelined replica, whose loop does not read them inline):
    each request submitted at its arrival, none at or after `stop`; then no more arrivals."""
    for req in requests:
        if req.arrival >= stop:
            break
        if req.arrival > env.now:
            yield env.timeout(req.arrival - env.now)
        submit(req)
    close()
