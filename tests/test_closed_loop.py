"""Closed-loop runs end to end: each user's requests carry the user's prefix group (`user % groups`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import polars as pl

from sim.config.scenario import validate_scenario
from sim.studies.run import run_policy

USERS, GROUPS = 6, 3

SCENARIO = f"""
name = "closed-loop-groups"
seed = 11

[model]
name = "llama-2-7b"
gpu = "A100-80GB"

[workload]
arrival = {{ kind = "closed_loop", users = {USERS}, think_time_s = {{ kind = "exponential", mean = 0.2 }} }}
prompt = {{ kind = "uniform", low = 16, high = 128 }}
output = {{ kind = "uniform", low = 4, high = 64 }}
max_tokens = 64
prefix = {{ groups = {GROUPS}, prefix_len = 64 }}

[horizon]
max_requests = 300
drain = true

[policies.continuous]
scheduler = "continuous"
max_num_seqs = 64
"""


def _requests() -> pl.DataFrame:
    scenario = validate_scenario(tomllib.loads(SCENARIO), "closed-loop-groups")
    return run_policy(scenario, "continuous", Path(".")).requests


def _most_open_at_once(group: pl.DataFrame) -> int:
    """The largest number of the group's requests in the system at one instant (arrival to finish)."""
    events = sorted(
        [(t, 1) for t in group["arrival"].to_list()] + [(t, -1) for t in group["finished_at"].to_list()],
        key=lambda e: (e[0], e[1]),  # a finish at an instant comes before an arrival at that instant
    )
    open_now = most = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


def test_each_user_keeps_its_prefix_group() -> None:
    """User u sends its first request at t = 0 (request id u), then one at a time: with USERS / GROUPS
    users per group, a group never has more requests open at once than it has users."""
    req = _requests()
    assert req.height == 300 and (req["state"].cast(str) == "finished").all()
    first = req.filter(pl.col("id") < USERS).sort("id")
    assert first["prefix_group"].to_list() == [u % GROUPS for u in range(USERS)]
    per_group = USERS // GROUPS
    for group in range(GROUPS):
        rows = req.filter(pl.col("prefix_group") == group)
        assert _most_open_at_once(rows) == per_group, group
