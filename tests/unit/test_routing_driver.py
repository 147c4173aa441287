"""RoutingDriver: zone windows of a primary and its fallback -> route commands."""

from __future__ import annotations

import dataclasses

import pytest

from controllers.window_record import WindowRecord, decode_window
from core.settings import ClassSlo, ModelSpec, Settings, SettingsError
from loop.canary_driver import window_obs
from loop.commands import Command
from loop.errors import SnapshotVersionError
from loop.routing_driver import RoutingDriver
from tests.unit.test_breaker_driver import assert_restores_alike, plain

P, F = "llama2-70b", "llama2-13b"
F_SPEC = ModelSpec(F)


def _w(model: str, zone: str, start: int, p95: float, scope: str = "zone") -> WindowRecord:
    node = {"node": f"{zone}/n1"} if scope == "node" else {}
    return decode_window(
        {
            "kind": "window",
            "scope": scope,
            "model": model,
            "zone": zone,
            "window_start_ms": start,
            "window_end_ms": start + 10_000,
            "ttft_p95_ms": p95,
            "e2e_p95_ms": None,
            "queue_len_mean": 0.0,
            "rate_rps": 5.0,
            "replicas_ready": 2,
            **node,
        }
    )


def _feed(d: RoutingDriver, start: int, p95_primary: float, p95_fallback: float = 100.0) -> list[Command]:
    out: list[Command] = []
    for z in ("az-a", "az-b"):
        out += d.on_window(_w(P, z, start, p95_primary), 1_000)
        out += d.on_window(_w(F, z, start, p95_fallback), 1_000)
    return out


def test_settings_parse_fallbacks() -> None:
    s = Settings.from_env({"GOVERNOR_FALLBACKS": f"{P}={F}, a=b"})
    assert s.fallbacks == ((P, F), ("a", "b"))
    assert Settings.from_env(s.to_env()).fallbacks == s.fallbacks
    assert Settings.from_env({}).fallbacks == ()
    with pytest.raises(SettingsError):
        Settings.from_env({"GOVERNOR_FALLBACKS": "x"})


def test_slow_primary_moves_degradable_classes_to_the_fallback_and_back() -> None:
    d = RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"), fallbacks=((P, F),)))
    assert d.on_window(_w(P, "az-a", 0, 2000.0, scope="node"), 1) == []
    assert d.on_window(_w("bloom-176b", "az-a", 0, 2000.0), 1) == []
    cmds = _feed(d, 0, 2000.0)
    assert sorted(c.zone for c in cmds) == ["az-a", "az-b"] and {c.kind for c in cmds} == {"route"}
    c = Command.decode(cmds[0].encode())
    assert c.model == P and c.basis_ms == 10_000
    trading = c.payload["weights"]["trading"]
    assert sum(w for t, w in trading.items() if t.startswith(F)) > 0.9
    assert sum(c.payload["weights"]["batch"].get(f"{F}|{z}", 0.0) for z in ("az-a", "az-b")) == 0.0
    assert set(c.payload["fallback"]) >= {"trading", "voice"}
    assert _feed(d, 10_000, 2000.0) == []  # same picture: nothing to publish
    back: list[Command] = []
    for i in range(2, 8):
        back += _feed(d, i * 10_000, 100.0)
    assert back and back[-1].payload["fallback"] == {}
    assert sum(w for t, w in back[-1].payload["weights"]["trading"].items() if t.startswith(P)) > 0.9


def test_a_missing_zone_window_is_judged_when_a_later_window_arrives() -> None:
    d = RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"), fallbacks=((P, F),)))
    assert d.on_window(_w(P, "az-a", 0, 2000.0), 1) == []
    assert d.on_window(_w(F, "az-a", 0, 100.0), 1) == []
    cmds = d.on_window(_w(P, "az-a", 10_000, 2000.0), 1)
    assert cmds and cmds[0].basis_ms == 10_000


def test_window_obs_of_an_absent_window_is_empty() -> None:
    assert window_obs(None).requests == 0
    o = window_obs(dataclasses.replace(_w(P, "az-a", 0, 100.0), count=200, error_rate=0.015, ttft_p99_ms=900.0))
    assert (o.requests, o.errors, o.p99_ms) == (200, 3, 900.0)


def test_an_open_breaker_takes_its_target_out_of_the_routing() -> None:
    states = {f"{P}|az-a": "open", f"{P}|az-b": "half_open"}
    d = RoutingDriver.from_settings(
        Settings(zones=("az-a", "az-b"), fallbacks=((P, F),)), breaker_of=lambda t: states.get(t, "closed")
    )
    assert d.obs(_w(P, "az-a", 0, 100.0)).breaker == "open"
    cmds = _feed(d, 0, 100.0)
    batch = cmds[0].payload["weights"]["batch"]  # not degradable: stays on the primary
    assert batch.get(f"{P}|az-a", 0.0) == 0.0
    assert batch[f"{P}|az-b"] == pytest.approx(1.0)  # the half-open target alone is left


