"""The deployment files agree with the code and with each other.

Docker does not run where the test suite runs, so docker-compose.yml, the
Dockerfile, the Prometheus/Grafana provisioning and the Kubernetes manifests
are kept correct here: parsed, cross-checked against ``core.settings``
(every environment variable must be one the code reads, and must build a
``Settings``), against the CLI's subcommands, and against each other (ports,
hostnames, healthchecks, scrape targets, metric names).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from core.settings import ENV_VARS, Settings
from core.signing import Keyring, generate_keys

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PROMETHEUS = ROOT / "infra" / "prometheus" / "prometheus.yml"
ALERTS = ROOT / "infra" / "prometheus" / "alerts.yml"
GRAFANA_DATASOURCE = ROOT / "infra" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
GRAFANA_PROVIDERS = ROOT / "infra" / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
GRAFANA_DASHBOARD = ROOT / "infra" / "grafana" / "dashboards" / "governor.json"
K8S = ROOT / "infra" / "k8s"
CLI = ROOT / "governor" / "cli.py"

BUILD = object()  # marker: the service is built from ./Dockerfile

# Subcommands of the `governor` CLI (governor/cli.py, build_parser()).
KNOWN_COMMANDS = {
    "worker",  # the Faust stream worker
    "executor",  # per-zone command executor
    "fleet",  # simulated inference fleet replaying a trace
    "servers",  # embedded Tansu + redis-server, for machines without Docker
    "demo",  # closed loop on the embedded servers (dev.py demo)
    "bench",  # benchmarks (dev.py bench)
    "ingest",  # the telemetry adapters (infra/k8s/ingest-*.yaml)
}
# Subcommands whose pods serve no metrics port of their own (tests/unit/test_k8s_manifests.py checks theirs).
ADAPTERS = {"ingest"}
# Subcommands that start their own embedded broker/Redis: wrong inside compose
# or Kubernetes, where the real ones run.
EMBEDDED_ONLY = {"servers", "demo", "bench"}

# The metric names Prometheus alerts and the Grafana dashboard may use: the
# contract with the exporters in streams/ and executors/ (see alerts.yml).
CONTRACT_METRICS = {
    "governor_slo_violation_rate",
    "governor_deadletter_total",
    "governor_commands_expired_total",
    "governor_commands_applied_total",
    "governor_latency_p95_seconds",
    "governor_latency_p99_seconds",
    "governor_ttft_p95_seconds",
    "governor_ttft_slo_seconds",
    "governor_replicas_target",
    "governor_replicas_ready",
    "governor_breaker_state",
    "governor_agent_weight",
    "governor_telemetry_stale",
    "governor_requests_total",
    "governor_slo_violations_total",
}
METRIC_RE = re.compile(r"\bgovernor_[a-z0-9_]+\b")

# service -> image (prefix) or BUILD; one comment per case.
EXPECTED_SERVICES: list[tuple[str, Any]] = [
    ("kafka", "apache/kafka:3.8.0"),  # KRaft single node, no ZooKeeper
    ("redis", "redis:7-alpine"),  # command streams and fleet state
    ("worker", BUILD),  # governor worker: the Faust stream pipeline
    ("executor-az-a", BUILD),  # executor for zone az-a (sim backend)
    ("executor-az-b", BUILD),  # executor for zone az-b (sim backend)
    ("fleet", BUILD),  # simulated fleet producing telemetry
    ("prometheus", "prom/prometheus"),  # scrapes worker and executors
    ("grafana", "grafana/grafana"),  # dashboards provisioned from infra/grafana
]
GOVERNOR_SERVICES = [name for name, image in EXPECTED_SERVICES if image is BUILD]

# service -> exact command; one comment per case.
EXPECTED_COMMANDS = [
    ("worker", ["governor", "worker"]),  # stream worker, default CMD of the image
    ("executor-az-a", ["governor", "executor", "--zone", "az-a", "--backend", "sim"]),  # zone a
    ("executor-az-b", ["governor", "executor", "--zone", "az-b", "--backend", "sim"]),  # zone b
    ("fleet", ["governor", "fleet", "--trace", "azure-conv", "--qps", "40"]),  # Azure conv trace
]

# service -> GOVERNOR_METRICS_PORT; one comment per case.
EXPECTED_METRICS_PORTS = [
    ("worker", 9464),  # stream worker exporter
    ("executor-az-a", 9465),  # executor exporters count up from the worker's
    ("executor-az-b", 9466),
    ("fleet", 0),  # the simulated fleet is not scraped
]

# Kafka broker settings that a single-node KRaft broker needs; one comment per case.
KAFKA_SETTINGS = [
    ("KAFKA_PROCESS_ROLES", "broker,controller"),  # combined mode: one node is both
    ("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1"),  # default 3 cannot be met by one broker
    ("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1"),  # same for the txn log
    ("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "true"),  # Faust's changelog/repartition topics
    ("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER"),  # names the :9093 listener
]


# -- loading ----------------------------------------------------------------


def _yaml(path: Path) -> Any:
    assert path.is_file(), f"{path.relative_to(ROOT)} is missing"
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _yaml(COMPOSE)


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


# What a user's shell or .env gives compose for ${...} interpolation: docker-compose.yml ships no
# signing key and demands one (docs/operations.md: `echo "GOVERNOR_COMMAND_KEYS=k1:$(openssl rand -hex 32)" >> .env`).
USER_ENV = {"GOVERNOR_COMMAND_KEYS": generate_keys()}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[?-])([^}]*))?\}")


def _interpolate(value: str, user_env: dict[str, str]) -> str:
    """``value`` as compose interpolates it: ``${X}``, ``${X:-default}``, ``${X:?error}`` (LookupError)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if user_env.get(name) or (name in user_env and not op.startswith(":")):
            return user_env[name]
        if op.endswith("?"):
            raise LookupError(f"{name}: {arg}")
        return arg if op.endswith("-") else ""

    return INTERPOLATION.sub(one, value)


