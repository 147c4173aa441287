"""The telemetry producer that inference nodes import.

Records are buffered per partition key ((model, zone), so one key's records
stay ordered on one partition) and shipped as one Kafka message per batch:
a batch goes out when it holds ``max_batch`` records or its oldest record is
``linger_ms`` old.  ``encoding="columns"`` ships a batch as columns (one
array per field, :mod:`governor_telemetry.columnar`), which the worker checks
and aggregates with numpy instead of a Python object per record;
``"typed"`` ships the columns as raw typed arrays behind a JSON header
(:mod:`governor_telemetry.typed`: the worker reads them in place, the
fastest to ingest; workers must be upgraded before producers send it); the
default ``"rows"`` ships one JSON object per record.  The buffer is bounded: when ``max_pending`` records are
waiting, :meth:`TelemetryProducer.send` waits (back-pressure) instead of
growing memory without limit; :meth:`TelemetryProducer.send_nowait` raises
:class:`BufferFull` instead, for callers that must never block.

Each record is checked, before it is buffered, with the rules ingest applies
(:func:`governor_telemetry.records.validate_record`): a record the worker
would dead-letter raises :class:`InvalidRecord` (a ``ValueError`` that names
the field) in the caller instead.  ``validate=False`` turns the check off, for
tests that put bad records on the wire on purpose.

Example::

    async with TelemetryProducer("127.0.0.1:9092", "governor.telemetry",
                                 source="node-17") as producer:
        await producer.send({"kind": "request", ...})

SASL and TLS come from the ``KAFKA_SECURITY_PROTOCOL`` / ``KAFKA_SASL_*`` /
``KAFKA_SSL_*`` variables (:mod:`governor_telemetry.security`), or from
``kafka_options=`` (aiokafka keyword arguments) when given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaProducer

from governor_telemetry.columnar import encode_columns, encode_typed
from governor_telemetry.records import FIELDS_BY_KIND, encode_envelope, partition_key, show, validate_record
from governor_telemetry.security import kafka_options_from_env, login_refused

log = logging.getLogger(__name__)


class BufferFull(RuntimeError):
    """send_nowait found ``max_pending`` records already waiting."""


# Names a reason of validate_record can be about: the fields, and the record's own keys.
_FIELD_NAMES = frozenset(name for table in FIELDS_BY_KIND.values() for name in table) | {
    "kind",
    "schema_version",
    "free_block_hist",
}


class InvalidRecord(ValueError):
    """A record that ingest would dead-letter, refused by the producer before it is buffered.

    ``reason`` is :func:`~governor_telemetry.records.validate_record`'s (the text the
    dead letter would carry), ``field`` the field it is about (None when it is about
    the record as a whole).

    >>> err = InvalidRecord("missing field 'request_id'", {"kind": "request", "model": "m"})
    >>> err.field, str(err)
    ('request_id', "invalid telemetry record (kind 'request', model 'm'): missing field 'request_id'")
    """

    def __init__(self, reason: str, record: Any) -> None:
        self.reason = reason
        self.field = next((w for w in re.findall(r"\w+", reason) if w in _FIELD_NAMES), None)
        where = ""
        if isinstance(record, Mapping):
            known = [f"{k} {show(record[k])}" for k in ("kind", "request_id", "model", "zone") if k in record]
            where = f" ({', '.join(known)})" if known else ""
        super().__init__(f"invalid telemetry record{where}: {reason}")


#: How a batch goes on the wire: one JSON object per record, one array per field, or typed arrays.
ENCODINGS = {"rows": encode_envelope, "columns": encode_columns, "typed": encode_typed}


class TelemetryProducer:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        source: str,
        linger_ms: int = 100,
        max_batch: int = 500,
        max_pending: int = 50_000,
        clock_ms: Any = None,
        kafka_options: Mapping[str, Any] | None = None,
        validate: bool = True,
        encoding: str = "rows",
    ) -> None:
        if linger_ms <= 0 or max_batch <= 0 or max_pending < max_batch:
            raise ValueError("need linger_ms > 0, max_batch > 0 and max_pending >= max_batch")
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {show(encoding)}")
        self.encoding = encoding
        self._encode = ENCODINGS[encoding]
        self.bootstrap = bootstrap
        self.topic = topic
        self.source = source
        self.linger_ms = linger_ms
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.validate = validate  # False: send records as they are (tests of the worker's dead letters)
        # SASL/TLS (governor_telemetry.security); None = from the KAFKA_* environment variables
        self.kafka_options = dict(kafka_options_from_env() if kafka_options is None else kafka_options)
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._buffers: dict[bytes, list[Mapping[str, Any]]] = {}
        self._first_ms: dict[bytes, float] = {}
        self._pending = 0
        self._space = asyncio.Condition()
        self._producer: AIOKafkaProducer | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent_records = 0
        self.sent_messages = 0

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap,
            linger_ms=5,
            acks=1,
            max_request_size=8 * 1024 * 1024,
            **self.kafka_options,
        )
        try:
            await self._producer.start()
        except Exception as exc:
            await self._producer.stop()
            self._producer = None
            refused = login_refused(exc, self.kafka_options)
            if refused is not None:
                raise refused from exc
            raise
        self._task = asyncio.create_task(self._flush_loop(), name="telemetry-flush")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._producer is not None:
            try:
                await self.flush()
            finally:
                await self._producer.stop()
                self._producer = None

    async def __aenter__(self) -> TelemetryProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def pending(self) -> int:
        return self._pending

    def _check(self, record: Mapping[str, Any]) -> None:
        if self.encoding != "rows" and not self.validate:
            # Even unchecked, a record must be one the columns can carry (encode_columns' rule).
            try:
                encode_columns([record], self.source, 0)
            except (ValueError, TypeError, AttributeError) as exc:  # AttributeError: not a mapping
                raise InvalidRecord(str(exc), record) from exc
        if self.validate:
            reason = validate_record(record)
            if reason is not None:
                raise InvalidRecord(reason, record)

    def _buffer(self, record: Mapping[str, Any]) -> bytes:
        if self._pending >= self.max_pending:
            raise BufferFull(f"{self._pending} records pending (max_pending={self.max_pending})")
        key = partition_key(str(record.get("model", "")), str(record.get("zone", "")))
        buf = self._buffers.setdefault(key, [])
        if not buf:
            self._first_ms[key] = time.monotonic() * 1000
        buf.append(record)
        self._pending += 1
        return key

    def send_nowait(self, record: Mapping[str, Any]) -> None:
        """Buffer one record; raises :class:`InvalidRecord` for a record ingest would
        dead-letter and :class:`BufferFull` when ``max_pending`` records are waiting."""
        self._check(record)
        self._buffer(record)

    async def send(self, record: Mapping[str, Any]) -> None:
        """Buffer one record; waits while the buffer is full (back-pressure).

        Raises :class:`InvalidRecord` (before any wait) for a record ingest would dead-letter.
        """
        self._check(record)
        if self._pending >= self.max_pending:
            async with self._space:
                await self._space.wait_for(lambda: self._pending < self.max_pending)
        key = self._buffer(record)
        if len(self._buffers.get(key, ())) >= self.max_batch:
            await self._ship(key)

    async def _ship(self, key: bytes) -> None:
        batch = self._buffers.pop(key, None)
        self._first_ms.pop(key, None)
        if not batch:
            return
        assert self._producer is not None, "producer not started"
        done = 0
        try:
            for i in range(0, len(batch), self.max_batch):
                chunk = batch[i : i + self.max_batch]
                payload = self._encode(chunk, self.source, self._clock_ms())
                await self._producer.send(self.topic, payload, key=key)
                done += len(chunk)
                self.sent_messages += 1
                self.sent_records += len(chunk)
        except BaseException:
            # Keep what did not go out, in order, ahead of newer records.
            self._buffers[key] = batch[done:] + self._buffers.get(key, [])
            self._first_ms[key] = time.monotonic() * 1000
            self._pending -= done
            raise
        self._pending -= len(batch)
        async with self._space:
            self._space.notify_all()

    async def flush(self) -> None:
        for key in list(self._buffers):
            await self._ship(key)
        if self._producer is not None:
            await self._producer.flush()

    async def _flush_loop(self) -> None:
        tick = self.linger_ms / 4000.0
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic() * 1000
            for key, first in list(self._first_ms.items()):
                if now - first >= self.linger_ms:
                    try:
                        await self._ship(key)
                    except Exception:  # broker trouble: keep the records, retry next tick
                        log.exception("telemetry flush to %s failed; retrying", self.topic)