def test_the_breaker_drivers_state_feeds_the_router() -> None:
    from loop.breaker_driver import BreakerDriver

    s = Settings(zones=("az-a", "az-b"), fallbacks=((P, F),), breaker_min_requests=200)
    brk = BreakerDriver.from_settings(s)
    d = RoutingDriver.from_settings(s, breaker_of=brk.state_of)
    trip = dataclasses.replace(_w(P, "az-a", 0, 100.0), count=500, error_rate=0.1, violation_rate=0.1)
    assert brk.on_window(trip, 1)[0].payload["state"] == "open"
    weights = _feed(d, 0, 100.0)[0].payload["weights"]
    assert all(ws.get(f"{P}|az-a", 0.0) == 0.0 for ws in weights.values())


def _routing_stream() -> list[WindowRecord]:
    """Primary slow, then fast again, then slow: fallback entered, left and entered."""
    out = []
    for i, p95 in enumerate([2000.0] * 3 + [100.0] * 6 + [2000.0] * 3):
        for z in ("az-a", "az-b"):
            out += [_w(P, z, i * 10_000, p95 + 10 * i), _w(F, z, i * 10_000, 100.0)]
    return out


@pytest.mark.parametrize("cut", [2, 13, 22, 30])  # mid-gathering and at window boundaries
def test_a_restored_routing_driver_decides_like_the_original(cut: int) -> None:
    s = Settings(zones=("az-a", "az-b"), fallbacks=((P, F),))
    rest = assert_restores_alike(
        lambda: RoutingDriver.from_settings(s), lambda d, w: d.on_window(w, w.window_end_ms), _routing_stream(), cut
    )
    assert rest


def test_routing_snapshot_drops_families_no_longer_routed() -> None:
    d = RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"), fallbacks=((P, F),)))
    _feed(d, 0, 2000.0)
    data = plain(d.snapshot())
    assert RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"), fallbacks=((P, F),))).restore(data) == 1
    assert RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"))).restore(data) == 0
    with pytest.raises(SnapshotVersionError):
        d.restore({"version": 0})


def test_a_forecast_surge_moves_traffic_off_the_target_before_its_queue_grows() -> None:
    """Same P95 everywhere; the forecaster expects 20 rps at the primary in az-a against a
    capacity of 2 replicas x 2 rps: the router predicts the backlog and steers away from it."""
    from core.settings import ModelSpec

    s = Settings(
        zones=("az-a", "az-b"),
        fallbacks=((P, F),),
        models=(ModelSpec(P, replica_capacity_rps=2.0), ModelSpec(F, replica_capacity_rps=4.0)),
    )

    def surge(model: str, zone: str) -> float | None:
        return 20.0 if (model, zone) == (P, "az-a") else None

    calm, ahead = RoutingDriver.from_settings(s), RoutingDriver.from_settings(s, forecast_of=surge)
    assert ahead.obs(_w(P, "az-a", 0, 100.0)).forecast_rps == 20.0
    assert calm.obs(_w(P, "az-a", 0, 100.0)).forecast_rps is None
    w_calm = _feed(calm, 0, 100.0)[0].payload["weights"]["batch"]
    w_ahead = _feed(ahead, 0, 100.0)[0].payload["weights"]["batch"]
    assert w_calm[f"{P}|az-a"] == pytest.approx(w_calm[f"{P}|az-b"])
    assert w_ahead[f"{P}|az-a"] < 0.5 * w_ahead[f"{P}|az-b"], w_ahead


def test_a_configured_class_slo_changes_the_routing_decision() -> None:
    """A primary at 500 ms misses trading's default 300 ms (fallback) but meets a configured 2 s (stays)."""
    models = (ModelSpec(P), F_SPEC)
    strict = RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"), models=models, fallbacks=((P, F),)))
    loose_p = ModelSpec(P, classes={"trading": ClassSlo(ttft_slo_ms=2000.0)})
    loose = RoutingDriver.from_settings(Settings(zones=("az-a", "az-b"), models=(loose_p, F_SPEC), fallbacks=((P, F),)))
    assert "trading" in _feed(strict, 0, 500.0)[0].payload["fallback"]
    routed = _feed(loose, 0, 500.0)[0].payload
    assert "trading" not in routed["fallback"]
    assert sum(w for t, w in routed["weights"]["trading"].items() if t.startswith(P)) > 0.5
