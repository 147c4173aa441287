"""The webhook backend against a real aiohttp server: signed requests, auth, retries, bounds, TLS.

The receiver checks the signature with the recipe of executors/webhook.py's docstring,
written out again here (not imported), so a change of the wire format fails this test.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from core.settings import Settings, SettingsError
from core.signing import Keyring
from executors.backends import BackendRejected, BackendUnavailable
from executors.webhook import WebhookBackend
from loop.commands import Command

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

KEY_HEX = "5a" * 32
RING = Keyring.parse("k1:" + bytes(range(32)).hex())


def _cmd(target: int = 4) -> Command:
    now = int(time.time() * 1000)
    c = Command(
        kind="scale",
        zone="az-a",
        model="m",
        target_replicas=target,
        reason="test",
        issued_at_ms=now,
        expires_at_ms=now + 60_000,
        basis_ms=now,
    )
    return c.with_hlc(now << 16).signed(RING)


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    hang_s: float = 0.0


@dataclass
class Seen:
    at: float
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A real HTTP server answering from a script (then 200), keeping every request it got."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.seen: list[Seen] = []
        self.url = ""
        self.moved_hit = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(time.monotonic(), dict(request.headers), await request.read()))
        a = self.script.pop(0) if self.script else Answer()
        if a.hang_s:
            await asyncio.sleep(a.hang_s)
        return web.Response(status=a.status, headers=a.headers, body=a.body)

    async def moved(self, request: web.Request) -> web.StreamResponse:
        self.moved_hit += 1
        return web.Response(status=200)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/cmd", rec.handle)
    app.router.add_post("/elsewhere", rec.moved)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rec.url = f"http://127.0.0.1:{port}/cmd"
    yield rec
    await runner.cleanup()


def _verify(key_hex: str, seen: Seen, max_age_s: float = 300.0) -> bool:
    """The receiver's recipe (docs/internals.md, executors/webhook.py), written out independently."""
    ts = seen.headers["X-Governor-Timestamp"]
    expected = "sha256=" + hmac.new(bytes.fromhex(key_hex), ts.encode() + b"." + seen.body, hashlib.sha256).hexdigest()
    fresh = abs(time.time() - int(ts)) <= max_age_s
    return fresh and hmac.compare_digest(expected, seen.headers.get("X-Governor-Signature", ""))


async def test_signed_request_verifies_with_the_documented_recipe_and_carries_the_auth(
    receiver: Receiver, tmp_path: Path
) -> None:
    auth = tmp_path / "auth"
    auth.write_text("Bearer first-token\n")
    key_file = tmp_path / "hmac"
    key_file.write_text(KEY_HEX + "\n")
    settings = Settings(webhook_url=receiver.url, webhook_hmac_key_file=str(key_file), webhook_auth_file=str(auth))
    wh = WebhookBackend.from_settings(settings)
    try:
        cmd = _cmd()
        assert await wh.apply(cmd) == {"status": 200, "attempts": 1}
        seen = receiver.seen[0]
        assert _verify(KEY_HEX, seen)
        assert not _verify("5b" * 32, seen)  # another key does not verify
        tampered = Seen(seen.at, seen.headers, seen.body.replace(b'"target_replicas":4', b'"target_replicas":40'))
        assert not _verify(KEY_HEX, tampered)
        stale = Seen(seen.at, {**seen.headers, "X-Governor-Timestamp": str(int(time.time()) - 3600)}, seen.body)
        assert not _verify(KEY_HEX, stale)  # the timestamp is signed: an old request is not replayable
        assert seen.headers["Authorization"] == "Bearer first-token"
        assert seen.headers["X-Governor-Command-Id"] == cmd.command_id
        assert seen.headers["X-Governor-Kind"] == "scale" and seen.headers["X-Governor-Zone"] == "az-a"
        # The body is the command as signed by governor: its own signature verifies with the command key.
        body = orjson.loads(seen.body)
        assert body["command_id"] == cmd.command_id and body["key_id"] == "k1"
        assert RING.verify(asdict(Command.decode(seen.body))) is None
        # A rotated token is picked up without a restart.
        auth.write_text("Bearer second-token")
        later = time.time() + 5
        import os

        os.utime(auth, (later, later))
        await wh.apply(_cmd(5))
        assert receiver.seen[1].headers["Authorization"] == "Bearer second-token"
    finally:
        await wh.close()


async def test_429_with_retry_after_is_waited_for_then_applied(receiver: Receiver) -> None:
    receiver.script = [Answer(429, {"Retry-After": "1"}, b"slow down")]
    wh = WebhookBackend(receiver.url, backoff_s=0.01, hmac_key=bytes.fromhex(KEY_HEX))
    try:
        assert await wh.apply(_cmd()) == {"status": 200, "attempts": 2}
        gap = receiver.seen[1].at - receiver.seen[0].at
        assert 0.9 <= gap < 3.0, gap  # Retry-After honoured (not the 10 ms backoff)
        assert receiver.seen[0].body == receiver.seen[1].body  # the same command, byte for byte
    finally:
        await wh.close()