def _raw_env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "use the mapping form of `environment` (with the anchor)"
    return env


def _env(service: dict[str, Any]) -> dict[str, str]:
    return {k: _interpolate(v, USER_ENV) if isinstance(v, str) else v for k, v in _raw_env(service).items()}


def _is_governor(service: dict[str, Any]) -> bool:
    cmd = service.get("command")
    return isinstance(cmd, list) and bool(cmd) and cmd[0] == "governor"


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def _k8s_containers() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name, doc in _k8s_docs():
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                out.append((f"{name}:{c['name']}", c))
    return out


def _k8s_env() -> dict[str, str]:
    """ConfigMap data plus Secret stringData: what every governor pod gets."""
    env: dict[str, str] = {}
    for _, doc in _k8s_docs():
        if doc["kind"] == "ConfigMap":
            env.update(doc.get("data") or {})
        elif doc["kind"] == "Secret":
            env.update(doc.get("stringData") or {})
    return env


# -- compose: services, images, commands -----------------------------------------


def test_compose_has_no_version_key_and_exactly_the_expected_services(
    compose: dict[str, Any],
) -> None:
    assert "version" not in compose, "the compose spec dropped `version:`; remove it"
    assert set(compose["services"]) == {name for name, _ in EXPECTED_SERVICES}


@pytest.mark.parametrize(("name", "image"), EXPECTED_SERVICES, ids=[n for n, _ in EXPECTED_SERVICES])
def test_service_image_or_build(services: dict[str, Any], name: str, image: Any) -> None:
    svc = services[name]
    if image is BUILD:
        build = svc.get("build")
        assert isinstance(build, dict), f"{name}: expected build: {{context, dockerfile}}"
        assert (ROOT / build["context"]).resolve() == ROOT
        assert (ROOT / build["context"] / build.get("dockerfile", "Dockerfile")).is_file()
        assert _is_governor(svc), f"{name}: a built service runs the governor CLI"
    else:
        assert "build" not in svc
        assert svc["image"].startswith(image), f"{name}: image {svc['image']!r}"


def test_governor_services_are_the_built_ones(services: dict[str, Any]) -> None:
    assert sorted(n for n, s in services.items() if _is_governor(s)) == sorted(GOVERNOR_SERVICES)


@pytest.mark.parametrize(("name", "argv"), EXPECTED_COMMANDS, ids=[n for n, _ in EXPECTED_COMMANDS])
def test_service_command(services: dict[str, Any], name: str, argv: list[str]) -> None:
    assert services[name]["command"] == argv


