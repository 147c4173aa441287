"""Where ``governor ingest scrape`` finds its engines: a static list, HTTP SD, Kubernetes pods.

A :class:`TargetSource` answers "which ``/metrics`` endpoints, in which zone, now?" as a
list of :class:`Endpoint`.  Three sources, any combination:

* :class:`StaticTargets`: ``GOVERNOR_SCRAPE_ENDPOINTS`` plus each ``--endpoint URL=zone``.
* :class:`HttpSdTargets`: ``GOVERNOR_SCRAPE_HTTP_SD``, a Prometheus ``http_sd_configs``
  document (``[{"targets": ["host:port", ...], "labels": {"zone": "az-a", ...}}]``); the
  zone label (``GOVERNOR_SCRAPE_ZONE_LABEL``, default ``zone``) is required per group,
  ``__scheme__`` (http/https) and ``__metrics_path__`` are honoured as Prometheus does, and
  ``__meta_start_time_s`` (unix seconds), when given, is when the group's engines started.
* :class:`KubernetesTargets`: ``GOVERNOR_SCRAPE_K8S_SELECTOR`` (+ ``_NAMESPACE``, ``_PORT``):
  the pods matching the label selector, listed through the official ``kubernetes``
  client (in-cluster config in a pod, else the kubeconfig); only ``Running`` pods whose
  ``Ready`` condition is true and that are not being deleted; the zone is the pod's
  zone label when it has one, else its node's ``topology.kubernetes.io/zone``; the URL
  is ``http://<podIP>:<port>/metrics`` and the pod's ``startTime`` its start time.  It needs get/list on pods and get on nodes
  (``infra/k8s/rbac-ingest.yaml``).  The list is read from the API server's watch cache
  (``resourceVersion=0``), so a list every scrape costs the API server little.

:class:`Discovery` re-reads every source before each scrape (in threads: the sources
block).  A source that fails keeps its last good list and the failure is logged; the
merged list is then validated (:func:`validate_targets`): a target whose zone is not in
``GOVERNOR_ZONES`` is skipped with a warning, duplicate URLs are kept once, and at most
``GOVERNOR_SCRAPE_MAX_TARGETS`` are kept.  Every source's input is hostile: a malformed
document or pod is skipped with the reason, never a crash.

More targets than one adapter reads in an interval are split across adapters (:class:`Shard`):
``GOVERNOR_SCRAPE_SHARD=i/n`` keeps the targets whose URL a jump consistent hash
(:func:`shard_of`) puts in bucket ``i`` of ``n`` (n adapters, 0/n .. n-1/n, read every target
exactly once; a target's bucket depends on its URL and ``n`` only, so it keeps its adapter as
targets come and go, and going from ``n`` to ``n + 1`` adapters moves only a ``1/(n+1)`` share),
and ``GOVERNOR_SCRAPE_SHARD_ZONES`` keeps those of the zones named (an adapter per zone).  The
shard is taken before the ``GOVERNOR_SCRAPE_MAX_TARGETS`` bound, which holds per adapter.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import logging
import math
import os
import re
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from core.settings import Settings, scrape_shard_parts

__all__ = ["Discovery", "Endpoint", "HttpSdTargets", "KubernetesTargets", "StaticTargets", "TargetSource"]
__all__ += ["Shard", "parse_endpoint", "parse_http_sd", "shard_of", "validate_targets"]

log = logging.getLogger(__name__)

ZONE_NODE_LABEL = "topology.kubernetes.io/zone"
START_LABEL = "__meta_start_time_s"  # HTTP SD: when the group's engines started (unix seconds)
MAX_SD_BYTES = 4 * 1024 * 1024
_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9]([A-Za-z0-9.\-]{0,252})):(\d{1,5})$")
_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/\-]*$")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class DiscoveryError(RuntimeError):
    """A source could not say what its targets are (its last good list stays in use)."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    zone: str
    #: when the target's process started (unix s), where discovery knows it (a pod's ``startTime``,
    #: the HTTP SD label :data:`START_LABEL`); the scraper's first-scrape rule uses it
    start_time_s: float | None = field(default=None, compare=False, repr=False)

    @property
    def node(self) -> str:
        """The replica's node id: ``host:port`` of its metrics URL."""
        parts = urlsplit(self.url)
        return parts.netloc or self.url


