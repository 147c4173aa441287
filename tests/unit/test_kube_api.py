"""tests/kube_api.py, the shared Kubernetes API test server, through the official client.

If the official ``kubernetes`` client can list, get, watch and patch against it and gets
the typed objects and the ``ApiException`` statuses a real API server would give, the
code under test that uses the same client is exercised on the real wire format.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.kube_api import KubeAPI, parse_selector

pytestmark = pytest.mark.timeout(60)
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture
def api() -> Iterator[KubeAPI]:
    with KubeAPI() as server:
        yield server


@pytest.fixture
def k8s(api: KubeAPI) -> Iterator[client.ApiClient]:
    with client.ApiClient(api.client_configuration()) as c:
        yield c


def test_discovery_documents_parse_with_the_client(k8s: client.ApiClient) -> None:
    versions = client.CoreApi(k8s).get_api_versions()
    assert versions.versions == ["v1"]
    groups = {g.name: g.preferred_version.group_version for g in client.ApisApi(k8s).get_api_versions().groups}
    assert groups["apps"] == "apps/v1" and groups["autoscaling"] == "autoscaling/v2"
    resources = {r.name for r in client.AppsV1Api(k8s).get_api_resources().resources}
    assert {"deployments", "deployments/scale", "statefulsets/scale"} <= resources
    assert client.VersionApi(k8s).get_code().major == "1"


@pytest.mark.parametrize(
    "selector, want",
    [
        ("app=vllm", {"a", "b", "c"}),  # equality
        ("app==vllm,tier=gold", {"a"}),  # double equals, conjunction
        ("app=vllm,tier!=gold", {"b", "c"}),  # != also matches a missing label
        ("tier in (gold, silver)", {"a", "b"}),  # set-based
        ("app=vllm,tier notin (gold)", {"b", "c"}),
        ("tier", {"a", "b", "d"}),  # exists
        ("!tier", {"c"}),  # does not exist
        ("", {"a", "b", "c", "d"}),  # everything
    ],
)
def test_label_selectors_filter_pod_lists(api: KubeAPI, k8s: client.ApiClient, selector: str, want: set[str]) -> None:
    api.add_pod("a", labels={"app": "vllm", "tier": "gold"}, ip="10.0.0.1")
    api.add_pod("b", labels={"app": "vllm", "tier": "silver"}, ip="10.0.0.2")
    api.add_pod("c", labels={"app": "vllm"}, ip="10.0.0.3")
    api.add_pod("d", labels={"app": "sglang", "tier": "x"}, ip="10.0.0.4")
    api.add_pod("e", namespace="other", labels={"app": "vllm"}, ip="10.0.0.5")
    pods = client.CoreV1Api(k8s).list_namespaced_pod("default", label_selector=selector)
    assert {p.metadata.name for p in pods.items} == want
    assert pods.kind == "PodList" and int(pods.metadata.resource_version) > 0


def test_pod_and_node_fields_reach_the_typed_objects(api: KubeAPI, k8s: client.ApiClient) -> None:
    api.add_node("node-a", zone="az-a")
    api.add_pod("p", labels={"app": "vllm"}, ip="10.1.2.3", node="node-a", ready=False, port=8001)
    core = client.CoreV1Api(k8s)
    pod = core.list_namespaced_pod("default").items[0]
    assert pod.status.phase == "Running" and pod.status.pod_ip == "10.1.2.3" and pod.spec.node_name == "node-a"
    assert {c.type: c.status for c in pod.status.conditions}["Ready"] == "False"
    assert pod.spec.containers[0].ports[0].container_port == 8001
    node = core.read_node("node-a")
    assert node.metadata.labels["topology.kubernetes.io/zone"] == "az-a"
    by_field = core.list_namespaced_pod("default", field_selector="spec.nodeName=node-b")
    assert by_field.items == []
    assert len(core.list_pod_for_all_namespaces().items) == 1


def test_missing_objects_are_404_status_objects(k8s: client.ApiClient) -> None:
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(k8s).read_node("nope")
    assert err.value.status == 404
    body = err.value.body
    assert '"kind": "Status"' in body and '"reason": "NotFound"' in body and '"code": 404' in body
    with pytest.raises(ApiException) as err:
        client.AppsV1Api(k8s).read_namespaced_deployment_scale("nope", "default")
    assert err.value.status == 404 and 'deployments.apps \\"nope\\" not found' in err.value.body


@pytest.mark.parametrize("ctype", [MERGE, STRATEGIC])
@pytest.mark.parametrize("kind", ["deployment", "stateful_set"])
def test_scale_subresource_get_and_patch(api: KubeAPI, k8s: client.ApiClient, ctype: str, kind: str) -> None:
    if kind == "deployment":
        api.add_deployment("vllm", replicas=2, labels={"app": "vllm"})
    else:
        api.add_statefulset("vllm", replicas=2, labels={"app": "vllm"})
    apps = client.AppsV1Api(k8s)
    read = getattr(apps, f"read_namespaced_{kind}_scale")
    patch = getattr(apps, f"patch_namespaced_{kind}_scale")
    scale = read("vllm", "default")
    assert scale.kind == "Scale" and scale.api_version == "autoscaling/v1"
    assert scale.spec.replicas == 2 and scale.status.replicas == 2 and scale.status.selector == "app=vllm"
    out = patch("vllm", "default", {"spec": {"replicas": 5}}, _content_type=ctype)
    assert out.spec.replicas == 5 and int(out.metadata.resource_version) > int(scale.metadata.resource_version)
    workload = getattr(apps, f"read_namespaced_{kind}")("vllm", "default")
    assert workload.spec.replicas == 5 and workload.status.ready_replicas == 5
    assert workload.metadata.generation == 2 and workload.status.observed_generation == 2


def test_scale_patch_conflicts_and_bad_bodies(api: KubeAPI, k8s: client.ApiClient) -> None:
    api.add_deployment("vllm", replicas=2)
    apps = client.AppsV1Api(k8s)
    rv = apps.read_namespaced_deployment_scale("vllm", "default").metadata.resource_version
    apps.patch_namespaced_deployment_scale("vllm", "default", {"spec": {"replicas": 3}}, _content_type=MERGE)
    stale = {"metadata": {"resourceVersion": rv}, "spec": {"replicas": 4}}
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("vllm", "default", stale, _content_type=MERGE)
    assert err.value.status == 409 and '"reason": "Conflict"' in err.value.body
    # The client sends a dict as a strategic merge patch, a list as a JSON Patch.
    assert apps.patch_namespaced_deployment_scale("vllm", "default", {"spec": {"replicas": 4}}).spec.replicas == 4
    assert api.requests[-1][2] == STRATEGIC
    # A JSON Patch must be a list of operations (the client never sends it otherwise: raw request).
    url = f"{api.url}/apis/apps/v1/namespaces/default/deployments/vllm/scale"
    req = urllib.request.Request(url, b'{"spec": {"replicas": 4}}', method="PATCH")
    req.add_header("Content-Type", "application/json-patch+json")
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(req, timeout=5)
    assert raw.value.code == 400 and json.loads(raw.value.read())["kind"] == "Status"
    req = urllib.request.Request(url, b'{"spec": {"replicas": 4}}', method="PATCH")
    req.add_header("Content-Type", "text/plain")
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(req, timeout=5)
    assert raw.value.code == 415
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("vllm", "default", {"spec": {"replicas": -1}}, _content_type=MERGE)
    assert err.value.status == 422
    ops = [{"op": "replace", "path": "/spec/replicas", "value": 6}]
    assert apps.patch_namespaced_deployment_scale("vllm", "default", ops).spec.replicas == 6
    assert apps.read_namespaced_deployment("vllm", "default").spec.replicas == 6


def test_slow_rollout_status_is_set_by_the_test(k8s: client.ApiClient) -> None:
    with KubeAPI(auto_ready=False) as api, client.ApiClient(api.client_configuration()) as c:
        api.add_deployment("vllm", replicas=1)
        apps = client.AppsV1Api(c)
        apps.patch_namespaced_deployment_scale("vllm", "default", {"spec": {"replicas": 3}}, _content_type=MERGE)
        dep = apps.read_namespaced_deployment("vllm", "default")
        assert dep.spec.replicas == 3 and dep.status.ready_replicas == 1
        api.set_status("deployments", "vllm", readyReplicas=3, replicas=3)
        assert apps.read_namespaced_deployment("vllm", "default").status.ready_replicas == 3


def test_hpa_list_and_httproute_patch(api: KubeAPI, k8s: client.ApiClient) -> None:
    api.add_hpa("vllm", "vllm", min_replicas=2, max_replicas=8)
    hpas = client.AutoscalingV2Api(k8s).list_namespaced_horizontal_pod_autoscaler("default")
    assert [(h.spec.scale_target_ref.name, h.spec.max_replicas) for h in hpas.items] == [("vllm", 8)]
    api.add_httproute("llm", [("vllm-a", 8000, 50), ("vllm-b", 8000, 50)])
    custom = client.CustomObjectsApi(k8s)
    route = custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", "default", "httproutes", "llm")
    rules = route["spec"]["rules"]
    rules[0]["backendRefs"][0]["weight"] = 80
    rules[0]["backendRefs"][1]["weight"] = 20
    out = custom.patch_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", "default", "httproutes", "llm", {"spec": {"rules": rules}},
        _content_type=MERGE,
    )  # fmt: skip
    assert [b["weight"] for b in out["spec"]["rules"][0]["backendRefs"]] == [80, 20]
    assert out["kind"] == "HTTPRoute" and out["metadata"]["generation"] == 2


def test_watch_streams_added_modified_deleted(api: KubeAPI, k8s: client.ApiClient) -> None:
    api.add_pod("a", labels={"app": "vllm"})
    core = client.CoreV1Api(k8s)
    rv = core.list_namespaced_pod("default", label_selector="app=vllm").metadata.resource_version
    seen: list[tuple[str, str, str]] = []

    def changes() -> None:
        api.add_pod("b", labels={"app": "vllm"}, ip="10.0.0.2")
        api.add_pod("x", labels={"app": "other"}, ip="10.0.0.9")  # filtered out by the selector
        api.add_pod("b", labels={"app": "vllm"}, ip="10.0.0.2", ready=False)
        api.delete("v1", "pods", "a")

    threading.Timer(0.2, changes).start()
    w = watch.Watch()
    for ev in w.stream(
        core.list_namespaced_pod, "default", label_selector="app=vllm", resource_version=rv, timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].metadata.name, ev["object"].status.conditions[1].status))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "b", "True"), ("MODIFIED", "b", "False"), ("DELETED", "a", "True")]


def test_injected_faults_fail_the_next_calls_then_clear(api: KubeAPI, k8s: client.ApiClient) -> None:
    api.add_deployment("vllm")
    apps = client.AppsV1Api(k8s)
    # A 429 carries Retry-After, which urllib3 (under the client) honours by retrying: one is invisible.
    api.inject(429, times=1, path="/scale")
    assert apps.read_namespaced_deployment_scale("vllm", "default").spec.replicas == 1
    api.inject(403, times=1, path="/scale", method="GET")
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_deployment_scale("vllm", "default")
    assert err.value.status == 403 and '"reason": "Forbidden"' in err.value.body
    api.inject(500, times=1, path="/scale")
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_deployment_scale("vllm", "default", {"spec": {"replicas": 2}}, _content_type=MERGE)
    assert err.value.status == 500
    assert apps.read_namespaced_deployment_scale("vllm", "default").spec.replicas == 1
    assert sum(1 for _, p, _ in api.requests if "/scale" in p) == 5


def test_bad_selector_is_a_400() -> None:
    with pytest.raises(ValueError):
        parse_selector("a in b")


def test_watch_of_workload_status_follows_a_scale_write(api: KubeAPI, k8s: client.ApiClient) -> None:
    api.add_deployment("vllm", replicas=1)
    apps = client.AppsV1Api(k8s)
    rv = apps.list_namespaced_deployment("default").metadata.resource_version
    threading.Timer(
        0.2,
        lambda: apps.patch_namespaced_deployment_scale(
            "vllm", "default", {"spec": {"replicas": 4}}, _content_type=MERGE
        ),
    ).start()
    w = watch.Watch()
    for ev in w.stream(apps.list_namespaced_deployment, "default", resource_version=rv, timeout_seconds=5):
        assert ev["type"] == "MODIFIED"
        assert (ev["object"].spec.replicas, ev["object"].status.ready_replicas) == (4, 4)
        w.stop()
        break
    else:
        raise AssertionError("no watch event")
