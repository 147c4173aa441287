"""``promtool`` on what governor ships to Prometheus: the exporters' text, the alerts, the config.

``promtool`` comes from Debian's ``prometheus`` package at ``/usr/bin/promtool``;
``infra/install-debian-packages.sh prometheus`` installs it when missing (apt-get;
root or sudo; no service is started).  ``GOVERNOR_SKIP_DEBIAN=1`` skips these
tests when it is missing instead.

The exporters' text is the real thing: the worker's registry
(:class:`streams.metrics_export.WorkerMetrics`) after telemetry batches went
through :class:`loop.control_loop.ControlLoop` (windows closed, a decision
made), every family given a sample, rendered by ``prometheus_client``; the
executor's (:class:`~executors.metrics.ExecutorMetrics` with
``governor_build_info``, as ``governor executor`` serves it); and the OTLP
receiver's (``governor ingest otlp``, :class:`adapters.otlp.runner.OtlpReceiver`).
``governor ingest scrape`` serves no metrics.  ``promtool check metrics`` finds
nothing in any of them (``KNOWN_FINDINGS``).

A real Prometheus scrapes two executors' exporters through the executor job of
``infra/prometheus/prometheus.yml`` (its targets pointed at loopback): every
series carries one ``zone`` label, the executor's own, and no ``exported_zone``
(a target label ``zone`` beside the exporter's made Prometheus rename theirs).
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from prometheus_client import generate_latest

from adapters.otlp.runner import OtlpReceiver
from adapters.otlp.spans import MapOptions
from controllers.window_record import decode_window
from core.settings import ModelSpec, Settings
from executors.metrics import ExecutorMetrics
from loop.control_loop import ControlLoop
from streams.health import HealthServer, build_info
from streams.metrics_export import WorkerMetrics
from tests.integration.redis7 import debian_binary, running_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = Path("/usr/bin/promtool")
PROM_DIR = ROOT / "infra" / "prometheus"

T0 = 1_700_000_000_000
MODEL = "m"
ZONES = ("az-a", "az-b")

# What `promtool check metrics` (Prometheus 2.42, Debian bookworm) may say about each exporter:
# nothing since the latency gauges are in seconds (they were *_ms: "abbreviated units").
KNOWN_FINDINGS: dict[str, set[str]] = {"worker": set(), "executor": set(), "otlp": set()}


@pytest.fixture(scope="module")
def promtool() -> Path:
    """``/usr/bin/promtool``, installed by the project's script when missing (tests/integration/redis7.py)."""
    return debian_binary("prometheus", PROMTOOL, "the promtool tests")


def _promtool(promtool: Path, *args: str, stdin: bytes | None = None, cwd: Path | None = None) -> tuple[int, str]:
    done = subprocess.run([str(promtool), *args], input=stdin, capture_output=True, cwd=cwd, timeout=60)
    return done.returncode, (done.stdout + done.stderr).decode()


def _lint(promtool: Path, text: bytes) -> tuple[int, list[str]]:
    """``promtool check metrics`` on an exposition: its exit status and its findings, one per line."""
    rc, out = _promtool(promtool, "check", "metrics", stdin=text)
    return rc, [line.strip() for line in out.splitlines() if line.strip()]


# -- the exporters' text ----------------------------------------------------------------------


def _req(i: int, ts: int, zone: str) -> dict[str, Any]:
    return {
        "kind": "request",
        "request_id": f"r{i}",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}-n1",
        "ttft_ms": 100.0 + i % 7,
        "e2e_ms": 1_000.0 + i % 13,
        "network_ms": 2.0 + i % 3,  # the stage latencies: governor_stage_latency_seconds has samples
        "preprocess_ms": 5.0,
        "decode_ms": 800.0,
        "status": "ok",
    }


def _gpu(ts: int, zone: str) -> dict[str, Any]:
    return {
        "kind": "gpu",
        "ts_ms": ts,
        "model": MODEL,
        "zone": zone,
        "node": f"{zone}-n1",
        "state": "ready",
        "gpu_util": 0.9,
        "mem_used_bytes": 10,
        "mem_total_bytes": 20,
        "queue_len": 2,
        "running": 4,
    }


