"""`sim run` of a scenario with `[cluster]`: build the replicas, run the fleet, and make the records.

Records: the requests and steps of every replica in one frame each, with a `replica` column (the replica
that served the request: its decode replica under disaggregation); disaggregated runs add where each
request spent its time (`prefill_replica`, `prefill_s`, `transfer_s`, `decode_wait_s`, `decode_s`). The
summary is the single-replica summary over the whole fleet, plus `cluster` (groups, GPUs, router) and
`replicas` (each replica's own summary). A fleet serving LoRA gives each replica its own adapter cache
(sim/engine/lora.py); its records carry the LoRA columns and its summaries a `lora` block, the fleet's and
each replica's.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from sim.catalog.engines import DEFAULT_ENGINE
from sim.catalog.links import get_link
from sim.config.cluster import ClusterSection
from sim.config.scenario import Scenario
from sim.core.request import Request
from sim.cost.memory import KvBudget, replica_kv_memory
from sim.cost.parallel import wrap_step_time
from sim.cost.placement import Placement, group_placement
from sim.cost.replica import build_cost_and_memory
from sim.cost.roofline import CostModel
from sim.engine.closed_loop import ClosedLoopSource
from sim.engine.data_parallel import DataParallelRanks, rank_budgets
from sim.engine.horizon import Horizon
from sim.engine.lora import LoraRun, setup_lora
from sim.engine.lora_records import lora_summary
from sim.engine.sampling import per_request_sampling, sample_as_checkpoint, sampled_step_time
from sim.engine.schedulers.registry import load_all as load_policies
from sim.engine.virtual_engines import VirtualEngines, engine_budgets
from sim.fleet.decode import PagedDecode, decode_scheduler
from sim.fleet.engine import Fleet, FleetOutput, Member, ReplicaSpec, fleet_overloaded, seeded
from sim.fleet.routers import load_all as load_routers
from sim.fleet.routing import Router
from sim.io.errors import SimError
from sim.records.columns import CHUNK_ROWS
from sim.records.sinks import ParquetSink
from sim.records.summary import Records, Slo, summarize
from sim.workload.generator import Workload, rate_steps

PD_COLUMNS = ("prefill_replica", "prefill_s", "transfer_s", "decode_wait_s", "decode_s")


def group_scenario(scenario: Scenario, gpu: str | None, tp: int | None) -> Scenario:
    """The scenario with one group's GPU and TP in its [model] table."""
    update: dict[str, Any] = {}
    if gpu is not None:
        update["gpu"] = gpu
    if tp is not None:
        update["tp"] = tp
    if not update:
        return scenario
    out = scenario.model_copy(update={"model": scenario.model.model_copy(update=update)})
    out._policy_configs = scenario._policy_configs
    return out


def build_specs(
    scenario: Scenario, cluster: ClusterSection, policy: str, source: str, workload: Workload | None = None
) -> tuple[list[ReplicaSpec], dict[str, Any]]:
    """One `ReplicaSpec` per replica, and each group's figures for the summary; with the run's `workload`,
    its sampling parameters priced per replica as on one replica (`sampled_step_time`)."""
    specs: list[ReplicaSpec] = []
    groups: dict[str, Any] = {}
    policies = load_policies()
    for gi, group in enumerate(cluster.groups):
        gname = cluster.group_name(gi)
        where = f"{source}: cluster.groups[{gi}]"
        pname = group.policy or policy
        kind, config = scenario.policy(pname)
        try:
            gs = group_scenario(scenario, group.gpu, group.tp)
            placement = group_placement(group, gs.model.tp)
            engine = getattr(config, "engine", DEFAULT_ENGINE)
            cost, budget, info = build_cost_and_memory(gs, where, placement, where, engine)
            sampled = workload is not None and _check_sampling(gs, workload, placement, group, config, where)
            if not sampled:
                sample_as_checkpoint(cost, gs.model.name, kind, where)
        except SimError as err:
            raise SimError(str(err)) from None
        placed_step_time = wrap_step_time(cost, cost.model, cost.gpu, placement)
        loras: list[LoraRun | None] = [None] * group.count
        if getattr(config, "lora", None) is not None:  # each replica its own adapter cache
            if placement.beyond_tp:
                raise SimError(f"{where}: LoRA adapters are served with tensor parallelism only (pp, ep"
                               " and dp at 1), as the LoRA cost model is per TP shard")  # fmt: skip
            loras, budget = _group_lora(gs, config, cost, budget, where, group.count)
            info.update(kv_blocks=budget.num_blocks, kv_tokens=budget.num_tokens)
        build = partial(_scheduler, policies[kind], config, group.role)
        scheds = [build(budget, placement.dp, placement.pp) for _ in range(group.count)]
        first = scheds[0].ranks[0] if placement.dp > 1 else scheds[0]
        paged = isinstance(first, PagedDecode)
        shown = f"{kind} (decode)" if paged else "decode" if group.role == "decode" else kind
        groups[gname] = {
            **info,
            "count": group.count,
            "role": group.role,
            "policy": pname,
            "scheduler": shown,
        }
        for r, (sched, lora) in enumerate(zip(scheds, loras, strict=True)):
            step_time = placed_step_time if lora is None else lora.step_time
            if sampled:  # each replica its own per-row sampler over the rows of its own steps
                step_time = sampled_step_time(gs, workload, cost, step_time, kind, None, pname, where)
            specs.append(
                ReplicaSpec(
                    f"{gname}-{r}", gname, group.role, sched, step_time, info["kv_bytes_per_token"], lora
                )
            )
    return specs, groups


