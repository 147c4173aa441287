"""Prometheus metrics of the stream worker (the executors' are :mod:`executors.metrics`).

Metric names are a contract with ``infra/prometheus`` (alerts) and
``infra/grafana`` (dashboard); a test checks the dashboard against them.
Each process owns a registry (no global state, so tests can build several).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from core.vocab import DEAD_LETTER_KINDS
from loop.deadletters import dead_letter_kind
from streams.health import HealthServer, Readiness, build_info, serve

_LABELS = ("model", "zone")
_STAGES = ("network", "preprocess", "decode")  # the window record's {stage}_p50_ms / _p95_ms
_BREAKER_VALUES = {"closed": 0.0, "half_open": 1.0, "open": 2.0}  # governor_breaker_state


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.build_info = build_info(r)  # governor_build_info{version,python} 1
        self.p50 = Gauge(
            "governor_latency_p50_seconds", "end-to-end latency P50 of the last window (s)", _LABELS, registry=r
        )
        self.p95 = Gauge(
            "governor_latency_p95_seconds", "end-to-end latency P95 of the last window (s)", _LABELS, registry=r
        )
        self.p99 = Gauge(
            "governor_latency_p99_seconds", "end-to-end latency P99 of the last window (s)", _LABELS, registry=r
        )
        self.ttft_p95 = Gauge(
            "governor_ttft_p95_seconds", "time-to-first-token P95 of the last window (s)", _LABELS, registry=r
        )
        self.ttft_slo = Gauge(
            "governor_ttft_slo_seconds", "the model's time-to-first-token SLO (s), beside its P95", _LABELS, registry=r
        )
        self.violation = Gauge(
            "governor_slo_violation_rate", "share of requests missing their SLO", _LABELS, registry=r
        )
        self.unfixable = Gauge(
            "governor_slo_unfixable_rate",
            "share of requests over their TTFT SLO even without waiting (no replica count fixes them; "
            "the scaler's feedback leaves them out)",
            _LABELS,
            registry=r,
        )
        self.stage_unfixable = Gauge(
            "governor_slo_stage_unfixable_rate",
            "share of requests over their TTFT SLO that their network and preprocess time explain "
            "(a slow stage, not queueing: the scaler adds no replicas for them)",
            _LABELS,
            registry=r,
        )
        # The window's stage latencies (controllers.window_fields.STAGE_COLUMNS), one gauge per quantile as
        # for the end-to-end latency: a "quantile" label is a summary's (promtool check metrics).
        self.stage_latency = {
            q: Gauge(
                name,
                f"a request stage's latency {q.upper()} in the last window (stage: network, preprocess, decode)",
                ("model", "zone", "stage"),
                registry=r,
            )
            for q, name in (
                ("p50", "governor_stage_latency_p50_seconds"),
                ("p95", "governor_stage_latency_p95_seconds"),
            )
        }
        self.rate = Gauge("governor_request_rate_rps", "requests per second in the last window", _LABELS, registry=r)
        # Counters for burn-rate alerts (rate() over any range): requests and SLO violations per closed window.
        self.requests_total = Counter("governor_requests_total", "requests in closed zone windows", _LABELS, registry=r)
        self.violations_total = Counter(
            "governor_slo_violations_total",
            "requests that missed their SLO, in closed zone windows",
            _LABELS,
            registry=r,
        )
        self.queue = Gauge("governor_queue_len", "mean queued requests per replica", _LABELS, registry=r)
        self.gpu_util = Gauge("governor_gpu_util", "mean GPU utilisation", _LABELS, registry=r)
        self.ready = Gauge("governor_replicas_ready", "replicas serving", _LABELS, registry=r)
        self.starting = Gauge("governor_replicas_starting", "replicas loading", _LABELS, registry=r)
        self.target = Gauge(  # set every zone window and on restore (ControlLoop.export_targets); KEDA follows it
            "governor_replicas_target", "the scaler's current replica target", _LABELS, registry=r
        )
        self.capacity = Gauge(  # beside the target: the capacity the feedforward sized it with
            "governor_replica_capacity_rps",
            "one replica's capacity the feedforward sizes with (learned online, the profile as prior)",
            _LABELS,
            registry=r,
        )
        self.admission_feasible = Gauge(
            "governor_admission_feasible",
            "1 while an orchestrator's admitted periodic tasks meet their deadlines at the measured P99",
            ("orchestrator",),
            registry=r,
        )
        self.admission_margin = Gauge(
            "governor_admission_margin",
            "critical scaling factor of an orchestrator's admitted tasks (latency may grow by this factor)",
            ("orchestrator",),
            registry=r,
        )
        self.records = Counter("governor_records_total", "telemetry records read", registry=r)
        self.telemetry_messages = Counter(
            "governor_telemetry_messages",
            "telemetry messages decoded, by encoding (rows, columns, typed: GOVERNOR_TELEMETRY_ENCODING, "
            "TelemetryProducer(encoding=)); a message that does not decode is its dead letter",
            ("encoding",),
            registry=r,
        )
        for encoding in ("rows", "columns", "typed"):
            self.telemetry_messages.labels(encoding)
        self.ingest_batches = Counter(  # streams.agents.Worker.ingest: many messages a batch under load
            "governor_ingest_batches_total", "telemetry batches the ingest agent took", registry=r
        )
        self.deadletters = Counter(
            "governor_deadletter_total",
            "records sent to the dead-letter topic, by kind (core.vocab.DEAD_LETTER_KINDS)",
            ("reason",),
            registry=r,
        )
        for kind in DEAD_LETTER_KINDS:  # a fixed set of series, each from 0
            self.deadletters.labels(kind)
        self.windows = Counter("governor_windows_closed_total", "windows closed", ("scope",), registry=r)
        self.node_cap_dropped = Counter(
            "governor_window_node_cap_dropped",
            "telemetry records of nodes a (model, zone) window had no slot for (GOVERNOR_MAX_NODES_PER_WINDOW)",
            _LABELS,
            registry=r,
        )
        self.commands = Counter("governor_commands_issued_total", "commands published", ("kind", "zone"), registry=r)
        self.bridged = Counter("governor_commands_bridged_total", "commands written to Redis", ("zone",), registry=r)
        self.events = Counter(
            "governor_control_events_total", "drift detections and mode switches", ("kind", "signal"), registry=r
        )
        self.ff_mode = Gauge("governor_feedforward_mode", "1 while feedforward drives the level", _LABELS, registry=r)
        self.stale = Gauge(
            "governor_telemetry_stale",
            "1 while a (model, zone)'s telemetry is missing (requests, GPU samples or every window): the loop holds",
            _LABELS,
            registry=r,
        )
        self.sde = Gauge(
            "governor_latency_sde",
            "online OU fit of TTFT P50 (theta 1/s, mu ms, sigma)",
            ("model", "zone", "param"),
            registry=r,
        )
        self.redis_retries = Counter("governor_redis_retries_total", "Redis writes retried", registry=r)
        self.agent_crashes = Counter(  # streams.boundary.AgentWatch: /readyz 503 until the agent runs again
            "governor_agent_crashes_total",
            "agent bodies that raised (Faust restarts the agent)",
            ("agent",),
            registry=r,
        )
        self.snapshots_ignored = Counter(
            "governor_snapshots_ignored_total",
            "learned-state snapshots refused at start (unauthenticated, unreadable, version, scope, stale)",
            ("reason",),
            registry=r,
        )
        self.snapshots_restored = Counter(
            "governor_snapshots_restored_total", "learned-state snapshots restored at start", registry=r
        )
        self.breaker_state = Gauge(
            "governor_breaker_state",
            "circuit breaker of a model|zone target: 0 closed, 1 half_open, 2 open",
            _LABELS,
            registry=r,
        )
        self.breaker_transitions = Counter(
            "governor_breaker_transitions_total",
            "circuit breaker state changes, by the state entered",
            ("model", "zone", "state"),
            registry=r,
        )
        self.agent_weight = Gauge(
            "governor_agent_weight",
            "last published mixed-agent weight (docs/model.md §15 (agents)) of a path: rag, tool or llm",
            ("model", "zone", "path"),
            registry=r,
        )

    def observe_window(self, m: Mapping[str, Any]) -> None:
        self.windows.labels(m["scope"]).inc()
        if m["scope"] != "zone":
            return
        lab = (m["model"], m["zone"])
        if m.get("node_cap_dropped"):  # the window's one node-cap dead letter and the records it counts
            self.deadletters.labels("too many nodes").inc()
            self.node_cap_dropped.labels(*lab).inc(m["node_cap_dropped"])
        count = m.get("count") or 0
        if count > 0:
            self.requests_total.labels(*lab).inc(count)
            self.violations_total.labels(*lab).inc(round(count * float(m.get("violation_rate") or 0.0)))
        for gauge, key, scale in (  # window records carry ms; Prometheus wants base units (seconds)
            (self.p50, "e2e_p50_ms", 1e-3),
            (self.p95, "e2e_p95_ms", 1e-3),
            (self.p99, "e2e_p99_ms", 1e-3),
            (self.ttft_p95, "ttft_p95_ms", 1e-3),
            (self.ttft_slo, "ttft_slo_ms", 1e-3),
            (self.violation, "violation_rate", 1.0),
            (self.unfixable, "unfixable_rate", 1.0),
            (self.stage_unfixable, "stage_unfixable_rate", 1.0),
            (self.rate, "rate_rps", 1.0),
            (self.queue, "queue_len_mean", 1.0),
            (self.gpu_util, "gpu_util_mean", 1.0),
            (self.ready, "replicas_ready", 1.0),
            (self.starting, "replicas_starting", 1.0),
        ):
            value = m.get(key)
            if value is not None:
                gauge.labels(*lab).set(float(value) * scale)
        for stage in _STAGES:
            for q, gauge in self.stage_latency.items():
                value = m.get(f"{stage}_{q}_ms")
                if value is not None:
                    gauge.labels(*lab, stage).set(float(value) * 1e-3)

    def observe_breaker(self, model: str, zone: str, state: str, *, changed: bool) -> None:
        """A target's breaker state after a window; ``changed`` counts a transition."""
        self.breaker_state.labels(model, zone).set(_BREAKER_VALUES[state])
        if changed:
            self.breaker_transitions.labels(model, zone, state).inc()

    def observe_agent_weights(self, model: str, zone: str, weights: Mapping[str, float]) -> None:
        """The weights of an ``agents`` command, one sample per path."""
        for path, w in weights.items():
            self.agent_weight.labels(model, zone, path).set(float(w))

    def observe_dead_letter(self, reason: str) -> None:
        """Count a dead letter under its kind (a reason's kind, or a kind itself).

        The label is always one of ``DEAD_LETTER_KINDS``, never the reason's text
        (which may carry the bad value): the series stay a fixed set.
        """
        self.deadletters.labels(dead_letter_kind(reason)).inc()

    def serve(self, port: int, addr: str = "127.0.0.1", readiness: Readiness | None = None) -> HealthServer | None:
        """Serve /metrics, /healthz and /readyz on ``addr:port`` (GOVERNOR_METRICS_ADDR,
        GOVERNOR_METRICS_PORT; 0 = off); see :mod:`streams.health`."""
        return serve(self.registry, port, addr, readiness)
