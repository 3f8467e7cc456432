"""The EP all-to-all's bytes and links, and EPLB's redundant experts (sim/cost/parallel.py uses both).

All-to-all rules (`ep_all_to_all`), per MoE layer and source rank of `T` tokens, `k` routed experts a token:
- `per_expert`: every (token, expert) pair once, `T x k x hidden x (ep - 1) / ep` bytes, all over one link
  (NVLink within a node, the inter-node link once `ep` exceeds a node). The rule before these modes.
- `deepep_normal`: DeepEP's normal (high-throughput, prefill) kernels. A token goes once to each node that
  holds one of its experts over the inter-node link, and from there once to each rank that holds one over
  NVLink, "however many of its experts live there" (DeepEP README: kernels "optimized for asymmetric-domain
  bandwidth forwarding, such as forwarding data from NVLink domain to RDMA domain", after DeepSeek-V3's
  group-limited gating; arXiv 2412.19437 §3.2.2: each token goes to at most 4 nodes, "once it reaches the
  target node ... instantly forwarded via NVLink"). The two hops run concurrently: the step pays the slower,
  `max(latency + inter bytes / inter bandwidth, latency + NVLink bytes / NVLink bandwidth)`.
- `deepep_low_latency`: DeepEP's low-latency (decode) kernels: pure RDMA, one message per (token, expert)
  pair straight to the expert's rank (`internode_ll.cu` writes each `dst_expert_idx` slot), NVLink where the
  peer is in the node: `k x (ep - g) / ep` pairs a token over the inter-node link, `k x (g - 1) / ep` over
  NVLink (g = GPUs of a node in the group), the slower of the two.
- `deepep_auto`: SGLang's `--deepep-mode auto`: normal kernels for a step with prompt tokens, low-latency for
  a decode-only step.
SMs the kernels take from the compute they overlap (`COMM_SMS`, read by two-batch overlap): DeepEP's normal
kernels run on a set number of SMs, 24 in its README's example (`Buffer.set_num_sms(24)`, the V1 default the
V2 README cites: "SM usage reduced from 24 to 4 - 6"); the low-latency kernels' receive hook "without any SM
occupation" (DeepEP docs/legacy.md). `per_expert` (an NCCL-style all-to-all) states none: its overlap is the
upper bound.
The distinct nodes and ranks a token reaches are the expectation under a uniform gate: `k` experts drawn
without replacement, within `topk_group` of `n_group` contiguous groups when the model's config.json limits
the groups (`ModelSpec.expert_groups`); the experts lie contiguously over ranks and ranks over nodes (with
redundant experts, the `E / ep` logical experts a rank serves, possibly fractional: an approximation).
Dispatch bytes per element (`ep_dispatch_dtype`): bf16 2; fp8 1 plus a float32 scale per 128 channels
(DeepEP's FP8 dispatch with DeepGEMM's 1 x 128 blocks: 7,392 bytes a token at hidden 7,168). Combine is bf16
(DeepEP: "FP8 dispatching and BF16 combining"; arXiv 2412.19437 §3.3.2: combine kept in BF16).

DP attention without EP (`dp > 1`, `ep = 1`): vLLM's expert layers "form a tensor parallel group of size
DP x TP" unless `--enable-expert-parallel` is given (docs/serving/data_parallel_deployment.md), as SGLang's DP
attention over TP experts does: every GPU gathers the tokens of all `dp` ranks, computes its shard of each
expert over all of them, and reduce-scatters the outputs back. `sharded_experts` charges per MoE layer an
all-gather and a reduce-scatter of the step's tokens x hidden x 2 B, (dp - 1) / dp of it through each GPU,
each `latency + bytes / bandwidth` over the group's link, and the shard reads of the experts the step's
tokens touch beyond those the slowest rank's own tokens touch (its step already reads those).

EPLB (`ep_redundant_experts = R`): DeepSeek's `eplb.py` global policy, as vLLM's `rebalance_experts` runs it
with `--eplb-config '{"num_redundant_experts": R}'`: each of the R redundant slots replicates the logical
expert with the most load per replica (its tokens split evenly over its replicas), then the E + R physical
experts go heaviest first to the least loaded rank with a slot free, (E + R) / ep slots a rank. vLLM needs
`(E + R) % ep == 0` (deepseek-ai/EPLB eplb.py, which vLLM's rebalancer follows: `assert num_physical_experts %
num_gpus == 0`); so 256 + 32 = 288 experts fill EP 72 or EP 144, which 256 alone do not divide.
"""