def _check_sampling(
    scenario: Scenario, workload: Workload, placement: Placement, group: Any, config: Any, where: str
) -> bool:
    """Whether the run gives sampling parameters per request (`[workload.sampling]`, a trace's sampling
    columns); an error where a group's replicas cannot price them: the per-row sampler reads a plain
    replica's step, not a pipeline's, DP ranks', a decode group's or LoRA's."""
    given = per_request_sampling(scenario, workload)
    if given is None:
        return False
    if placement.beyond_tp or group.role == "decode" or getattr(config, "lora", None) is not None:
        raise SimError(f"{where}: sampling parameters ({given}) are costed on tensor-parallel replicas only, "
                       "not with pp, ep or dp, a decode group or LoRA adapters")  # fmt: skip
    return True


def _scheduler(policy: Any, config: Any, role: str, budget: KvBudget, dp: int, pp: int = 1) -> Any:
    """A replica's scheduler: the policy's (as a decode replica's for the decode role), or with `dp` > 1
    attention ranks one such per rank, each with its share of the blocks (sim/engine/data_parallel.py); for
    a policy that runs `pp` > 1 stages as virtual engines, one per engine (sim/engine/virtual_engines.py)."""
    if dp > 1:
        budgets = rank_budgets(budget, dp)
        return DataParallelRanks([_scheduler(policy, config, role, b, 1, pp) for b in budgets], budgets)
    sched = policy.build(config, budget)
    if role == "decode":
        return decode_scheduler(sched, budget, int(getattr(config, "max_num_seqs", 256)))
    if pp > 1 and getattr(sched, "virtual_engines", False):
        budgets = engine_budgets(budget, pp)
        return VirtualEngines([policy.build(config, b) for b in budgets], budgets)
    return sched


def _group_lora(
    scenario: Scenario, config: Any, cost: CostModel, budget: KvBudget, where: str, count: int
) -> tuple[list[LoraRun | None], KvBudget]:
    """One group's LoRA parts, one per replica (each with its own GPU slots and host cache), and its
    replicas' KV budget with the slots taken out (as `studies.run` does for one replica)."""
    m = scenario.model
    kv = replica_kv_memory(m, cost.model, cost.gpu, where)
    runs: list[LoraRun | None] = []
    for _ in range(count):
        try:
            run = setup_lora(cost.model, cost.gpu, m.tp, cost, kv, config.lora, scenario.workload.lora)[0]
        except SimError as err:
            raise SimError(f"{where}: model: {err}") from None
        runs.append(run)
    first = runs[0]
    assert first is not None
    if m.num_kv_blocks is None:  # the LoRA slots take KV memory
        budget = KvBudget(first.blocks_with, budget.block_size, budget.max_model_len)
    return runs, budget


