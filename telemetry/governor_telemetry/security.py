"""Kafka SASL and TLS options for the producer on inference nodes (standard library only).

The control plane reads the same variables through ``core.settings`` and
``core.transport``, which call :func:`kafka_security_options`, so a node's
producer and governor's own clients connect the same way:

``KAFKA_SECURITY_PROTOCOL`` (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL),
``KAFKA_SASL_MECHANISM`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512),
``KAFKA_SASL_USERNAME``, ``KAFKA_SASL_PASSWORD``, ``KAFKA_SSL_CAFILE``,
``KAFKA_SSL_CERTFILE``, ``KAFKA_SSL_KEYFILE``.

>>> kafka_options_from_env({})
{'security_protocol': 'PLAINTEXT'}
>>> opts = kafka_options_from_env({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
...     "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "KAFKA_SASL_USERNAME": "node", "KAFKA_SASL_PASSWORD": "pw"})
>>> opts["sasl_mechanism"], opts["sasl_plain_username"]
('SCRAM-SHA-256', 'node')
>>> kafka_options_from_env({"KAFKA_SECURITY_PROTOCOL": "TLS"})
Traceback (most recent call last):
...
ValueError: KAFKA_SECURITY_PROTOCOL=TLS: must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MECHANISMS",
    "PROTOCOLS",
    "TLS_PROTOCOLS",
    "KafkaLoginRefused",
    "kafka_options_from_env",
    "kafka_security_options",
    "login_refused",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
TLS_PROTOCOLS = ("SSL", "SASL_SSL")


def kafka_security_options(
    protocol: str = "PLAINTEXT",
    mechanism: str = "PLAIN",
    username: str = "",
    password: str = "",
    cafile: str = "",
    certfile: str = "",
    keyfile: str = "",
) -> dict[str, Any]:
    """Keyword arguments that make an aiokafka client connect with this protocol and these credentials."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"KAFKA_SECURITY_PROTOCOL={protocol}: must be one of {', '.join(PROTOCOLS)}")
    opts: dict[str, Any] = {"security_protocol": protocol}
    if protocol.startswith("SASL_"):
        if mechanism not in MECHANISMS:
            raise ValueError(f"KAFKA_SASL_MECHANISM={mechanism}: must be one of {', '.join(MECHANISMS)}")
        if not (username and password):
            raise ValueError(f"KAFKA_SECURITY_PROTOCOL={protocol} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD")
        opts.update(sasl_mechanism=mechanism, sasl_plain_username=username, sasl_plain_password=password)
    if protocol in TLS_PROTOCOLS:
        ctx = ssl.create_default_context(cafile=cafile or None)
        if certfile:
            ctx.load_cert_chain(certfile, keyfile or None)
        opts["ssl_context"] = ctx
    return opts


def kafka_options_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """:func:`kafka_security_options` from the ``KAFKA_*`` variables (``os.environ`` by default)."""
    env = os.environ if env is None else env
    return kafka_security_options(
        protocol=env.get("KAFKA_SECURITY_PROTOCOL") or "PLAINTEXT",
        mechanism=env.get("KAFKA_SASL_MECHANISM") or "PLAIN",
        username=env.get("KAFKA_SASL_USERNAME", ""),
        password=env.get("KAFKA_SASL_PASSWORD", ""),
        cafile=env.get("KAFKA_SSL_CAFILE", ""),
        certfile=env.get("KAFKA_SSL_CERTFILE", ""),
        keyfile=env.get("KAFKA_SSL_KEYFILE", ""),
    )


class KafkaLoginRefused(ConnectionError):
    """The brokers refused the SASL login: retrying with the same credentials cannot help."""


def login_refused(exc: BaseException, options: Mapping[str, Any]) -> KafkaLoginRefused | None:
    """A :class:`KafkaLoginRefused` if ``exc``, raised while a client started, is a refused SASL login.

    aiokafka raises ``SaslAuthenticationFailed`` or ``UnsupportedSaslMechanismError``; against a
    broker whose SCRAM error message it cannot parse (Tansu 0.6) it raises a bare ``KeyError``.
    """
    if not str(options.get("security_protocol", "")).startswith("SASL_"):
        return None
    name = type(exc).__name__
    if name not in ("SaslAuthenticationFailed", "UnsupportedSaslMechanismError", "KeyError"):
        return None
    user, mech = options.get("sasl_plain_username", ""), options.get("sasl_mechanism", "")
    return KafkaLoginRefused(
        f"the Kafka brokers refused the SASL login of KAFKA_SASL_USERNAME={user} with "
        f"KAFKA_SASL_MECHANISM={mech} ({name}: {exc}); check the user, its password and that the "
        "brokers offer this mechanism"
    )