@pytest.mark.parametrize("name", GOVERNOR_SERVICES)
def test_service_command_is_a_known_subcommand(services: dict[str, Any], name: str) -> None:
    sub = services[name]["command"][1]
    assert sub in KNOWN_COMMANDS, f"{name}: unknown subcommand {sub!r}"
    assert sub not in EMBEDDED_ONLY, f"{name}: {sub!r} starts embedded servers; compose has real ones"


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    names: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            names |= set(action.choices)
    return names


def test_commands_parse_with_the_real_cli(services: dict[str, Any]) -> None:
    if not CLI.is_file():
        pytest.skip("governor/cli.py is not written yet; KNOWN_COMMANDS stands in for it")
    try:
        cli = importlib.import_module("governor.cli")
    except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
        pytest.fail(f"governor/cli.py exists but does not import: {exc!r}")
    build_parser = getattr(cli, "build_parser", None)
    if not callable(build_parser):
        pytest.fail("governor/cli.py must expose build_parser() -> argparse.ArgumentParser")
    parser = build_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    available = _subcommands(parser)
    argvs = [(f"compose:{n}", services[n]["command"]) for n in GOVERNOR_SERVICES]
    argvs += [(f"k8s:{n}", c["command"]) for n, c in _k8s_containers()]
    for where, argv in argvs:
        assert argv[1] in available, f"{where}: CLI has no subcommand {argv[1]!r} ({sorted(available)})"
        try:
            parser.parse_args(argv[1:])
        except SystemExit as exc:
            pytest.fail(f"{where}: `{' '.join(argv)}` is rejected by the CLI (exit {exc.code})")


# -- compose: environment -------------------------------------------------------------


@pytest.mark.parametrize("name", GOVERNOR_SERVICES)
def test_environment_names_are_read_by_settings(services: dict[str, Any], name: str) -> None:
    env = _env(services[name])
    unknown = sorted(set(env) - set(ENV_VARS))
    assert not unknown, f"{name}: core.settings does not read {unknown}"
    not_str = sorted(k for k, v in env.items() if not isinstance(v, str))
    assert not not_str, f"{name}: quote these values (Settings parses strings): {not_str}"


@pytest.mark.parametrize("name", GOVERNOR_SERVICES)
def test_environment_builds_settings(services: dict[str, Any], name: str) -> None:
    cmd = services[name]["command"]
    settings = Settings.from_env(_env(services[name]))
    assert settings.web_port == 0, "the Faust web server stays off"
    # A sped-up clock needs a shared origin, or each process keeps wall time.
    assert settings.clock_speed == 1 or settings.clock_origin_s > 0, name
    if "--zone" in cmd:
        zone = cmd[cmd.index("--zone") + 1]
        assert zone in settings.zones, f"{name}: zone {zone!r} not in GOVERNOR_ZONES"


@pytest.mark.parametrize("name", GOVERNOR_SERVICES)
def test_compose_demands_a_signing_key_and_ships_none(services: dict[str, Any], name: str) -> None:
    """Issue 31, item 2: the shipped REPLACE-ME key was public and worked.  Compose now stops with
    a message until the user sets GOVERNOR_COMMAND_KEYS; it has no default to fall back on."""
    raw = _raw_env(services[name])["GOVERNOR_COMMAND_KEYS"]
    assert re.fullmatch(r"\$\{GOVERNOR_COMMAND_KEYS:\?[^}]+\}", raw), f"{name}: demand the key, ship none: {raw}"
    with pytest.raises(LookupError, match="GOVERNOR_COMMAND_KEYS"):
        _interpolate(raw, {})
    with pytest.raises(LookupError):
        _interpolate(raw, {"GOVERNOR_COMMAND_KEYS": ""})  # an empty value is no key either
    ring = Settings.from_env(_env(services[name])).keyring()
    assert ring is not None and ring.key_ids == Keyring.parse(USER_ENV["GOVERNOR_COMMAND_KEYS"]).key_ids


def _published_host_ips(entry: Any) -> str:
    """The host address a `ports:` entry (short or long syntax) publishes on; "" for every interface."""
    if isinstance(entry, dict):
        return str(entry.get("host_ip", ""))
    parts = str(entry).split(":")
    return parts[0] if len(parts) == 3 else ""


