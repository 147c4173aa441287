"""Scraping without trust: the scrape adapter and the PromQL source against a real TLS endpoint on loopback.

A throwaway CA signs a server certificate (127.0.0.1) and a client certificate
(``openssl``, as tests/integration/test_redis_tls.py makes them); an aiohttp
server with an ``ssl`` context from them serves the vLLM fixture expositions on
``/metrics`` and a canned instant vector on ``/api/v1/query``, and answers 401
unless ``Authorization`` is the bearer token the test expects now.  Through the
settings (``GOVERNOR_SCRAPE_TLS_*``, ``GOVERNOR_SCRAPE_BEARER_TOKEN_FILE``, the
``GOVERNOR_SCRAPE_PROMETHEUS_*`` four):

* without the CA the server's certificate is refused (verification fails);
* with the CA the adapter's records equal those of the same texts read without I/O;
* the token goes from its file, and a rotated file's new token from the next scrape on;
* a server that requires a client certificate is refused without one and answers with it;
* the PromQL source does the same against its Prometheus;
* an unusable setting (a certificate without its key, a missing CA file) is exit 2 naming it.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import threading
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from adapters.scrape.promql import PromqlError, PromqlSource
from adapters.scrape.runner import EndpointCollector, Scraper, fetch_text
from adapters.scrape.runner import run as run_scrape
from adapters.scrape.targets import Endpoint
from adapters.scrape.trust import TrustError
from core.settings import ModelSpec, Settings
from governor.cli import build_parser
from tests.integration.test_redis_tls import _certificates

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
MODEL = ModelSpec("llama", ttft_slo_ms=1000.0, itl_slo_ms=150.0)
VECTOR = b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"up"},"value":[1,"1"]}]}}'


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("the scrape TLS test needs the openssl command to make its throwaway certificates")
    d = tmp_path_factory.mktemp("scrape-tls")
    _certificates(d)
    return d


class TlsEndpoint:
    """An https server on 127.0.0.1 (its own event loop, in a thread); ``token``: the bearer it wants now."""

    def __init__(self, certs: Path, client_cert_required: bool) -> None:
        self.texts = [(FIX / name).read_bytes() for name in ("vllm_1.txt", "vllm_2.txt")]
        self.stage = 0
        self.token: str | None = None
        self.seen: list[str] = []  # the Authorization headers of the requests that reached a handler
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certs / "server.crt", certs / "server.key")
        if client_cert_required:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(certs / "ca.crt")
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = int(self._sock.getsockname()[1])
        self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/api/v1/query", self._query)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.SockSite(self._runner, self._sock, ssl_context=ctx).start())
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def url(self, path: str = "/metrics") -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def _authorised(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        self.seen.append(header)
        return self.token is None or header == f"Bearer {self.token}"

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.Response(status=401, text="bearer token wanted")
        return web.Response(body=self.texts[self.stage], content_type="text/plain")

    async def _query(self, request: web.Request) -> web.Response:
        if not self._authorised(request):
            return web.Response(status=401, text="bearer token wanted")
        return web.Response(body=VECTOR, content_type="application/json")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


@pytest.fixture
def start(certs: Path) -> Iterator[Callable[[bool], TlsEndpoint]]:
    """``start(client_cert_required)``: a new server, closed at the test's end."""
    started: list[TlsEndpoint] = []

    def one(client_cert_required: bool) -> TlsEndpoint:
        started.append(TlsEndpoint(certs, client_cert_required))
        return started[-1]

    try:
        yield one
    finally:
        for srv in started:
            srv.close()


@pytest.fixture
def server(start: Callable[[bool], TlsEndpoint]) -> TlsEndpoint:
    return start(False)


@pytest.fixture
def mtls_server(start: Callable[[bool], TlsEndpoint]) -> TlsEndpoint:
    return start(True)


def _settings(**kw: Any) -> Settings:
    return Settings(models=(MODEL,), **kw)


def _collector(settings: Settings, srv: TlsEndpoint) -> EndpointCollector:
    scraper = Scraper(settings, [Endpoint(srv.url(), "az-a")], "vllm", {SERVED: "llama"})
    return EndpointCollector(scraper, timeout_s=5.0)


def _token(path: Path, text: str, srv: TlsEndpoint) -> Path:
    """Write ``text`` (a token and maybe a newline) to ``path``; ``srv`` wants that token from now on."""
    path.write_text(text)
    srv.token = text.strip()
    return path


def _comparable(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(sorted((k, v) for k, v in r.items() if k not in ("ts_ms", "request_id"))) for r in records)


def test_a_certificate_no_configured_ca_signed_is_refused(server: TlsEndpoint) -> None:
    collector = _collector(_settings(), server)
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        fetch_text(server.url(), 5.0, collector.http)
    assert server.seen == []  # refused in the handshake: no request reached the server


