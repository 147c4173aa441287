"""Agent class weights with a consumer: the gateway backend writes ``x-agent-class`` rules into an HTTPRoute
on the test API server (tests/kube_api.py), fed by the real worker through a zone executor; the simulated
gateway reads the same weights from the real Redis and routes each class to its share of the replicas."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio as aioredis
from governor_telemetry.producer import TelemetryProducer
from kubernetes import client as k8s

from controllers.agent_weights import AgentSignals, weights
from core.clock import ScaledClock
from core.settings import Settings
from core.workloads import parse_routes
from executors.backends import BackendRejected, RoutingBackend
from executors.executor import ZoneExecutor
from executors.gateway import GatewayBackend
from executors.guard import CommandGuard
from loop.commands import Command
from sim.fleet import Fleet, FleetConfig
from sim.gateway import TrafficGate, sync_routing_from_redis
from sim.perf_model import PerfModel
from tests.integration.harness import worker_and_executors
from tests.kube_api import KubeAPI

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

GV = "gateway.networking.k8s.io/v1"
M = "llama2-70b"
POOLS = [{"name": f"vllm-p{i}", "port": 8000} for i in range(4)]
ROUTES = [
    {
        "family": M,
        "zone": "az-a",
        "route": "llm",
        "backends": {f"{M}|az-a": {"name": "vllm-70b", "port": 8000}, "small|az-a": {"name": "vllm-small"}},
        "agent_pools": POOLS,
    }
]
SIGNALS = {"stability": 0.9, "rag_score": 0.9, "tool_conf": 0.2}


@pytest.fixture
def api() -> Iterator[KubeAPI]:
    with KubeAPI() as server:
        yield server


def _route(api: KubeAPI, rules: list[dict[str, Any]] | None = None) -> None:
    api.add_httproute("llm", [("vllm-70b", 8000, 1), ("vllm-small", 80, 1)])
    if rules is not None:
        obj = api.get(GV, "httproutes", "llm")
        obj["spec"]["rules"] = rules
        api.put(GV, "httproutes", obj)


def _gateway(api: KubeAPI) -> GatewayBackend:
    return GatewayBackend(k8s.ApiClient(api.client_configuration()), parse_routes(ROUTES), "az-a", backoff_s=0.01)


def _agents(w: dict[str, float], basis_ms: int = 2_000) -> Command:
    return Command(
        kind="agents",
        zone="az-a",
        model=M,
        reason="agent weights",
        issued_at_ms=basis_ms,
        expires_at_ms=basis_ms + 60_000,
        basis_ms=basis_ms,
        payload={"weights": w, "signals": SIGNALS, "paths": {}},
    )


def _agent_rules(api: KubeAPI) -> dict[str, dict[str, int]]:
    """class -> {pool: weight} of the rules matching x-agent-class (and each rule's match checked)."""
    out = {}
    for rule in api.get(GV, "httproutes", "llm")["spec"]["rules"]:
        headers = [h for m in rule.get("matches") or [] for h in m.get("headers") or []]
        if headers:
            assert headers == [{"type": "Exact", "name": "x-agent-class", "value": headers[0]["value"]}]
            out[headers[0]["value"]] = {r["name"]: r["weight"] for r in rule["backendRefs"]}
    return out


async def test_agents_become_one_header_rule_per_class_and_the_default_rule_stays(api: KubeAPI) -> None:
    _route(api)
    gw = _gateway(api)
    out = await gw.apply(_agents({"rag": 0.5, "tool": 0.0, "llm": 0.5}))
    # rag holds pools 0-1, llm 2-3; tool (weight 0) has no rule: its requests take the default rule
    assert _agent_rules(api) == {
        "rag": {"vllm-p0": 500, "vllm-p1": 500, "vllm-p2": 0, "vllm-p3": 0},
        "llm": {"vllm-p0": 0, "vllm-p1": 0, "vllm-p2": 500, "vllm-p3": 500},
    }
    assert out["routes"]["default/llm"]["agent_classes"]["rag"]["vllm-p0:8000"] == 500
    rules = api.get(GV, "httproutes", "llm")["spec"]["rules"]
    assert len(rules) == 3 and rules[0]["backendRefs"][0]["name"] == "vllm-70b"  # the default rule, first
    # new weights rebuild governor's rules (no duplicates); a route command keeps them
    await gw.apply(_agents({"rag": 0.6, "tool": 0.1, "llm": 0.3}, 3_000))
    route = Command(
        kind="route", zone="az-a", model=M, reason="r", issued_at_ms=4_000, expires_at_ms=64_000, basis_ms=4_000,
        payload={"weights": {"*": {f"{M}|az-a": 3.0, "small|az-a": 1.0}}},
    )  # fmt: skip
    await gw.apply(route)
    rules = api.get(GV, "httproutes", "llm")["spec"]["rules"]
    assert len(rules) == 4
    assert {r["name"]: r["weight"] for r in rules[0]["backendRefs"]} == {"vllm-70b": 750, "vllm-small": 250}
    assert _agent_rules(api)["tool"] == {"vllm-p0": 0, "vllm-p1": 0, "vllm-p2": 1000, "vllm-p3": 0}
    assert sum(_agent_rules(api)["rag"].values()) == 1000


async def test_agent_rules_keep_the_default_rules_path_and_respect_the_rule_limit(api: KubeAPI) -> None:
    default = {"matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}], "backendRefs": [{"name": "vllm-70b"}]}
    _route(api, [default])
    await _gateway(api).apply(_agents({"rag": 1.0, "tool": 0.0, "llm": 0.0}))
    rag = api.get(GV, "httproutes", "llm")["spec"]["rules"][1]
    header = {"type": "Exact", "name": "x-agent-class", "value": "rag"}
    assert rag["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}, "headers": [header]}]
    # 15 operator rules + 2 classes > 16 rules: rejected, nothing written
    _route(api, [default] * 15)
    with pytest.raises(BackendRejected, match="16"):
        await _gateway(api).apply(_agents({"rag": 0.5, "tool": 0.0, "llm": 0.5}))
    assert len(api.get(GV, "httproutes", "llm")["spec"]["rules"]) == 15


async def test_a_route_without_agent_pools_rejects_agents(api: KubeAPI) -> None:
    _route(api)
    bare = [{k: v for k, v in ROUTES[0].items() if k != "agent_pools"}]
    gw = GatewayBackend(k8s.ApiClient(api.client_configuration()), parse_routes(bare), "az-a", backoff_s=0.01)
    with pytest.raises(BackendRejected, match="agent_pools"):
        await gw.apply(_agents({"rag": 0.5, "tool": 0.0, "llm": 0.5}))


def _req(i: int, now: int) -> dict[str, Any]:
    return {
        "kind": "request", "request_id": f"a-{i}", "ts_ms": now, "model": M, "zone": "az-a", "node": "az-a/n1",
        "ttft_ms": 200.0, "itl_ms": 30.0, "e2e_ms": 3200.0, "prompt_tokens": 1000, "output_tokens": 100,
        "status": "ok", "agent_stability": 0.9, "agent_rag_score": 0.9, "agent_tool_conf": 0.2,
        "agent_path": ("rag", "llm", "tool")[i % 3],
    }  # fmt: skip


async def test_the_workers_agents_command_reaches_the_httproute(
    api: KubeAPI, settings: Settings, tmp_path: Path
) -> None:
    """Telemetry with agent signals -> the worker -> an agents command -> a zone executor with the
    gateway backend -> the HTTPRoute's x-agent-class rules carry the weights of those signals."""
    settings = settings.replace(zones=("az-a",), command_ttl_s=60.0)
    _route(api)
    want = weights(AgentSignals(0.9, 0.9, 0.2)).as_dict()
    async with worker_and_executors(settings, tmp_path) as (worker, redis, _):
        executor = ZoneExecutor(
            zone="az-a", prefix=settings.topic_prefix, redis=redis, backend=_gateway(api),
            guard=CommandGuard.from_settings(settings), clock=ScaledClock(), results=None, results_topic="x",
            block_ms=50, probe_interval_s=0,
        )  # fmt: skip
        await executor.ensure_group()
        async with TelemetryProducer(
            settings.kafka_bootstrap, settings.topic("telemetry"), source="test", linger_ms=20
        ) as producer:
            for step in range(20):
                now = int(time.time() * 1000)
                for k in range(3):
                    await producer.send(_req(3 * step + k, now))
                await asyncio.sleep(0.2)
        rules: dict[str, dict[str, int]] = {}
        deadline = time.monotonic() + 30
        while not rules and time.monotonic() < deadline:
            await executor.poll_once()  # the worker's scale commands are rejected here: not this backend's kind
            rules = _agent_rules(api)
            await asyncio.sleep(0.1)
        assert set(rules) == {k for k, v in want.items() if v > 0}, worker.tail()
        for pools in rules.values():  # each class holds its weight of the 4 pools (1000 per pool in all)
            assert sum(pools.values()) == 1000
        held = {p: sum(want[c] * rules[c][p] for c in rules) / 1000 for p in rules["rag"]}
        assert held == pytest.approx(dict.fromkeys(held, 0.25), abs=0.01)


async def test_the_simulated_gateway_routes_each_class_to_its_share(settings: Settings) -> None:
    """RoutingBackend -> the real Redis -> sync_routing_from_redis: llm requests land on llm's replicas;
    a gateway that ignores the field spreads them over all."""
    redis = aioredis.Redis.from_url(str(settings.redis_url))
    try:
        await RoutingBackend(redis, settings.topic_prefix).apply(_agents({"rag": 0.5, "tool": 0.0, "llm": 0.5}))
        nodes = {}
        for routes in (True, False):
            fleet = Fleet(FleetConfig(models={M: PerfModel.from_splitwise()}, initial_replicas=4, seed=1))
            gate = TrafficGate(np.random.default_rng(0), agent_routes=routes)
            await sync_routing_from_redis(fleet, redis, settings.topic_prefix, ["az-a"], M, 0.0, {}, gate)
            assert gate.agents[("az-a", M)] == {"rag": 0.5, "tool": 0.0, "llm": 0.5}
            for i in range(40):
                fleet.submit(i * 0.05, "az-a", M, 2000, 50, f"q{i}", agent={"agent_path": "llm"})
            nodes[routes] = {r["node"].rsplit("/", 1)[1] for r in fleet.advance_to(600.0)}
        assert nodes == {True: {"r2", "r3"}, False: {"r0", "r1", "r2", "r3"}}
    finally:
        await redis.aclose()