def test_compose_publishes_ports_on_loopback_only(services: dict[str, Any]) -> None:
    """Issue 31, item 8: Grafana (anonymous Viewer) and Prometheus (no auth) were published on every
    interface of the host.  Every published port binds 127.0.0.1."""
    published = [(name, p) for name, svc in services.items() for p in svc.get("ports", [])]
    assert {n for n, _ in published} == {"prometheus", "grafana"}
    wide = [(n, p) for n, p in published if _published_host_ips(p) != "127.0.0.1"]
    assert not wide, f"ports published beyond loopback: {wide}"


def test_exporters_bind_the_compose_network_explicitly(services: dict[str, Any]) -> None:
    """The default bind is loopback; compose's exporters, scraped by service name, set 0.0.0.0 (in
    their own container) in so many words, and publish nothing on the host."""
    assert Settings().metrics_addr == "127.0.0.1"
    scraped = _scrape_targets()
    for name in GOVERNOR_SERVICES:
        raw, settings = _raw_env(services[name]), Settings.from_env(_env(services[name]))
        if settings.metrics_port:
            assert raw.get("GOVERNOR_METRICS_ADDR") == "0.0.0.0", name
            assert (name, settings.metrics_port) in scraped, name
            assert not services[name].get("ports"), f"{name}: its exporter is not published on the host"


def test_compose_runs_with_feedforward_at_the_profiled_capacity(services: dict[str, Any]) -> None:
    """Every model of the stack carries replica_capacity_rps (feedforward on), and it and the headroom
    are the profile `governor demo` would compute for that model's SLO on the trace the fleet replays."""
    from sim.fastloop import LoopConfig
    from sim.profiling import profile
    from sim.traces import load_trace

    fleet = services["fleet"]["command"]
    trace = load_trace(fleet[fleet.index("--trace") + 1])
    for name in GOVERNOR_SERVICES:
        for spec in Settings.from_env(_env(services[name])).models:
            assert spec.replica_capacity_rps is not None, f"{name}: {spec.name} has no replica_capacity_rps"
    for spec in Settings.from_env(_env(services["worker"])).models:
        cfg = LoopConfig.of(model=spec.name, ttft_slo_ms=spec.ttft_slo_ms, itl_slo_ms=spec.itl_slo_ms)
        capacity, headroom = profile(trace, cfg)
        assert spec.replica_capacity_rps == round(capacity, 4), spec.name
        assert spec.replica_headroom == round(headroom, 4), spec.name


def test_k8s_executor_backends_exist() -> None:
    """GOVERNOR_EXECUTOR_BACKENDS of the ConfigMap names only backends the executor can build."""
    from executors.chain import REGISTRY, parse_spec

    spec = _k8s_env()["GOVERNOR_EXECUTOR_BACKENDS"]
    kinds = parse_spec(spec, REGISTRY)  # SettingsError naming an unknown backend
    assert kinds["scale"] == "k8s" and kinds["route"] == "gateway", spec


@pytest.mark.parametrize(("name", "port"), EXPECTED_METRICS_PORTS, ids=[n for n, _ in EXPECTED_METRICS_PORTS])
def test_metrics_port(services: dict[str, Any], name: str, port: int) -> None:
    assert Settings.from_env(_env(services[name])).metrics_port == port


def test_shared_connection_settings_agree(services: dict[str, Any]) -> None:
    # Every governor process must talk to the same broker, Redis and topics.
    for key in ("KAFKA_BOOTSTRAP", "REDIS_URL", "GOVERNOR_TOPIC_PREFIX", "GOVERNOR_ZONES"):
        values = {_env(services[n]).get(key) for n in GOVERNOR_SERVICES}
        assert len(values) == 1 and None not in values, f"{key} differs: {values}"


def _listeners(value: str) -> dict[str, tuple[str, int]]:
    """'PLAINTEXT://kafka:9092,CONTROLLER://:9093' -> {name: (host, port)}."""
    out = {}
    for item in value.split(","):
        name, _, addr = item.strip().partition("://")
        host, _, port = addr.rpartition(":")
        out[name] = (host, int(port))
    return out


@pytest.mark.parametrize(("key", "value"), KAFKA_SETTINGS, ids=[k for k, _ in KAFKA_SETTINGS])
def test_kafka_kraft_settings(services: dict[str, Any], key: str, value: str) -> None:
    assert str(services["kafka"]["environment"][key]) == value


