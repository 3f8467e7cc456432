"""The cost of a step beyond TP: a replica placed over `tp x pp x dp` GPUs, with experts over `ep` ranks.

The placement's keys, checks and memory per GPU: sim/cost/placement.py.

Costs, on top of the single-GPU-group cost model (`base`, at degree `tp`), per step:
- PP: a stage costs `base` x its layers / all layers (the head and embedding are charged pro rata: an
  assumption no source states); a batch's activations go point to point between stages, `latency + tokens x
  hidden x 2 B / bandwidth` over the intra- or inter-node link. A step's latency is the sum of its stages
  and transfers (`step_time`); the engine keeps up to `pp` batches in flight over `stage_seconds`
  (sim/engine/pipeline.py), as `pipeline_seconds` schedules equal batches.
- DP attention: each of the `dp` ranks runs its own rows (`ranks`: the rows of each, in order, as the
  engine's per-rank schedulers give them, sim/engine/data_parallel.py; without it, a step's rows dealt round
  robin, as `sim step` shows a balanced step); each rank's time is `base` over its rows; the step waits for
  the slowest rank.
- EP: per MoE layer a dispatch and a combine all-to-all of each rank's routed tokens, under the rule of
  `ep_all_to_all` (sim/cost/expert_parallel.py: `per_expert`, `tokens x top_k x hidden x 2 B x (ep - 1) / ep`
  over one link, or DeepEP's kernels, per destination node and rank), the dispatch in `ep_dispatch_dtype`
  and the combine in bf16, its bytes those of the rank that receives most (max share x ep of the mean's:
  the all-to-all ends when the busiest receiver has its tokens); and the expert GEMMs of the busiest rank
  over the tokens routed to it: under a skewed gate (`expert_skew`, Zipf over experts laid out contiguously
  on ranks, no expert above one pair a token: `gate_shares`) the step rises by the busiest rank's expert
  time less the mean rank's (balanced experts add nothing over `base`); with `ep_redundant_experts`,
  EPLB's placement of replicas sets each rank's share (sim/cost/expert_parallel.py).
- DP attention over experts tensor-parallel on the stage's GPUs (`dp > 1`, `ep = 1`, vLLM's default): per
  MoE layer an all-gather of the step's tokens and a reduce-scatter back, and the reads of the experts the
  step's tokens touch beyond the slowest rank's own (sim/cost/expert_parallel.py, `sharded_experts`).
- Two-batch overlap (`two_batch_overlap`, EP only; SGLang's TBO after DeepSeek's dual micro-batch design):
  each rank's rows split into two micro-batches, alternately; each pays its own compute (the roofline over its
  rows: the weights are read twice) and its own dispatch and combine (half the bytes, the latency twice). One
  micro-batch's communication runs behind the other's compute, phase by phase as SGLang orders them
  (attention, dispatch, experts, combine): a dispatch behind the other's attention and dense work A, a
  combine behind its expert GEMMs E. Communication kernels that run on SMs (DeepEP's normal kernels:
  `COMM_SMS`, s of the GPU's S) leave the compute the rest while they run, so a stage saves min(D (1 - s/S),
  A) + min(K (1 - s/S), E) of its dispatches D and combines K; the low-latency kernels take none.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.catalog.gpus import Gpu
from sim.catalog.links import get_link
from sim.catalog.model import ModelSpec
from sim.cost.expert_parallel import (
    COMM_SMS,
    all_to_all_links,
    all_to_all_seconds,
    dispatch_bytes_per_element,
    expert_loads,
    low_latency_step,
    sharded_experts,
)
from sim.cost.kernels import ACT_BYTES  # activations sent between stages and in the all-to-all: 16-bit
from sim.cost.placement import Placement, stage_layers


def pipeline_seconds(stage_s: list[float], batches: int, in_flight: int) -> float:
    """Makespan of `batches` equal batches through the stages with at most `in_flight` in the pipeline.

    Batch b starts stage s when stage s is free and b has left stage s-1; it enters stage 0 only when batch
    b - in_flight has left the last stage. One in flight: batches x sum(stages). Enough in flight: the
    slowest stage bounds the throughput; fewer runnable batches than stages leave bubbles."""
    pp = len(stage_s)
    free = [0.0] * pp
    done: list[float] = []
    for b in range(batches):
        t = done[b - in_flight] if b >= in_flight else 0.0
        for s in range(pp):
            t = max(t, free[s]) + stage_s[s]
            free[s] = t
        done.append(t)
    return done[-1] if done else 0.0


@dataclass
class StepBreakdown:
    """One step under a placement, per rank: what `sim step` shows."""

    seconds: float
    stage_s: list[float]
    rank_s: list[float]  # attention ranks' compute at the first stage
    pp_send_s: float  # per stage boundary
    dispatch_s: float  # all MoE layers of a stage, dispatch all-to-all
    combine_s: float
    expert_rank_s: list[float] = field(default_factory=list)  # expert GEMMs per EP rank, one stage
    skew_s: float = 0.0
    compute_bound: bool = False  # the slowest attention rank's step
    overlap_s: list[float] = field(default_factory=list)  # per stage: communication two-batch overlap hides
    gather_s: float = 0.0  # per MoE layer, experts TP-sharded under DP: all-gather and reduce-scatter
    group_reads_s: float = 0.0  # per MoE layer: the experts the step's tokens touch beyond the rank's own


class ParallelCost:
    """The step cost of one replica under a placement, over a TP-degree cost model `base`."""

    def __init__(self, base: Any, model: ModelSpec, gpu: Gpu, p: Placement) -> None:
        self.base, self.model, self.gpu, self.p = base, model, gpu, p
        # One attention rank's view: its routed experts are 1/dp of the stage's expert bytes per GPU, and of
        # the experts whose tiles its fused-MoE kernel fills (the pairs its tokens route cost what they cost).
        self.rank_base = copy.copy(base)
        if p.dp > 1 and hasattr(base, "expert_bytes_per_layer"):
            self.rank_base.expert_bytes_per_layer = base.expert_bytes_per_layer / p.dp
            if getattr(base, "moe_fill_expert", 0.0):
                self.rank_base.moe_fill_expert = base.moe_fill_expert / p.dp
            n_half = getattr(base, "moe_n_half_cols", 0.0)
            width = model.expert_params / (3 * model.hidden_size) / base.tp  # an expert's columns a GPU
            if p.ep == 1 and n_half and width:
                # Experts TP-sharded over the dp ranks run the fused-MoE kernel on shards dp times narrower
                # than the base's: each pair costs what it does on that shard (`fused_moe_flops`, shape term).
                narrow = (1.0 + n_half * p.dp / width) / (1.0 + n_half / width)
                self.rank_base.moe_cost_tok = base.moe_cost_tok * narrow
                self.rank_base.moe_fill_expert *= narrow
        self.layers = stage_layers(model.num_layers, p.pp)
        self.intra, self.inter = get_link(p.intra_node_link), get_link(p.inter_node_link)
        # Ranks are numbered stage-major (vLLM: TP innermost), so a replica over several nodes has at least
        # one stage boundary between nodes; every boundary is costed at that slowest one's link. The EP group
        # spans nodes when it exceeds one.
        self.pp_link = self.inter if p.gpus > p.gpus_per_node else self.intra
        self.ep_link = self.inter if p.ep > p.gpus_per_node else self.intra
        self.group_link = self.inter if p.tp * p.dp > p.gpus_per_node else self.intra  # a stage's GPUs
        k, skew = model.experts_per_token, p.expert_skew
        self.loads = (
            expert_loads(model.num_experts, k, p.ep, skew, p.ep_redundant_experts) if p.ep > 1 else np.ones(1)
        )
        self.busiest = float(self.loads.max()) * p.ep  # the rank receiving most, over the mean (1: balanced)

    def _expert_seconds(self, routed_tokens: float) -> float:
        """Expert GEMMs of one MoE layer over `routed_tokens` (token x expert pairs) on one rank:
        max(compute, weight reads) at the base model's rates, the compute as the base charges its fused-MoE
        kernel (per pair, and the tiles each touched expert fills) where it has one."""
        m, b = self.model, self.base
        experts_here = self.p.physical_experts(m) / self.p.ep
        touched = min(experts_here, routed_tokens)
        moe_tok = getattr(b, "moe_cost_tok", 0.0)
        if moe_tok:
            pair, fill = moe_tok / m.experts_per_token, b.moe_fill_expert
            flops = (pair * routed_tokens + fill * touched) / m.num_moe_layers * b.tp / self.p.tp
        else:
            flops = 2.0 * m.expert_params * routed_tokens / self.p.tp
        nbytes = touched * b.expert_bytes_per_layer * b.tp / self.p.tp
        compute = flops / (b.peak_flops * b.cal.compute_eff_prefill)
        memory = nbytes / (b.hbm * b.cal.bandwidth_eff)
        return max(compute, memory)

    def breakdown(
        self, new_tokens: np.ndarray, context: np.ndarray, ranks: Sequence[int] | None = None
    ) -> StepBreakdown:
        """The step's parts; `ranks`: how many of the rows (in order) each attention rank runs, else round
        robin."""
        c, q = np.asarray(new_tokens), np.asarray(context)
        p, m = self.p, self.model
        if ranks is None:
            rows = [(c[r :: p.dp], q[r :: p.dp]) for r in range(p.dp)]
        else:
            cuts = np.cumsum(ranks)[:-1]
            rows = list(zip(np.split(c, cuts), np.split(q, cuts), strict=True))
        runs = [self._rank_step(rc, rq) for rc, rq in rows]
        rank_s = [float(seconds) for seconds, _ in runs]
        attn = max(rank_s)
        compute_bound = bool(runs[rank_s.index(attn)][1])
        tokens = float(c.sum())
        moe_layers = [m.num_moe_layers * n / m.num_layers for n in self.layers]  # pro rata per stage
        dispatch = combine = skew = moe = 0.0
        free = 1.0  # share of the SMs the compute keeps while the all-to-all runs
        expert_rank: list[float] = []
        if p.ep > 1 and tokens > 0:
            routed = tokens * m.experts_per_token
            mode = p.ep_all_to_all
            if mode == "deepep_auto":
                mode = "deepep_low_latency" if low_latency_step(c) else "deepep_normal"
            free = 1.0 - COMM_SMS.get(mode, 0) / self.gpu.sms
            elem = dispatch_bytes_per_element(p.ep_dispatch_dtype)
            dispatch, combine = (self._all_to_all(mode, tokens, b) for b in (elem, ACT_BYTES))
            expert_rank = [self._expert_seconds(routed * share) for share in self.loads]
            skew = max(expert_rank) - float(np.mean(expert_rank))
            if p.two_batch_overlap:  # both micro-batches' expert GEMMs a MoE layer, the mean EP rank's
                moe = 2.0 * float(np.mean([self._expert_seconds(routed / 2 * x) for x in self.loads]))
        gather = group_reads = 0.0
        if p.ep == 1 and p.dp > 1 and m.num_experts and tokens > 0:  # experts TP-sharded over the dp ranks
            own, b = float(rows[rank_s.index(attn)][0].sum()), self.rank_base
            per_s = b.hbm * b.cal.bandwidth_eff
            gather, group_reads = sharded_experts(m, tokens, own, p.dp, b.expert_bytes_per_layer, per_s,
                                                  self.group_link)  # fmt: skip
        per_moe = dispatch + combine + skew + gather + group_reads
        layers = zip(self.layers, moe_layers, strict=True)
        stage_s, overlap = [], []
        for n, k in layers:
            compute, hidden = attn * n / m.num_layers, 0.0
            if p.two_batch_overlap:  # dispatch behind the other micro-batch's attention, combine its experts
                experts = min(k * moe, compute)
                hidden = min(k * dispatch * free, compute - experts) + min(k * combine * free, experts)
            stage_s.append(compute + k * per_moe - hidden)
            overlap.append(hidden)
        send = self.pp_link.latency_s + tokens * m.hidden_size * ACT_BYTES / self.pp_link.bandwidth
        pp_send = send if p.pp > 1 and tokens > 0 else 0.0
        seconds = sum(stage_s) + (p.pp - 1) * pp_send
        return StepBreakdown(
            seconds, stage_s, rank_s, pp_send, dispatch, combine, expert_rank, skew, compute_bound,
            overlap if p.two_batch_overlap else [], gather, group_reads,
        )  # fmt: skip

    def _all_to_all(self, mode: str, tokens: float, elem: float) -> float:
        """Dispatch or combine of one MoE layer: each attention rank sends its share of the step's `tokens`
        at `elem` bytes per hidden element; under two-batch overlap two, each of half the tokens."""
        p, m = self.p, self.model
        parts = 2 if p.two_batch_overlap else 1
        busiest = self.busiest
        if mode == "per_expert":  # every (token, expert) pair, all over the EP link
            per_rank = tokens * m.experts_per_token / p.dp
            nbytes = busiest * per_rank * m.hidden_size * elem * (p.ep - 1) / p.ep
            if parts == 1:
                return all_to_all_seconds(nbytes, self.ep_link)
            return parts * all_to_all_seconds(nbytes / parts, self.ep_link)
        nvl, ib = all_to_all_links(m, mode, tokens / p.dp / parts, p.ep, p.gpus_per_node, elem)
        nvl, ib = busiest * nvl, busiest * ib
        one = max(all_to_all_seconds(nvl, self.intra), all_to_all_seconds(ib, self.inter) if ib else 0.0)
        return parts * one

    def _rank_step(self, c: np.ndarray, q: np.ndarray) -> tuple[float, bool]:
        """One attention rank's compute over its rows; under two-batch overlap the sum of its two
        micro-batches' (alternate rows), each paying its own weight reads."""
        if not self.p.two_batch_overlap or c.size < 2:
            return self.rank_base.step_time(c, q)
        (a, bound_a), (b, bound_b) = (self.rank_base.step_time(c[i::2], q[i::2]) for i in (0, 1))
        return a + b, bool(bound_a or bound_b)

    @property
    def pp(self) -> int:
        """Pipeline stages: the batches the engine may keep in flight."""
        return self.p.pp

    @property
    def ranked(self) -> bool:
        """DP attention: the engine's plans say which rows each rank runs (`ranks`)."""
        return self.p.dp > 1

    def stage_seconds(
        self, new_tokens: np.ndarray, context: np.ndarray, ranks: Sequence[int] | None = None
    ) -> tuple[list[float], float, bool]:
        """(each stage's seconds, one send between stages, compute_bound) of a step."""
        c = np.asarray(new_tokens)
        if c.size == 0:
            return [0.0] * self.p.pp, 0.0, False
        b = self.breakdown(c, np.asarray(context), ranks)
        return b.stage_s, b.pp_send_s, b.compute_bound

    def step_time(
        self, new_tokens: np.ndarray, context: np.ndarray, ranks: Sequence[int] | None = None
    ) -> tuple[float, bool]:
        """(seconds, compute_bound): one batch in flight, the sum of its stages and transfers."""
        c = np.asarray(new_tokens)
        if c.size == 0:
            return 0.0, False
        b = self.breakdown(c, np.asarray(context), ranks)
        return b.seconds, b.compute_bound


def wrap_step_time(
    base: Any, model: ModelSpec, gpu: Gpu, p: Placement
) -> Callable[[np.ndarray, np.ndarray], tuple[float, bool]]:
    """`base.step_time` unchanged for plain TP, else the placement's."""
    return base.step_time if not p.beyond_tp else ParallelCost(base, model, gpu, p).step_time
