"""Strict schema validation of Kubernetes objects, with no cluster and no kubectl.

``validate(doc)`` checks one object against the schema of its kind in strict mode (an unknown or
misspelled field fails, as ``kubectl apply`` with strict field validation would refuse it):

* built-in kinds (Deployment, Role, ...) against the Kubernetes OpenAPI schemas that
  ``kubernetes-validate`` ships (its ``-strict`` variants: every object ``additionalProperties:
  false``), for :data:`K8S_VERSION`;
* custom resources against the ``openAPIV3Schema`` of their CRD, vendored in
  ``tests/fixtures/crds/`` (its README names the upstream file of each).  CRD schemas are
  structural: the API server prunes fields a schema does not declare, and strict field
  validation turns each pruned field into an error.  :func:`strict` mirrors that by adding
  ``additionalProperties: false`` to every object schema that lists ``properties`` and is not
  marked ``x-kubernetes-preserve-unknown-fields``; ``metadata`` is checked as the built-in
  ``ObjectMeta``, as the API server does for every custom resource.  CEL rules
  (``x-kubernetes-validations``) are not evaluated.

A kind with neither schema raises :class:`UnknownKind`.  Used by tests/unit/test_k8s_manifests.py.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError
from referencing import Registry, Resource

__all__ = ["CRDS", "K8S_VERSION", "UnknownKind", "crd_schema_path", "strict", "validate"]

ROOT = Path(__file__).resolve().parents[1]
CRDS = ROOT / "tests" / "fixtures" / "crds"
# Oldest Kubernetes minor the manifests must be valid for (kubernetes-validate picks its schemas).
K8S_VERSION = "1.30"
DEFS_ID = "https://kubernetes.io/api/_definitions.json"
OBJECT_META = {"$ref": f"{DEFS_ID}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}


class UnknownKind(Exception):
    """Neither kubernetes-validate nor tests/fixtures/crds has a schema for this apiVersion/kind."""


def strict(schema: Any) -> Any:
    """A CRD schema with the API server's pruning as errors (a copy; the input is unchanged).

    >>> strict({"type": "object", "properties": {"a": {"type": "string"}}})["additionalProperties"]
    False
    >>> "additionalProperties" in strict({"type": "object", "x-kubernetes-preserve-unknown-fields": True,
    ...                                   "properties": {"a": {}}})
    False
    >>> strict({"type": "string", "nullable": True})["type"]
    ['string', 'null']
    """
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) if k not in ("enum", "default", "required", "example") else v for k, v in schema.items()}
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]  # OpenAPI 3.0 nullable: JSON Schema has no such keyword
    return out


@cache
def _definitions() -> Resource[Any]:
    """kubernetes-validate's strict definitions (ObjectMeta, PodTemplateSpec, ...) for K8S_VERSION."""
    from kubernetes_validate.utils import all_versions, schema_contents

    version = [v for v in all_versions() if v.rsplit(".", 1)[0] <= K8S_VERSION][-1]
    defs = schema_contents(f"kubernetes-json-schema/v{version}-local-strict/_definitions.json", version)
    return Resource.from_contents(defs)


def crd_schema_path(api_version: str, kind: str) -> Path:
    group, _, version = api_version.rpartition("/")
    return CRDS / f"{group}_{version}_{kind.lower()}.json"


@cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    path = crd_schema_path(api_version, kind)
    if not path.is_file():
        raise UnknownKind(f"no schema for {api_version} {kind}: not built in, and no {path.relative_to(ROOT)}")
    schema = strict(json.loads(path.read_text()))
    schema["properties"]["metadata"] = OBJECT_META
    registry: Registry[Any] = Registry().with_resource(DEFS_ID, _definitions())
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, registry=registry)


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError if ``doc`` is not valid for its kind, UnknownKind if none is known."""
    if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
        raise UnknownKind(f"not a Kubernetes object (apiVersion and kind): {str(doc)[:80]}")
    if "/" in doc["apiVersion"] and "." in doc["apiVersion"].split("/")[0]:
        path = crd_schema_path(doc["apiVersion"], doc["kind"])
        if path.is_file():
            _crd_validator(doc["apiVersion"], doc["kind"]).validate(doc)
            return
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except SchemaNotFoundError:
        _crd_validator(doc["apiVersion"], doc["kind"]).validate(doc)