def test_kafka_listeners_agree_with_bootstrap(services: dict[str, Any]) -> None:
    kenv = services["kafka"]["environment"]
    listeners = _listeners(kenv["KAFKA_LISTENERS"])
    advertised = _listeners(kenv["KAFKA_ADVERTISED_LISTENERS"])
    assert set(listeners) == {"PLAINTEXT", "CONTROLLER"}
    assert listeners["PLAINTEXT"][1] != listeners["CONTROLLER"][1]
    # Clients connect to what the broker advertises, which must be this service.
    host, port = advertised["PLAINTEXT"]
    assert host == "kafka" and port == listeners["PLAINTEXT"][1]
    for name in GOVERNOR_SERVICES:
        assert _env(services[name])["KAFKA_BOOTSTRAP"] == f"{host}:{port}", name
    # The quorum is this node, on the controller listener.
    node, _, voter = kenv["KAFKA_CONTROLLER_QUORUM_VOTERS"].partition("@")
    assert node == str(kenv["KAFKA_NODE_ID"])
    vhost, _, vport = voter.rpartition(":")
    assert vhost in {"kafka", "localhost"} and int(vport) == listeners["CONTROLLER"][1]


def test_redis_url_agrees_with_redis_service(services: dict[str, Any]) -> None:
    cmd = services["redis"].get("command") or []
    port = int(cmd[cmd.index("--port") + 1]) if "--port" in cmd else 6379
    assert "--appendonly" in cmd, "redis keeps its data across restarts"
    for name in GOVERNOR_SERVICES:
        url = urlsplit(_env(services[name])["REDIS_URL"])
        assert url.scheme == "redis", name
        assert (url.hostname, url.port or 6379) == ("redis", port), name


# -- compose: healthchecks and start order ------------------------------------------


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("kafka", "/opt/kafka/bin/kafka-broker-api-versions.sh"),  # broker answers API requests
        ("redis", "redis-cli"),  # PING answers PONG
    ],
)
def test_healthcheck(services: dict[str, Any], name: str, needle: str) -> None:
    test = services[name]["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] in {"CMD", "CMD-SHELL"}
    assert needle in " ".join(test)
    if name == "kafka":
        assert "localhost:9092" in " ".join(test) or "kafka:9092" in " ".join(test)


@pytest.mark.parametrize("name", [n for n, port in EXPECTED_METRICS_PORTS if port])
def test_governor_healthcheck_asks_readyz_on_its_metrics_port(services: dict[str, Any], name: str) -> None:
    # streams/health.py serves /readyz (200 connected, 503 not) beside /metrics.
    check = services[name]["healthcheck"]
    test = " ".join(check["test"])
    assert check["test"][0] in {"CMD", "CMD-SHELL"} and "/readyz" in test, name
    assert "GOVERNOR_METRICS_PORT" in test or str(Settings.from_env(_env(services[name])).metrics_port) in test


def test_k8s_probes_use_healthz_and_readyz() -> None:
    for where, c in _k8s_containers():
        if c["command"][1] in ADAPTERS:
            continue
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            get = c[probe]["httpGet"]
            assert (get["path"], get["port"]) == (path, "metrics"), f"{where}: {probe}"


def test_depends_on_waits_for_healthy_services(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        deps = svc.get("depends_on") or {}
        assert isinstance(deps, dict), f"{name}: use the mapping form of depends_on"
        for dep, spec in deps.items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}, which has none"
    for name in GOVERNOR_SERVICES:
        deps = services[name]["depends_on"]
        for dep in ("kafka", "redis"):
            assert deps[dep]["condition"] == "service_healthy", f"{name} -> {dep}"


# -- Dockerfile ------------------------------------------------------------------------


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    froms = [ln.split()[1] for ln in lines if ln.upper().startswith("FROM ")]
    assert froms and all(f == "python:3.11-slim" for f in froms), froms
    # Both distributions in one resolve: the control plane depends on governor-telemetry (./telemetry).
    installs = [ln.split()[3:] for ln in lines if ln.startswith("RUN pip install")]
    assert any({"./telemetry", "."} <= set(args) for args in installs), installs
    users = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] not in {"root", "0"}, "run as a non-root user"
    assert not any(ln.upper().startswith("ENTRYPOINT") for ln in lines)
    cmd = [ln for ln in lines if ln.upper().startswith("CMD ")]
    assert cmd and json.loads(cmd[-1][4:]) == ["governor", "worker"]
    ignored = set(DOCKERIGNORE.read_text().split())
    assert {".git", ".venv"} <= ignored


