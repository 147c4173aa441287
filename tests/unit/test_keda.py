"""The KEDA ScaledObjects in ``infra/k8s/keda/`` against the code and the cluster config (issue 16, item 3).

No KEDA runs here: the files are parsed and checked field by field against the
KEDA ``ScaledObject`` reference (keda.sh/docs, ``reference/scaledobject-spec``
and ``scalers/prometheus``), against the metric the worker exports
(:class:`streams.metrics_export.WorkerMetrics`) and against ``GOVERNOR_MODELS`` /
``GOVERNOR_ZONES`` of ``infra/k8s/configmap.yaml``.  Why each value is what it
is: ``infra/k8s/keda/README.md``.  ``tests/integration/test_keda_bridge.py``
runs each file's query on a real Prometheus scraping a real worker.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.settings import Settings
from streams.metrics_export import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
KEDA = ROOT / "infra" / "k8s" / "keda"
CONFIGMAP = ROOT / "infra" / "k8s" / "configmap.yaml"

# The query shape the bridge uses: one (model, zone) of the exported gauge, as one sample.
QUERY = re.compile(r'^max\((?P<metric>[a-z_]+)\{model="(?P<model>[^"]+)",zone="(?P<zone>[^"]+)"\}\)$')

# Field names of the ScaledObject CRD (keda.sh/v1alpha1, KEDA 2.x reference) used to catch typos:
# an unknown key is silently dropped by nothing -- the API server refuses it or ignores it.
SPEC_FIELDS = {
    "scaleTargetRef",
    "pollingInterval",
    "cooldownPeriod",
    "initialCooldownPeriod",
    "idleReplicaCount",
    "minReplicaCount",
    "maxReplicaCount",
    "fallback",
    "advanced",
    "triggers",
}
TRIGGER_FIELDS = {"type", "name", "metadata", "metricType", "useCachedMetrics", "authenticationRef"}
PROMETHEUS_FIELDS = {  # scalers/prometheus: trigger metadata
    "serverAddress",
    "query",
    "queryParameters",
    "threshold",
    "activationThreshold",
    "namespace",
    "customHeaders",
    "ignoreNullValues",
    "unsafeSsl",
}
HPA_CONFIG_FIELDS = {"name", "behavior"}


def scaled_objects() -> list[tuple[str, dict[str, Any]]]:
    """Every ScaledObject document under ``infra/k8s/keda/`` with its file name."""
    out = []
    for path in sorted(KEDA.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None and doc.get("kind") != "Kustomization":
                out.append((path.name, doc))
    return out


def query_of(doc: dict[str, Any]) -> str:
    """The Prometheus query of a ScaledObject's (only) trigger."""
    return str(doc["spec"]["triggers"][0]["metadata"]["query"])


def _cluster_settings() -> Settings:
    return Settings.from_env(yaml.safe_load(CONFIGMAP.read_text())["data"])


DOCS = scaled_objects()


def test_there_is_one_scaled_object_per_configured_model_and_zone() -> None:
    settings = _cluster_settings()
    want = {(m.name, z) for m in settings.models for z in settings.zones}
    have = []
    for name, doc in DOCS:
        match = QUERY.match(query_of(doc))
        assert match, f"{name}: query {query_of(doc)!r} is not max(<metric>{{model=...,zone=...}})"
        have.append((match["model"], match["zone"]))
    assert sorted(have) == sorted(want)
    # Each one scales the workload GOVERNOR_WORKLOADS maps its (model, zone) to: the same object in the same
    # namespace as the executors' k8s backend would scale (run one or the other on a workload, never both).
    mapped = {w.key: (w.kind, w.name, w.namespace) for w in settings.workloads}
    for name, doc in DOCS:
        match = QUERY.match(query_of(doc))
        assert match is not None
        ref = doc["spec"]["scaleTargetRef"]
        got = (ref.get("kind", "Deployment"), ref["name"], doc["metadata"]["namespace"])
        assert got == mapped[(match["model"], match["zone"])], (name, got)
    kustomization = yaml.safe_load((KEDA / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == {p.name for p in KEDA.glob("*.yaml")} - {"kustomization.yaml"}


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[n for n, _ in DOCS])
def test_a_scaled_object_follows_the_exported_target(name: str, doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "keda.sh/v1alpha1" and doc["kind"] == "ScaledObject"
    assert doc["metadata"]["name"] and doc["metadata"]["namespace"]
    spec = doc["spec"]
    assert set(spec) <= SPEC_FIELDS, set(spec) - SPEC_FIELDS
    assert spec["scaleTargetRef"]["name"]
    [trigger] = spec["triggers"]  # one trigger: governor's target, nothing to combine it with
    assert set(trigger) <= TRIGGER_FIELDS, set(trigger) - TRIGGER_FIELDS
    assert trigger["type"] == "prometheus"
    # desired = ceil(value / threshold) for AverageValue (the HPA's external per-pod metric): the target
    assert trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert set(meta) <= PROMETHEUS_FIELDS, set(meta) - PROMETHEUS_FIELDS
    assert all(isinstance(v, str) for v in meta.values()), "trigger metadata is a map of strings"
    assert meta["threshold"] == "1"
    assert meta["ignoreNullValues"] == "false"  # an empty result is an error (hold), not 0 (minimum)
    assert meta["serverAddress"].startswith(("http://", "https://"))
    match = QUERY.match(meta["query"])
    assert match is not None
    exported = {m.name for m in WorkerMetrics().registry.collect()}
    assert match["metric"] == "governor_replicas_target" and match["metric"] in exported
    # the model's bounds in GOVERNOR_MODELS, the ones the controller clamps to
    spec_model = _cluster_settings().model(match["model"])
    assert spec_model is not None
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (spec_model.min_replicas, spec_model.max_replicas)
    assert spec["minReplicaCount"] > 0  # never scaled to zero by KEDA's activation
    # a static fallback would scale to a fixed count on a query error: hold instead (README.md)
    fallback = spec.get("fallback")
    assert fallback is None or fallback.get("behavior") in ("currentReplicas", "currentReplicasIfHigher")
    hpa = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert set(hpa) <= HPA_CONFIG_FIELDS
    for direction in ("scaleUp", "scaleDown"):
        rule = hpa["behavior"][direction]
        assert rule["stabilizationWindowSeconds"] == 0, direction
        assert max(p["value"] for p in rule["policies"] if p["type"] == "Pods") >= spec["maxReplicaCount"], direction
