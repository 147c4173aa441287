"""The Faust application and its broker-facing configuration.

Faust hard-codes the worker consumer's ``fetch_max_wait_ms`` at 1,500 ms.
Brokers that hold a fetch for its whole wait (Tansu does even when data is
there) then cost ~1.1 s per hop.  :class:`GovernorApp` plugs in a transport
whose consumer thread sets the fetch wait from the settings after Faust has
built the aiokafka consumer and before it starts.  The override is plain
aiokafka configuration: the same code runs unchanged on Apache Kafka, where a
short fetch wait only means more, smaller fetch requests.
"""

from __future__ import annotations

import logging
from typing import Any

import aiokafka
import faust
from faust.transport.drivers import aiokafka as faust_aiokafka

from core.settings import Settings
from core.transport import kafka_options

log = logging.getLogger(__name__)


class _ConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    def _create_worker_consumer(self, transport: Any) -> aiokafka.AIOKafkaConsumer:
        consumer = super()._create_worker_consumer(transport)
        wait_ms = int(getattr(self.app, "fetch_max_wait_ms", 0) or 0)
        if wait_ms > 0:
            if not hasattr(consumer, "_fetch_max_wait_ms"):
                raise RuntimeError(
                    "aiokafka changed: AIOKafkaConsumer has no _fetch_max_wait_ms; "
                    "update streams/app.py for this aiokafka version"
                )
            consumer._fetch_max_wait_ms = wait_ms
        return consumer


class _Consumer(faust_aiokafka.Consumer):
    def _new_consumer_thread(self) -> _ConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _Transport(faust_aiokafka.Transport):
    Consumer = _Consumer


class GovernorApp(faust.App):
    """faust.App whose consumers use the configured fetch wait."""

    fetch_max_wait_ms: int = 0

    def _new_transport(self) -> Any:
        return _Transport(self.conf.broker_consumer, self)


def broker_credentials(settings: Settings) -> faust.auth.Credentials | None:
    """The Faust form of the Kafka transport settings (``core.transport`` gives aiokafka's)."""
    opts = kafka_options(settings)
    proto, ctx = opts["security_protocol"], opts.get("ssl_context")
    if proto.startswith("SASL_"):
        return faust.SASLCredentials(
            username=opts["sasl_plain_username"],
            password=opts["sasl_plain_password"],
            ssl_context=ctx,
            mechanism=opts["sasl_mechanism"],
        )
    if proto == "SSL":
        return faust.SSLCredentials(ctx)
    return None


def create_app(settings: Settings, app_id: str = "governor") -> GovernorApp:
    """Build the Faust app from the settings (never from the environment)."""
    app = GovernorApp(
        app_id,
        broker=f"kafka://{settings.kafka_bootstrap}",
        value_serializer="raw",
        key_serializer="raw",
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        # A group join takes ~half the session timeout; Faust's 60 s default
        # would stall every worker start by ~30 s.
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=max(1.0, settings.session_timeout_s / 5),
        broker_request_timeout=max(30.0, settings.session_timeout_s * 2),
        broker_commit_interval=1.0,
        consumer_auto_offset_reset="earliest",
        producer_linger_ms=5,
        web_enabled=settings.web_port > 0,
        web_port=settings.web_port or 6066,
        web_bind="127.0.0.1",
        datadir=settings.data_dir,
        table_standby_replicas=0,
        # A rebalance does not wait for every event in flight to be acknowledged: the ingest agent
        # holds telemetry unacknowledged until its windows close, which they do not while the
        # consumers are paused (streams.agents); its records are re-read from the committed offsets.
        stream_wait_empty=False,
        broker_credentials=broker_credentials(settings),
    )
    app.fetch_max_wait_ms = settings.fetch_max_wait_ms
    return app