async def test_503_is_retried_with_backoff_then_unavailable(receiver: Receiver) -> None:
    receiver.script = [Answer(503, body=b"down for maintenance")] * 10
    wh = WebhookBackend(receiver.url, retries=3, backoff_s=0.05)
    try:
        with pytest.raises(BackendUnavailable, match="HTTP 503: down for maintenance after 3 attempt"):
            await wh.apply(_cmd())
        assert len(receiver.seen) == 3
        gaps = [b.at - a.at for a, b in zip(receiver.seen, receiver.seen[1:], strict=False)]
        assert gaps[0] >= 0.02 and gaps[1] >= 0.045, gaps  # 0.05 * 2**n times a jitter in [0.5, 1)
    finally:
        await wh.close()


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_is_rejected_at_once_with_a_bounded_excerpt(receiver: Receiver, status: int) -> None:
    receiver.script = [Answer(status, body=b"no such model \x00\r\n" + b"x" * 100_000)]
    wh = WebhookBackend(receiver.url, backoff_s=0.01)
    try:
        with pytest.raises(BackendRejected) as info:
            await wh.apply(_cmd())
        why = str(info.value)
        assert why.startswith(f"webhook answered HTTP {status}: no such model ?"), why
        assert len(why) < 400 and "\r" not in why and "\n" not in why
        assert len(receiver.seen) == 1
    finally:
        await wh.close()


async def test_a_redirect_is_not_followed(receiver: Receiver) -> None:
    receiver.script = [Answer(307, {"Location": receiver.url.replace("/cmd", "/elsewhere")})]
    wh = WebhookBackend(receiver.url, auth="Bearer secret")
    try:
        with pytest.raises(BackendRejected, match="HTTP 307 \\(redirects are not followed\\)"):
            await wh.apply(_cmd())
        assert receiver.moved_hit == 0  # the token never went to the other URL
    finally:
        await wh.close()


async def test_one_apply_is_bounded_in_time(receiver: Receiver) -> None:
    receiver.script = [Answer(hang_s=2.0)] * 10  # longer than the bound; short enough for a quick teardown
    wh = WebhookBackend(receiver.url, timeout_s=0.3, deadline_s=1.0, retries=100, backoff_s=0.01)
    try:
        with pytest.raises(BackendUnavailable, match=r"after [234] attempt\(s\)"):
            await wh.apply(_cmd())
        # Each attempt is cut at timeout_s (0.3 s of a 2 s hang), so timed-out attempts are retried:
        # at least 2; the 1 s deadline, not the 100 retries, ends them: at most ceil(1.0 / 0.3) = 4.
        assert 2 <= len(receiver.seen) <= 4, len(receiver.seen)
    finally:
        await wh.close()


async def test_a_retry_after_beyond_the_bound_gives_up_at_once(receiver: Receiver) -> None:
    receiver.script = [Answer(503, {"Retry-After": "3600"})]
    wh = WebhookBackend(receiver.url, deadline_s=2.0)
    try:
        with pytest.raises(BackendUnavailable, match="Retry-After 3600.0 s passes GOVERNOR_WEBHOOK_TIMEOUT_S=2"):
            await wh.apply(_cmd())
        assert len(receiver.seen) == 1  # one attempt, then the refusal: no wait for a retry
    finally:
        await wh.close()


async def test_no_server_is_unavailable(receiver: Receiver) -> None:
    wh = WebhookBackend("http://127.0.0.1:9/cmd", retries=2, backoff_s=0.01)  # discard port: refused
    try:
        with pytest.raises(BackendUnavailable, match="after 2 attempt"):
            await wh.apply(_cmd())
    finally:
        await wh.close()


async def test_https_is_verified_against_the_configured_ca(tmp_path: Path) -> None:
    from tests.kafka_secure import make_tls_files

    try:
        files = make_tls_files(tmp_path / "tls")
    except FileNotFoundError:
        pytest.skip("no openssl CLI")
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/cmd", rec.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.cert, files.key)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"https://127.0.0.1:{port}/cmd"
    untrusting = WebhookBackend(url, retries=1)
    trusting = WebhookBackend(url, ca_file=str(files.ca))
    try:
        with pytest.raises(BackendUnavailable, match="(?i)certificate"):
            await untrusting.apply(_cmd())
        assert rec.seen == []
        assert await trusting.apply(_cmd()) == {"status": 200, "attempts": 1}
        assert len(rec.seen) == 1
    finally:
        await untrusting.close()
        await trusting.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({}, "needs GOVERNOR_WEBHOOK_URL"),  # no URL anywhere
        ({"webhook_url": "ftp://host/x"}, "must be an http"),  # not http(s)
        ({"webhook_url": "http:///nohost"}, "must be an http"),  # no host
        ({"webhook_url": "http://[::1"}, "must be an http"),  # unparsable
        ({"webhook_url": "http://h\r\nX: 1/"}, "must be an http"),  # control characters
        ({"webhook_url": "https://u:pw@host/x"}, "no credentials in the URL"),  # a password in the URL
        ({"webhook_url": "https://h/x", "webhook_hmac_key": "ab" * 8}, "at least 32 bytes"),  # short key
        ({"webhook_url": "https://h/x", "webhook_hmac_key": "zz" * 32}, "not hexadecimal"),  # not hex
        ({"webhook_url": "https://h/x", "webhook_hmac_key_file": "/nonexistent/k"}, "No such file"),  # no file
        ({"webhook_url": "https://h/x", "webhook_auth": "Bearer a\r\nX-Evil: 1"}, "printable ASCII"),  # injection
        ({"webhook_url": "https://h/x", "webhook_auth_file": "/nonexistent/a"}, "No such file"),  # no auth file
        ({"webhook_url": "https://h/x", "webhook_ca_file": "/nonexistent/ca"}, "GOVERNOR_WEBHOOK_CA_FILE"),
    ],
)
def test_misconfiguration_is_a_settings_error_naming_it(changes: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        WebhookBackend.from_settings(Settings(**changes))  # type: ignore[arg-type]
    assert "ab" * 8 not in str(info.value) and "zz" * 32 not in str(info.value)  # never the key
