"""Prometheus metrics of an executor (served by ``governor executor`` with :func:`streams.health.serve`).

Metric names are a contract with ``infra/prometheus`` (alerts) and
``infra/grafana`` (dashboard); a test checks the dashboard against them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["ExecutorMetrics"]


class ExecutorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.outcomes = Counter(
            "governor_commands_applied_total", "commands by outcome", ("zone", "outcome"), registry=r
        )
        self.expired = Counter("governor_commands_expired_total", "commands refused as expired", ("zone",), registry=r)
        self.latency = Gauge(
            "governor_command_latency_seconds", "issue -> apply latency of the last command (s)", ("zone",), registry=r
        )
        self.paused = Gauge(
            "governor_executor_paused", "1 while governor pause holds this zone's commands", ("zone",), registry=r
        )