def parse_endpoint(raw: str) -> Endpoint:
    """``URL=zone`` -> :class:`Endpoint` (ValueError says what is wrong).

    >>> parse_endpoint("http://10.0.0.5:8000/metrics=az-a")
    Endpoint(url='http://10.0.0.5:8000/metrics', zone='az-a')
    """
    url, sep, zone = raw.strip().rpartition("=")
    if not sep or not url.startswith(("http://", "https://")) or not zone or not urlsplit(url).netloc:
        raise ValueError(f"--endpoint {raw!r}: want URL=zone, e.g. http://10.0.0.5:8000/metrics=az-a")
    return Endpoint(url, zone)


class TargetSource(Protocol):
    """The current targets of one source (blocking; raises on failure)."""

    name: str

    def targets(self) -> list[Endpoint]: ...


class StaticTargets:
    name = "static"

    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = list(endpoints)

    def targets(self) -> list[Endpoint]:
        return list(self.endpoints)


def parse_http_sd(body: bytes, zone_label: str = "zone") -> tuple[list[Endpoint], list[str]]:
    """A Prometheus HTTP SD document -> (targets, problems); DiscoveryError if it is not one.

    >>> doc = b'[{"targets": ["10.0.0.5:8000"], "labels": {"zone": "az-a", "__metrics_path__": "/m"}}]'
    >>> parse_http_sd(doc)
    ([Endpoint(url='http://10.0.0.5:8000/m', zone='az-a')], [])
    """
    if len(body) > MAX_SD_BYTES:
        raise DiscoveryError(f"HTTP SD document of {len(body)} bytes is over {MAX_SD_BYTES}")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise DiscoveryError(f"HTTP SD document is not JSON: {exc}") from None
    if not isinstance(doc, list):
        raise DiscoveryError(f"HTTP SD document is a {type(doc).__name__}, want a list of target groups")
    out: list[Endpoint] = []
    problems: list[str] = []
    for i, group in enumerate(doc):
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            problems.append(f"group {i}: not an object with a targets list")
            continue
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            problems.append(f"group {i}: labels must map strings to strings")
            continue
        zone = labels.get(zone_label, "")
        scheme = labels.get("__scheme__", "http")
        path = labels.get("__metrics_path__", "/metrics")
        if not zone:
            problems.append(f"group {i}: no {zone_label!r} label")
            continue
        if scheme not in ("http", "https"):
            problems.append(f"group {i}: __scheme__ {scheme[:20]!r} is not http or https")
            continue
        if not _PATH.match(path) or len(path) > 256:
            problems.append(f"group {i}: __metrics_path__ {path[:40]!r} is not a URL path")
            continue
        start_s = _start_time(labels.get(START_LABEL))
        if START_LABEL in labels and start_s is None:
            problems.append(f"group {i}: {START_LABEL} {labels[START_LABEL][:40]!r} is not unix seconds (ignored)")
        for t in group["targets"]:
            m = _HOSTPORT.match(t) if isinstance(t, str) else None
            if m is None or not 0 < int(m.group(3)) < 65536:
                problems.append(f"group {i}: target {str(t)[:60]!r} is not host:port")
                continue
            out.append(Endpoint(f"{scheme}://{t}{path}", zone, start_s))
    return out, problems


def _start_time(raw: str | None) -> float | None:
    """A start time label as unix seconds (None: absent or not a finite positive number)."""
    try:
        v = float(raw) if raw is not None else math.nan
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


class HttpSdTargets:
    """The targets a Prometheus HTTP SD endpoint lists (re-read every scrape)."""

    name = "http_sd"

    def __init__(self, url: str, zone_label: str = "zone", timeout_s: float = 5.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"GOVERNOR_SCRAPE_HTTP_SD={url!r}: want an http(s) URL")
        self.url, self.zone_label, self.timeout_s = url, zone_label, timeout_s

    def targets(self) -> list[Endpoint]:
        req = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 (operator-given URL)
                body: bytes = resp.read(MAX_SD_BYTES + 1)
        except OSError as exc:
            raise DiscoveryError(f"GET {self.url}: {exc}") from exc
        found, problems = parse_http_sd(body, self.zone_label)
        _log_problems(self.name, problems)
        return found


