"""Weighted routing over (variant, zone) targets, injected errors, and the gateway contract
(breakers and canary shares on top of the weights) the simulated fleet reads from Redis."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sim.fleet import Fleet, FleetConfig, FleetConfigError
from sim.gateway import HALF_OPEN_SHARE, TrafficGate, gate_weights, sync_routing_from_redis
from sim.perf_model import PerfModel
from sim.router import ErrorInjector, WeightedRouter, parse_target


def _fleet(seed: int = 0) -> Fleet:
    perf = PerfModel.from_splitwise()
    return Fleet(
        FleetConfig(
            models={"big": perf, "small": perf}, zones=("az-a", "az-b"), initial_replicas=1, jitter=False, seed=seed
        )
    )


def test_weights_are_honoured_per_class_and_seeded() -> None:
    picks = []
    for _ in range(2):
        f = _fleet()
        f.set_routing("fam", {"big|az-a": 3, ("small", "az-b"): 1}, 0.0)
        f.set_routing("fam", {"small|az-a": 1}, 0.0, request_class="trading")
        p = [f.submit_routed(0.0, "fam", "voice", 10, 1, f"v{i}") for i in range(2000)]
        assert all(f.submit_routed(0.0, "fam", "trading", 10, 1, f"t{i}") == ("small", "az-a") for i in range(50))
        picks.append(p)
    assert picks[0] == picks[1]
    share = sum(t == ("big", "az-a") for t in picks[0]) / 2000
    assert 0.72 < share < 0.78


def test_unknown_target_and_bad_weights_are_refused() -> None:
    f = _fleet()
    with pytest.raises(FleetConfigError):
        f.set_routing("fam", {"nope|az-a": 1}, 0.0)
    with pytest.raises(FleetConfigError):
        f.set_routing("fam", {"big|az-a": 0}, 0.0)
    with pytest.raises(FleetConfigError):
        f.submit_routed(0.0, "other", "voice", 1, 1, "x")
    with pytest.raises(FleetConfigError):
        parse_target("no-zone")


def test_router_weights_round_trip() -> None:
    r = WeightedRouter(np.random.default_rng(0))
    r.set("f", {"a|z": 1, "b|z": 1})
    assert r.weights("f", "any") == pytest.approx({"a|z": 0.5, "b|z": 0.5})


def test_injected_errors_mark_records_in_window_only() -> None:
    f = _fleet()
    f.inject_errors("az-a", "big", 1.0, 0.0, 50.0)
    f.submit(0.0, "az-a", "big", 100, 4, "a")
    f.submit(0.0, "az-b", "big", 100, 4, "b")
    recs = {r["request_id"]: r["status"] for r in f.advance_to(30.0)}
    assert recs == {"a": "error", "b": "ok"}
    f.submit(60.0, "az-a", "big", 100, 4, "c")
    assert [r["status"] for r in f.advance_to(90.0)] == ["ok"]


def test_error_rate_is_close_to_the_injected_probability() -> None:
    inj = ErrorInjector(np.random.default_rng(1))
    inj.add("z", "m", 0.05, 0.0, 10.0)
    n = sum(inj.status("z", "m", 1.0) == "error" for _ in range(20000))
    assert 0.04 < n / 20000 < 0.06


# -- the gateway contract: breakers and canary shares (sim.gateway.TrafficGate) -----------------


@pytest.mark.parametrize(
    ("weights", "factors", "expected"),
    [
        # no breaker: the weights, normalised
        ({"a|z": 3, "b|z": 1}, {}, {"a|z": 0.75, "b|z": 0.25}),
        # an open target is removed and the rest renormalised
        ({"a|z": 1, "b|z": 1, "c|z": 2}, {"a|z": 0.0}, {"b|z": 1 / 3, "c|z": 2 / 3}),
        # a half-open target keeps 5 % of its share; the closed ones take the rest in proportion
        ({"a|z": 1, "b|z": 1}, {"a|z": 0.05}, {"a|z": 0.025, "b|z": 0.975}),
        # only probing targets left: they share the traffic
        ({"a|z": 1, "b|z": 3}, {"a|z": 0.05, "b|z": 0.0}, {"a|z": 1.0}),
        # every target open: fail open, the weights unchanged (a breaker never drops a class)
        ({"a|z": 1, "b|z": 3}, {"a|z": 0.0, "b|z": 0.0}, {"a|z": 0.25, "b|z": 0.75}),
        # zero weights are not targets; a breaker on an unrelated target changes nothing
        ({"a|z": 0, "b|z": 2}, {"x|z": 0.0}, {"b|z": 1.0}),
    ],
)
def test_gate_weights(weights: dict, factors: dict, expected: dict) -> None:
    got = gate_weights(weights, factors)
    assert got == pytest.approx(expected)
    assert sum(got.values()) == pytest.approx(1.0)


def test_half_open_target_gets_five_percent_until_its_probe_budget_is_spent() -> None:
    g = TrafficGate(np.random.default_rng(0))
    g.set_breaker("m|z1", "half_open", probe_budget=3, basis_ms=10)
    assert g.factor("m", "z1") == HALF_OPEN_SHARE and g.factor("m", "z2") == 1.0
    assert [g.sent("m", "z1") for _ in range(4)] == [False, False, True, False]  # True: budget just spent
    assert g.factor("m", "z1") == 0.0 and g.breakers["m|z1"].probes_sent == 3
    g.set_breaker("m|z1", "half_open", probe_budget=3, basis_ms=10)  # another zone's copy: same budget
    assert g.factor("m", "z1") == 0.0
    g.set_breaker("m|z1", "half_open", probe_budget=3, basis_ms=20)  # a new version: a fresh budget
    assert g.factor("m", "z1") == HALF_OPEN_SHARE
    g.set_breaker("m|z1", "closed", 0, 30)
    assert g.breakers == {} and not g.sent("m", "z1")
    with pytest.raises(FleetConfigError):
        g.set_breaker("m|z1", "ajar", 0, 40)


def test_zone_choice_avoids_open_zones_and_probes_half_open_ones() -> None:
    zones = ["z1", "z2", "z3"]
    g = TrafficGate(np.random.default_rng(1))
    assert all(g.zone_for("m", "z1", zones) == "z1" for _ in range(100))  # no breaker: unchanged
    g.set_breaker("m|z1", "open", 0, 1)
    assert {g.zone_for("m", z, zones) for z in zones * 300} == {"z2", "z3"}
    g.set_breaker("m|z1", "half_open", 10**6, 2)
    n = 30_000
    picks = [g.zone_for("m", zones[i % 3], zones) for i in range(n)]
    # z1 keeps 5 % of its third; the other two share the rest equally
    for zone, p in (("z1", HALF_OPEN_SHARE / 3), ("z2", (1 - HALF_OPEN_SHARE / 3) / 2)):
        k = picks.count(zone)
        assert abs(k - n * p) < 4 * (n * p * (1 - p)) ** 0.5, (zone, k)
    g.set_breaker("m|z2", "open", 0, 3)
    g.set_breaker("m|z3", "open", 0, 3)
    g.set_breaker("m|z1", "open", 0, 3)
    assert g.zone_for("m", "z2", zones) == "z2"  # every zone open: fail open


def test_canary_share_is_drawn_per_zone_and_obeys_the_canarys_breaker() -> None:
    g = TrafficGate(np.random.default_rng(2))
    g.set_canary("z1", "m", "m@v2", 0.2)
    n = 20_000
    k = sum(g.variant_for("m", "z1") == "m@v2" for _ in range(n))
    assert abs(k - 0.2 * n) < 4 * (n * 0.2 * 0.8) ** 0.5
    assert all(g.variant_for("m", "z2") == "m" for _ in range(100))  # z2 has no canary
    assert all(g.variant_for("other", "z1") == "other" for _ in range(100))
    g.set_breaker("m@v2|z1", "open", 0, 1)
    assert all(g.variant_for("m", "z1") == "m" for _ in range(1000))  # an open canary gets nothing
    with pytest.raises(FleetConfigError):
        g.set_canary("z1", "m", "m@v2", 1.5)


class _FakeRedis:
    """The two hashes, as redis-py returns them (bytes), and nothing else."""

    def __init__(self) -> None:
        self.h: dict[str, dict[bytes, bytes]] = {}

    def put(self, key: str, field: str, value: object) -> None:
        self.h.setdefault(key, {})[field.encode()] = value if isinstance(value, bytes) else json.dumps(value).encode()

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        return dict(self.h.get(key, {}))


def _canary_fleet() -> Fleet:
    perf = PerfModel.from_splitwise()
    return Fleet(
        FleetConfig(
            models={"big": perf, "big@v2": perf, "small": perf},
            zones=("az-a", "az-b"),
            initial_replicas=1,
            jitter=False,
        )
    )


async def test_sync_applies_breakers_to_weights_with_same_version_skipping() -> None:
    f, r, seen, g = _canary_fleet(), _FakeRedis(), {}, TrafficGate(np.random.default_rng(0))
    r.put("p:routing:az-a", "_version", 5)
    r.put("p:routing:az-a", "*", {"weights": {"big|az-a": 0.5, "small|az-a": 0.5, "nope|az-a": 1}})
    assert await sync_routing_from_redis(f, r, "p", ["az-a"], "fam", 0.0, seen, g) == ["*"]
    assert f.router.weights("fam") == pytest.approx({"big|az-a": 0.5, "small|az-a": 0.5})
    n_log = len(f.routing_log)
    assert await sync_routing_from_redis(f, r, "p", ["az-a"], "fam", 1.0, seen, g) == []
    assert len(f.routing_log) == n_log  # same _version, no breaker change: nothing re-applied
    r.put("p:breaker:az-a", "big|az-a", {"target": "big|az-a", "state": "open", "basis_ms": 7})
    r.put("p:breaker:az-a", "bad|az-a", b"{not json")  # bad input is skipped, not a crash
    await sync_routing_from_redis(f, r, "p", ["az-a"], "fam", 2.0, seen, g)
    assert f.router.weights("fam") == {"small|az-a": 1.0}
    r.put("p:breaker:az-a", "big|az-a", {"target": "big|az-a", "state": "half_open", "probe_budget": 2, "basis_ms": 9})
    await sync_routing_from_redis(f, r, "p", ["az-a"], "fam", 3.0, seen, g)
    assert f.router.weights("fam") == pytest.approx({"big|az-a": 0.025, "small|az-a": 0.975})
    r.put(
        "p:breaker:az-b", "big|az-a", {"target": "big|az-a", "state": "half_open", "probe_budget": 2, "basis_ms": 9}
    )  # the driver writes every zone's hash
    await sync_routing_from_redis(f, r, "p", ["az-a", "az-b"], "fam", 3.5, seen, g)
    del r.h["p:breaker:az-a"][b"big|az-a"]
    await sync_routing_from_redis(f, r, "p", ["az-a", "az-b"], "fam", 3.6, seen, g)
    assert "big|az-a" in g.breakers  # still in az-b's hash
    del r.h["p:breaker:az-b"][b"big|az-a"]  # gone everywhere: closed again
    await sync_routing_from_redis(f, r, "p", ["az-a", "az-b"], "fam", 4.0, seen, g)
    assert f.router.weights("fam") == pytest.approx({"big|az-a": 0.5, "small|az-a": 0.5})


async def test_sync_reads_the_canary_field_per_zone_when_the_fleet_has_the_version() -> None:
    f, r, seen, g = _canary_fleet(), _FakeRedis(), {}, TrafficGate(np.random.default_rng(0))
    r.put("p:routing:az-a", "_canary|big", {"model": "big", "version": "v2", "share": 0.2, "basis_ms": 10})
    r.put("p:routing:az-b", "_canary|big", {"model": "big", "version": "v9", "share": 0.5, "basis_ms": 10})
    await sync_routing_from_redis(f, r, "p", ["az-a", "az-b"], "big", 0.0, seen, g)
    assert g.canary == {("az-a", "big"): ("big@v2", 0.2)}  # no big@v9 in the fleet: ignored
    assert seen["az-a|_canary|big"] == 10
    r.put("p:routing:az-a", "_canary|big", {"model": "big", "version": "v2", "share": 0.9, "basis_ms": 10})
    await sync_routing_from_redis(f, r, "p", ["az-a"], "big", 1.0, seen, g)
    assert g.canary[("az-a", "big")][1] == 0.2  # same basis_ms: the same version, skipped
    r.put("p:routing:az-a", "_canary|big", {"model": "big", "version": "v2", "share": 0.0, "basis_ms": 20})
    await sync_routing_from_redis(f, r, "p", ["az-a"], "big", 2.0, seen, g)
    assert g.canary[("az-a", "big")][1] == 0.0
