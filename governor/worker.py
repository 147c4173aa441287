"""``governor worker``: the Faust stream worker process."""

from __future__ import annotations

import logging
from pathlib import Path

from faust.worker import Worker

from core.clock import ScaledClock
from core.settings import Settings
from governor.processes import WORKER_READY
from streams.agents import build_pipeline
from streams.app import create_app

log = logging.getLogger(__name__)


def run_worker(settings: Settings) -> int:
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    clock = ScaledClock(settings.clock_speed, settings.clock_origin_s)
    pipeline = build_pipeline(app, settings, clock)
    pipeline.metrics.serve(settings.metrics_port, settings.metrics_addr)

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # Faust's receiver type requires signal=
    async def _assigned(sender, assigned, **kwargs) -> None:  # type: ignore[no-untyped-def]
        log.info("%s: %d partitions assigned", WORKER_READY, len(assigned))

    worker = Worker(
        app, loglevel=logging.getLevelName(logging.getLogger().level).lower(), redirect_stdouts=False, quiet=True
    )
    worker.execute_from_commandline()
    return 0
