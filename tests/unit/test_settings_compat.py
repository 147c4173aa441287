"""Every ``GOVERNOR_*`` variable and config-file field of ac0d19c keeps working.

``tests/fixtures/settings_ac0d19c.schema.json`` is ``git show
ac0d19c:docs/settings.schema.json`` as it was published (78 fields): each of
its fields is set once through the environment (``Settings.from_env``) and
once through a config file (``Settings.load``), and must reach the field of
the same name with the value given.  Regrouping the settings into sections or
renaming a field fails here.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from core.settings import CODECS, Settings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "settings_ac0d19c.schema.json"
PUBLISHED: dict[str, Any] = json.loads(FIXTURE.read_text())["properties"]
_KINDS = {f.name: f.metadata["kind"] for f in dataclasses.fields(Settings)}
KEY = "k1:" + bytes(range(32)).hex()

# Values that need more than their schema says (files, JSON objects, cross-field rules).
_SAMPLES: dict[str, Any] = {
    "kafka_bootstrap": "broker:9093",
    "redis_url": "redis://cache:6380/1",
    "models": [{"name": "m1", "ttft_slo_ms": 500.0, "classes": {"trading": {"ttft_slo_ms": 200.0}}}],
    "pid_gains": {"kp": 0.5, "ki": 0.05},
    "command_keys": KEY,
    "fallbacks": [["big", "small"]],
    "zones": ["eu-1", "eu-2"],
    "scrape_endpoints": ["http://e:8000/metrics=az-a"],
    "scrape_model_map": ["served=llama2-70b"],
    "workloads": [{"model": "llama2-70b", "zone": "az-a", "kind": "Deployment", "name": "d", "namespace": "ns"}],
    "gateway_routes": [
        {"family": "llama2-70b", "zone": "az-a", "route": "llm", "backends": {"llama2-70b|az-a": {"name": "svc"}}}
    ],
    "webhook_hmac_key": bytes(range(32)).hex(),
}
# Fields whose value must come with others (a SASL protocol needs its user; TLS files need their protocol).
_COMPANIONS: dict[str, dict[str, Any]] = {
    "kafka_security_protocol": {"kafka_sasl_username": "u", "kafka_sasl_password": "p"},
    "kafka_ssl_cafile": {"kafka_security_protocol": "SSL"},
    "kafka_ssl_certfile": {"kafka_security_protocol": "SSL", "kafka_ssl_keyfile": "@file"},
    "kafka_ssl_keyfile": {"kafka_security_protocol": "SSL", "kafka_ssl_certfile": "@file"},
    "redis_tls_ca_file": {"redis_url": "rediss://cache:6380/0"},
    "redis_tls_cert_file": {"redis_url": "rediss://cache:6380/0", "redis_tls_key_file": "@file"},
    "redis_tls_key_file": {"redis_url": "rediss://cache:6380/0", "redis_tls_cert_file": "@file"},
}
_FILES = {
    "gains_file": json.dumps({"gains": {"ki": 0.07}}),
    "command_keys_file": KEY + "\n",
}
_FILE_FIELDS = {
    "kafka_ssl_cafile",
    "kafka_ssl_certfile",
    "kafka_ssl_keyfile",
    "redis_tls_ca_file",
    "redis_tls_cert_file",
    "redis_tls_key_file",
    "command_keys_file",
    "gains_file",
    "webhook_hmac_key_file",
    "webhook_auth_file",
    "webhook_ca_file",
}


def _sample(name: str, prop: dict[str, Any]) -> Any:
    """A valid value of a published field, unlike its default."""
    if name in _SAMPLES:
        return _SAMPLES[name]
    default = prop.get("default")
    if "enum" in prop:
        return next(c for c in reversed(prop["enum"]) if c != default)
    kind = prop["type"]
    if kind == "boolean":
        return not default
    if kind == "integer":
        return int(default) + 1
    if kind == "number":
        return 2 * default if default else 1.0
    if kind == "string":
        return "x"
    raise AssertionError(f"no sample for {name} ({kind}): add one to _SAMPLES")


def _values(name: str, tmp_path: Path) -> dict[str, Any]:
    """``name``'s sample and its companions, with file fields pointing at files that exist."""
    values = {name: _sample(name, PUBLISHED[name]), **_COMPANIONS.get(name, {})}
    for key in values:
        if key in _FILE_FIELDS:
            path = tmp_path / key
            path.write_text(_FILES.get(key, "secret\n"))
            values[key] = str(path)
    return values


def _env_text(name: str, value: Any) -> str:
    """The environment form of a config-file value of field ``name``."""
    codec = CODECS[_KINDS[name]]
    return str(codec.format(codec.load(value)))


def test_the_fixture_is_the_published_schema() -> None:
    assert len(PUBLISHED) == 78
    assert all(p["x-env"] for p in PUBLISHED.values())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_published_variable_is_read_from_the_environment(name: str, tmp_path: Path) -> None:
    values = _values(name, tmp_path)
    env = {PUBLISHED[k]["x-env"]: _env_text(k, v) for k, v in values.items()}
    settings, sources = Settings.load(env)
    assert sources[name] == "env"
    assert settings.to_env()[PUBLISHED[name]["x-env"]] == env[PUBLISHED[name]["x-env"]]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_published_field_is_read_from_a_config_file(name: str, tmp_path: Path) -> None:
    values = _values(name, tmp_path)
    path = tmp_path / "governor.yaml"
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    settings, sources = Settings.load({}, str(path))
    assert sources[name] == "file"
    assert settings.to_env()[PUBLISHED[name]["x-env"]] == _env_text(name, values[name])
