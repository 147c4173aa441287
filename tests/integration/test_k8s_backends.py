"""The ``k8s`` and ``gateway`` executor backends and the replica truth the first one reports.

They run against the test API server (tests/kube_api.py).

The official Kubernetes client talks HTTP to :class:`tests.kube_api.KubeAPI`,
which serves the real paths and JSON shapes; these tests check what lands in
the objects (``spec.replicas`` of the scale subresource, an HPA's
``minReplicas``, an HTTPRoute's ``backendRefs`` weights, annotations) and how
API errors are classified.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from core import names
from core.settings import ModelSpec, Settings
from core.workloads import parse_routes, parse_workloads
from executors.backends import BackendRejected, BackendUnavailable, FleetBudget
from executors.gateway import INTENT, GatewayBackend
from executors.k8s import ANNOTATION_PREFIX, KubernetesBackend
from loop.commands import Command
from tests.kube_api import KubeAPI

ROUTE_GV = "gateway.networking.k8s.io/v1"
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def api() -> Iterator[KubeAPI]:
    with KubeAPI() as server:
        yield server


def _client(api: KubeAPI) -> k8s.ApiClient:
    return k8s.ApiClient(api.client_configuration())


def _scale(target: int, model: str = "m", zone: str = "az-a", basis_ms: int = 1_000) -> Command:
    return Command(
        kind="scale",
        zone=zone,
        model=model,
        target_replicas=target,
        reason="pid: violations 4.1 % > 2 %",
        issued_at_ms=basis_ms,
        expires_at_ms=basis_ms + 60_000,
        basis_ms=basis_ms,
    )


def _cmd(kind: str, payload: dict[str, Any], model: str = "m", zone: str = "az-a", basis_ms: int = 2_000) -> Command:
    return Command(
        kind=kind,
        zone=zone,
        model=model,
        reason="test",
        issued_at_ms=basis_ms,
        expires_at_ms=basis_ms + 60_000,
        basis_ms=basis_ms,
        payload=payload,
    )


def _backend(api: KubeAPI, *entries: dict[str, Any], **kw: Any) -> KubernetesBackend:
    return KubernetesBackend(_client(api), parse_workloads(list(entries)), **kw)


DEPLOY = {"model": "m", "zone": "az-a", "kind": "Deployment", "name": "vllm-m", "namespace": "llm"}


async def test_scale_writes_the_scale_subresource_and_annotates(api: KubeAPI) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    out = await _backend(api, DEPLOY).apply(_scale(5))
    obj = api.get("apps/v1", "deployments", "vllm-m", "llm")
    assert obj["spec"]["replicas"] == 5
    assert out["previous"] == 2 and out["replicas"] == 5 and out["annotated"] is True
    notes = obj["metadata"]["annotations"]
    assert notes[ANNOTATION_PREFIX + "target-replicas"] == "5"
    assert notes[ANNOTATION_PREFIX + "command-id"] == _scale(5).command_id
    assert "violations" in notes[ANNOTATION_PREFIX + "reason"]
    scale_writes = [r for r in api.requests if r[0] == "PATCH" and r[1].split("?")[0].endswith("/vllm-m/scale")]
    assert scale_writes and all(r[2] == "application/merge-patch+json" for r in scale_writes)


async def test_statefulset_scale(api: KubeAPI) -> None:
    api.add_statefulset("sglang-m", replicas=1)
    entry = {"model": "m", "zone": "az-a", "kind": "StatefulSet", "name": "sglang-m"}
    await _backend(api, entry).apply(_scale(3))
    assert api.get("apps/v1", "statefulsets", "sglang-m")["spec"]["replicas"] == 3


async def test_unmapped_or_missing_workload_is_rejected(api: KubeAPI) -> None:
    backend = _backend(api, DEPLOY)
    with pytest.raises(BackendRejected, match="no workload mapped"):
        await backend.apply(_scale(3, zone="az-b"))
    with pytest.raises(BackendRejected, match="404"):  # mapped, but not on the cluster
        await backend.apply(_scale(3))


async def test_forbidden_is_rejected_at_once(api: KubeAPI) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    api.inject(403, times=1, path="/horizontalpodautoscalers")
    with pytest.raises(BackendRejected, match="403"):
        await _backend(api, DEPLOY).apply(_scale(4))
    assert api.get("apps/v1", "deployments", "vllm-m", "llm")["spec"]["replicas"] == 2


@pytest.mark.parametrize("code", [409, 429, 500, 503])
async def test_transient_errors_are_retried(api: KubeAPI, code: int) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    api.inject(code, times=2, path="/scale", method="PATCH")
    out = await _backend(api, DEPLOY, backoff_s=0.01).apply(_scale(6))
    assert out["attempts"] == 3
    assert api.get("apps/v1", "deployments", "vllm-m", "llm")["spec"]["replicas"] == 6


async def test_retries_end_in_unavailable_within_the_bound(api: KubeAPI) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    api.inject(503, times=1000, path="/scale", method="PATCH")
    with pytest.raises(BackendUnavailable, match="503"):
        await _backend(api, DEPLOY, backoff_s=0.01, max_wait_s=0.3).apply(_scale(6))
    assert api.get("apps/v1", "deployments", "vllm-m", "llm")["spec"]["replicas"] == 2


async def test_unreachable_api_server_is_unavailable() -> None:
    cfg = k8s.Configuration()
    cfg.host = "http://127.0.0.1:9"  # discard port: connection refused
    backend = KubernetesBackend(k8s.ApiClient(cfg), parse_workloads([DEPLOY]), backoff_s=0.01, max_wait_s=0.2)
    with pytest.raises(BackendUnavailable):
        await backend.apply(_scale(3))


async def test_a_workload_an_hpa_owns_is_refused_by_default(api: KubeAPI) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    api.add_hpa("vllm-m-hpa", "vllm-m", namespace="llm", min_replicas=1, max_replicas=8)
    with pytest.raises(BackendRejected, match="HorizontalPodAutoscaler llm/vllm-m-hpa"):
        await _backend(api, DEPLOY).apply(_scale(4))
    assert api.get("apps/v1", "deployments", "vllm-m", "llm")["spec"]["replicas"] == 2


async def test_coexist_sets_the_hpa_floor_and_leaves_replicas_alone(api: KubeAPI) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    api.add_hpa("vllm-m-hpa", "vllm-m", namespace="llm", min_replicas=1, max_replicas=8)
    backend = _backend(api, {**DEPLOY, "hpa": "coexist"})
    out = await backend.apply(_scale(5))
    hpa = api.get("autoscaling/v2", "horizontalpodautoscalers", "vllm-m-hpa", "llm")
    assert hpa["spec"]["minReplicas"] == 5 and out["capped"] is False
    assert hpa["metadata"]["annotations"][ANNOTATION_PREFIX + "target-replicas"] == "5"
    assert api.get("apps/v1", "deployments", "vllm-m", "llm")["spec"]["replicas"] == 2
    out = await backend.apply(_scale(12, basis_ms=2_000))  # above the HPA's ceiling: clamped, and said
    hpa = api.get("autoscaling/v2", "horizontalpodautoscalers", "vllm-m-hpa", "llm")
    assert hpa["spec"]["minReplicas"] == 8 and out["capped"] is True
    await backend.apply(_scale(0, basis_ms=3_000))  # an HPA floor cannot be 0
    assert api.get("autoscaling/v2", "horizontalpodautoscalers", "vllm-m-hpa", "llm")["spec"]["minReplicas"] == 1


async def test_an_hpa_of_another_workload_does_not_block(api: KubeAPI) -> None:
    api.add_deployment("vllm-m", namespace="llm", replicas=2)
    api.add_hpa("other-hpa", "something-else", namespace="llm")
    await _backend(api, DEPLOY).apply(_scale(3))
    assert api.get("apps/v1", "deployments", "vllm-m", "llm")["spec"]["replicas"] == 3


async def test_replica_truth_counts_pending_pods_as_starting(api: KubeAPI) -> None:
    api.auto_ready = False
    api.add_deployment("vllm-m", namespace="llm", replicas=4)
    backend = _backend(api, DEPLOY)
    await backend.apply(_scale(8))
    api.set_status("deployments", "vllm-m", "llm", replicas=8, readyReplicas=4, unavailableReplicas=4)
    assert await backend.replicas("m", "az-a") == {"desired": 8, "ready": 4, "starting": 4}
    assert await backend.replicas("m", "az-b") is None


async def test_non_scale_commands_are_rejected(api: KubeAPI) -> None:
    cmd = _cmd("canary", {"model": "m", "version": "v2", "share": 0.1})
    with pytest.raises(BackendRejected, match="scale commands only"):
        await _backend(api, DEPLOY).apply(cmd)


# -- gateway ---------------------------------------------------------------------------------------

ROUTES = [
    {
        "family": "m",
        "zone": "az-a",
        "route": "llm",
        "namespace": "default",
        "backends": {
            "m|az-a": {"name": "vllm-m", "port": 8000},
            "small|az-a": {"name": "vllm-small", "port": 8000},
            "m@v2|az-a": {"name": "vllm-m-v2", "port": 8000},
        },
    }
]


def _weights(api: KubeAPI) -> dict[str, int]:
    route = api.get(ROUTE_GV, "httproutes", "llm")
    return {r["name"]: r["weight"] for r in route["spec"]["rules"][0]["backendRefs"]}


def _gateway(api: KubeAPI) -> GatewayBackend:
    return GatewayBackend(_client(api), parse_routes(ROUTES), "az-a", backoff_s=0.01)


async def test_route_weights_become_backend_ref_weights(api: KubeAPI) -> None:
    api.add_httproute("llm", [("vllm-m", 8000, 1), ("vllm-small", 8000, 1), ("other-team", 80, 7)])
    gw = _gateway(api)
    await gw.apply(_cmd("route", {"weights": {"default": {"m|az-a": 3, "small|az-a": 1}}}))
    assert _weights(api) == {"vllm-m": 750, "vllm-small": 250, "other-team": 7}
    route = api.get(ROUTE_GV, "httproutes", "llm")
    assert json.loads(route["metadata"]["annotations"][INTENT])["rules"] == {"0": {"m|az-a": 3.0, "small|az-a": 1.0}}


async def test_open_breaker_is_weight_zero_and_closing_restores(api: KubeAPI) -> None:
    api.add_httproute("llm", [("vllm-m", 8000, 1), ("vllm-small", 8000, 1)])
    gw = _gateway(api)
    await gw.apply(_cmd("route", {"weights": {"default": {"m|az-a": 1, "small|az-a": 1}}}))
    breaker = {"target": "m|az-a", "probe_budget": 10, "threshold": 0.5, "error_ratio": 0.9}
    await gw.apply(_cmd("breaker", {**breaker, "state": "open"}, model="m|az-a", basis_ms=3_000))
    assert _weights(api) == {"vllm-m": 0, "vllm-small": 1000}
    await gw.apply(_cmd("breaker", {**breaker, "state": "half_open"}, model="m|az-a", basis_ms=4_000))
    assert _weights(api) == {"vllm-m": 25, "vllm-small": 975}
    await gw.apply(_cmd("breaker", {**breaker, "state": "closed"}, model="m|az-a", basis_ms=5_000))
    assert _weights(api) == {"vllm-m": 500, "vllm-small": 500}


async def test_canary_share_is_the_canary_backend_weight(api: KubeAPI) -> None:
    api.add_httproute("llm", [("vllm-m", 8000, 1)])
    gw = _gateway(api)
    await gw.apply(_cmd("canary", {"model": "m", "version": "v2", "share": 0.1}))
    assert _weights(api) == {"vllm-m": 900, "vllm-m-v2": 100}  # the canary backendRef is appended
    route = api.get(ROUTE_GV, "httproutes", "llm")
    assert route["spec"]["rules"][0]["backendRefs"][-1] == {"name": "vllm-m-v2", "port": 8000, "weight": 100}
    await gw.apply(_cmd("canary", {"model": "m", "version": "v2", "share": 0.0}, basis_ms=3_000))
    assert _weights(api) == {"vllm-m": 1000, "vllm-m-v2": 0}


async def test_gateway_rejects_unknown_targets_and_uncovered_zones(api: KubeAPI) -> None:
    api.add_httproute("llm", [("vllm-m", 8000, 1)])
    gw = _gateway(api)
    with pytest.raises(BackendRejected, match="no backendRef"):
        await gw.apply(_cmd("route", {"weights": {"default": {"m|az-a": 1, "m|az-b": 1}}}))
    with pytest.raises(BackendRejected, match="no gateway_routes entry"):
        other_zone = GatewayBackend(_client(api), parse_routes(ROUTES), "az-b")
        await other_zone.apply(_cmd("route", {"weights": {"default": {"m|az-b": 1}}}, zone="az-b"))
    assert _weights(api) == {"vllm-m": 1}  # nothing written


async def test_gateway_retries_a_conflicting_writer(api: KubeAPI) -> None:
    api.add_httproute("llm", [("vllm-m", 8000, 1), ("vllm-small", 8000, 1)])
    api.inject(409, times=1, path="/httproutes/llm", method="PATCH")
    out = await _gateway(api).apply(_cmd("route", {"weights": {"default": {"m|az-a": 1, "small|az-a": 3}}}))
    assert out["routes"]["default/llm"]["attempts"] == 2
    assert _weights(api) == {"vllm-m": 250, "vllm-small": 750}


# -- replica truth: k8s status -> executor reporter -> Redis -> the worker's view ------------------


async def test_platform_reporter_writes_what_the_worker_reads(api: KubeAPI, settings: Settings) -> None:
    import redis.asyncio as aioredis

    from core import names
    from executors.chain import ChainBackend
    from executors.platform import PlatformReporter, replica_source
    from loop.platform_truth import PlatformTruth

    api.auto_ready = False
    api.add_deployment("vllm-m", namespace="llm", replicas=4)
    s = settings.replace(models=(ModelSpec("m"),), zones=("az-a", "az-b"))
    k8s_backend = KubernetesBackend(_client(api), parse_workloads([DEPLOY]))
    chain = ChainBackend({"scale": k8s_backend})
    source = replica_source(chain)
    assert source is k8s_backend
    await chain.apply(_scale(8))  # 4 more ordered; the workload controller has not made them ready
    api.set_status("deployments", "vllm-m", "llm", replicas=8, readyReplicas=4)
    redis = aioredis.Redis.from_url(str(s.redis_url))
    try:
        now = [123_000]
        reporter = PlatformReporter(source, redis, s.topic_prefix, "az-a", ["m", "other"], lambda: now[0])
        assert await reporter.report_once() == 1  # "other" has no workload: nothing written for it
        fields = await redis.hgetall(names.platform_replicas(s.topic_prefix, "az-a"))
        truth = PlatformTruth(s)
        assert truth.set("az-a", fields) == []
        assert truth.readings[("m", "az-a")] == (4, 4, 123_000)
        api.inject(503, times=1, path="/deployments/vllm-m")  # a failed read writes nothing, and says so
        now[0] = 133_000
        assert await reporter.report_once() == 0 and reporter.failures == 1
    finally:
        await redis.aclose()


async def test_leaderworkerset_scale_annotation_and_status(api: KubeAPI) -> None:
    """A LeaderWorkerSet (multi-node serving: one replica = a leader and its workers) scales like the others."""
    api.auto_ready = False
    api.add_leaderworkerset("vllm-405b", namespace="llm", replicas=2, size=4)
    entry = {"model": "m", "zone": "az-a", "kind": "LeaderWorkerSet", "name": "vllm-405b", "namespace": "llm"}
    backend = _backend(api, entry)
    out = await backend.apply(_scale(3))
    lws = api.get("leaderworkerset.x-k8s.io/v1", "leaderworkersets", "vllm-405b", "llm")
    assert lws["spec"]["replicas"] == 3 and out["previous"] == 2 and out["annotated"] is True
    assert lws["metadata"]["annotations"][ANNOTATION_PREFIX + "target-replicas"] == "3"
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 4  # the scale write touched nothing else
    # The LWS controller reports 2 groups ready of 3 through the status subresource.
    status = k8s.CustomObjectsApi(_client(api)).patch_namespaced_custom_object_status(
        "leaderworkerset.x-k8s.io",
        "v1",
        "llm",
        "leaderworkersets",
        "vllm-405b",
        {"status": {"readyReplicas": 2, "replicas": 3}},
        _content_type="application/merge-patch+json",
    )
    assert status["spec"]["replicas"] == 3
    assert await backend.replicas("m", "az-a") == {"desired": 3, "ready": 2, "starting": 1}


async def test_the_k8s_backend_keeps_the_fleet_budget(api: KubeAPI, settings: Settings) -> None:
    """A key-holder test: total 100, two zones asking for 64 each through the k8s backend, as
    ``governor executor --zone Z`` builds it: the second is ``rejected: budget`` and its Deployment untouched."""
    import redis.asyncio as aioredis

    from executors.chain import BackendContext, build_backend
    from tests.integration.harness import signed
    from tests.integration.test_guardrails import _executor, _send, budget_set

    workloads = [
        {"model": "m", "zone": z, "kind": "Deployment", "name": f"vllm-m-{z}", "namespace": "llm"}
        for z in ("az-a", "az-b")
    ]
    s = settings.replace(
        zones=("az-a", "az-b"),
        max_replicas_total=100,
        models=(ModelSpec("m", max_replicas=128),),
        workloads=parse_workloads(workloads),
        k8s_api_url=api.url,
    )
    for z in s.zones:
        api.add_deployment(f"vllm-m-{z}", namespace="llm", replicas=2)
    assert await asyncio.to_thread(budget_set, s, "az-a=64", "az-b=36") == 0  # the operator's split
    redis = aioredis.Redis.from_url(str(s.redis_url))
    try:

        def executor(zone: str) -> Any:  # governor executor --zone Z --backend k8s
            ctx = BackendContext(redis, s.topic_prefix, zone, s, budget=FleetBudget.from_settings(s))
            return _executor(s, redis, zone, backend=build_backend(ctx, "k8s"))

        basis = [int(time.time() * 1000)]

        def scale(zone: str, target: int) -> bytes:
            basis[0] += 1  # each command newer than the last
            return signed(s, _scale(target, zone=zone, basis_ms=basis[0]))

        a, b = executor("az-a"), executor("az-b")
        for ex in (a, b):
            await ex.ensure_group()
        assert (await _send(a, scale("az-a", 64)))["outcome"] == "applied"
        res = await _send(b, scale("az-b", 64))
        assert res["outcome"] == "rejected", res
        assert res["reason"].startswith("budget: 64 replicas of m in az-b would make 64, above az-b's allowance 36")
        assert api.get("apps/v1", "deployments", "vllm-m-az-a", "llm")["spec"]["replicas"] == 64
        assert api.get("apps/v1", "deployments", "vllm-m-az-b", "llm")["spec"]["replicas"] == 2  # never asked
        # The platform refuses one (a 403): the reservation is given back.
        api.inject(403, times=1, path="/horizontalpodautoscalers")
        assert (await _send(b, scale("az-b", 30)))["outcome"] == "failed"
        assert await redis.hget(names.desired_replicas(s.topic_prefix, "az-b"), "m") == b"0"
        assert (await _send(b, scale("az-b", 30)))["outcome"] == "applied"
        # A decrease is asked of the platform, then recorded in the ledger.
        assert (await _send(a, scale("az-a", 10)))["outcome"] == "applied"
        assert await redis.hget(names.desired_replicas(s.topic_prefix, "az-a"), "m") == b"10"
        assert api.get("apps/v1", "deployments", "vllm-m-az-a", "llm")["spec"]["replicas"] == 10
    finally:
        await redis.aclose()
