"""Each router's choice, checked on hand-made reports."""

from __future__ import annotations

import math

import numpy as np

from sim.core.request import Request
from sim.fleet.routers import load_all
from sim.fleet.routing import Snapshot


def _router(name: str, n: int, seed: int = 0, **knobs: object):  # type: ignore[no-untyped-def]
    kind = load_all()[name]
    return kind.build(kind.config.model_validate(knobs), n, np.random.default_rng(seed))


def _req(i: int, group: int = -1) -> Request:
    return Request(i, 0.0, 10, 1, 1, prefix_group=group)


def test_round_robin_cycles() -> None:
    r = _router("round_robin", 3)
    reports = [Snapshot() for _ in range(3)]
    assert [r.route(_req(i), reports) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_uniform_and_seeded() -> None:
    reports = [Snapshot() for _ in range(4)]
    a = [_router("random", 4, seed=5).route(_req(i), reports) for i in range(1)]
    r1, r2 = _router("random", 4, seed=5), _router("random", 4, seed=5)
    seq1 = [r1.route(_req(i), reports) for i in range(4000)]
    assert seq1 == [r2.route(_req(i), reports) for i in range(4000)]
    counts = np.bincount(seq1, minlength=4)
    assert a[0] == seq1[0]
    assert all(abs(c - 1000) < 4 * math.sqrt(1000 * 0.75) for c in counts)  # binomial, 4 sigma


def test_least_outstanding_takes_the_shortest_queue() -> None:
    r = _router("least_outstanding", 4)
    assert r.route(_req(0), [Snapshot(3), Snapshot(1), Snapshot(2), Snapshot(1)]) == 1
    # a tie goes to the next replica after the previous choice
    assert r.route(_req(1), [Snapshot(3), Snapshot(1), Snapshot(2), Snapshot(1)]) == 3


def test_power_of_two_picks_the_less_loaded_of_two() -> None:
    """With loads 0..9, the choice is the smaller index of two distinct random ones: P(choice = k) =
    2 (9 - k) / 90, so index 9 is never chosen and 0 most often (18 of 90)."""
    r = _router("power_of_two", 10, seed=1)
    reports = [Snapshot(k) for k in range(10)]
    picks = np.bincount([r.route(_req(i), reports) for i in range(9000)], minlength=10)
    assert picks[9] == 0
    for k in range(9):
        expect = 9000 * 2 * (9 - k) / 90
        assert abs(picks[k] - expect) < 4 * math.sqrt(expect) + 1


def test_least_kv_prefers_free_memory_then_short_queues() -> None:
    r = _router("least_kv", 3)
    assert r.route(_req(0), [Snapshot(0, 0, 0.5), Snapshot(5, 0, 0.1), Snapshot(0, 0, 0.3)]) == 1
    assert r.route(_req(0), [Snapshot(4, 0, 0.2), Snapshot(2, 0, 0.2), Snapshot(3, 0, 0.2)]) == 1


def test_prefix_affinity_is_sticky_until_the_load_bound() -> None:
    r = _router("prefix_affinity", 4, load_factor=1.25)
    idle = [Snapshot() for _ in range(4)]
    home = {g: r.route(_req(0, g), idle) for g in range(40)}
    assert all(r.route(_req(1, g), idle) == home[g] for g in range(40))  # same prefix, same replica
    assert len(set(home.values())) == 4  # groups spread over all replicas
    # the home replica is at the bound: total 8 + 1 over 4 replicas x 1.25 -> ceil(2.8125) = 3
    g = 0
    loads = [Snapshot(2) for _ in range(4)]
    loads[home[g]] = Snapshot(3)
    loads[(home[g] + 1) % 4] = Snapshot(1)
    loads[(home[g] + 2) % 4] = Snapshot(0)
    other = r.route(_req(2, g), loads)
    assert other != home[g]
    assert loads[home[g]].outstanding == 3 == math.ceil(1.25 * (sum(s.outstanding for s in loads) + 1) / 4)
    loads = [Snapshot(3) for _ in range(4)]
    loads[home[g]] = Snapshot(2)  # bound ceil(1.25 x 12 / 4) = 4: below it again, so back home
    assert r.route(_req(3, g), loads) == home[g]