def simulate_fleet(
    scenario: Scenario,
    policy: str,
    base_dir: Path,
    seed: int | np.random.SeedSequence | None,
    source: str,
    records: Path | None = None,
) -> tuple[FleetOutput, list[ReplicaSpec], dict[str, Any]]:
    """Run the fleet; `records`: a folder to stream each replica's records into as the run goes
    (`records/replicas/<name>/`), else they are kept in memory."""
    cluster = scenario.cluster
    assert cluster is not None
    seed = scenario.seed if seed is None else seed
    workload = Workload(scenario.workload, seed, base_dir)
    specs, groups = build_specs(scenario, cluster, policy, source, workload)
    h = scenario.horizon
    horizon = Horizon(h.duration_s, h.max_requests, h.drain, h.max_waiting)
    name, _ = cluster.router_kind()
    kind, config = load_routers()[name], scenario._router_config
    assert config is not None
    streams = iter(seeded(seed).spawn(2))

    def make_router(n: int) -> Router:
        return kind.build(config, n, next(streams))

    link = get_link(cluster.link) if cluster.disaggregated else None
    sink_for = None if records is None else partial(_replica_sink, records / REPLICA_RECORDS)
    fleet = Fleet(specs, make_router, horizon, link, cluster.report_delay_s, sink_for)
    if workload.closed_loop is not None:
        cl = workload.closed_loop
        loop = ClosedLoopSource(cl.users, cl.think_time, cl.new_request, cl.ramp_s)
        return fleet.run(closed_loop=loop), specs, groups
    requests: Iterator[Request] = workload.open_loop(h.max_requests, h.duration_s)
    return fleet.run(requests), specs, groups


REPLICA_RECORDS = "replicas"  # each replica's streamed records, under the run's records folder, until merged


class ReplicaSink(ParquetSink):
    """A replica's `ParquetSink`, which makes its folder at its first chunk: a replica that is never sent
    a request is never finished (see `_replica_frames`), so it makes no folder and writes no file."""

    def write(self, name: str, chunk: pl.DataFrame) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        super().write(name, chunk)


def _replica_sink(folder: Path, name: str) -> ReplicaSink:
    return ReplicaSink(folder / name)


def _idle(out: FleetOutput, member: Member) -> bool:
    """Whether no request was ever sent to `member` (so it has no record: no request and no step)."""
    return out.routed[member.index] == 0


def _replica_frames(out: FleetOutput) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The replicas' request and step records, one after the other, each with a `replica` column. Idle
    replicas, whose frames would add no row, are left out (the first one kept, for the columns), and their
    recorders never finished: they cost nothing here."""
    req_frames, step_frames = [], []
    for m in out.members:
        if m.index and _idle(out, m):
            continue
        name = pl.lit(m.spec.name, dtype=pl.String).alias("replica")
        req_frames.append(m.recorder.requests_lazy().with_columns(name))
        step_frames.append(m.recorder.steps_lazy().with_columns(name))
    return pl.concat(req_frames, parallel=False), pl.concat(step_frames, parallel=False)


def _itl_gaps(out: FleetOutput) -> pl.DataFrame:
    """The replicas' corrections of the pooled ITL (`Recorder.itl_gaps`), each with a `replica` column; idle
    replicas, which have none, left out as in `_replica_frames`."""
    frames = [
        m.recorder.itl_gaps().with_columns(pl.lit(m.spec.name, dtype=pl.String).alias("replica"))
        for m in out.members
        if not _idle(out, m)
    ]
    empty = pl.DataFrame(schema={"duration": pl.Float64, "decode_tokens": pl.Int64, "replica": pl.String})
    return pl.concat([empty, *frames])


def fleet_frames(out: FleetOutput, disaggregated: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The fleet's request and step records, each with a `replica` column: requests by id, steps replica by
    replica, each in time order (records kept in memory)."""
    requests, steps = _replica_frames(out)
    requests = requests.sort("id")
    if disaggregated:
        requests = _with_handoffs(requests, out)
    return requests.collect(), steps.collect()


