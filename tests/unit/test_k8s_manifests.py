"""Every Kubernetes manifest under infra/k8s is valid, strictly, without a cluster or kubectl.

Each YAML document is validated against the schema of its kind in strict mode
(an unknown or misspelled field fails): built-in kinds against the Kubernetes
OpenAPI schemas of ``kubernetes-validate``, custom resources against their CRD
schemas vendored in ``tests/fixtures/crds/`` (``tests/k8s_schema.py`` says how
they are made strict).  A kind with neither schema fails.  Tests that misspell
one field, in built-in and in custom kinds, must fail, so the validator cannot
pass vacuously.

The rest cross-checks the manifests with each other and with their sources:
kustomizations list every file and only files that exist; the generated files
(``governor manifests``) equal the generator's output; RBAC grants what the
executors' backends call; the ServiceMonitor selects the metrics Service.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from governor.manifests import ALERTS, DASHBOARD, render, zones_from_configmap
from tests.k8s_schema import CRDS, UnknownKind, validate

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "infra" / "k8s"


# -- the manifests -----------------------------------------------------------------------


def _files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def _docs(path: Path) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc is not None:
            yield doc


def _objects() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{p.relative_to(K8S)}#{i}", d)
        for p in _files()
        if p.name != "kustomization.yaml"
        for i, d in enumerate(_docs(p))
    ]


def _kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in _objects() if d.get("kind") == kind]


OBJECTS = _objects()


def test_there_are_manifests_of_every_expected_kind() -> None:
    kinds = {d["kind"] for _, d in OBJECTS}
    assert {"Deployment", "Role", "RoleBinding", "ServiceAccount", "ServiceMonitor", "PrometheusRule"} <= kinds
    assert "NetworkPolicy" in kinds


@pytest.mark.parametrize(("where", "doc"), OBJECTS, ids=[w for w, _ in OBJECTS])
def test_manifest_is_valid_for_its_kind_strictly(where: str, doc: dict[str, Any]) -> None:
    try:
        validate(doc)
    except jsonschema.ValidationError as exc:
        at = ".".join(str(p) for p in exc.absolute_path)
        pytest.fail(f"{where} ({doc['kind']} {doc.get('metadata', {}).get('name')}): {at}: {exc.message}")
    except UnknownKind as exc:
        pytest.fail(f"{where}: {exc}")


# -- the validator is not vacuous ----------------------------------------------------------


def _first(kind: str) -> dict[str, Any]:
    return copy.deepcopy(_kind(kind)[0])


# (kind, how to break it, why it must fail); one comment per case.
MISSPELLINGS = [
    # Built-in kind: `replica` for `replicas` (strict OpenAPI schema of apps/v1).
    ("Deployment", lambda d: d["spec"].update(replica=d["spec"].pop("replicas"))),
    # Built-in kind, deep: a probe's `httpGet.paht` inside the pod template.
    (
        "Deployment",
        lambda d: d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"].update(paht="/"),
    ),
    # Custom kind: ServiceMonitor endpoint `prot` for `port` (vendored CRD schema, made strict).
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(prot="metrics")),
    # Custom kind, wrong type: PrometheusRule `for` must match the duration pattern.
    ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update({"for": "five minutes"})),
    # Custom kind, metadata: an unknown ObjectMeta field is refused as for built-in kinds.
    ("ServiceMonitor", lambda d: d["metadata"].update(lables={"a": "b"})),
]


@pytest.mark.parametrize(("kind", "breaks"), MISSPELLINGS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(MISSPELLINGS)])
def test_a_misspelled_field_fails_validation(kind: str, breaks: Any) -> None:
    doc = _first(kind)
    validate(doc)  # valid as committed
    breaks(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_a_scaledobject_with_a_misspelled_field_fails() -> None:
    doc: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x", "namespace": "llm"},
        "spec": {"scaleTargetRef": {"name": "w"}, "triggers": [{"type": "prometheus", "metadata": {"query": "1"}}]},
    }
    validate(doc)
    doc["spec"]["minReplicas"] = 1  # the HPA's name, not KEDA's minReplicaCount
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate(doc)


# Custom resources governor's backends act on but infra/k8s does not ship (the operator's own): an
# HTTPRoute the gateway backend patches and a LeaderWorkerSet the k8s backend scales.
HTTPROUTE: dict[str, Any] = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "llama2-70b-az-a", "namespace": "llm", "annotations": {"governor.io/intent": "{}"}},
    "spec": {
        "parentRefs": [{"name": "inference-gateway"}],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/v1"}}],
                "backendRefs": [
                    {"name": "llama2-70b-az-a", "port": 8000, "weight": 900},
                    {"name": "llama2-70b-az-b", "port": 8000, "weight": 100},
                ],
                "timeouts": {"request": "30s"},
            }
        ],
    },
}
LEADERWORKERSET: dict[str, Any] = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": "llama2-70b-az-a", "namespace": "llm"},
    "spec": {
        "replicas": 2,
        "leaderWorkerTemplate": {
            "size": 2,
            "workerTemplate": {
                "metadata": {"labels": {"app": "vllm"}},
                "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest"}]},
            },
        },
    },
}

# (document, how to break it); one comment per case.
CUSTOM_MISSPELLINGS = [
    # HTTPRoute backendRef `wieght` for `weight`.
    (HTTPROUTE, lambda d: d["spec"]["rules"][0]["backendRefs"][0].update(wieght=1)),
    # HTTPRoute weight above the CRD's maximum of 1,000,000.
    (HTTPROUTE, lambda d: d["spec"]["rules"][0]["backendRefs"][0].update(weight=2_000_000)),
    # LeaderWorkerSet `replica` for `replicas`.
    (LEADERWORKERSET, lambda d: d["spec"].update(replica=2)),
    # LeaderWorkerSet pod template: a container field misspelled (checked as the built-in PodSpec).
    (
        LEADERWORKERSET,
        lambda d: d["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0].update(
            imagePullPolice="Always"
        ),
    ),
]


@pytest.mark.parametrize(
    ("doc", "breaks"), CUSTOM_MISSPELLINGS, ids=[f"{d['kind']}-{i}" for i, (d, _) in enumerate(CUSTOM_MISSPELLINGS)]
)
def test_httproute_and_leaderworkerset_validate_and_refuse_misspellings(doc: dict[str, Any], breaks: Any) -> None:
    doc = copy.deepcopy(doc)
    validate(doc)
    breaks(doc)
    with pytest.raises(jsonschema.ValidationError):
        validate(doc)


def test_an_unknown_kind_fails() -> None:
    with pytest.raises(UnknownKind):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})
    with pytest.raises(UnknownKind):
        validate({"apiVersion": "v1", "kind": "ConfigMapp", "metadata": {"name": "w"}})


def test_every_vendored_crd_schema_is_documented_and_structural() -> None:
    readme = (CRDS / "README.md").read_text()
    schemas = sorted(CRDS.glob("*.json"))
    kinds = {p.name.split("_", 1)[1] for p in schemas}
    assert {"v1alpha1_scaledobject.json", "v1_servicemonitor.json", "v1_prometheusrule.json"} <= kinds
    assert {"v1_httproute.json", "v1_leaderworkerset.json"} <= kinds
    for path in schemas:
        assert path.name in readme, f"{path.name}: say in README.md where it came from"
        schema = json.loads(path.read_text())
        assert schema["type"] == "object" and {"apiVersion", "kind", "metadata"} <= set(schema["properties"])


# -- kustomizations ------------------------------------------------------------------------


def _kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def test_kustomization_resources_exist_and_list_every_manifest() -> None:
    listed: set[Path] = set()
    for kz in _kustomizations():
        doc = yaml.safe_load(kz.read_text())
        assert doc["kind"] == "Kustomization", kz
        for entry in doc.get("resources", []):
            target = (kz.parent / entry).resolve()
            assert target.exists(), f"{kz.relative_to(K8S)}: resource {entry!r} does not exist"
            if target.is_dir():
                assert (target / "kustomization.yaml").is_file(), f"{kz}: {entry} has no kustomization.yaml"
            listed.add(target)
    manifests = {p.resolve() for p in _files() if p.name != "kustomization.yaml"}
    unlisted = sorted(str(p.relative_to(K8S)) for p in manifests - listed)
    assert not unlisted, f"in no kustomization.yaml: {unlisted}"


# -- generated files -----------------------------------------------------------------------


def test_generated_manifests_equal_the_generator_output() -> None:
    zones = zones_from_configmap(K8S / "configmap.yaml")
    for rel, text in render(zones, ROOT).items():
        path = K8S / rel
        assert path.is_file(), f"{rel} missing: run `governor manifests`"
        assert path.read_text() == text, f"{rel} differs from the generator: run `governor manifests`"
    executors = sorted(p.name for p in K8S.glob("executor-*.yaml"))
    assert executors == sorted(f"executor-{z}.yaml" for z in zones), "an executor file per zone, no more"


def test_prometheusrule_groups_are_the_compose_alerts() -> None:
    (rule,) = _kind("PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load((ROOT / ALERTS).read_text())["groups"]


def test_dashboard_configmap_is_the_grafana_dashboard() -> None:
    cms = [d for d in _kind("ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert len(cms) == 1
    assert json.loads(cms[0]["data"]["governor.json"]) == json.loads((ROOT / DASHBOARD).read_text())


# -- pods, RBAC, monitoring --------------------------------------------------------------


def _pods(app: str | None = "governor") -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The Deployments whose pods are labelled ``app.kubernetes.io/name: app`` (None: every one).

    ``governor``: the worker and the executors, which serve the metrics port; ``governor-ingest``:
    the telemetry adapters (ingest-*.yaml), whose own tests are below.
    """
    deployments = _kind("Deployment")
    return [
        (d["metadata"]["name"], d["spec"]["template"], d)
        for d in deployments
        if app is None or d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == app
    ]


