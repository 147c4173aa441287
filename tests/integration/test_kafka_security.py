"""Kafka SASL and TLS with governor's real clients against a real Tansu (tests/kafka_secure.py).

SASL: Tansu 0.6.0 with ``--authentication`` refuses governor's clients that
come without credentials, with PLAIN (not offered) or with SCRAM credentials
it does not know; it cannot store a SCRAM user at all (see tests/kafka_secure.py),
so a client with the right credentials cannot log in either: that test is a
strict xfail that turns into a failure the day the broker can do it.

TLS: governor's ``KAFKA_SECURITY_PROTOCOL=SSL`` + ``KAFKA_SSL_CAFILE``
clients (topic creation, the node's TelemetryProducer, a consumer) produce
and read back through a TLS listener whose certificate comes from a
throwaway CA; a client that does not trust that CA fails verification.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from governor_telemetry.producer import TelemetryProducer
from governor_telemetry.records import decode_envelope
from governor_telemetry.security import KafkaLoginRefused, kafka_security_options

from core.settings import Settings
from core.transport import kafka_options
from launch.embedded import free_port
from launch.topics import ensure_topics
from tests.kafka_secure import HOST, TlsFiles, TlsTerminator, make_tls_files, tansu, tansu_user_create

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

USER, PASSWORD = "node-a", "right-password"
# A refused SCRAM login: Tansu answers the client-final message with "e=unknown-user" and error code 0;
# aiokafka's SCRAM client then fails looking for the server signature ("v=") with KeyError('v').
# A refused PLAIN login or no SASL at all: Tansu closes the connection -> KafkaConnectionError.
REFUSED = (KafkaError, KeyError)
FAST = {"request_timeout_ms": 3000, "metadata_max_age_ms": 3000}


def _record(n: int = 0) -> dict[str, Any]:
    # A valid request record: the producer refuses what ingest would dead-letter.
    return {
        "kind": "request",
        "request_id": f"r{n}",
        "model": "llama2-70b",
        "zone": "az-a",
        "node": "node-a",
        "ts_ms": 1_000 + n,
        "ttft_ms": 12.5,
        "e2e_ms": 80.0,
        "status": "ok",
    }


async def _start(client: Any, timeout_s: float = 10.0) -> None:
    try:
        await asyncio.wait_for(client.start(), timeout_s)
    finally:
        close = getattr(client, "close", None) or client.stop
        await close()


# -- SASL -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sasl_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    with tansu(tmp_path_factory.mktemp("tansu-sasl"), authentication=True) as port:
        yield port


def _sasl_settings(port: int, mechanism: str, password: str) -> Settings:
    return Settings.from_env(
        {
            "KAFKA_BOOTSTRAP": f"{HOST}:{port}",
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_MECHANISM": mechanism,
            "KAFKA_SASL_USERNAME": USER,
            "KAFKA_SASL_PASSWORD": password,
        }
    )


@pytest.mark.xfail(
    strict=True,
    reason="Tansu 0.6.0 cannot store SCRAM users: `tansu user create` is refused by a broker with "
    "--authentication and is a no-op (dynostore) on one without, so every login is e=unknown-user",
)
async def test_right_scram_credentials_produce_and_read_back(sasl_port: int) -> None:
    created = tansu_user_create(sasl_port, USER, PASSWORD, "scram512")
    assert created.returncode == 0, created.stdout + created.stderr
    settings = _sasl_settings(sasl_port, "SCRAM-SHA-512", PASSWORD)
    topic = f"sec{uuid.uuid4().hex[:8]}"
    opts = kafka_security_options("SASL_PLAINTEXT", "SCRAM-SHA-512", USER, PASSWORD)
    async with TelemetryProducer(settings.kafka_bootstrap, topic, source="node-a", kafka_options=opts) as producer:
        await producer.send(_record())
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest", **kafka_options(settings)
    )
    await asyncio.wait_for(consumer.start(), 10)
    try:
        msg = await asyncio.wait_for(consumer.getone(), 10)
    finally:
        await consumer.stop()
    assert decode_envelope(msg.value)[0]["model"] == "llama2-70b"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
async def test_node_producer_with_wrong_password_is_refused(sasl_port: int, mechanism: str) -> None:
    opts = kafka_security_options("SASL_PLAINTEXT", mechanism, USER, "wrong-password")
    producer = TelemetryProducer(f"{HOST}:{sasl_port}", "telemetry", source="node-a", kafka_options={**opts, **FAST})
    with pytest.raises(KafkaLoginRefused, match=f"KAFKA_SASL_USERNAME={USER} with KAFKA_SASL_MECHANISM={mechanism}"):
        await asyncio.wait_for(producer.start(), 10)  # one clear error, not aiokafka's KeyError('v')
    await producer.stop()
    assert producer.sent_records == 0


async def test_admin_and_consumer_from_settings_with_wrong_password_are_refused(sasl_port: int) -> None:
    settings = _sasl_settings(sasl_port, "SCRAM-SHA-256", "wrong-password")
    opts = kafka_options(settings)
    assert opts["security_protocol"] == "SASL_PLAINTEXT" and opts["sasl_mechanism"] == "SCRAM-SHA-256"
    with pytest.raises(REFUSED):
        await _start(AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **opts, request_timeout_ms=3000))
    with pytest.raises(REFUSED):
        await _start(AIOKafkaConsumer("telemetry", bootstrap_servers=settings.kafka_bootstrap, **opts, **FAST))


async def test_ensure_topics_with_wrong_password_fails(sasl_port: int) -> None:
    settings = _sasl_settings(sasl_port, "SCRAM-SHA-512", "wrong-password")
    with pytest.raises(KafkaLoginRefused, match="refused the SASL login"):
        await asyncio.wait_for(ensure_topics(settings, timeout_s=30.0), 15)  # at once: retrying cannot help


@pytest.mark.parametrize(
    "opts",
    [
        pytest.param(kafka_security_options(), id="plaintext-no-sasl"),
        pytest.param(kafka_security_options("SASL_PLAINTEXT", "PLAIN", USER, PASSWORD), id="sasl-plain"),
    ],
)
async def test_client_without_scram_cannot_produce(sasl_port: int, opts: dict[str, Any]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=f"{HOST}:{sasl_port}", **opts, **FAST)
    with pytest.raises(KafkaConnectionError):
        await _start(producer)


# -- TLS --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TlsTerminator, TlsFiles]]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI makes the test certificates")
    base = tmp_path_factory.mktemp("tansu-tls")
    files = make_tls_files(base / "pki")
    tls_port = free_port()
    with tansu(base, advertised_port=tls_port) as port, TlsTerminator(tls_port, port, files) as terminator:
        yield terminator, files


def _tls_settings(terminator: TlsTerminator, ca: Path, tmp_path: Path) -> Settings:
    return Settings.from_env(
        {
            "KAFKA_BOOTSTRAP": f"{HOST}:{terminator.port}",
            "KAFKA_SECURITY_PROTOCOL": "SSL",
            "KAFKA_SSL_CAFILE": str(ca),
            "GOVERNOR_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}",
            "GOVERNOR_DATA_DIR": str(tmp_path / "state"),
        }
    )


async def test_tls_clients_with_the_ca_create_topics_produce_and_read_back(
    tls: tuple[TlsTerminator, TlsFiles], tmp_path: Path
) -> None:
    terminator, files = tls
    settings = _tls_settings(terminator, files.ca, tmp_path)
    created = await asyncio.wait_for(ensure_topics(settings, timeout_s=10.0), 20)
    assert set(created) == set(settings.topics.values())
    topic = settings.topics["telemetry"]

    node_opts = kafka_security_options("SSL", cafile=str(files.ca))
    async with TelemetryProducer(settings.kafka_bootstrap, topic, source="node-a", kafka_options=node_opts) as producer:
        for n in range(3):
            await producer.send(_record(n))
    assert producer.sent_records == 3

    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka_bootstrap, auto_offset_reset="earliest", **kafka_options(settings)
    )
    await asyncio.wait_for(consumer.start(), 10)
    try:
        records: list[Any] = []
        while len(records) < 3:
            msg = await asyncio.wait_for(consumer.getone(), 10)
            records += decode_envelope(msg.value)
    finally:
        await consumer.stop()
    assert sorted(r["ts_ms"] for r in records) == [1_000, 1_001, 1_002]
    assert terminator.handshakes > 0


async def test_tls_client_without_the_ca_fails_verification(
    tls: tuple[TlsTerminator, TlsFiles], caplog: pytest.LogCaptureFixture
) -> None:
    terminator, _ = tls
    before = len(terminator.handshake_errors)
    opts = kafka_security_options("SSL")  # system CAs only: the throwaway CA is not among them
    producer = AIOKafkaProducer(bootstrap_servers=f"{HOST}:{terminator.port}", **opts, **FAST)
    with caplog.at_level(logging.ERROR, logger="aiokafka"), pytest.raises(KafkaConnectionError):
        await _start(producer)
    # The client rejected the certificate (aiokafka logs why, then reports "Unable to bootstrap"),
    # and the listener saw that handshake end without a session.
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
    for _ in range(100):  # the listener's thread notes it a moment later
        if len(terminator.handshake_errors) > before:
            break
        await asyncio.sleep(0.02)
    assert len(terminator.handshake_errors) > before