# -- Prometheus ------------------------------------------------------------------------


def _scrape_targets() -> set[tuple[str, int]]:
    targets = set()
    for job in _yaml(PROMETHEUS)["scrape_configs"]:
        for sc in job.get("static_configs", []):
            for t in sc["targets"]:
                host, _, port = t.rpartition(":")
                targets.add((host, int(port)))
    return targets


def test_prometheus_scrapes_exactly_the_governor_exporters(services: dict[str, Any]) -> None:
    expected = set()
    for name in GOVERNOR_SERVICES:
        port = Settings.from_env(_env(services[name])).metrics_port
        if port:
            expected.add((name, port))
    assert _scrape_targets() == expected


def test_prometheus_config_is_mounted_with_its_rules(services: dict[str, Any]) -> None:
    conf = _yaml(PROMETHEUS)
    for rule_file in conf["rule_files"]:
        assert (PROMETHEUS.parent / rule_file).is_file(), rule_file
    mounts = [v.split(":")[:2] for v in services["prometheus"]["volumes"]]
    assert ["./infra/prometheus", "/etc/prometheus"] in mounts
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]


def test_alert_rules_use_contract_metrics() -> None:
    rules = [r for g in _yaml(ALERTS)["groups"] for r in g["rules"]]
    used: set[str] = set()
    for rule in rules:
        assert rule.get("alert") and rule.get("expr"), rule
        used |= set(METRIC_RE.findall(rule["expr"]))
    assert used <= CONTRACT_METRICS, used - CONTRACT_METRICS
    # The three signals the operators are paged or ticketed on.
    assert {
        "governor_slo_violation_rate",
        "governor_deadletter_total",
        "governor_commands_expired_total",
    } <= used


def test_contract_metrics_are_exported() -> None:
    exported: set[str] = set()
    for module, cls_name in (("streams.metrics_export", "WorkerMetrics"), ("executors.metrics", "ExecutorMetrics")):
        cls = getattr(importlib.import_module(module), cls_name)
        for family in cls().registry.collect():
            # prometheus_client reports counter families without the _total suffix.
            exported.add(family.name + ("_total" if family.type == "counter" else ""))
    missing = sorted(CONTRACT_METRICS - exported)
    assert not missing, f"alerts/dashboard use metrics no exporter defines: {missing}"


# -- Grafana ---------------------------------------------------------------------------


def test_grafana_dashboard_uses_contract_metrics() -> None:
    dash = json.loads(GRAFANA_DASHBOARD.read_text())
    datasource_uid = _yaml(GRAFANA_DATASOURCE)["datasources"][0]["uid"]
    used: set[str] = set()
    for panel in dash["panels"]:
        exprs = [t["expr"] for t in panel["targets"]]
        found = {m for e in exprs for m in METRIC_RE.findall(e)}
        assert found, f"panel {panel['title']!r} shows no governor metric"
        assert panel["datasource"]["uid"] == datasource_uid, panel["title"]
        used |= found
    assert used <= CONTRACT_METRICS, used - CONTRACT_METRICS
    # One panel group per signal the brief asks for.
    assert {
        "governor_latency_p95_seconds",
        "governor_latency_p99_seconds",
        "governor_slo_violation_rate",
        "governor_replicas_target",
        "governor_replicas_ready",
        "governor_commands_applied_total",
        "governor_deadletter_total",
    } <= used
    # TTFT is plotted against its SLO in one panel (issue 15: the operator sees the margin, not two graphs).
    assert any(
        {"governor_ttft_p95_seconds", "governor_ttft_slo_seconds"}
        <= {m for t in panel["targets"] for m in METRIC_RE.findall(t["expr"])}
        for panel in dash["panels"]
    )


def test_grafana_provisioning_matches_compose_mounts(services: dict[str, Any]) -> None:
    mounts = dict(v.split(":")[:2] for v in services["grafana"]["volumes"])
    assert mounts["./infra/grafana/provisioning"] == "/etc/grafana/provisioning"
    providers = _yaml(GRAFANA_PROVIDERS)["providers"]
    assert mounts["./infra/grafana/dashboards"] == providers[0]["options"]["path"]
    url = urlsplit(_yaml(GRAFANA_DATASOURCE)["datasources"][0]["url"])
    assert url.hostname in services and url.port == 9090