def _batch(records: list[Any]) -> bytes:
    return orjson.dumps({"schema_version": 1, "kind": "batch", "source": "t", "sent_ms": T0, "records": records})


@pytest.fixture(scope="module")
def worker_text() -> bytes:
    # a profiled capacity: the feedforward sizes with it, so governor_replica_capacity_rps has a sample
    spec = ModelSpec(MODEL, max_replicas=20, replica_capacity_rps=2.0)
    settings = Settings(models=(spec,), zones=ZONES, window_s=1.0, lateness_s=0.2)
    metrics = WorkerMetrics()
    loop = ControlLoop(settings, metrics)
    src = {"topic": "telemetry", "partition": 0, "offset": 1}
    closed = []
    for step in range(6):  # six one-second windows per zone, one bad record each (a dead letter)
        now = T0 + step * 1_000
        recs: list[Any] = [_req(step * 100 + i, now + i, z) for z in ZONES for i in range(20)]
        recs += [_gpu(now, z) for z in ZONES] + [{"kind": "request"}]
        closed += loop.ingest(_batch(recs), src, now).windows
    closed += loop.close_due(T0 + 60_000)
    zone_windows = [decode_window(w) for w in closed if w["scope"] == "zone"]
    assert zone_windows, "no zone window closed"
    for w in zone_windows:
        loop.decide(w, T0 + 60_000)
    # The series the Faust agents and the start-up path write (not ControlLoop), through the same objects.
    metrics.commands.labels("scale", "az-a").inc()
    metrics.bridged.labels("az-a").inc()
    metrics.redis_retries.inc()
    metrics.snapshots_ignored.labels("stale").inc()
    metrics.snapshots_restored.inc()
    metrics.events.labels("drift", "ttft").inc()
    metrics.ff_mode.labels(MODEL, "az-a").set(0.0)
    metrics.sde.labels(MODEL, "az-a", "theta").set(0.5)
    metrics.stale.labels(MODEL, "az-b").set(0.0)
    metrics.observe_breaker(MODEL, "az-a", "open", changed=True)
    metrics.observe_agent_weights(MODEL, "az-a", {"rag": 0.2, "tool": 0.3, "llm": 0.5})
    metrics.target.labels(MODEL, "az-a").set(3)
    metrics.admission_feasible.labels("desk-1").set(1.0)
    metrics.admission_margin.labels("desk-1").set(1.4)
    metrics.agent_crashes.labels("ingest").inc()  # streams.boundary.AgentWatch
    metrics.node_cap_dropped.labels(MODEL, "az-a").inc(3)  # a window the node cap cut
    text = generate_latest(metrics.registry)
    assert _families_without_samples(text) == [], "give every family a sample, or promtool lints less"
    return text


def _executor_metrics(zone: str) -> ExecutorMetrics:
    """An executor's exporter as ``governor executor`` builds it, every family given a sample."""
    metrics = ExecutorMetrics()
    build_info(metrics.registry)
    metrics.outcomes.labels(zone, "applied").inc()
    metrics.outcomes.labels(zone, "failed").inc()
    metrics.expired.labels(zone).inc()
    metrics.latency.labels(zone).set(12.5)
    metrics.paused.labels(zone).set(0)
    return metrics


@pytest.fixture(scope="module")
def executor_text() -> bytes:
    text = generate_latest(_executor_metrics("az-a").registry)
    assert _families_without_samples(text) == []
    return text


@pytest.fixture(scope="module")
def otlp_text() -> bytes:
    receiver = OtlpReceiver(producer=None, opts=MapOptions())  # no span is sent
    receiver._answer(400, "a body that is not OTLP")  # the requests counter's one sample
    text = generate_latest(receiver.registry)
    assert _families_without_samples(text) == []
    return text


def _families_without_samples(text: bytes) -> list[str]:
    lines = text.decode().splitlines()
    names = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    samples = {line.split("{")[0].split(" ")[0] for line in lines if line and not line.startswith("#")}
    suffixes = ("", "_total", "_created", "_info")
    return [n for n in names if not any(n + s in samples or n.removesuffix("_total") + s in samples for s in suffixes)]


def _text(request: pytest.FixtureRequest, exporter: str) -> bytes:
    text = request.getfixturevalue(f"{exporter}_text")
    assert isinstance(text, bytes)
    return text