async def test_with_the_ca_file_the_records_are_those_of_the_texts(certs: Path, server: TlsEndpoint) -> None:
    collector = _collector(_settings(scrape_tls_ca_file=str(certs / "ca.crt")), server)
    assert await collector.collect(1_700_000_000_000) == []  # the baseline
    server.stage = 1
    got = await collector.collect(1_700_000_005_000)
    offline = Scraper(_settings(), [Endpoint(server.url(), "az-a")], "vllm", {SERVED: "llama"})
    texts = [t.decode() for t in server.texts]
    offline.step({server.url(): texts[0]}, 1_700_000_000_000)
    want = offline.step({server.url(): texts[1]}, 1_700_000_005_000)
    assert got and _comparable(got) == _comparable(want)


def test_the_bearer_token_comes_from_its_file_and_a_rotated_one_is_used(
    certs: Path, server: TlsEndpoint, tmp_path: Path
) -> None:
    token_file = _token(tmp_path / "token", "first-token\n", server)
    ca = str(certs / "ca.crt")
    plain = _collector(_settings(scrape_tls_ca_file=ca), server)
    with pytest.raises(urllib.error.HTTPError, match="401"):
        fetch_text(server.url(), 5.0, plain.http)  # no token, no metrics
    collector = _collector(_settings(scrape_tls_ca_file=ca, scrape_bearer_token_file=str(token_file)), server)
    assert fetch_text(server.url(), 5.0, collector.http).startswith("#")
    _token(token_file, "second-token\n", server)  # rotated: the server wants the new one from now on
    assert fetch_text(server.url(), 5.0, collector.http).startswith("#")
    assert server.seen == ["", "Bearer first-token", "Bearer second-token"]


def test_a_server_that_requires_a_client_certificate_gets_the_configured_one(
    certs: Path, mtls_server: TlsEndpoint
) -> None:
    ca = str(certs / "ca.crt")
    without = _collector(_settings(scrape_tls_ca_file=ca), mtls_server)
    with pytest.raises(OSError):  # the server ends the handshake (an SSL error or a reset, by TLS version)
        fetch_text(mtls_server.url(), 5.0, without.http)
    with_cert = _settings(
        scrape_tls_ca_file=ca,
        scrape_tls_cert_file=str(certs / "client.crt"),
        scrape_tls_key_file=str(certs / "client.key"),
    )
    assert fetch_text(mtls_server.url(), 5.0, _collector(with_cert, mtls_server).http).startswith("#")
    assert mtls_server.seen == [""]


def test_the_promql_source_uses_its_own_ca_client_certificate_and_token(
    certs: Path, mtls_server: TlsEndpoint, tmp_path: Path
) -> None:
    token_file = _token(tmp_path / "prom-token", "prom-token", mtls_server)
    base = mtls_server.url("")
    untrusted = PromqlSource(_settings(), base, "vllm", {SERVED: "llama"})
    with pytest.raises(PromqlError, match="CERTIFICATE_VERIFY_FAILED"):
        untrusted.query("up", 1.0)
    trusted = _settings(
        scrape_prometheus_ca_file=str(certs / "ca.crt"),
        scrape_prometheus_cert_file=str(certs / "client.crt"),
        scrape_prometheus_key_file=str(certs / "client.key"),
        scrape_prometheus_bearer_token_file=str(token_file),
        # the targets' settings are another side's: they do not reach the Prometheus
        scrape_bearer_token_file=str(tmp_path / "absent"),
    )
    assert PromqlSource(trusted, base, "vllm", {SERVED: "llama"}).query("up", 1.0) == [({"__name__": "up"}, 1.0)]
    assert mtls_server.seen == ["Bearer prom-token"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"GOVERNOR_SCRAPE_TLS_CERT_FILE": "{certs}/client.crt"}, "GOVERNOR_SCRAPE_TLS_KEY_FILE"),
        ({"GOVERNOR_SCRAPE_TLS_CA_FILE": "{certs}/absent.crt"}, "GOVERNOR_SCRAPE_TLS_CA_FILE"),
        ({"GOVERNOR_SCRAPE_BEARER_TOKEN_FILE": "{certs}/absent"}, "GOVERNOR_SCRAPE_BEARER_TOKEN_FILE"),
    ],
)
def test_an_unusable_setting_is_exit_2_naming_it(
    certs: Path, env: dict[str, str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings.from_env({k: v.format(certs=certs) for k, v in env.items()})
    args = build_parser().parse_args(["ingest", "scrape", "--endpoint", "https://127.0.0.1:1/metrics=az-a"])
    assert run_scrape(settings, args) == 2
    assert capsys.readouterr().err.startswith(f"governor ingest scrape: {named}")


def test_a_client_certificate_without_its_key_is_a_trust_error_naming_the_key(certs: Path) -> None:
    settings = _settings(scrape_prometheus_cert_file=str(certs / "client.crt"))
    with pytest.raises(TrustError, match="^GOVERNOR_SCRAPE_PROMETHEUS_KEY_FILE"):
        PromqlSource(settings, "https://127.0.0.1:1", "vllm")