def write_fleet_records(out: FleetOutput, disaggregated: bool, folder: Path) -> None:
    """`fleet_frames` written to `folder/requests.parquet` and `folder/steps.parquet` from the replicas'
    streamed records, holding about `CHUNK_ROWS` requests at a time: each replica's requests are in id order,
    so the fleet's are merged one id range at a time, and the steps are copied replica by replica."""
    requests, steps = _replica_frames(out)
    steps.sink_parquet(folder / "steps.parquet", statistics=False)
    bounds = requests.select(lo=pl.col("id").min(), hi=pl.col("id").max(), n=pl.len()).collect().row(0)
    lo, hi, count = bounds
    sink = ParquetSink(folder)
    if count == 0:
        sink.write("requests", _finish_requests(requests.head(0), out, disaggregated))
    else:
        parts = -(-count // CHUNK_ROWS)
        edges = np.linspace(lo, hi + 1, parts + 1).round().astype(np.int64)
        for a, b in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
            if b > a:
                in_range = requests.filter((pl.col("id") >= a) & (pl.col("id") < b))
                sink.write("requests", _finish_requests(in_range, out, disaggregated))
    sink.finish("requests")


def _finish_requests(requests: pl.LazyFrame, out: FleetOutput, disaggregated: bool) -> pl.DataFrame:
    requests = requests.sort("id")
    return (_with_handoffs(requests, out) if disaggregated else requests).collect()


def _with_handoffs(requests: pl.LazyFrame, out: FleetOutput) -> pl.LazyFrame:
    """Where each disaggregated request's time went, from the fleet's hand-off books (NaN becomes null)."""
    names = [m.spec.name for m in out.members]
    books = pl.DataFrame(
        {
            "id": list(out.handoffs),
            "_prefill_replica": [names[h.prefill_replica] for h in out.handoffs.values()],
            "_prefill_end": [h.prefill_end for h in out.handoffs.values()],
            "_transfer": [h.transfer_s for h in out.handoffs.values()],
        },
        schema={
            "id": pl.Int64,
            "_prefill_replica": pl.String,
            "_prefill_end": pl.Float64,
            "_transfer": pl.Float64,
        },
    )
    admitted = pl.DataFrame(
        {"id": list(out.admitted_at), "_start": list(out.admitted_at.values())},
        schema={"id": pl.Int64, "_start": pl.Float64},
    )
    id_type = requests.collect_schema()["id"]
    books, admitted = books.cast({"id": id_type}), admitted.cast({"id": id_type})
    nan = float("nan")

    def value(name: str) -> pl.Expr:
        return pl.col(name).cast(pl.Float64).fill_null(nan)

    cols = {
        "prefill_replica": pl.col("_prefill_replica"),
        "prefill_s": value("_prefill_end") - value("scheduled_at"),
        "transfer_s": value("_transfer"),
        "decode_wait_s": value("_start") - value("first_token_at"),
        "decode_s": value("finished_at") - value("_start"),
    }
    joined = requests.join(books.lazy(), on="id", how="left").join(admitted.lazy(), on="id", how="left")
    return (
        joined.sort("id")
        .with_columns(**cols)
        .drop("_prefill_replica", "_prefill_end", "_transfer", "_start")
        .with_columns(pl.col(pl.Float64).fill_nan(None))
    )


def fleet_summary(
    scenario: Scenario, requests: Records, steps: Records, out: FleetOutput, groups: dict[str, Any]
) -> dict[str, Any]:
    slo = Slo(scenario.slo.ttft_s, scenario.slo.tpot_s, scenario.slo.e2e_s)
    changes = rate_steps(scenario.workload.arrival)
    overloaded = fleet_overloaded(requests, changes)
    gaps = _itl_gaps(out)
    summary = summarize(requests, steps, out.end_time, slo, overloaded, changes, gaps)
    cluster = scenario.cluster
    assert cluster is not None
    name, knobs = cluster.router_kind()
    config = scenario._router_config
    gpus = sum(g["count"] * g["tp"] for g in groups.values())
    per: dict[str, Any] = {}
    idle: dict[str, Any] | None = None  # the summary of a replica without records: the same for each
    for m in out.members:
        rname = m.spec.name
        if _idle(out, m):
            if idle is None:
                r_req, r_steps = requests.head(0), steps.head(0)
                idle = summarize(r_req, r_steps, out.end_time, slo, fleet_overloaded(r_req, changes), changes)
            s = copy.deepcopy(idle)
        else:
            r_req = requests.filter(pl.col("replica") == rname)
            r_steps = steps.filter(pl.col("replica") == rname)
            r_gaps = gaps.filter(pl.col("replica") == rname)
            s = summarize(
                r_req, r_steps, out.end_time, slo, fleet_overloaded(r_req, changes), changes, r_gaps
            )
        if m.spec.lora is not None:  # its own adapter cache's loads
            s["lora"] = lora_summary(m.spec.lora, steps.head(0) if _idle(out, m) else r_steps)
        per[rname] = {"group": m.spec.group, "role": m.spec.role, "routed": out.routed[m.index], **s}
    summary["cluster"] = {
        "router": name,
        "router_config": config.model_dump(mode="json") if config is not None else knobs,
        "report_delay_s": cluster.report_delay_s,
        "link": cluster.link if cluster.disaggregated else None,
        "replicas": len(out.members),
        "gpus": gpus,
        "groups": groups,
    }
    summary["replicas"] = per
    first = out.members[0].spec.lora
    if first is not None:  # the fleet's loads over every replica; slot and KV figures: the first group's
        summary["lora"] = lora_summary(first, steps)
    return summary