# -- metrics: the lint -----------------------------------------------------------------------


@pytest.mark.parametrize("exporter", sorted(KNOWN_FINDINGS))
def test_promtool_finds_nothing_new_in_the_exporter(
    promtool: Path, request: pytest.FixtureRequest, exporter: str
) -> None:
    rc, findings = _lint(promtool, _text(request, exporter))
    new = set(findings) - KNOWN_FINDINGS[exporter]
    assert not new, f"promtool check metrics (exit {rc}) on the {exporter}'s exporter: new findings {sorted(new)}"
    assert (rc == 0) == (not findings), (rc, findings)


@pytest.mark.parametrize("exporter", sorted(KNOWN_FINDINGS))
def test_promtool_check_metrics_passes_on_the_exporter(
    promtool: Path, request: pytest.FixtureRequest, exporter: str
) -> None:
    rc, findings = _lint(promtool, _text(request, exporter))
    assert rc == 0 and not findings, f"promtool check metrics on the {exporter}'s exporter (exit {rc}): {findings}"


# -- rules and config --------------------------------------------------------------------------


def test_promtool_check_rules_passes_on_the_alerts(promtool: Path) -> None:
    rc, out = _promtool(promtool, "check", "rules", str(PROM_DIR / "alerts.yml"))
    assert rc == 0, out
    assert "SUCCESS" in out, out


def test_promtool_test_rules_fires_the_burn_rate_alert_only_where_the_budget_burns(promtool: Path) -> None:
    """infra/prometheus/alerts_test.yml: 1 % violations raise nothing, 50 % raise GovernorSLOBurnRateHigh."""
    rc, out = _promtool(promtool, "test", "rules", str(PROM_DIR / "alerts_test.yml"))
    assert rc == 0, out
    assert "SUCCESS" in out, out


def test_promtool_check_config_passes_with_its_rule_file(promtool: Path, tmp_path: Path) -> None:
    # The config names alerts.yml relative to itself: check a copy of the two, elsewhere.
    for name in ("prometheus.yml", "alerts.yml"):
        shutil.copy(PROM_DIR / name, tmp_path / name)
    rc, out = _promtool(promtool, "check", "config", "prometheus.yml", cwd=tmp_path)
    assert rc == 0, out
    assert "1 rule files found" in out and "SUCCESS" in out, out


# -- a real Prometheus scraping the executors through the shipped config ---------------------------


def _series(base: str, match: str) -> list[dict[str, str]]:
    query = urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(f"{base}/api/v1/series?{query}", timeout=5) as r:  # noqa: S310 - loopback
        data: list[dict[str, str]] = orjson.loads(r.read())["data"]
    return data


def test_a_real_prometheus_gives_each_executor_series_one_zone_label(tmp_path: Path) -> None:
    conf = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    job = next(j for j in conf["scrape_configs"] if j["job_name"] == "governor-executor")
    servers: list[HealthServer] = []
    try:
        for group in job["static_configs"]:  # executor-az-a:9465 -> an az-a executor's exporter on loopback
            [target] = group["targets"]
            zone = target.split(":")[0].removeprefix("executor-")
            assert zone in ZONES, target
            servers.append(HealthServer(_executor_metrics(zone).registry, None, 0))
            group["targets"] = [f"127.0.0.1:{servers[-1].port}"]
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": [job]}
        with running_prometheus(config, tmp_path, "the executor zone label test") as base:
            deadline = time.monotonic() + 30  # one scrape of each brings every series at once
            while len(_series(base, 'governor_executor_paused{job="governor-executor"}')) < len(servers):
                assert time.monotonic() < deadline, "prometheus scraped no executor"
                time.sleep(0.2)
            series = _series(base, '{job="governor-executor",__name__=~"governor_.*"}')
    finally:
        for server in servers:
            server.close()
    assert not [s for s in series if "exported_zone" in s], "a target label collides with the exporter's zone"
    by_port = {str(srv.port): zone for srv, zone in zip(servers, ZONES, strict=True)}
    zoned = [s for s in series if s["__name__"] != "governor_build_info"]
    assert len(zoned) >= 5 * len(servers), series
    assert all(s.get("zone") == by_port[s["instance"].rsplit(":", 1)[1]] for s in zoned), series