def test_probes_hit_the_health_endpoints_of_the_metrics_port() -> None:
    for name, tmpl, _ in _pods():
        for c in tmpl["spec"]["containers"]:
            assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}, name
            assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}, name
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], name
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, name


def test_only_executors_mount_an_api_token_and_run_the_real_backends() -> None:
    accounts = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in _kind("ServiceAccount")}
    executors = 0
    for name, tmpl, _ in _pods():
        spec = tmpl["spec"]
        cmd = spec["containers"][0]["command"]
        if cmd[:2] == ["governor", "executor"]:
            executors += 1
            assert "--backend" not in cmd, f"{name}: the real backends come from GOVERNOR_EXECUTOR_BACKENDS"
            assert spec["automountServiceAccountToken"] is True, name
            assert ("governor", spec["serviceAccountName"]) in accounts, name
        else:
            assert spec["automountServiceAccountToken"] is False, name
    assert executors >= 2
    (sa,) = [a for a in _kind("ServiceAccount") if a["metadata"]["name"] == "governor-executor"]
    assert sa.get("automountServiceAccountToken") is False, "opt in per pod (the executors), not per account"


# What the executors' backends call (executors/k8s.py, executors/gateway.py): (apiGroup, resource, verb).
REQUIRED_GRANTS = [
    ("apps", "deployments/scale", "patch"),  # k8s backend: the scale write
    ("apps", "deployments/scale", "get"),
    ("apps", "statefulsets/scale", "patch"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets/scale", "patch"),
    ("apps", "deployments", "get"),  # replica truth: status.readyReplicas
    ("apps", "statefulsets", "get"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "get"),
    ("", "pods", "list"),  # Pending pods
    ("autoscaling", "horizontalpodautoscalers", "list"),  # find an HPA on the workload
    ("apps", "deployments", "patch"),  # governor.io/* annotations
    ("autoscaling", "horizontalpodautoscalers", "patch"),  # coexist: the HPA's minReplicas
    ("gateway.networking.k8s.io", "httproutes", "get"),  # gateway backend
    ("gateway.networking.k8s.io", "httproutes", "patch"),
]


CLUSTER = "(cluster)"  # the namespace of a ClusterRoleBinding's grants


def _grants(account: str) -> set[tuple[str, str, str, str]]:
    """What ServiceAccount ``governor/account`` may do: (namespace or CLUSTER, apiGroup, resource, verb)."""
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in _kind("Role")}
    roles |= {(CLUSTER, r["metadata"]["name"]): r for r in _kind("ClusterRole")}
    grants: set[tuple[str, str, str, str]] = set()
    for rb in _kind("RoleBinding") + _kind("ClusterRoleBinding"):
        if not any(s["name"] == account and s["namespace"] == "governor" for s in rb["subjects"]):
            continue
        ns = rb["metadata"].get("namespace", CLUSTER)
        role = roles[(CLUSTER if rb["roleRef"]["kind"] == "ClusterRole" else ns, rb["roleRef"]["name"])]
        for rule in role["rules"]:
            grants |= {(ns, g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return grants


def _granted_to_executor() -> set[tuple[str, str, str]]:
    return {(g, r, v) for ns, g, r, v in _grants("governor-executor") if ns != CLUSTER}


@pytest.mark.parametrize("grant", REQUIRED_GRANTS, ids=["/".join(g) for g in REQUIRED_GRANTS])
def test_rbac_grants_the_executor_what_its_backends_call(grant: tuple[str, str, str]) -> None:
    assert grant in _granted_to_executor()


def test_rbac_grants_nothing_broader() -> None:
    grants = _granted_to_executor()
    assert not any("*" in g for g in grants), "no wildcards"
    writes = {(g, r) for g, r, v in grants if v in ("create", "update", "patch", "delete", "deletecollection")}
    allowed = {(g, r) for g, r, v in REQUIRED_GRANTS if v == "patch"}
    allowed |= {("apps", "deployments/scale"), ("apps", "statefulsets/scale")}
    allowed |= {("leaderworkerset.x-k8s.io", "leaderworkersets/scale")}
    allowed |= {("apps", "statefulsets"), ("leaderworkerset.x-k8s.io", "leaderworkersets")}
    assert writes <= allowed, writes - allowed


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_servicemonitor_scrapes_every_governor_pod() -> None:
    (sm,) = _kind("ServiceMonitor")
    services = [s for s in _kind("Service") if _matches(sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]
    assert len(services) == 1, "the ServiceMonitor selects exactly the metrics Service"
    (svc,) = services
    assert svc["metadata"]["namespace"] in sm["spec"]["namespaceSelector"]["matchNames"]
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= ports
    for name, tmpl, _ in _pods():
        assert _matches(svc["spec"]["selector"], tmpl["metadata"]["labels"]), f"{name} is not scraped"


# -- listeners: who may connect (issue 31, item 8) ----------------------------------------------


def _ingress_policies() -> list[dict[str, Any]]:
    return [p for p in _kind("NetworkPolicy") if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])]


def test_every_deployment_is_isolated_by_an_ingress_network_policy() -> None:
    """A pod no NetworkPolicy selects accepts every connection: each Deployment's pods are selected."""
    policies = _ingress_policies()
    assert policies
    for name, tmpl, doc in _pods(None):
        labels = tmpl["metadata"]["labels"]
        selecting = [
            p
            for p in policies
            if p["metadata"]["namespace"] == doc["metadata"]["namespace"]
            and not p["spec"]["podSelector"].get("matchExpressions")
            and _matches(p["spec"]["podSelector"].get("matchLabels", {}), labels)
        ]
        assert selecting, f"{name}: no NetworkPolicy selects its pods"


def test_network_policies_admit_only_prometheus_to_the_metrics_port() -> None:
    """Each rule names its peers (no empty `from`, no ipBlock, no empty selector) and only the
    port every selected container calls `metrics`: /metrics, /healthz and /readyz."""
    for policy in _ingress_policies():
        if policy["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/name") != "governor":
            continue  # the telemetry adapters' (below)
        rules = policy["spec"].get("ingress", [])
        assert rules, "a policy that admits nothing would fail Prometheus (the kubelet is exempt)"
        for rule in rules:
            assert rule.get("ports") == [{"port": "metrics", "protocol": "TCP"}], rule
            assert rule.get("from"), "an empty `from` admits every source"
            for peer in rule["from"]:
                assert set(peer) == {"namespaceSelector", "podSelector"}, peer
                assert peer["namespaceSelector"].get("matchLabels") and peer["podSelector"].get("matchLabels"), peer
                assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}
        for name, tmpl, _ in _pods():
            if _matches(policy["spec"]["podSelector"].get("matchLabels", {}), tmpl["metadata"]["labels"]):
                for c in tmpl["spec"]["containers"]:
                    assert {p["name"] for p in c.get("ports", [])} == {"metrics"}, f"{name}: a port no rule admits"


