"""A pipeline-parallel replica as vLLM before v1 runs it: `pp` virtual engines, each a scheduler of its own.

vLLM 0.6 (`vllm/engine/llm_engine.py`, v0.6.3.post1) gives a replica of `pipeline_parallel_size` = pp one
`Scheduler` per virtual engine. Each has the policy's own `max_num_seqs` and `max_num_batched_tokens` and
1/pp of the replica's KV blocks (`num_gpu_blocks //= pipeline_parallel_size` in `vllm/core/scheduler.py`
and `vllm/worker/cache_engine.py`, which keeps one cache per virtual engine). An arriving request is added
to the scheduler with the fewest unfinished requests (the first of equals, `min`) and stays there. The engine
loop (`AsyncLLMEngine.run_engine_loop`) keeps one step of each virtual engine going: a virtual engine forms
its next batch when its previous one has come out of the last stage and been processed. So up to pp batches
are in flight, one per virtual engine (sim/engine/pipeline.py takes them through the stages), and a
sequence's batch mates are the requests of its own virtual engine only.

Here, as in the v1 batch queue the pipeline models, a replica with no virtual engine free to form a batch
waits for its oldest batch; vLLM's loop would also start an idle virtual engine at once when a request is
added to it while the others' batches are in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.core.request import Request
from sim.core.step import KvUsage, StepPlan
from sim.cost.memory import KvBudget


def engine_budgets(budget: KvBudget, pp: int) -> list[KvBudget]:
    """The replica's KV blocks as vLLM 0.6 splits them over `pp` virtual engines: `num_blocks // pp` each."""
    return [KvBudget(budget.num_blocks // pp, budget.block_size, budget.max_model_len) for _ in range(pp)]


class VirtualEngines:
    """The scheduler of a PP replica over `engines`, one scheduler per virtual engine (see the module
    docstring). Plans are the virtual engines' own, their KV usage the replica's (every engine's, summed)."""

    def __init__(self, engines: Sequence[Any], budgets: Sequence[KvBudget]) -> None:
        self.engines = list(engines)
        self.unfinished = [0] * len(self.engines)  # each engine's requests added and not finished
        self.engine_of: dict[int, int] = {}  # request id -> its virtual engine
        self.stepping = [False] * len(self.engines)  # a batch of the engine in flight
        self.usage = [KvUsage(0, 0, b.num_tokens) for b in budgets]  # as each engine's latest plan gave it
        self._owner: dict[int, int] = {}  # id(plan) -> the engine that formed it

    @property
    def num_waiting(self) -> int:
        return sum(int(e.num_waiting) for e in self.engines)

    def pipeline(self, in_flight: int) -> bool:
        """One batch in flight per virtual engine (sim/engine/pipeline.py)."""
        return in_flight == len(self.engines)

    def add(self, request: Request, now: float) -> bool:
        unfinished = self.unfinished
        e = min(range(len(unfinished)), key=unfinished.__getitem__)
        if not self.engines[e].add(request, now):
            return False
        unfinished[e] += 1
        self.engine_of[request.id] = e
        return True

    def schedule(self, now: float) -> StepPlan | None:
        """The next batch of the first virtual engine that has none in flight and something to run."""
        for e, engine in enumerate(self.engines):
            if self.stepping[e] or not self.unfinished[e]:
                continue
            plan: StepPlan | None = engine.schedule(now)
            if plan is None:
                continue
            self.stepping[e] = True
            self._owner[id(plan)] = e
            usage = self.usage
            usage[e] = plan.kv
            plan.kv = KvUsage(
                sum(u.used for u in usage), sum(u.allocated for u in usage), sum(u.capacity for u in usage)
            )
            return plan
        return None

    def update(self, plan: StepPlan, now: float) -> list[Request]:
        e = self._owner.pop(id(plan))
        self.stepping[e] = False
        finished: list[Request] = self.engines[e].update(plan, now)
        for req in finished:
            self.unfinished[self.engine_of.pop(req.id)] -= 1
        return finished

    def wake_at(self, now: float) -> float | None:
        times = [t for e in self.engines if (t := e.wake_at(now)) is not None]
        return min(times) if times else None

    def in_flight(self) -> list[Request]:
        return [req for e in self.engines for req in e.in_flight()]
