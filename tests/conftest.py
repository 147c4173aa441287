"""Shared fixtures.  Integration tests get the real embedded broker and Redis,
started once per session by the project's own launcher (or the ones named by
KAFKA_BOOTSTRAP / REDIS_URL), and a unique topic/key prefix per test.  Tests of real engines
(marked ``engines``) get the engine python and the tiny model made by the project's own
``engines.setup``, once per session.

Property tests run derandomised, everywhere (the ``ci`` hypothesis profile): the same
examples on every run, so a failure is never a matter of the draw; the failing examples
found so far are pinned with ``@example`` beside their tests."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from core.settings import Settings
from launch.embedded import EmbeddedServers

hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.load_profile("ci")


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    base = tmp_path_factory.mktemp("servers")
    settings = Settings(data_dir=str(base / "state"))
    with EmbeddedServers(settings, os.environ, log_dir=base) as s:
        yield s.settings


@pytest.fixture
def settings(servers: Settings, tmp_path: Path) -> Settings:
    """Real servers, a fresh topic/key namespace, short windows, clock at 1x."""
    return servers.replace(
        topic_prefix=f"t{uuid.uuid4().hex[:10]}",
        data_dir=str(tmp_path / "state"),
        window_s=1.0,
        lateness_s=0.5,
        partitions=2,
        clock_origin_s=time.time(),
    )


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The Python that runs real engines: GOVERNOR_ENGINE_PYTHON, or the engine venv under
    GOVERNOR_ENGINE_HOME, made here if ``python3 dev.py test`` did not make it first.  A failed
    install fails only the tests that use it, each with pip's last lines (pytest keeps the error
    of a session fixture: it does not try again for every test)."""
    from engines.setup import engine_python as find

    return find(Settings.from_env(os.environ))


@pytest.fixture(scope="session")
def tiny_model(engine_python: Path) -> Path:
    """The tiny model of seed 0 under the engine home (made once, then its stamp says it is current)."""
    from engines.setup import engine_home, ensure_model

    return ensure_model(engine_python, engine_home(Settings.from_env(os.environ)), seed=0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-engine files first (a stable sort, so each file stays whole and in order): the two test
    processes (`--dist loadfile`) then run them beside the rest of the suite, not after it.  Run last,
    they made a 2-core CI run 22 minutes long, its last 7 spent on one file with the other process idle.
    The files marked ``realtime`` (a live loop at a trace speed-up, held against the fast loop) last: beside
    the real engines they lost the cores and failed (0.35 of the windows within one replica, alone 0.96+)."""
    items.sort(
        key=lambda item: 0 if item.get_closest_marker("engines") else 2 if item.get_closest_marker("realtime") else 1
    )
