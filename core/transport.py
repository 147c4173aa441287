"""How every governor client reaches Kafka and Redis: SASL, TLS, Redis AUTH (standard library only).

One place turns the transport settings (``KAFKA_SECURITY_PROTOCOL``,
``KAFKA_SASL_*``, ``KAFKA_SSL_*``, ``REDIS_TLS_*``) into the keyword
arguments of the clients, so the worker, the executors, the admin client,
the one-shot commands and the benchmarks all connect the same way:

- :func:`kafka_options` -> keyword arguments for ``AIOKafkaProducer``,
  ``AIOKafkaConsumer`` and ``AIOKafkaAdminClient`` (``security_protocol``,
  ``sasl_mechanism``, ``sasl_plain_username`` / ``_password``,
  ``ssl_context``); the Faust app maps the same settings to its
  ``broker_credentials`` (:mod:`streams.app`).
- :func:`redis_options` -> keyword arguments for ``Redis.from_url`` (the TLS
  files of a ``rediss://`` URL).  Redis AUTH and ACL users ride in the URL
  itself: ``redis://user:password@host:6379/0`` (``rediss://`` for TLS).
- :func:`transport_reason` -> why a combination cannot work (checked when
  the settings are built, so a bad one stops a process at start with one
  line, never at the first connection).

>>> from types import SimpleNamespace as S
>>> plain = S(kafka_security_protocol="PLAINTEXT", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="",
...           kafka_sasl_password="", kafka_ssl_cafile="", kafka_ssl_certfile="", kafka_ssl_keyfile="",
...           redis_url="redis://127.0.0.1:6379/0", redis_tls_ca_file="", redis_tls_cert_file="",
...           redis_tls_key_file="")
>>> kafka_options(plain)
{'security_protocol': 'PLAINTEXT'}
>>> redis_options(plain)
{}
>>> sasl = S(**{**vars(plain), "kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_username": "gov"})
>>> transport_reason(sasl)
'KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD'
>>> sasl.kafka_sasl_password = "pw"
>>> sorted(kafka_options(sasl).items())  # doctest: +NORMALIZE_WHITESPACE
[('sasl_mechanism', 'PLAIN'), ('sasl_plain_password', 'pw'), ('sasl_plain_username', 'gov'),
 ('security_protocol', 'SASL_PLAINTEXT')]
>>> transport_reason(S(**{**vars(plain), "redis_tls_ca_file": "/ca.pem"}))
'REDIS_TLS_CA_FILE is set but REDIS_URL is not rediss:// (TLS files need a TLS URL)'
"""

from __future__ import annotations

import os
from typing import Any

from governor_telemetry.security import TLS_PROTOCOLS, kafka_security_options

__all__ = ["kafka_options", "redis_options", "transport_reason"]


def transport_reason(s: Any) -> str | None:
    """Why these transport settings cannot work, or None when they can."""
    proto = s.kafka_security_protocol
    if proto.startswith("SASL_") and not (s.kafka_sasl_username and s.kafka_sasl_password):
        return f"KAFKA_SECURITY_PROTOCOL={proto} needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD"
    kafka_files = {
        "KAFKA_SSL_CAFILE": s.kafka_ssl_cafile,
        "KAFKA_SSL_CERTFILE": s.kafka_ssl_certfile,
        "KAFKA_SSL_KEYFILE": s.kafka_ssl_keyfile,
    }
    if proto not in TLS_PROTOCOLS:
        for name, value in kafka_files.items():
            if value:
                return f"{name} is set but KAFKA_SECURITY_PROTOCOL={proto} does not use TLS (SSL or SASL_SSL)"
    redis_files = {
        "REDIS_TLS_CA_FILE": s.redis_tls_ca_file,
        "REDIS_TLS_CERT_FILE": s.redis_tls_cert_file,
        "REDIS_TLS_KEY_FILE": s.redis_tls_key_file,
    }
    if not str(s.redis_url).startswith("rediss://"):
        for name, value in redis_files.items():
            if value:
                return f"{name} is set but REDIS_URL is not rediss:// (TLS files need a TLS URL)"
    for pair in (("KAFKA_SSL_CERTFILE", "KAFKA_SSL_KEYFILE"), ("REDIS_TLS_CERT_FILE", "REDIS_TLS_KEY_FILE")):
        files = {**kafka_files, **redis_files}
        if bool(files[pair[0]]) != bool(files[pair[1]]):
            return f"{pair[0]} and {pair[1]} go together (a client certificate needs its key)"
    for name, value in {**kafka_files, **redis_files}.items():
        if value and not os.path.isfile(value):
            return f"{name}={value}: no such file"
    return None


def kafka_options(s: Any) -> dict[str, Any]:
    """Keyword arguments that make an aiokafka client connect as the settings say."""
    opts: dict[str, Any] = kafka_security_options(
        protocol=s.kafka_security_protocol,
        mechanism=s.kafka_sasl_mechanism,
        username=s.kafka_sasl_username,
        password=str(s.kafka_sasl_password),
        cafile=s.kafka_ssl_cafile,
        certfile=s.kafka_ssl_certfile,
        keyfile=s.kafka_ssl_keyfile,
    )
    return opts


def redis_options(s: Any) -> dict[str, Any]:
    """Keyword arguments for ``Redis.from_url(settings.redis_url, **...)`` (TLS files of a rediss:// URL)."""
    if not str(s.redis_url).startswith("rediss://"):
        return {}
    opts: dict[str, Any] = {"ssl_cert_reqs": "required"}
    if s.redis_tls_ca_file:
        opts["ssl_ca_certs"] = s.redis_tls_ca_file
    if s.redis_tls_cert_file:
        opts["ssl_certfile"] = s.redis_tls_cert_file
        opts["ssl_keyfile"] = s.redis_tls_key_file
    return opts
