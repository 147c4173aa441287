"""Scraping without trust: TLS and a bearer token towards the engines and towards a Prometheus.

Two sets of settings, one per side, as Prometheus' own ``tls_config`` and
``bearer_token_file`` (``scrape_configs``) and its remote clients have them:

* the scrape targets (``governor ingest scrape`` GETs each engine's ``/metrics``):
  ``GOVERNOR_SCRAPE_TLS_CA_FILE``, ``GOVERNOR_SCRAPE_TLS_CERT_FILE``,
  ``GOVERNOR_SCRAPE_TLS_KEY_FILE``, ``GOVERNOR_SCRAPE_BEARER_TOKEN_FILE``;
* the PromQL source (``GOVERNOR_SCRAPE_PROMETHEUS_URL``): the same four under
  ``GOVERNOR_SCRAPE_PROMETHEUS_*``.

The CA file verifies an ``https`` server (unset: the system CAs; the certificate
is always verified, host name included).  The client certificate and its key
go together, for servers that require one (mutual TLS).  The token file holds
the token alone (``Authorization: Bearer <token>``); it is read again for every
request, so a rotated token (a projected service-account token, a mounted
secret) is used from the next scrape on.  Everything is checked once at start:
a missing or unreadable file, a certificate without its key, is a
:class:`TrustError` naming the setting (``governor ingest scrape`` exits 2).
An ``http://`` URL gets no TLS, and the token in clear text: use ``https``
beyond loopback.

>>> t = HttpTrust("GOVERNOR_SCRAPE_TLS", cert_file="/c.pem")
Traceback (most recent call last):
...
adapters.scrape.trust.TrustError: GOVERNOR_SCRAPE_TLS_KEY_FILE: set it with GOVERNOR_SCRAPE_TLS_CERT_FILE (a client certificate needs its key)
"""

from __future__ import annotations

import ssl
import urllib.request
from dataclasses import dataclass
from http.client import HTTPResponse
from typing import cast

from core.settings import Settings

__all__ = ["HttpTrust", "TrustError", "TrustedHttp"]


class TrustError(ValueError):
    """A TLS or token setting that cannot be used; the message starts with the setting's name."""


#: The largest token file read (a service-account token is about 1 kB).
MAX_TOKEN_BYTES = 16 * 1024


@dataclass(frozen=True)
class HttpTrust:
    """``prefix`` is the settings' common name (for messages): ``<prefix>_CA_FILE`` and so on."""

    prefix: str
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    bearer_token_file: str = ""
    token_setting: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            missing, given = ("KEY_FILE", "CERT_FILE") if self.cert_file else ("CERT_FILE", "KEY_FILE")
            raise TrustError(
                f"{self.prefix}_{missing}: set it with {self.prefix}_{given} (a client certificate needs its key)"
            )

    @classmethod
    def for_targets(cls, s: Settings) -> HttpTrust:
        """The engines' side (``GOVERNOR_SCRAPE_TLS_*``, ``GOVERNOR_SCRAPE_BEARER_TOKEN_FILE``)."""
        return cls._of(s, "GOVERNOR_SCRAPE_TLS", "scrape_tls_", "scrape_bearer_token_file")

    @classmethod
    def for_prometheus(cls, s: Settings) -> HttpTrust:
        """The PromQL source's side (``GOVERNOR_SCRAPE_PROMETHEUS_*``)."""
        return cls._of(s, "GOVERNOR_SCRAPE_PROMETHEUS", "scrape_prometheus_", "scrape_prometheus_bearer_token_file")

    @classmethod
    def _of(cls, s: Settings, prefix: str, tls_fields: str, token_field: str) -> HttpTrust:
        files = {name: str(getattr(s, tls_fields + name)) for name in ("ca_file", "cert_file", "key_file")}
        token_env = f"GOVERNOR_{token_field.upper()}"
        return cls(prefix, **files, bearer_token_file=str(getattr(s, token_field)), token_setting=token_env)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The context of ``https`` requests (None: Python's default, the system CAs)."""
        if not (self.ca_file or self.cert_file):
            return None
        ctx = ssl.create_default_context()
        try:
            if self.ca_file:
                what = f"{self.prefix}_CA_FILE={self.ca_file!r}"
                ctx.load_verify_locations(cafile=self.ca_file)
            if self.cert_file:
                what = f"{self.prefix}_CERT_FILE={self.cert_file!r} with its key {self.key_file!r}"
                ctx.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TrustError(f"{what}: {getattr(exc, 'strerror', None) or exc}") from None
        return ctx

    def token(self) -> str:
        """The bearer token, read from its file now ('' without one)."""
        if not self.bearer_token_file:
            return ""
        where = f"{self.token_setting}={self.bearer_token_file!r}"
        try:
            with open(self.bearer_token_file, "rb") as fh:
                raw = fh.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            raise TrustError(f"{where}: {exc.strerror or exc}") from None
        token = raw.decode("ascii", errors="replace").strip()
        if not token or len(raw) > MAX_TOKEN_BYTES or any(not c.isprintable() or c.isspace() for c in token):
            raise TrustError(f"{where}: want one token (printable ASCII, no spaces, under {MAX_TOKEN_BYTES} bytes)")
        return token


class TrustedHttp:
    """Blocking HTTP requests with one :class:`HttpTrust` (the context built and the token file read at start)."""

    def __init__(self, trust: HttpTrust) -> None:
        self.trust = trust
        self._ctx = trust.ssl_context()
        trust.token()  # a missing or empty token file fails now, not at the first scrape

    def open(self, req: urllib.request.Request, timeout_s: float) -> HTTPResponse:
        """``urlopen`` with the CA, the client certificate and ``Authorization: Bearer`` from the file as now."""
        token = self.trust.token()
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        # S310: operator-given URLs (the targets, the Prometheus)
        return cast(HTTPResponse, urllib.request.urlopen(req, timeout=timeout_s, context=self._ctx))  # noqa: S310
