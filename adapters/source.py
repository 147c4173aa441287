"""The telemetry source interface, and the table of sources ``governor ingest`` offers.

A source turns an engine's own telemetry into governor's records and produces them to
the telemetry topic.  Every source is a runner module that implements :class:`Source`
(``governor ingest NAME``: its parser and its run); a source that polls (the direct
scrape, PromQL) also implements :class:`Collector` and lets
:func:`adapters.scrape.runner.scrape_loop` pace it, while a pushed source (OTLP) serves
its own receiver.  The pure half of a source (exposition text or spans -> records) sits
beside its runner, e.g. :mod:`adapters.scrape.deltas` and :mod:`adapters.otlp.spans`.

Adding a source: a module with ``add_parser`` and ``run`` (plus its pure half), and one
line in :data:`SOURCES`.

>>> sorted(SOURCES)
['otlp', 'scrape']
>>> SOURCES["scrape"].run
'adapters.scrape.runner:run'
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from launch.commands import Command

if TYPE_CHECKING:
    from core.settings import Settings

__all__ = ["HELP", "SOURCES", "Collector", "Source", "source"]

HELP = "receive engine telemetry and produce governor records"


@runtime_checkable
class Source(Protocol):
    """A telemetry source as ``governor ingest NAME`` runs it (its runner module is one)."""

    def add_parser(self, ingest_sub: Any) -> None:
        """Register ``NAME`` and its flags under the ``governor ingest`` subcommands."""

    def run(self, settings: Settings, args: argparse.Namespace) -> int:
        """Receive or poll until stopped (SIGINT, SIGTERM); the exit code (2: a usage error)."""
        ...


class Collector(Protocol):
    """A polled source: one poll's worth of records (direct scrape or PromQL)."""

    settings: Settings

    async def collect(self, now_ms: int) -> list[dict[str, Any]]: ...


def source(module: str, help: str) -> Command:
    """The ``governor ingest`` command of the :class:`Source` in ``module`` (it produces to Kafka)."""
    return Command(help, run=f"{module}:run", parser=f"{module}:add_parser", needs=(True, False))


#: ``governor ingest NAME``, in help order: one line a source
SOURCES: dict[str, Command] = {
    "otlp": source("adapters.otlp.runner", "OTLP/HTTP trace receiver: engine request spans -> telemetry records"),
    "scrape": source("adapters.scrape.runner", "scrape vLLM/SGLang /metrics: histogram deltas -> telemetry records"),
}