from __future__ import annotations

import itertools
import math
from typing import Literal

import numpy as np

from sim.catalog.links import Link
from sim.catalog.model import ModelSpec
from sim.cost.kernels import ACT_BYTES  # 16-bit activations
from sim.cost.step_model import expected_distinct_experts

ALL_TO_ALL = ("per_expert", "deepep_normal", "deepep_low_latency", "deepep_auto")
AllToAll = Literal["per_expert", "deepep_normal", "deepep_low_latency", "deepep_auto"]
COMM_SMS = {"deepep_normal": 24, "deepep_low_latency": 0}
DISPATCH_DTYPES = ("bf16", "fp8")
COMBINE_BYTES = 2.0  # bf16
FP8_SCALE_BLOCK = 128  # channels per float32 scale in an FP8 dispatch
MAX_GROUP_CHOICES = 20_000  # group subsets enumerated exactly; beyond, the limit is left out


def dispatch_bytes_per_element(dtype: str) -> float:
    """Bytes per hidden element of a dispatched token: bf16 2, fp8 1 + 4 / 128 (its scales)."""
    return 2.0 if dtype == "bf16" else 1.0 + 4.0 / FP8_SCALE_BLOCK


def _ranges_overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def _none_chosen(pool: float, outside: float, k: int) -> float:
    """P(all k draws without replacement from `pool` items fall among its `outside` ones):
    prod (outside - i) / (pool - i)."""
    p = 1.0
    for i in range(k):
        if pool - i <= 0:  # fewer experts in the chosen groups than a token takes: every bin is reached
            return 0.0
        p *= max(0.0, outside - i) / (pool - i)
    return p


def distinct_destinations(model: ModelSpec, units: float) -> float:
    """Expected distinct units (ranks or nodes, each holding E / units contiguous experts) a token's k experts
    reach under a uniform gate, within `expert_groups_per_token` of `expert_groups` groups if limited."""
    n, k = model.num_experts, model.experts_per_token
    if units <= 1 or k == 0:
        return 1.0 if k else 0.0
    groups, per_token = model.expert_groups, model.expert_groups_per_token
    limited = 0 < per_token < groups and math.comb(groups, per_token) <= MAX_GROUP_CHOICES
    choices = itertools.combinations(range(groups), per_token) if limited else [None]
    bins = math.ceil(units)
    width, gwidth = n / units, (n / groups if limited else n)
    total, count = 0.0, 0
    for chosen in choices:
        spans = [(g * gwidth, (g + 1) * gwidth) for g in chosen] if chosen is not None else [(0.0, float(n))]
        pool = sum(b - a for a, b in spans)
        reach = 0.0
        for u in range(bins):
            lo, hi = u * width, min((u + 1) * width, n)
            inside = sum(_ranges_overlap(lo, hi, a, b) for a, b in spans)
            if inside > 0:
                reach += 1.0 - _none_chosen(pool, pool - inside, k)
        total += reach
        count += 1
    return total / count


def low_latency_step(new_tokens: np.ndarray) -> bool:
    """True for a decode-only step (every row one new token): DeepEP's low-latency kernels under `auto`."""
    return bool(np.all(np.asarray(new_tokens) <= 1))


