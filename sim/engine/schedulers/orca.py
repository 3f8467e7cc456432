"""The vLLM paper's Orca baselines: `continuous` batching whose reservations go through a buddy allocator.

Orca (Yu et al., OSDI'22) batches at the iteration level; the vLLM paper (SOSP'23, §6.1) reimplements it with
a buddy allocator and three reservation rules, `oracle`, `pow2` and `max` (buddy.py). Everything else is the
`continuous` policy: FCFS admission with head-of-line blocking, whole-prompt prefills sharing a step with the
running requests' decodes, a reservation held from admission to finish. This is a variant of `continuous`
and imports it, as `vllm/spec.py` does `vllm`.
"""

from __future__ import annotations

from sim.config.policies import OrcaConfig
from sim.cost.memory import KvBudget
from sim.engine.schedulers.buddy import BuddyReservations
from sim.engine.schedulers.continuous import ContinuousScheduler
from sim.engine.schedulers.registry import register


class OrcaScheduler(ContinuousScheduler):
    def __init__(self, config: OrcaConfig, memory: KvBudget) -> None:
        super().__init__(config, memory)
        self.kv = BuddyReservations(memory, config.reservation, config.buddy_tokens)


def build(config: OrcaConfig, memory: KvBudget) -> OrcaScheduler:
    return OrcaScheduler(config, memory)


register("orca", build)
