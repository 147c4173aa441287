"""Chained backends: the GOVERNOR_EXECUTOR_BACKENDS parser (hostile inputs), the chain's choice and
refusal, the dry-run backend's words per kind, the webhook's Retry-After parser."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, cast

import pytest

from core.settings import Settings, SettingsError
from executors.backends import DryRunBackend, RoutingBackend, SimFleetBackend, applied_by, would
from executors.chain import REGISTRY, BackendContext, ChainBackend, build_backend, parse_spec
from executors.errors import BackendRefused
from executors.webhook import WebhookBackend, retry_after_s
from loop.commands import COMMAND_KINDS, Command

ALL = sorted(COMMAND_KINDS)


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("scale=sim", {"scale": "sim"}),  # one kind, the others unassigned
        ("*=dry-run", dict.fromkeys(ALL, "dry-run")),  # every kind
        ("*=dry-run,scale=webhook", {**dict.fromkeys(ALL, "dry-run"), "scale": "webhook"}),  # a default and one
        ("scale=webhook,*=dry-run", {**dict.fromkeys(ALL, "dry-run"), "scale": "webhook"}),  # order does not matter
        (" scale = sim ,, route=routing, ", {"scale": "sim", "route": "routing"}),  # blanks and empty items
        (
            "scale=sim,relocate=sim,route=routing,breaker=routing,canary=routing,agents=routing",
            {"scale": "sim", "relocate": "sim", **dict.fromkeys(("route", "breaker", "canary", "agents"), "routing")},
        ),
    ],
)
def test_spec_parses(raw: str, want: dict[str, str]) -> None:
    assert parse_spec(raw) == want


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("", "names no kind=backend"),  # nothing
        (" , ,", "names no kind=backend"),  # only separators
        ("scale", "'scale' is not kind=backend"),  # no '='
        ("scale=", "is not kind=backend"),  # no backend
        ("=sim", "is not kind=backend"),  # no kind
        ("scaling=sim", "unknown kind 'scaling'"),  # a typo of a kind
        ("Scale=sim", "unknown kind 'Scale'"),  # kinds are case-sensitive
        ("scale=nomad", "unknown backend 'nomad' for scale"),
        ("scale=sim;route=routing", "unknown backend 'sim;route=routing'"),  # wrong separator
        ("scale=sim,scale=dry-run", "scale is given twice"),  # ambiguous
        ("*=sim,*=routing", r"\* is given twice"),  # ambiguous default
        ("scale=sim=x", "unknown backend 'sim=x'"),  # two '='
        ("x" * 5000, "at most 2000 characters"),  # hostile length
        ("scale\x00=sim", "unknown kind"),  # control characters
        ("a" * 1000 + "=sim", "unknown kind 'a"),  # a long name is cut in the message
    ],
)
def test_spec_refuses_with_a_settings_error_naming_the_item(raw: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        parse_spec(raw)
    assert str(info.value).startswith("GOVERNOR_EXECUTOR_BACKENDS")
    assert len(str(info.value)) < 300


def test_a_new_backend_is_one_registry_entry() -> None:
    class K8s:
        name = "k8s"

        async def apply(self, cmd: Command) -> dict[str, Any]:
            return {}

    registry = {**REGISTRY, "k8s": lambda c: K8s()}
    assert parse_spec("scale=k8s", registry) == {"scale": "k8s"}
    ctx = BackendContext(None, "p", "az-a", Settings(executor_backends="scale=k8s,*=routing"))  # type: ignore[arg-type]
    chain = build_backend(ctx, None, registry)
    assert isinstance(chain, ChainBackend) and chain.name_for("scale") == "k8s" and chain.name_for("route") == "routing"


def _ctx(**changes: Any) -> BackendContext:
    return BackendContext(None, "p", "az-a", Settings(**changes))  # type: ignore[arg-type]


def test_build_backend_keeps_the_single_backend_flag() -> None:
    assert isinstance(build_backend(_ctx(), None), SimFleetBackend)  # default, as before
    assert isinstance(build_backend(_ctx(), "routing"), RoutingBackend)  # --backend routing: every kind
    with pytest.raises(SettingsError, match="not both"):
        build_backend(_ctx(executor_backends="scale=sim"), "routing")
    with pytest.raises(SettingsError, match="unknown backend 'nomad'"):
        build_backend(_ctx(), "nomad")
    with pytest.raises(SettingsError, match="no workload in GOVERNOR_WORKLOADS"):  # k8s with nothing to scale
        build_backend(_ctx(), "k8s")
    with pytest.raises(SettingsError, match="no route in GOVERNOR_GATEWAY_ROUTES"):
        build_backend(_ctx(executor_backends="route=gateway"), None)
    with pytest.raises(SettingsError, match="needs GOVERNOR_WEBHOOK_URL"):  # validated at start, not per command
        build_backend(_ctx(executor_backends="relocate=webhook"), None)


def test_every_backend_that_scales_enforces_the_fleet_budget() -> None:
    """k8s and webhook (any backend taking scale commands) are wrapped in the zone's budget; sim checks it itself;
    dry-run, routing and gateway change no replicas.  The wrapper keeps the backend's name and replica source."""
    from core.settings import ModelSpec
    from core.workloads import parse_workloads
    from executors.budget import BudgetedBackend, FleetBudget
    from executors.platform import replica_source

    workloads = parse_workloads([{"model": "m", "zone": "az-a", "kind": "Deployment", "name": "vllm-m"}])
    spec = "scale=k8s,relocate=webhook,route=routing,canary=dry-run"
    ctx = _ctx(
        executor_backends=spec,
        models=(ModelSpec("m"),),
        workloads=workloads,
        k8s_api_url="http://127.0.0.1:1",
        webhook_url="http://127.0.0.1:1/cmd",
    )
    ctx = dataclasses.replace(ctx, budget=FleetBudget(("az-a", "az-b"), total=100, models=("m",)))
    chain = build_backend(ctx, None)
    assert isinstance(chain, ChainBackend)
    wrapped = {k: isinstance(b, BudgetedBackend) for k, b in chain.routes.items()}
    assert wrapped == {"scale": True, "relocate": True, "route": False, "canary": False}
    assert [applied_by(chain, k) for k in ("scale", "relocate")] == ["k8s", "webhook"]
    # The k8s backend's replica truth, through the wrapper.
    assert replica_source(chain) is cast(Any, chain.routes["scale"])
    assert isinstance(
        build_backend(dataclasses.replace(ctx, settings=ctx.settings.replace(executor_backends="")), "sim"),
        SimFleetBackend,
    )


