"""Create governor's topics up front, so producers and Faust agree on partitions."""

from __future__ import annotations

import asyncio
import logging

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
