"""The webhook backend: each command POSTed, signed, to a platform's URL.

**Request.**  ``POST GOVERNOR_WEBHOOK_URL`` (``--webhook-url`` wins), body =
the command JSON (:meth:`loop.commands.Command.encode`: every field, the
command's own ``key_id`` and ``signature`` included), with the headers

=========================  ===================================================
``Content-Type``           ``application/json``
``X-Governor-Command-Id``  the command's ``command_id`` (the dedupe key)
``X-Governor-Kind``        the command's ``kind``
``X-Governor-Zone``        the command's ``zone``
``X-Governor-Timestamp``   Unix seconds (integer) when this attempt was sent
``X-Governor-Signature``   ``sha256=`` + hex HMAC-SHA256, see below
``Authorization``          the contents of ``GOVERNOR_WEBHOOK_AUTH_FILE``
                           (or ``GOVERNOR_WEBHOOK_AUTH``), e.g. ``Bearer t``
=========================  ===================================================

``X-Governor-Signature`` (sent when ``GOVERNOR_WEBHOOK_HMAC_KEY_FILE`` or
``GOVERNOR_WEBHOOK_HMAC_KEY`` holds a key: hex, at least 32 bytes) is the
HMAC-SHA256, under that key, of the ASCII timestamp, one ``.``, and the raw
body bytes::

    expected = "sha256=" + hmac.new(bytes.fromhex(KEY), ts.encode() + b"." + body, "sha256").hexdigest()

A receiver verifies it before parsing anything: (1) read the raw body;
(2) recompute ``expected`` with the ``X-Governor-Timestamp`` value as ``ts``;
(3) compare with :func:`hmac.compare_digest`; (4) refuse a timestamp more
than a few minutes from its clock (binds the signature to the attempt, so an
old request cannot be replayed); (5) dedupe on ``X-Governor-Command-Id``:
delivery is at least once (a retried or re-claimed command arrives again,
byte for byte the same body).  The webhook key is not the command signing
key: the receiver never holds a key that could forge commands to executors.
The body's ``signature`` is governor's command signature (:mod:`core.signing`);
only holders of the command key can check it.

**Answers.**  2xx: applied (result detail ``{"status", "attempts"}``).
429, 5xx, a refused or dropped connection and a timeout are temporary:
retried with exponential backoff and jitter, or after ``Retry-After``
(seconds or an HTTP-date) when the answer has one.  Any other status (3xx:
redirects are not followed, so credentials never leave for another URL;
4xx) is permanent: outcome ``failed``, reason ``webhook answered HTTP <s>:
<first 300 bytes of the body>``.  One apply never takes longer than
``GOVERNOR_WEBHOOK_TIMEOUT_S`` (each attempt at most
``GOVERNOR_WEBHOOK_ATTEMPT_TIMEOUT_S``); when the bound is reached, or a
``Retry-After`` would pass it, the command stays pending
(:class:`BackendUnavailable`) and the executor retries it later.

**TLS.**  ``https`` URLs are verified against the system CAs, or against
``GOVERNOR_WEBHOOK_CA_FILE``; a URL with credentials in it is refused (put
them in the auth file).  The auth file is re-read when it changes (rotated
tokens need no restart).
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import hashlib
import hmac
import logging
import os
import random
import ssl
import time
from typing import Any

import aiohttp
from yarl import URL

from core.settings import Settings, SettingsError
from executors.errors import BackendRejected, BackendUnavailable
from loop.commands import Command

__all__ = ["MIN_KEY_BYTES", "WebhookBackend", "retry_after_s", "signature"]

log = logging.getLogger(__name__)

MIN_KEY_BYTES = 32
EXCERPT_BYTES = 300  # of an error answer's body, in the result's reason
MAX_HEADER_BYTES = 8192  # of the Authorization value
MAX_BACKOFF_S = 5.0


def signature(key: bytes, timestamp: str, body: bytes) -> str:
    """The ``X-Governor-Signature`` value of ``body`` sent at ``timestamp`` (module docstring).

    >>> signature(bytes(32), "1700000000", b"{}")[:15]
    'sha256=a9dc44c8'
    """
    return "sha256=" + hmac.new(key, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def retry_after_s(value: str | None, now_s: float) -> float | None:
    """Seconds a ``Retry-After`` value asks to wait (delta seconds or an HTTP-date), or None if unusable.

    >>> retry_after_s("3", 0.0), retry_after_s(" 0 ", 0.0), retry_after_s("-1", 0.0), retry_after_s("soon", 0.0)
    (3.0, 0.0, None, None)
    >>> retry_after_s("Thu, 01 Jan 1970 00:00:10 GMT", 4.0), retry_after_s("Thu, 01 Jan 1970 00:00:10 GMT", 99.0)
    (6.0, 0.0)
    """
    if not value:
        return None
    v = value.strip()
    if v.isascii() and v.isdigit() and len(v) <= 10:
        return float(int(v))
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # "-0000": UTC by RFC 5322
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now_s)


def _safe(text: str, limit: int = 200) -> str:
    """``text`` as a header value: printable ASCII only, at most ``limit`` characters."""
    return "".join(c if " " <= c <= "~" else "?" for c in text[:limit])


def parse_key(raw: str, what: str) -> bytes:
    """A hex HMAC key of at least :data:`MIN_KEY_BYTES` bytes; :class:`SettingsError` naming ``what`` (never the key)."""
    try:
        key = bytes.fromhex(raw.strip())
    except ValueError:
        raise SettingsError(f"{what}: not hexadecimal") from None
    if len(key) < MIN_KEY_BYTES:
        raise SettingsError(f"{what}: must be at least {MIN_KEY_BYTES} bytes (got {len(key)})")
    return key


def parse_auth(raw: str, what: str) -> str:
    """An ``Authorization`` value: one line of printable ASCII; :class:`SettingsError` naming ``what``."""
    value = raw.strip()
    if not value or len(value) > MAX_HEADER_BYTES or not all(" " <= c <= "~" for c in value):
        raise SettingsError(f"{what}: must be one non-empty line of printable ASCII (at most {MAX_HEADER_BYTES})")
    return value


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read(MAX_HEADER_BYTES + 1)
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{what}={path!r}: {getattr(exc, 'strerror', None) or exc}") from None


class _AuthSource:
    """The ``Authorization`` value: fixed, or a file re-read whenever its mtime changes."""

    def __init__(self, value: str = "", path: str = "") -> None:
        self.path = path
        self._mtime = -1.0
        self._value = parse_auth(value, "GOVERNOR_WEBHOOK_AUTH") if value and not path else ""
        if path:
            self.value()  # fails at start, not at the first command

    def value(self) -> str:
        if not self.path:
            return self._value
        try:
            mtime = os.stat(self.path).st_mtime
            if mtime != self._mtime:
                self._value = parse_auth(_read(self.path, "GOVERNOR_WEBHOOK_AUTH_FILE"), "GOVERNOR_WEBHOOK_AUTH_FILE")
                self._mtime = mtime
        except (OSError, SettingsError) as exc:
            if not self._value:
                raise SettingsError(str(exc)) from None
            log.warning("webhook: auth file %s unreadable (%s); keeping the value read before", self.path, exc)
        return self._value


class WebhookBackend:
    """POSTs each command, signed, to ``url`` (aiohttp; the contract is in the module docstring)."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        timeout_s: float = 3.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        *,
        deadline_s: float = 10.0,
        hmac_key: bytes | None = None,
        auth: str = "",
        auth_file: str = "",
        ca_file: str = "",
    ) -> None:
        try:
            u = URL(url)
            host = u.host
        except (ValueError, TypeError):
            host = None
        if host is None or u.scheme not in ("http", "https") or not all("!" <= c <= "~" for c in url):
            raise SettingsError(
                f"GOVERNOR_WEBHOOK_URL={_safe(url)!r}: must be an http(s):// URL with a host, printable ASCII"
            )
        if u.user or u.password:
            raise SettingsError("GOVERNOR_WEBHOOK_URL: no credentials in the URL (use GOVERNOR_WEBHOOK_AUTH_FILE)")
        if hmac_key is not None and len(hmac_key) < MIN_KEY_BYTES:
            raise SettingsError(f"webhook HMAC key must be at least {MIN_KEY_BYTES} bytes")
        self.url, self.timeout_s, self.retries, self.backoff_s = url, timeout_s, max(1, retries), backoff_s
        self.deadline_s, self.hmac_key = deadline_s, hmac_key
        self._auth = _AuthSource(auth, auth_file)
        self._ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_file) if ca_file else True
        self._session: aiohttp.ClientSession | None = None
        if hmac_key is None:
            log.warning("webhook %s: no GOVERNOR_WEBHOOK_HMAC_KEY(_FILE); requests carry no X-Governor-Signature", url)
        if u.scheme == "http" and (hmac_key or auth or auth_file) and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("webhook %s: plain http; the Authorization header travels in clear", url)

    @classmethod
    def from_settings(cls, settings: Settings, url: str = "") -> WebhookBackend:
        """The webhook of a deployment (``url`` overrides GOVERNOR_WEBHOOK_URL); SettingsError if misconfigured."""
        url = url or settings.webhook_url
        if not url:
            raise SettingsError("the webhook backend needs GOVERNOR_WEBHOOK_URL (or --webhook-url)")
        key: bytes | None = None
        if settings.webhook_hmac_key_file:
            where = f"GOVERNOR_WEBHOOK_HMAC_KEY_FILE={settings.webhook_hmac_key_file!r}"
            key = parse_key(_read(settings.webhook_hmac_key_file, "GOVERNOR_WEBHOOK_HMAC_KEY_FILE"), where)
        elif settings.webhook_hmac_key:
            key = parse_key(settings.webhook_hmac_key, "GOVERNOR_WEBHOOK_HMAC_KEY=(secret)")
        try:
            return cls(
                url,
                timeout_s=settings.webhook_attempt_timeout_s,
                deadline_s=settings.webhook_timeout_s,
                hmac_key=key,
                auth=settings.webhook_auth,
                auth_file=settings.webhook_auth_file,
                ca_file=settings.webhook_ca_file,
            )
        except (OSError, ssl.SSLError) as exc:
            raise SettingsError(f"GOVERNOR_WEBHOOK_CA_FILE={settings.webhook_ca_file!r}: {exc}") from None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=4)
            self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def headers(self, cmd: Command, body: bytes, now_s: float) -> dict[str, str]:
        """The headers of one attempt (module docstring)."""
        ts = str(int(now_s))
        h = {
            "Content-Type": "application/json",
            "X-Governor-Command-Id": _safe(cmd.command_id),
            "X-Governor-Kind": _safe(cmd.kind),
            "X-Governor-Zone": _safe(cmd.zone),
            "X-Governor-Timestamp": ts,
        }
        if self.hmac_key is not None:
            h["X-Governor-Signature"] = signature(self.hmac_key, ts, body)
        try:
            auth = self._auth.value()
        except SettingsError as exc:
            raise BackendUnavailable(f"webhook auth: {exc}") from None
        if auth:
            h["Authorization"] = auth
        return h

    def _backoff(self, attempt: int) -> float:
        return min(MAX_BACKOFF_S, self.backoff_s * 2.0 ** (attempt - 1)) * random.uniform(0.5, 1.0)

    async def apply(self, cmd: Command) -> dict[str, Any]:
        body = cmd.encode()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        last, attempt = "no attempt", 0
        while attempt < self.retries and (remaining := deadline - loop.time()) > 0:
            attempt += 1
            wait: float | None = None
            try:
                timeout = aiohttp.ClientTimeout(total=min(self.timeout_s, remaining))
                headers = self.headers(cmd, body, time.time())
                post = self._client().post(self.url, data=body, headers=headers, allow_redirects=False, timeout=timeout)
                async with post as resp:
                    if 200 <= resp.status < 300:
                        return {"status": resp.status, "attempts": attempt}
                    excerpt = await self._excerpt(resp)
                    if resp.status != 429 and resp.status < 500:
                        moved = " (redirects are not followed)" if 300 <= resp.status < 400 else ""
                        raise BackendRejected(f"webhook answered HTTP {resp.status}{moved}{excerpt}")
                    last = f"HTTP {resp.status}{excerpt}"
                    wait = retry_after_s(resp.headers.get("Retry-After"), time.time())
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = f"{type(exc).__name__}: {_safe(str(exc), 300)}"
            if attempt >= self.retries:
                break
            delay = self._backoff(attempt) if wait is None else wait
            if delay >= deadline - loop.time():
                why = "Retry-After" if wait is not None else "backoff"
                raise BackendUnavailable(
                    f"webhook {self.url}: {last}; {why} {delay:.1f} s passes GOVERNOR_WEBHOOK_TIMEOUT_S="
                    f"{self.deadline_s:g} after {attempt} attempt(s)"
                )
            await asyncio.sleep(delay)
        raise BackendUnavailable(f"webhook {self.url}: {last} after {attempt} attempt(s)")

    @staticmethod
    async def _excerpt(resp: aiohttp.ClientResponse) -> str:
        """``": <first bytes of the body>"`` (printable only), or "" when there is none."""
        try:
            raw = await resp.content.read(EXCERPT_BYTES)
        except (aiohttp.ClientError, TimeoutError, OSError):
            return ""
        text = _safe(raw.decode("utf-8", "replace"), EXCERPT_BYTES).strip()
        return f": {text}" if text else ""