# -- Kubernetes ------------------------------------------------------------------------


def test_k8s_manifests_parse_and_are_listed_in_kustomization() -> None:
    docs = _k8s_docs()
    assert docs, "infra/k8s has no manifests"
    kinds = {doc["kind"] for _, doc in docs}
    assert {"Namespace", "ConfigMap", "Secret", "Deployment", "Service"} <= kinds
    for name, doc in docs:
        assert doc.get("apiVersion") and doc.get("kind"), name
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], name
    kustomization = _yaml(K8S / "kustomization.yaml")
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_k8s_env_names_are_read_by_settings_and_build_settings() -> None:
    env = _k8s_env()
    names = set(env)
    for where, c in _k8s_containers():
        names |= {e["name"] for e in c.get("env", [])}
        for ref in c.get("envFrom", []):
            assert "configMapRef" in ref, f"{where}: envFrom only from the ConfigMap"
    unknown = sorted(names - set(ENV_VARS))
    assert not unknown, f"infra/k8s sets variables core.settings does not read: {unknown}"
    settings = Settings.from_env(env)
    assert settings.metrics_port > 0 and settings.web_port == 0


# Secrets the pods read that the bundle does not ship: the operator creates them (secret.yaml says how).
OUT_OF_BAND_SECRETS = {"governor-command-keys": {"GOVERNOR_COMMAND_KEYS"}}


def test_k8s_signing_key_secret_is_created_by_the_operator_not_shipped() -> None:
    """A Secret in the bundle would hold a public key, and `kubectl apply -k` would overwrite the real one."""
    shipped = {d["metadata"]["name"] for _, d in _k8s_docs() if d["kind"] == "Secret"}
    assert not shipped & set(OUT_OF_BAND_SECRETS)
    text = (K8S / "secret.yaml").read_text()
    for name, keys in OUT_OF_BAND_SECRETS.items():
        assert f"create secret generic {name}" in text, f"secret.yaml: say how to create {name}"
        for key in keys:
            assert f'--from-literal={key}="k1:$(openssl rand -hex 32)"' in text


