"""Create governor's topics up front, so producers and Faust agree on partitions; read the loop's output back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from governor_telemetry.security import login_refused

from core.settings import Settings
from core.transport import kafka_options

log = logging.getLogger(__name__)


async def ensure_topics(settings: Settings, timeout_s: float = 30.0) -> list[str]:
    names = settings.topics
    wanted = [
        NewTopic(name=t, num_partitions=1 if key == "deadletter" else settings.partitions, replication_factor=1)
        for key, t in names.items()
    ]
    deadline = asyncio.get_running_loop().time() + timeout_s
    options = kafka_options(settings)
    while True:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap, **options)
        try:
            try:
                await admin.start()
            except (KafkaError, KeyError) as exc:
                refused = login_refused(exc, options)
                if refused is not None:  # wrong credentials: retrying cannot help
                    raise refused from exc
                raise
            existing = set(await admin.list_topics())
            missing = [t for t in wanted if t.name not in existing]
            if missing:
                try:
                    await admin.create_topics(missing)
                except TopicAlreadyExistsError:
                    pass
            return [t.name for t in missing]
        except KafkaError as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise
            log.warning("creating topics failed (%s); retrying", exc)
            await asyncio.sleep(0.5)
        finally:
            await admin.close()


class Collector:
    """Reads the results, dead-letter and metrics topics for the report."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.results: list[dict[str, Any]] = []
        self.dead_letters: list[dict[str, Any]] = []
        self.windows: list[dict[str, Any]] = []
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        t = self.settings.topics
        self._consumer = AIOKafkaConsumer(
            t["results"],
            t["deadletter"],
            t["metrics"],
            bootstrap_servers=self.settings.kafka_bootstrap,
            **kafka_options(self.settings),
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=50,
        )
        await self._consumer.start()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        assert self._consumer is not None
        sink = {
            self.settings.topic("results"): self.results,
            self.settings.topic("deadletter"): self.dead_letters,
            self.settings.topic("metrics"): self.windows,
        }
        while True:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=5000)
            for tp, msgs in batches.items():
                for msg in msgs:
                    with contextlib.suppress(orjson.JSONDecodeError):
                        sink[tp.topic].append(orjson.loads(msg.value))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer:
            await self._consumer.stop()
