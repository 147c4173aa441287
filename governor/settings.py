"""One settings object, built once at the entry point and passed down.

Every knob is read from ``GOVERNOR_*`` environment variables (or the two
standard ones, ``KAFKA_BOOTSTRAP`` and ``REDIS_URL``) by :func:`Settings.from_env`,
which is only ever called by an entry point -- never at import time.
``ENV_VARS`` lists every variable this module reads; the docker-compose
validation test checks the compose file against it.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field


class SettingsError(ValueError):
    """A setting has a value governor cannot use; the message names it."""


class Secret(str):
    """A string that does not print itself (Redis URLs may carry passwords)."""

    def __repr__(self) -> str:
        return "Secret('**********')" if self else "Secret('')"


@dataclass(frozen=True)
class ModelSpec:
    """Per-model SLO and replica bounds.

    A request violates the SLO when its time to first token exceeds
    ``ttft_slo_ms`` or its mean inter-token latency exceeds ``itl_slo_ms``
    (the two SLOs LLM serving stacks such as Dynamo plan against).
    """

    name: str
    ttft_slo_ms: float = 1000.0
    itl_slo_ms: float = 150.0
    min_replicas: int = 1
    max_replicas: int = 64
    # Requests/s one replica sustains within the SLO (profiling, see sim.profiling).
    # Set = the feedforward path sizes the fleet from demand; None = feedback only.
    replica_capacity_rps: float | None = None

    def __post_init__(self) -> None:
        if self.replica_capacity_rps is not None and self.replica_capacity_rps <= 0:
            raise SettingsError(f"model {self.name}: replica_capacity_rps must be > 0")
        if self.ttft_slo_ms <= 0 or self.itl_slo_ms <= 0:
            raise SettingsError(f"model {self.name}: SLOs must be positive")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise SettingsError(
                f"model {self.name}: need 0 <= min_replicas ({self.min_replicas}) "
                f"<= max_replicas ({self.max_replicas})"
            )


DEFAULT_MODELS = (ModelSpec("llama2-70b"),)

# name -> (attribute, help).  Keep in sync with from_env (a test checks).
ENV_VARS: dict[str, str] = {
    "KAFKA_BOOTSTRAP": "host:port of the Kafka brokers; unset = start the embedded broker",
    "REDIS_URL": "redis:// URL; unset = start the embedded redis-server",
    "GOVERNOR_TOPIC_PREFIX": "prefix of every Kafka topic (default 'governor')",
    "GOVERNOR_PARTITIONS": "partitions of the topics governor creates",
    "GOVERNOR_ZONES": "comma-separated zones (default az-a,az-b)",
    "GOVERNOR_MODELS": "JSON list of model specs (name, ttft_slo_ms, itl_slo_ms, min/max_replicas, replica_capacity_rps: set = feedforward on)",
    "GOVERNOR_WINDOW_S": "tumbling window length in (trace) seconds; also the control period",
    "GOVERNOR_LATENESS_S": "how long a window waits for late records before it closes",
    "GOVERNOR_EPS_REF": "SLO-violation-rate reference of the scaling PID (default 0.02)",
    "GOVERNOR_PID_GAINS": "JSON object with kp, ki, kd of the scaling PID",
    "GOVERNOR_COMMAND_TTL_S": "seconds a command stays valid after it is issued",
    "GOVERNOR_CLOCK_SPEED": "trace seconds per wall second (1 in production; >1 replays faster)",
    "GOVERNOR_CLOCK_ORIGIN_S": "wall-clock epoch seconds at which the scaled clock started",
    "GOVERNOR_METRICS_PORT": "Prometheus /metrics port of the stream worker (0 = off)",
    "GOVERNOR_WEB_PORT": "Faust web port of the stream worker (0 = web server off)",
    "GOVERNOR_FETCH_MAX_WAIT_MS": "consumer fetch wait (Faust hard-codes 1500 ms; 50 ms gives ~60 ms hops)",
    "GOVERNOR_SESSION_TIMEOUT_S": "consumer-group session timeout (a join takes about half of it)",
    "GOVERNOR_DATA_DIR": "where the stream worker keeps its local state",
    "GOVERNOR_STARTUP_HINT_S": "expected replica start-up seconds (feedforward look-ahead)",
    "GOVERNOR_CONTROLLER": "feedback controller: pid (velocity PID) or fpid (fractional PID^alpha)",
    "GOVERNOR_DRIFT": "1/0: online drift detection (River ADWIN, Page-Hinkley) per (model, zone)",
    "GOVERNOR_OBSERVER": "1/0: Kalman observer of [util, queue, violations] predicted over the measured loop delay",
    "GOVERNOR_GAINS_FILE": "gains JSON written by `governor tune` (overrides GOVERNOR_PID_GAINS)",
    "GOVERNOR_LOG_LEVEL": "log level of every governor process (default INFO; read by the CLI)",
    "GOVERNOR_FALLBACKS": "comma-separated primary=fallback model pairs the worker routes (latency-aware, with fallback)",
    "GOVERNOR_BREAKER_MIN_REQUESTS": "requests a circuit breaker's window must exceed before it may open (seed: 1000)",
    "GOVERNOR_ZONE_REDUNDANCY": "zone losses the fleet is sized to survive without a scale-up (0 = none, 1 = N+1 zones)",
}


def _parse_models(raw: str) -> tuple[ModelSpec, ...]:
    try:
        items = json.loads(raw)
        return tuple(ModelSpec(**item) for item in items)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"GOVERNOR_MODELS: {exc}") from exc


def _parse_fallbacks(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        primary, sep, fallback = (x.strip() for x in item.partition("="))
        if not sep or not primary or not fallback or primary == fallback:
            raise SettingsError(f"GOVERNOR_FALLBACKS: {item!r} is not primary=fallback")
        pairs.append((primary, fallback))
    return tuple(pairs)


@dataclass(frozen=True)
class Settings:
    kafka_bootstrap: str = "127.0.0.1:9092"
    redis_url: Secret = Secret("redis://127.0.0.1:6379/0")
    topic_prefix: str = "governor"
    partitions: int = 4
    zones: tuple[str, ...] = ("az-a", "az-b")
    models: tuple[ModelSpec, ...] = DEFAULT_MODELS
    window_s: float = 10.0
    lateness_s: float = 2.0
    eps_ref: float = 0.02
    pid_gains: Mapping[str, float] = field(
        default_factory=lambda: {"kp": 0.0, "ki": 0.05, "kd": 0.0}
    )
    command_ttl_s: float = 60.0
    clock_speed: float = 1.0
    clock_origin_s: float = 0.0
    metrics_port: int = 0
    web_port: int = 0
    fetch_max_wait_ms: int = 50
    session_timeout_s: float = 10.0
    data_dir: str = "/tmp/governor"
    # Expected replica start-up time: the feedforward look-ahead horizon.
    startup_hint_s: float = 30.0
    controller: str = "pid"  # "pid" (velocity PID) or "fpid" (fractional PID^alpha)
    drift: bool = True
    dead_time_comp: bool = True  # scale-ups multiply ready replicas while capacity is in flight
    observer: bool = False  # Kalman observer + prediction over the measured loop delay
    gains_file: str = ""  # JSON written by `governor tune`; overrides pid_gains when set
    fallbacks: tuple[tuple[str, str], ...] = ()  # (primary, fallback) families the worker routes
    breaker_min_requests: int = 1000  # seed 4.4: a breaker judges windows of more than this many requests
    zone_redundancy: int = 0  # zone losses absorbed by standing capacity (1 = N+1 zones)

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise SettingsError("GOVERNOR_WINDOW_S must be > 0")
        if self.lateness_s < 0:
            raise SettingsError("GOVERNOR_LATENESS_S must be >= 0")
        if not 0 < self.eps_ref < 1:
            raise SettingsError("GOVERNOR_EPS_REF must be in (0, 1)")
        if self.clock_speed <= 0:
            raise SettingsError("GOVERNOR_CLOCK_SPEED must be > 0")
        if self.fetch_max_wait_ms <= 0:
            # Measured: fetch_max_wait_ms=0 makes the consumer receive nothing.
            raise SettingsError("GOVERNOR_FETCH_MAX_WAIT_MS must be > 0")
        if not self.zones:
            raise SettingsError("GOVERNOR_ZONES must name at least one zone")
        if self.partitions < 1:
            raise SettingsError("GOVERNOR_PARTITIONS must be >= 1")
        if self.breaker_min_requests < 1:
            raise SettingsError("GOVERNOR_BREAKER_MIN_REQUESTS must be >= 1")
        if not 0 <= self.zone_redundancy < len(self.zones):
            raise SettingsError(f"GOVERNOR_ZONE_REDUNDANCY={self.zone_redundancy}: must be >= 0 and below "
                                f"the number of zones ({len(self.zones)})")
        if self.controller not in ("pid", "fpid"):
            raise SettingsError(f"GOVERNOR_CONTROLLER={self.controller!r}: choose pid or fpid")

    # -- topics ---------------------------------------------------------
    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}.{name}"

    @property
    def topics(self) -> dict[str, str]:
        names = ("telemetry", "metrics", "commands", "results", "deadletter", "events")
        return {n: self.topic(n) for n in names}

    def model(self, name: str) -> ModelSpec | None:
        for spec in self.models:
            if spec.name == name:
                return spec
        return None

    def replace(self, **changes: object) -> Settings:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    # -- environment ----------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        d = cls()
        g = env.get

        def num(name: str, default: float, kind: type = float) -> float:
            raw = g(name)
            if raw is None or raw == "":
                return default
            try:
                return kind(raw)
            except ValueError as exc:
                raise SettingsError(f"{name}={raw!r}: {exc}") from exc

        gains = d.pid_gains
        gains_file = g("GOVERNOR_GAINS_FILE") or ""
        if gains_file:
            try:
                with open(gains_file) as fh:
                    loaded = json.load(fh)
                gains = {k: float(v) for k, v in loaded.get("gains", loaded).items()}
            except (OSError, ValueError, AttributeError) as exc:
                raise SettingsError(f"GOVERNOR_GAINS_FILE={gains_file!r}: {exc}") from exc
        elif g("GOVERNOR_PID_GAINS"):
            try:
                gains = {k: float(v) for k, v in json.loads(g("GOVERNOR_PID_GAINS", "")).items()}
            except (ValueError, AttributeError) as exc:
                raise SettingsError(f"GOVERNOR_PID_GAINS: {exc}") from exc
        zones = tuple(z.strip() for z in g("GOVERNOR_ZONES", ",".join(d.zones)).split(",") if z.strip())
        return cls(
            kafka_bootstrap=g("KAFKA_BOOTSTRAP") or d.kafka_bootstrap,
            redis_url=Secret(g("REDIS_URL") or d.redis_url),
            topic_prefix=g("GOVERNOR_TOPIC_PREFIX") or d.topic_prefix,
            partitions=int(num("GOVERNOR_PARTITIONS", d.partitions, int)),
            zones=zones,
            models=_parse_models(g("GOVERNOR_MODELS", "")) if g("GOVERNOR_MODELS") else d.models,
            window_s=num("GOVERNOR_WINDOW_S", d.window_s),
            lateness_s=num("GOVERNOR_LATENESS_S", d.lateness_s),
            eps_ref=num("GOVERNOR_EPS_REF", d.eps_ref),
            pid_gains=gains,
            command_ttl_s=num("GOVERNOR_COMMAND_TTL_S", d.command_ttl_s),
            clock_speed=num("GOVERNOR_CLOCK_SPEED", d.clock_speed),
            clock_origin_s=num("GOVERNOR_CLOCK_ORIGIN_S", d.clock_origin_s),
            metrics_port=int(num("GOVERNOR_METRICS_PORT", d.metrics_port, int)),
            web_port=int(num("GOVERNOR_WEB_PORT", d.web_port, int)),
            fetch_max_wait_ms=int(num("GOVERNOR_FETCH_MAX_WAIT_MS", d.fetch_max_wait_ms, int)),
            session_timeout_s=num("GOVERNOR_SESSION_TIMEOUT_S", d.session_timeout_s),
            data_dir=g("GOVERNOR_DATA_DIR") or d.data_dir,
            startup_hint_s=num("GOVERNOR_STARTUP_HINT_S", d.startup_hint_s),
            controller=g("GOVERNOR_CONTROLLER") or d.controller,
            drift=(g("GOVERNOR_DRIFT") or "1").strip().lower() not in ("0", "false", "no", "off"),
            gains_file=gains_file,
            observer=(g("GOVERNOR_OBSERVER") or "0").strip().lower() in ("1", "true", "yes", "on"),
            fallbacks=_parse_fallbacks(g("GOVERNOR_FALLBACKS", "")),
            breaker_min_requests=int(num("GOVERNOR_BREAKER_MIN_REQUESTS", d.breaker_min_requests, int)),
            zone_redundancy=int(num("GOVERNOR_ZONE_REDUNDANCY", d.zone_redundancy, int)),
        )

    def to_env(self) -> dict[str, str]:
        """The inverse of :meth:`from_env`: hand these settings to a child process."""
        return {
            "KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "REDIS_URL": str(self.redis_url),
            "GOVERNOR_TOPIC_PREFIX": self.topic_prefix,
            "GOVERNOR_PARTITIONS": str(self.partitions),
            "GOVERNOR_ZONES": ",".join(self.zones),
            "GOVERNOR_MODELS": json.dumps([dataclasses.asdict(m) for m in self.models]),
            "GOVERNOR_WINDOW_S": repr(self.window_s),
            "GOVERNOR_LATENESS_S": repr(self.lateness_s),
            "GOVERNOR_EPS_REF": repr(self.eps_ref),
            "GOVERNOR_PID_GAINS": json.dumps(dict(self.pid_gains)),
            "GOVERNOR_COMMAND_TTL_S": repr(self.command_ttl_s),
            "GOVERNOR_CLOCK_SPEED": repr(self.clock_speed),
            "GOVERNOR_CLOCK_ORIGIN_S": repr(self.clock_origin_s),
            "GOVERNOR_METRICS_PORT": str(self.metrics_port),
            "GOVERNOR_WEB_PORT": str(self.web_port),
            "GOVERNOR_FETCH_MAX_WAIT_MS": str(self.fetch_max_wait_ms),
            "GOVERNOR_SESSION_TIMEOUT_S": repr(self.session_timeout_s),
            "GOVERNOR_DATA_DIR": self.data_dir,
            "GOVERNOR_STARTUP_HINT_S": repr(self.startup_hint_s),
            "GOVERNOR_CONTROLLER": self.controller,
            "GOVERNOR_DRIFT": "1" if self.drift else "0",
            "GOVERNOR_GAINS_FILE": self.gains_file,
            "GOVERNOR_OBSERVER": "1" if self.observer else "0",
            "GOVERNOR_FALLBACKS": ",".join(f"{p}={f}" for p, f in self.fallbacks),
            "GOVERNOR_BREAKER_MIN_REQUESTS": str(self.breaker_min_requests),
            "GOVERNOR_ZONE_REDUNDANCY": str(self.zone_redundancy),
        }
