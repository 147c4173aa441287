"""Transport settings (core.transport): every client, Faust included, connects the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from core.settings import Settings, SettingsError
from core.transport import kafka_options, redis_options
from streams.app import broker_credentials

SASL = {
    "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "KAFKA_SASL_USERNAME": "governor",
    "KAFKA_SASL_PASSWORD": "s3cret",
}


def _without_context(opts: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in opts.items() if k != "ssl_context" and v is not None}


@pytest.mark.parametrize(
    "env",
    [{}, SASL, {**SASL, "KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, {"KAFKA_SECURITY_PROTOCOL": "SSL"}],
    ids=["plaintext", "sasl", "sasl-ssl", "ssl"],
)
def test_faust_gets_the_same_connection_as_every_aiokafka_client(env: dict[str, str]) -> None:
    s = Settings.from_env(env)
    opts = kafka_options(s)
    faust_opts = credentials_to_aiokafka_auth(broker_credentials(s))  # what Faust hands aiokafka
    assert _without_context(dict(faust_opts)) == _without_context(opts)
    assert ("ssl_context" in opts) == (env.get("KAFKA_SECURITY_PROTOCOL", "").endswith("SSL"))
    assert (faust_opts.get("ssl_context") is not None) == ("ssl_context" in opts)


def test_the_password_never_prints() -> None:
    s = Settings.from_env(SASL)
    assert "s3cret" not in repr(s) and "s3cret" not in repr(broker_credentials(s))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"),
        ({"KAFKA_SSL_CAFILE": "/ca.pem"}, "does not use TLS"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CAFILE": "/nonexistent/ca.pem"}, "no such file"),
        ({"KAFKA_SECURITY_PROTOCOL": "SSL", "KAFKA_SSL_CERTFILE": __file__}, "go together"),
        ({"REDIS_TLS_CA_FILE": __file__}, "REDIS_URL is not rediss://"),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "choose one of"),
        ({"KAFKA_SASL_MECHANISM": "GSSAPI"}, "choose one of"),
    ],
)
def test_a_combination_that_cannot_work_stops_at_start_with_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


def test_redis_tls_files_reach_redis_py(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    s = Settings.from_env({"REDIS_URL": "rediss://gov:pw@redis:6380/0", "REDIS_TLS_CA_FILE": str(ca)})
    assert redis_options(s) == {"ssl_cert_reqs": "required", "ssl_ca_certs": str(ca)}
    assert redis_options(Settings.from_env({"REDIS_URL": "redis://gov:pw@redis:6379/0"})) == {}