def all_to_all_links(
    model: ModelSpec, mode: str, tokens: float, ep: int, gpus_per_node: int, elem_bytes: float
) -> tuple[float, float]:
    """(bytes over NVLink, bytes over the inter-node link) one rank sends in one all-to-all of `tokens`
    tokens at `elem_bytes` per hidden element, under `mode` (not `per_expert` or `deepep_auto`)."""
    k, h = model.experts_per_token, model.hidden_size
    local = min(ep, gpus_per_node)  # ranks of the group on one node
    nodes = ep / local
    per_token = h * elem_bytes
    if mode == "deepep_low_latency":
        return tokens * k * (local - 1) / ep * per_token, tokens * k * (ep - local) / ep * per_token
    ranks = distinct_destinations(model, ep)
    nvl = tokens * ranks * (ep - 1) / ep * per_token
    if nodes <= 1:
        return nvl, 0.0
    return nvl, tokens * distinct_destinations(model, nodes) * (nodes - 1) / nodes * per_token


def eplb_rank_loads(logical: np.ndarray, ep: int, redundant: int) -> np.ndarray:
    """Share of the routed tokens on each of `ep` ranks after EPLB places `redundant` replicas of the
    `logical` experts' loads (DeepSeek's eplb.py `replicate_experts` then `balanced_packing`)."""
    load = np.asarray(logical, dtype=np.float64)
    replicas = np.ones(load.size, dtype=np.int64)
    for _ in range(redundant):  # each slot to the expert with the most load per replica (first on ties)
        replicas[int(np.argmax(load / replicas))] += 1
    physical = np.repeat(load / replicas, replicas)
    slots = physical.size // ep
    ranks, filled = np.zeros(ep), np.zeros(ep, dtype=np.int64)
    for item in np.argsort(-physical, kind="stable"):  # heaviest first, to the least loaded rank with room
        open_ranks = np.flatnonzero(filled < slots)
        r = int(open_ranks[np.argmin(ranks[open_ranks])])
        ranks[r] += physical[item]
        filled[r] += 1
    return ranks


def all_to_all_seconds(nbytes: float, link: Link) -> float:
    """One all-to-all message of `nbytes` per GPU over `link`: latency + bytes / bandwidth."""
    return link.latency_s + nbytes / link.bandwidth


def sharded_experts(
    model: ModelSpec, tokens: float, own: float, dp: int, expert_bytes: float, bytes_per_s: float, link: Link
) -> tuple[float, float]:
    """(all-gather plus reduce-scatter, expert reads beyond the slowest rank's) seconds per MoE layer of a
    step of `tokens` over `dp` attention ranks, `own` of them the slowest rank's; `expert_bytes` one expert's
    shard on a GPU, read at `bytes_per_s`."""
    moved = tokens * model.hidden_size * ACT_BYTES * (dp - 1) / dp
    gather = 2.0 * all_to_all_seconds(moved, link)
    touched = expected_distinct_experts(model.num_experts, model.experts_per_token, tokens)
    already = expected_distinct_experts(model.num_experts, model.experts_per_token, own)
    return gather, (touched - already) * expert_bytes / bytes_per_s


def gate_shares(num_experts: int, top_k: int, skew: float) -> np.ndarray:
    """Share of the routed (token, expert) pairs each expert receives, hottest first: Zipf(`skew`), with no
    expert above 1 / `top_k` (a token routes to `top_k` distinct experts, so an expert gets at most one pair
    a token); what the cap takes from the hottest goes to the others in proportion to their shares."""
    shares = 1.0 / np.arange(1, num_experts + 1, dtype=np.float64) ** skew
    shares /= shares.sum()
    cap = 1.0 / top_k
    capped = np.zeros(num_experts, dtype=bool)
    while True:
        over = ~capped & (shares > cap)
        if not over.any():
            return shares
        capped |= over
        shares[capped] = cap
        rest = ~capped
        if rest.any():
            shares[rest] *= (1.0 - cap * np.count_nonzero(capped)) / shares[rest].sum()


def expert_loads(num_experts: int, top_k: int, ep: int, skew: float, redundant: int = 0) -> np.ndarray:
    """Share of the routed tokens each EP rank receives: the gate's shares over experts (`gate_shares`),
    laid out contiguously, or with `redundant` experts as EPLB places them (`eplb_rank_loads`)."""
    weights = gate_shares(num_experts, top_k, skew)
    if redundant:
        return eplb_rank_loads(weights, ep, redundant)
    return weights.reshape(ep, num_experts // ep).sum(axis=1)