def _log_problems(source: str, problems: list[str]) -> None:
    if problems:
        more = f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        log.warning("%s: skipped %d entries: %s%s", source, len(problems), "; ".join(problems[:5]), more)


def kubernetes_api_client() -> Any:
    """The official client configured as a pod (in-cluster) or a workstation (kubeconfig) would be."""
    from kubernetes import client, config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def default_namespace(namespace: str) -> str:
    if namespace:
        return namespace
    try:
        return SA_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


class KubernetesTargets:
    """Ready engine pods by label selector, zone from the pod label or its node."""

    name = "kubernetes"

    def __init__(
        self,
        selector: str,
        namespace: str = "",
        port: int = 8000,
        zone_label: str = "zone",
        api_client: Any = None,
        timeout_s: float = 5.0,
        client_factory: Callable[[], Any] = kubernetes_api_client,
    ) -> None:
        if not selector.strip():
            raise ValueError("GOVERNOR_SCRAPE_K8S_SELECTOR is empty: an empty selector would scrape every pod")
        self.selector, self.port, self.zone_label = selector, port, zone_label
        self.namespace = default_namespace(namespace)
        self.timeout_s = timeout_s
        self._client, self._factory = api_client, client_factory
        self._node_zones: dict[str, str] = {}

    def _api(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def _node_zone(self, core: Any, node: str) -> str:
        if node not in self._node_zones:
            obj = core.read_node(node, _request_timeout=self.timeout_s)
            self._node_zones[node] = (obj.metadata.labels or {}).get(ZONE_NODE_LABEL, "")
        return self._node_zones[node]

    def targets(self) -> list[Endpoint]:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(self._api())
        try:
            pods = core.list_namespaced_pod(
                self.namespace, label_selector=self.selector, resource_version="0", _request_timeout=self.timeout_s
            )
        except (ApiException, OSError, ValueError) as exc:
            raise DiscoveryError(f"list pods {self.namespace}/{self.selector}: {_short(exc)}") from exc
        out: list[Endpoint] = []
        problems: list[str] = []
        nodes: set[str] = set()
        for pod in pods.items or []:
            meta, spec, status = pod.metadata, pod.spec, pod.status
            name = getattr(meta, "name", "?")
            if meta is None or status is None or meta.deletion_timestamp is not None or status.phase != "Running":
                continue
            if not any(c.type == "Ready" and c.status == "True" for c in status.conditions or []):
                continue
            try:
                ip = ipaddress.ip_address(status.pod_ip or "")
            except ValueError:
                problems.append(f"pod {name}: podIP {status.pod_ip!r} is not an IP")
                continue
            zone = (meta.labels or {}).get(self.zone_label, "")
            node = getattr(spec, "node_name", None) or ""
            if not zone and node:
                nodes.add(node)
                try:
                    zone = self._node_zone(core, node)
                except (ApiException, OSError, ValueError) as exc:
                    problems.append(f"pod {name}: node {node}: {_short(exc)}")
                    continue
            if not zone:
                problems.append(f"pod {name}: no {self.zone_label!r} label and node {node!r} has no {ZONE_NODE_LABEL}")
                continue
            host = f"[{ip}]" if ip.version == 6 else str(ip)
            started = getattr(status, "start_time", None)
            start_s = started.timestamp() if isinstance(started, datetime) else None
            out.append(Endpoint(f"http://{host}:{self.port}/metrics", zone, start_s))
        self._node_zones = {n: z for n, z in self._node_zones.items() if n in nodes}  # bounded by live nodes
        _log_problems(self.name, problems)
        return out


def _short(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    return f"HTTP {status} {reason}" if status else f"{type(exc).__name__}: {exc}"[:300]


def shard_of(url: str, count: int) -> int:
    """The bucket in ``[0, count)`` of a target URL: a jump consistent hash (Lamping and Veach,
    arXiv:1406.2294) of its BLAKE2b digest, the same in every process and Python version.

    >>> shard_of("http://10.0.0.5:8000/metrics", 1), [shard_of("http://10.0.0.5:8000/metrics", n) for n in (2, 3)]
    (0, [1, 2])
    """
    key = int.from_bytes(hashlib.blake2b(url.encode(), digest_size=8).digest(), "big")
    b, j = -1, 0
    while j < count:
        b = j
        key = (key * 2862933555777941757 + 1) % (1 << 64)
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


@dataclass(frozen=True)
class Shard:
    """One adapter's share of the targets: bucket ``index`` of ``count`` (:func:`shard_of`), and only
    ``zones`` when any are named (the module docstring)."""

    index: int = 0
    count: int = 1
    zones: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index {self.index} of count {self.count}: want 0 <= index < count")

    @classmethod
    def from_settings(cls, settings: Settings) -> Shard:
        index, count = scrape_shard_parts(settings.scrape_shard)
        return cls(index, count, tuple(settings.scrape_shard_zones))

    def owns(self, ep: Endpoint) -> bool:
        if self.zones and ep.zone not in self.zones:
            return False
        return self.count == 1 or shard_of(ep.url, self.count) == self.index

    def __str__(self) -> str:
        where = f" in {','.join(self.zones)}" if self.zones else ""
        return f"shard {self.index}/{self.count}{where}"


ALL = Shard()


def validate_targets(
    candidates: Sequence[Endpoint], zones: Sequence[str], max_targets: int, shard: Shard = ALL
) -> tuple[list[Endpoint], list[str]]:
    """Keep this ``shard``'s targets in a known zone, each URL once, at most ``max_targets`` -> (kept, problems).

    >>> a, b = Endpoint("http://a:1/metrics", "az-a"), Endpoint("http://b:1/metrics", "mars")
    >>> validate_targets([a, a, b], ("az-a",), 10)
    ([Endpoint(url='http://a:1/metrics', zone='az-a')], ["http://b:1/metrics: zone 'mars' is not in GOVERNOR_ZONES"])
    """
    kept: dict[str, Endpoint] = {}
    problems: list[str] = []
    for ep in candidates:
        if not shard.owns(ep):
            continue  # another adapter's
        if ep.zone not in zones:
            problems.append(f"{ep.url}: zone {ep.zone!r} is not in GOVERNOR_ZONES")
        elif ep.url in kept:
            if kept[ep.url].zone != ep.zone:
                problems.append(f"{ep.url}: listed in zones {kept[ep.url].zone} and {ep.zone}; kept the first")
        elif len(kept) >= max_targets:
            problems.append(f"{ep.url}: over GOVERNOR_SCRAPE_MAX_TARGETS={max_targets}")
        else:
            kept[ep.url] = ep
    return list(kept.values()), problems


class Discovery:
    """Every source re-read before each scrape; the last good list of a failing source kept."""

    def __init__(
        self, sources: Sequence[TargetSource], zones: Sequence[str], max_targets: int, shard: Shard = ALL
    ) -> None:
        self.sources, self.zones, self.max_targets, self.shard = list(sources), tuple(zones), max_targets, shard
        self._last: dict[str, list[Endpoint]] = {}
        self._reported: set[str] = set()
        self.failures = 0

    async def refresh(self) -> list[Endpoint]:
        results = await asyncio.gather(*(asyncio.to_thread(s.targets) for s in self.sources), return_exceptions=True)
        for src, res in zip(self.sources, results, strict=True):
            if isinstance(res, BaseException):
                self.failures += 1
                kept = len(self._last.get(src.name, []))
                log.warning("discovery %s failed, keeping its last %d targets: %s", src.name, kept, _short(res))
            else:
                self._last[src.name] = res
        merged = [ep for src in self.sources for ep in self._last.get(src.name, [])]
        kept_eps, problems = validate_targets(merged, self.zones, self.max_targets, self.shard)
        new = [p for p in problems if p not in self._reported]
        if new:  # each problem once while it lasts, not every scrape
            _log_problems("targets", new)
        self._reported = set(problems)
        return kept_eps