def test_pods_bind_the_metrics_port_on_the_pod_ip_explicitly() -> None:
    """The default is loopback (no auth); the probes and Prometheus dial the pod IP, so each pod
    spec sets GOVERNOR_METRICS_ADDR itself (not a shared ConfigMap another process could read)."""
    for cm in _kind("ConfigMap"):
        assert "GOVERNOR_METRICS_ADDR" not in (cm.get("data") or {}), cm["metadata"]["name"]
    for name, tmpl, _ in _pods():
        for c in tmpl["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env.get("GOVERNOR_METRICS_ADDR") == "0.0.0.0", f"{name}: set GOVERNOR_METRICS_ADDR in the pod spec"


# -- the telemetry adapters (issue 34, item 6) ---------------------------------------------------


def _adapter(subcommand: str) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """The one Deployment running ``governor ingest <subcommand>``: (its pod labels, pod spec, container)."""
    found = [
        (tmpl["metadata"]["labels"], tmpl["spec"], c)
        for _, tmpl, _ in _pods(None)
        for c in tmpl["spec"]["containers"]
        if c["command"][:3] == ["governor", "ingest", subcommand]
    ]
    assert len(found) == 1, f"want one Deployment running `governor ingest {subcommand}`, found {len(found)}"
    return found[0]


def _adapter_settings(container: dict[str, Any]) -> Any:
    """The Settings the container starts with: the ConfigMap it loads, then its own env."""
    from core.settings import Settings

    (cm,) = [d for d in _kind("ConfigMap") if d["metadata"]["name"] == "governor-env"]
    env = {**cm["data"], **{e["name"]: e["value"] for e in container.get("env", [])}}
    return Settings.from_env(env)


def test_the_scrape_adapter_discovers_the_engines_with_a_role_in_their_namespace() -> None:
    from governor.cli import build_parser

    _, pod, c = _adapter("scrape")
    settings = _adapter_settings(c)
    args = build_parser().parse_args(c["command"][1:])
    assert args.command == "ingest"
    ns = settings.scrape_k8s_namespace
    assert settings.scrape_k8s_selector and ns, "discovery by selector, in a namespace named in the pod spec"
    inference = {r["metadata"]["namespace"] for r in _kind("Role") if r["metadata"]["name"] == "governor-executor"}
    assert inference == {ns}, "the engines run where the executors scale the workloads"
    assert pod["automountServiceAccountToken"] is True and pod["serviceAccountName"] == "governor-ingest"
    grants = _grants(pod["serviceAccountName"])
    for verb in ("get", "list", "watch"):  # adapters/scrape/targets.py: list_namespaced_pod (watch cache)
        assert (ns, "", "pods", verb) in grants, verb
    assert (CLUSTER, "", "nodes", "get") in grants  # read_node: each pod's zone
    assert grants <= {(ns, "", "pods", v) for v in ("get", "list", "watch")} | {(CLUSTER, "", "nodes", "get")}
    assert "ports" not in c and "livenessProbe" not in c, "it serves nothing"


def test_the_otlp_receiver_listens_on_the_pod_ip_behind_its_service() -> None:
    from governor.cli import build_parser

    labels, pod, c = _adapter("otlp")
    args = build_parser().parse_args(c["command"][1:])
    _adapter_settings(c)
    assert args.host == "0.0.0.0"
    (port,) = c["ports"]
    assert port["containerPort"] == args.port
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": port["name"]}, probe
    assert pod["automountServiceAccountToken"] is False
    (svc,) = [s for s in _kind("Service") if s["spec"].get("selector") and _matches(s["spec"]["selector"], labels)]
    assert [p["targetPort"] for p in svc["spec"]["ports"]] == [port["name"]]
    admitted = [
        rule
        for p in _ingress_policies()
        if _matches(p["spec"]["podSelector"]["matchLabels"], labels)
        for rule in p["spec"].get("ingress", [])
    ]
    assert admitted and all(r["ports"] == [{"port": port["name"], "protocol": "TCP"}] for r in admitted)
    sources = [peer["namespaceSelector"]["matchLabels"] for r in admitted for peer in r["from"]]
    engines_ns = _adapter_settings(_adapter("scrape")[2]).scrape_k8s_namespace
    assert {"kubernetes.io/metadata.name": engines_ns} in sources, "the engines' exporters may send spans"


def test_the_scrape_adapter_admits_no_connection() -> None:
    labels, _, _ = _adapter("scrape")
    selecting = [p for p in _ingress_policies() if _matches(p["spec"]["podSelector"]["matchLabels"], labels)]
    assert selecting and all(not p["spec"].get("ingress") for p in selecting)
