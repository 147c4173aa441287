"""Scrape target discovery: static lists, Prometheus HTTP SD documents (hostile ones too),
Kubernetes pods through the official client against tests/kube_api.py, and the
validation and last-good-list rules of :class:`adapters.scrape.targets.Discovery`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubernetes import client

from adapters.scrape.runner import Scraper
from adapters.scrape.targets import (
    Discovery,
    DiscoveryError,
    Endpoint,
    HttpSdTargets,
    KubernetesTargets,
    Shard,
    StaticTargets,
    parse_endpoint,
    parse_http_sd,
    shard_of,
    validate_targets,
)
from core.settings import Settings, SettingsError
from tests.kube_api import KubeAPI

pytestmark = pytest.mark.timeout(60)
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"


@pytest.mark.parametrize(
    "raw, want",
    [
        ("http://10.0.0.5:8000/metrics=az-a", Endpoint("http://10.0.0.5:8000/metrics", "az-a")),
        ("https://e.x:443/m?x=1=az-b", Endpoint("https://e.x:443/m?x=1", "az-b")),  # the last = splits
        ("10.0.0.5:8000=az-a", None),  # no scheme
        ("http://10.0.0.5:8000/metrics", None),  # no zone
        ("http://10.0.0.5:8000/metrics=", None),  # empty zone
        ("http:///metrics=az-a", None),  # no host
    ],
)
def test_parse_endpoint(raw: str, want: Endpoint | None) -> None:
    if want is None:
        with pytest.raises(ValueError):
            parse_endpoint(raw)
    else:
        assert parse_endpoint(raw) == want


def test_http_sd_document_with_scheme_and_path_labels() -> None:
    doc = [
        {"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"zone": "az-a", "job": "vllm"}},
        {"targets": ["e.example:443"], "labels": {"zone": "az-b", "__scheme__": "https", "__metrics_path__": "/m"}},
        {"targets": ["[fd00::1]:9000"], "labels": {"zone": "az-b"}},
    ]
    found, problems = parse_http_sd(json.dumps(doc).encode())
    assert problems == []
    assert found == [
        Endpoint("http://10.0.0.5:8000/metrics", "az-a"),
        Endpoint("http://10.0.0.6:8000/metrics", "az-a"),
        Endpoint("https://e.example:443/m", "az-b"),
        Endpoint("http://[fd00::1]:9000/metrics", "az-b"),
    ]
    found, _ = parse_http_sd(b'[{"targets": ["h:1"], "labels": {"az": "az-c"}}]', zone_label="az")
    assert found == [Endpoint("http://h:1/metrics", "az-c")]


@pytest.mark.parametrize(
    "group, why",
    [
        ({"targets": ["h:1"]}, "no 'zone' label"),  # the zone is required
        ({"targets": ["h:1"], "labels": {"zone": ""}}, "no 'zone' label"),
        ({"targets": "h:1", "labels": {"zone": "az-a"}}, "targets list"),  # not a list
        ({"labels": {"zone": "az-a"}}, "targets list"),
        ("h:1", "targets list"),  # a group that is not an object
        ({"targets": ["h:1"], "labels": {"zone": 1}}, "strings to strings"),
        ({"targets": ["h:1"], "labels": ["zone"]}, "strings to strings"),
        ({"targets": ["h:1"], "labels": {"zone": "az-a", "__scheme__": "file"}}, "__scheme__"),
        ({"targets": ["h:1"], "labels": {"zone": "az-a", "__metrics_path__": "metrics"}}, "__metrics_path__"),
        ({"targets": ["h:1"], "labels": {"zone": "az-a", "__metrics_path__": "/a b"}}, "__metrics_path__"),
        ({"targets": ["http://h:1"], "labels": {"zone": "az-a"}}, "not host:port"),  # a URL, not a target
        ({"targets": ["h"], "labels": {"zone": "az-a"}}, "not host:port"),  # no port
        ({"targets": ["h:0"], "labels": {"zone": "az-a"}}, "not host:port"),
        ({"targets": ["h:99999"], "labels": {"zone": "az-a"}}, "not host:port"),
        ({"targets": ["h:1/x"], "labels": {"zone": "az-a"}}, "not host:port"),
        ({"targets": ["h :1"], "labels": {"zone": "az-a"}}, "not host:port"),
        ({"targets": [None], "labels": {"zone": "az-a"}}, "not host:port"),
        ({"targets": ["a@h:1"], "labels": {"zone": "az-a"}}, "not host:port"),  # userinfo smuggling
    ],
)
def test_hostile_http_sd_groups_are_skipped_with_a_reason(group: Any, why: str) -> None:
    good = {"targets": ["ok:1"], "labels": {"zone": "az-a"}}
    found, problems = parse_http_sd(json.dumps([group, good]).encode())
    assert found == [Endpoint("http://ok:1/metrics", "az-a")]
    assert len(problems) == 1 and why in problems[0]


@pytest.mark.parametrize(
    "body, why",
    [
        (b"not json", "not JSON"),
        (b'{"targets": []}', "want a list"),
        (b"null", "want a list"),
        (b"[" + b" " * (4 * 1024 * 1024) + b"]", "over"),
    ],
)
def test_documents_that_are_not_http_sd_raise(body: bytes, why: str) -> None:
    with pytest.raises(DiscoveryError, match=why):
        parse_http_sd(body)


def test_validate_targets_filters_zones_dedupes_and_caps() -> None:
    eps = [Endpoint(f"http://h{i}:1/metrics", "az-a") for i in range(5)]
    dup = Endpoint(eps[0].url, "az-b")
    mars = Endpoint("http://m:1/metrics", "mars")
    kept, problems = validate_targets([eps[0], mars, dup, eps[0], *eps[1:]], ("az-a", "az-b"), 3)
    assert kept == eps[:3]
    assert any("mars" in p for p in problems) and any("kept the first" in p for p in problems)
    assert sum("MAX_TARGETS" in p for p in problems) == 2


_URLS = st.lists(
    st.builds("http://10.{}.{}.{}:8000/metrics".format, *[st.integers(0, 255)] * 3), unique=True, max_size=60
)


@settings(derandomize=True, max_examples=60, deadline=None)
@given(urls=_URLS, more=_URLS, n=st.integers(1, 9))
@example(urls=["http://10.0.0.1:8000/metrics"], more=["http://10.0.0.2:8000/metrics"], n=2)
def test_shards_cover_every_target_once_and_keep_it_as_others_come(urls: list[str], more: list[str], n: int) -> None:
    eps = [Endpoint(u, "az-a") for u in urls]
    zones, cap = ("az-a",), 100_000
    shards = [validate_targets(eps, zones, cap, Shard(i, n))[0] for i in range(n)]
    # n adapters with 0/n .. n-1/n: every target read, by exactly one of them
    assert sorted(ep.url for kept in shards for ep in kept) == sorted(urls)
    grown = eps + [Endpoint(u, "az-a") for u in more if u not in urls]
    for i, kept in enumerate(shards):  # targets added (and listed first or last): nobody moves
        assert set(kept) <= set(validate_targets(grown, zones, cap, Shard(i, n))[0])
        assert set(kept) <= set(validate_targets(grown[::-1], zones, cap, Shard(i, n))[0])
    # one adapter more: a target either stays or moves to the new one (jump hash), never between old ones
    assert all(shard_of(u, n + 1) in (shard_of(u, n), n) for u in urls)


def test_a_shard_of_a_zone_and_the_cap_per_adapter() -> None:
    eps = [Endpoint(f"http://h{i}:1/metrics", ("az-a", "az-b")[i % 2]) for i in range(40)]
    zones = ("az-a", "az-b")
    b_only, problems = validate_targets(eps, zones, 100, Shard(zones=("az-b",)))
    assert b_only == eps[1::2] and problems == []  # another adapter's zone is not a problem
    mine = [ep for ep in eps if shard_of(ep.url, 2) == 1]
    capped, problems = validate_targets(eps, zones, 5, Shard(1, 2))
    # the bound counts this adapter's targets only: the first 5 of its own, the rest named
    assert capped == mine[:5] and len(problems) == len(mine) - 5
    assert all("MAX_TARGETS" in p for p in problems)


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, Shard()),  # unset: every target
        ({"GOVERNOR_SCRAPE_SHARD": "1/3"}, Shard(1, 3)),
        ({"GOVERNOR_SCRAPE_SHARD_ZONES": "az-b"}, Shard(zones=("az-b",))),
        ({"GOVERNOR_SCRAPE_SHARD": "3/3"}, "0 <= i < n"),  # the index counts from 0
        ({"GOVERNOR_SCRAPE_SHARD": "two"}, "want i/n"),
        ({"GOVERNOR_SCRAPE_SHARD": "-1/2"}, "want i/n"),
        ({"GOVERNOR_SCRAPE_SHARD_ZONES": "mars"}, "not in GOVERNOR_ZONES"),
    ],
)
def test_shard_settings(env: dict[str, str], want: Shard | str) -> None:
    if isinstance(want, Shard):
        assert Shard.from_settings(Settings.from_env(env)) == want
    else:
        with pytest.raises(SettingsError, match=want):
            Settings.from_env(env)


class _Flaky:
    name = "flaky"

    def __init__(self, results: list[list[Endpoint] | Exception]) -> None:
        self.results = results

    def targets(self) -> list[Endpoint]:
        r = self.results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r


def test_discovery_keeps_the_last_good_list_of_a_failing_source(caplog: pytest.LogCaptureFixture) -> None:
    a, b = Endpoint("http://a:1/metrics", "az-a"), Endpoint("http://b:1/metrics", "az-b")
    flaky = _Flaky([[a], DiscoveryError("HTTP 500"), [b]])
    disc = Discovery([flaky, StaticTargets([a])], ("az-a", "az-b"), 10)
    assert asyncio.run(disc.refresh()) == [a]  # deduplicated across sources
    assert asyncio.run(disc.refresh()) == [a] and disc.failures == 1
    assert "discovery flaky failed, keeping its last 1 targets" in caplog.text
    assert asyncio.run(disc.refresh()) == [b, a]


def test_scraper_drops_the_baselines_of_targets_that_left() -> None:
    settings = Settings()
    a, b = Endpoint("http://a:1/metrics", "az-a"), Endpoint("http://b:1/metrics", "az-b")
    scraper = Scraper(settings, [a, b], "vllm")
    text = (FIX / "vllm_1.txt").read_text()
    scraper.step({a.url: text, b.url: text}, 1_000_000)
    assert scraper.baselines == 2
    scraper.set_endpoints([b])
    assert scraper.baselines == 1 and scraper.previous(b.url, "meta-llama/Llama-3.1-8B-Instruct") is not None
    scraper.set_endpoints([])
    assert scraper.baselines == 0


@pytest.fixture
def sd_server() -> Iterator[tuple[str, list[Any]]]:
    """Serves ``docs[0]`` (bytes, or an int status) and pops it when more follow."""
    docs: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            doc = docs.pop(0) if len(docs) > 1 else docs[0]
            if isinstance(doc, int):
                self.send_error(doc)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(doc)))
            self.end_headers()
            self.wfile.write(doc)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/sd", docs
    finally:
        server.shutdown()
        server.server_close()


def test_http_sd_source_is_re_read_and_survives_a_failure(sd_server: tuple[str, list[Any]]) -> None:
    url, docs = sd_server
    one = [{"targets": ["10.0.0.5:8000"], "labels": {"zone": "az-a"}}]
    two = [{"targets": ["10.0.0.5:8000", "10.0.0.6:8000"], "labels": {"zone": "az-b"}}]
    docs.extend([json.dumps(one).encode(), 500, b"{broken", json.dumps(two).encode()])
    disc = Discovery([HttpSdTargets(url)], ("az-a", "az-b"), 10)
    first = asyncio.run(disc.refresh())
    assert first == [Endpoint("http://10.0.0.5:8000/metrics", "az-a")]
    assert asyncio.run(disc.refresh()) == first  # HTTP 500: the last good list
    assert asyncio.run(disc.refresh()) == first  # not JSON: the same
    assert [ep.zone for ep in asyncio.run(disc.refresh())] == ["az-b", "az-b"]
    assert disc.failures == 2
    with pytest.raises(ValueError):
        HttpSdTargets("file:///etc/passwd")


@pytest.fixture
def kube() -> Iterator[tuple[KubeAPI, client.ApiClient]]:
    with KubeAPI() as api, client.ApiClient(api.client_configuration()) as c:
        api.add_node("node-a", zone="az-a")
        api.add_node("node-b", zone="az-b")
        api.add_node("node-x")  # no zone label
        yield api, c


def test_kubernetes_pods_ready_running_with_zones(kube: tuple[KubeAPI, client.ApiClient]) -> None:
    api, c = kube
    sel = {"app": "vllm"}
    api.add_pod("ok-a", labels=sel, ip="10.0.0.1", node="node-a")
    api.add_pod("ok-b", labels=sel, ip="10.0.0.2", node="node-b")
    api.add_pod("override", labels={**sel, "zone": "az-b"}, ip="10.0.0.3", node="node-a")  # pod label wins
    api.add_pod("v6", labels=sel, ip="fd00::7", node="node-a")
    api.add_pod("not-ready", labels=sel, ip="10.0.0.4", node="node-a", ready=False)
    api.add_pod("pending", labels=sel, ip="", node="node-a", phase="Pending", ready=False)
    api.add_pod("leaving", labels=sel, ip="10.0.0.5", node="node-a", deleting=True)
    api.add_pod("no-zone", labels=sel, ip="10.0.0.6", node="node-x")
    api.add_pod("no-node", labels=sel, ip="10.0.0.8", node="node-gone")
    api.add_pod("other-app", labels={"app": "sglang"}, ip="10.0.0.9", node="node-a")
    api.add_pod("other-ns", namespace="prod", labels=sel, ip="10.0.1.1", node="node-a")
    src = KubernetesTargets("app=vllm", "default", 8000, api_client=c)
    assert src.targets() == [
        Endpoint("http://10.0.0.1:8000/metrics", "az-a"),
        Endpoint("http://10.0.0.2:8000/metrics", "az-b"),
        Endpoint("http://10.0.0.3:8000/metrics", "az-b"),
        Endpoint("http://[fd00::7]:8000/metrics", "az-a"),
    ]
    # Node zones are cached while the node has matching pods: one read per node.
    reads = [p for m, p, _ in api.requests if "/nodes/" in p]
    src.targets()
    assert [p for m, p, _ in api.requests if "/nodes/" in p] == reads + ["/api/v1/nodes/node-gone"]
    lists = [p for m, p, _ in api.requests if p.startswith("/api/v1/namespaces/default/pods")]
    assert all("labelSelector=app%3Dvllm" in p and "resourceVersion=0" in p for p in lists)


def test_kubernetes_discovery_follows_pods_and_survives_api_errors(kube: tuple[KubeAPI, client.ApiClient]) -> None:
    api, c = kube
    api.add_pod("a", labels={"app": "vllm"}, ip="10.0.0.1", node="node-a")
    disc = Discovery([KubernetesTargets("app=vllm", "default", 9000, api_client=c)], ("az-a", "az-b"), 10)
    assert [ep.url for ep in asyncio.run(disc.refresh())] == ["http://10.0.0.1:9000/metrics"]
    api.add_pod("b", labels={"app": "vllm"}, ip="10.0.0.2", node="node-b")
    api.inject(403, times=1, path="/pods")  # RBAC missing for a moment: the last good list stays
    assert len(asyncio.run(disc.refresh())) == 1 and disc.failures == 1
    assert len(asyncio.run(disc.refresh())) == 2
    api.delete("v1", "pods", "a")
    assert [ep.zone for ep in asyncio.run(disc.refresh())] == ["az-b"]
    with pytest.raises(ValueError):
        KubernetesTargets("  ", api_client=c)


def test_kubernetes_node_read_failure_skips_only_that_pod(kube: tuple[KubeAPI, client.ApiClient]) -> None:
    api, c = kube
    api.add_pod("a", labels={"app": "vllm"}, ip="10.0.0.1", node="node-a")
    api.add_pod("b", labels={"app": "vllm", "zone": "az-b"}, ip="10.0.0.2", node="node-b")
    api.inject(403, times=1, path="/nodes/")  # no RBAC on nodes: zones must come from pod labels
    assert KubernetesTargets("app=vllm", api_client=c).targets() == [Endpoint("http://10.0.0.2:8000/metrics", "az-b")]