def test_chain_builds_each_backend_once_and_names_it_per_kind() -> None:
    chain = build_backend(_ctx(executor_backends="route=routing,breaker=routing,scale=dry-run"), None)
    assert isinstance(chain, ChainBackend)
    assert chain.routes["route"] is chain.routes["breaker"]  # one routing backend for both kinds
    assert len(chain.backends()) == 2
    assert [applied_by(chain, k) for k in ("scale", "route", "agents")] == ["dry-run", "routing", "none"]
    assert applied_by(chain, None) == "chain"  # an entry that did not decode


def _cmd(kind: str, model: str = "m", **kw: Any) -> Command:
    now = int(time.time() * 1000)
    return Command(
        kind=kind, zone="az-a", model=model, reason="t", issued_at_ms=now, expires_at_ms=now + 1000, basis_ms=now, **kw
    )


BREAKER = {"target": "m|az-b", "probe_budget": 5, "threshold": 0.5, "error_ratio": 0.9}


def test_a_kind_with_no_backend_is_refused_not_dropped() -> None:
    chain = ChainBackend({"scale": DryRunBackend()}, "scale=dry-run")
    with pytest.raises(
        BackendRefused, match=r"no backend for canary commands \(GOVERNOR_EXECUTOR_BACKENDS=scale=dry-run\)"
    ):
        asyncio.run(chain.apply(_cmd("canary", payload={"model": "m", "version": "v2", "share": 0.1})))


@pytest.mark.parametrize(
    ("cmd", "sentence"),
    [
        (_cmd("scale", target_replicas=4), "would set az-a/m to 4 replicas"),
        (
            _cmd("breaker", "m|az-b", payload={**BREAKER, "state": "open"}),
            "would open breaker on m|az-b (error ratio 0.9 >= threshold 0.5) in az-a",
        ),
        (_cmd("breaker", "m|az-b", payload={**BREAKER, "state": "closed"}), "would close breaker on m|az-b in az-a"),
        (
            _cmd("breaker", "m|az-b", payload={**BREAKER, "state": "half_open"}),
            "would half-open breaker on m|az-b (probe budget 5) in az-a",
        ),
        (
            _cmd("canary", payload={"model": "m", "version": "v2", "share": 0.1}),
            "would send 10% of m's requests in az-a to m@v2",
        ),
        (
            _cmd("relocate", payload={"node": "n1", "max_bytes": 1024, "expected_generation": 3, "action": "move"}),
            "would move up to 1024 KV bytes of m on node n1 in az-a",
        ),
        (
            _cmd("route", "chat", payload={"weights": {"*": {"m|az-a": 1.0}}}),
            "would route family chat in az-a: {'*': {'m|az-a': 1.0}}",
        ),
    ],
)
def test_dry_run_says_what_each_kind_would_do(cmd: Command, sentence: str) -> None:
    assert would(cmd) == sentence
    assert "0 replicas" not in would(cmd) or cmd.kind == "scale"
    out = asyncio.run(DryRunBackend().apply(cmd))
    assert out == {"dry_run": True, "would": sentence}


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, None),  # absent
        ("", None),  # empty
        ("7", 7.0),  # delta seconds
        ("  7 ", 7.0),  # with blanks
        ("-1", None),  # negative: unusable
        ("1.5", None),  # not an integer (RFC 9110: delay-seconds is digits)
        ("99999999999999999999", None),  # absurdly long
        ("\u0661\u0662", None),  # non-ASCII digits
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: now
        ("not a date", None),  # garbage
    ],
)
def test_retry_after_parses_seconds_and_dates(value: str | None, want: float | None) -> None:
    assert retry_after_s(value, time.time()) == want


def test_retry_after_date_in_the_future() -> None:
    from email.utils import formatdate

    now = time.time()
    assert retry_after_s(formatdate(now + 30, usegmt=True), now) == pytest.approx(30, abs=1.0)


def test_webhook_headers_are_safe_for_hostile_ids() -> None:
    wh = WebhookBackend("http://127.0.0.1:1/x", hmac_key=bytes(32))
    cmd = _cmd("scale", target_replicas=1, command_id="id\r\nX-Evil: 1" + "y" * 500)
    h = wh.headers(cmd, b"{}", 1700000000.0)
    assert "\r" not in h["X-Governor-Command-Id"] and len(h["X-Governor-Command-Id"]) <= 200
    assert h["X-Governor-Timestamp"] == "1700000000" and h["X-Governor-Signature"].startswith("sha256=")
    assert "Authorization" not in h