def test_k8s_deployments_are_consistent() -> None:
    docs = _k8s_docs()
    configmaps = {d["metadata"]["name"] for _, d in docs if d["kind"] == "ConfigMap"}
    secrets = {
        d["metadata"]["name"]: set(d.get("stringData") or d.get("data") or {}) for _, d in docs if d["kind"] == "Secret"
    }
    metrics_port = Settings.from_env(_k8s_env()).metrics_port
    zones = Settings.from_env(_k8s_env()).zones
    executor_zones = []
    for name, doc in docs:
        if doc["kind"] != "Deployment":
            continue
        spec = doc["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items(), name
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        for c in pod["containers"]:
            cmd = c["command"]
            assert cmd[0] == "governor" and cmd[1] in KNOWN_COMMANDS - EMBEDDED_ONLY, name
            if cmd[1] == "executor":
                executor_zones.append(cmd[cmd.index("--zone") + 1])
            for ref in c.get("envFrom", []):
                assert ref["configMapRef"]["name"] in configmaps, name
            for e in c.get("env", []):
                key = e.get("valueFrom", {}).get("secretKeyRef")
                if key:
                    shipped = secrets.get(key["name"], set()) | OUT_OF_BAND_SECRETS.get(key["name"], set())
                    assert key["key"] in shipped, f"{name}: {key}"
            ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            assert cmd[1] in ADAPTERS or ports.get("metrics") == metrics_port, name
    # One executor Deployment per zone, no more, no less.
    assert sorted(executor_zones) == sorted(zones)
    services = [d for _, d in docs if d["kind"] == "Service"]
    assert any(p.get("targetPort") in {"metrics", metrics_port} for s in services for p in s["spec"]["ports"])


def test_every_executor_backend_of_the_cli_is_built() -> None:
    """``governor executor --backend X`` for every choice gives that backend (no server needed), with the
    Kubernetes manifests' settings: their workloads and routes are enough for the k8s and gateway
    backends of every zone."""
    from executors.backends import DryRunBackend, RoutingBackend, SimFleetBackend, WebhookBackend
    from executors.gateway import GatewayBackend
    from executors.k8s import KubernetesBackend
    from executors.local import LocalBackend
    from governor.executor_main import make_backend

    want = {
        "sim": SimFleetBackend,
        "dry-run": DryRunBackend,
        "routing": RoutingBackend,
        "webhook": WebhookBackend,
        "k8s": KubernetesBackend,
        "gateway": GatewayBackend,
        "local": LocalBackend,  # builds its engine pool; no engine starts before the first command
    }
    from governor.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    backend = next(a for a in sub.choices["executor"]._actions if a.dest == "backend")
    assert set(backend.choices or ()) == set(want)
    # An API URL that is never dialled: building a backend opens no connection.
    settings = Settings.from_env(
        {
            **_k8s_env(),
            "GOVERNOR_K8S_API_URL": "http://127.0.0.1:9",
            # the local backend checks both exist (an executor never installs): any python, any directory
            "GOVERNOR_ENGINE_PYTHON": sys.executable,
            "GOVERNOR_LOCAL_MODEL_DIR": str(Path(__file__).parent),
        }
    )
    for zone in settings.zones:
        for name, cls in want.items():
            built = make_backend(name, None, "p", zone, "http://gw/cmd", settings=settings)  # type: ignore[arg-type]
            assert isinstance(built, cls), (zone, name)


# -- no shipped file holds a usable signing key ------------------------------------------------


def _shipped_files() -> list[Path]:
    """What a user gets and copies from: compose, the Dockerfile, README, docs/ and infra/."""
    trees = [p for d in ("docs", "infra") for p in sorted((ROOT / d).rglob("*")) if p.is_file()]
    return [COMPOSE, DOCKERFILE, DOCKERIGNORE, ROOT / "README.md", *trees]


KEY_LIKE = re.compile(r"([^\s\"'`=:,;{}()\[\]<>|]+):([0-9A-Fa-f]{32,})(?![0-9A-Za-z])")
ASSIGNED = re.compile(r"\bGOVERNOR_COMMAND_KEYS[\"']?\s*[:=]\s*[\"']?([^\s\"'`]+)")


def _key_candidates(text: str) -> set[str]:
    """Everything in ``text`` that could be read as a GOVERNOR_COMMAND_KEYS value: any kid:hex with
    at least 16 bytes, and any literal assigned to the variable; base64 values of a Secret's
    ``data`` are decoded first."""
    import base64
    import binascii

    found = {f"{m[1]}:{m[2]}" for m in KEY_LIKE.finditer(text)} | {m[1] for m in ASSIGNED.finditer(text)}
    for blob in re.findall(r"GOVERNOR_COMMAND_KEYS\s*:\s*([A-Za-z0-9+/=]{40,})", text):
        try:
            found |= _key_candidates("GOVERNOR_COMMAND_KEYS=" + base64.b64decode(blob, validate=True).decode())
        except (binascii.Error, UnicodeDecodeError):
            pass
    return found


def test_the_key_scan_finds_the_keys_once_shipped() -> None:
    placeholder = "REPLACE-ME:" + "00" * 32  # docker-compose.yml and secret.yaml at ac0d19c
    assert placeholder in _key_candidates(f'  GOVERNOR_COMMAND_KEYS: "{placeholder}"')
    assert placeholder in _key_candidates(
        f"  GOVERNOR_COMMAND_KEYS: {__import__('base64').b64encode(placeholder.encode()).decode()}"
    )
    assert "k1:" + "ab" * 32 in _key_candidates("run with GOVERNOR_COMMAND_KEYS=k1:" + "ab" * 32 + " governor worker")
    assert "gen-1:" + "0f" * 20 in _key_candidates("| `gen-1:" + "0f" * 20 + "` |")


def test_no_shipped_file_holds_a_usable_signing_key() -> None:
    """Issue 31, item 2: every key-like string of a shipped file is refused by the keyring check
    that every process runs (core.signing.Keyring.parse), so copying it configures nothing."""
    files = _shipped_files()
    assert COMPOSE in files and K8S / "secret.yaml" in files and len(files) > 20
    usable = []
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue  # not text (an image): no key to copy
        for candidate in sorted(_key_candidates(text)):
            try:
                Keyring.parse(candidate)
            except ValueError:
                continue
            usable.append(f"{path.relative_to(ROOT)}: {candidate.split(':')[0]}:...")
    assert not usable, f"shipped files hold usable signing keys: {usable}"
