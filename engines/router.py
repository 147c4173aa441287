"""The vLLM router in front of the local engines: its worker API as a client, and its process.

``vllm-router`` (the vLLM project's request router, installed beside governor)
adds and removes workers while it runs (facts: ``docs`` of issue 33,
``real-engines.md``):

* ``POST /add_worker?url=U`` waits for ``U/health`` (polled every
  ``--worker-startup-check-interval``, set to 1 s here) and then routes to it;
* ``POST /remove_worker?url=U`` answers 200 at once, *even for a URL it never
  had*, so :meth:`RouterClient.remove_worker` confirms with ``GET
  /list_workers`` before it reports the worker gone; removal only stops new
  routing: a request in flight on the removed worker completes (draining is
  the caller's job, :mod:`engines.pool`);
* ``GET /list_workers`` answers ``{"urls": [...]}``.

Every call is retried within a bound (``attempts``, exponential backoff from
``backoff_s``); what still fails raises :class:`RouterUnavailable` with the
reason (connection refused, a status and the body's first characters).

Policy: :func:`start_router` takes it from ``GOVERNOR_LOCAL_ROUTER_POLICY``
(:func:`policy_args`), ``round_robin`` by default.  ``cache_aware`` (the
router's own default) keeps a request's prefix on the worker that served it
before unless the workers' loads (requests in flight) are imbalanced:
``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold *
min`` (its defaults 64 and 1.5); it sends a request to the worker whose
prefix tree matches more than ``cache_threshold`` (0.3) of it, else to the
one with the smallest tree.  With its default 64 a four-engine CPU fleet of
``--max-num-seqs 4`` is never imbalanced, so the load client's random
prompts all went to one engine and a scale-up's new engine stayed idle;
``round_robin`` spreads every request over the ready engines, which is what
capacity per replica measures.  ``cache_aware`` with a balance bound near the
engines' batch (e.g. ``balance_abs_threshold=4``) keeps shared prefixes
together and still uses a new engine (the simulated fleet's dispatch is the
same rule, :mod:`controllers.dispatch`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

__all__ = ["RouterClient", "RouterProcess", "RouterUnavailable", "policy_args", "router_binary", "start_router"]

POLICIES = ("round_robin", "cache_aware")
_THRESHOLDS = {
    "cache_threshold": (float, 0.0, 1.0),
    "balance_abs_threshold": (int, 0, None),
    "balance_rel_threshold": (float, 1.0, None),
}


def policy_args(spec: str) -> tuple[str, ...]:
    """``--policy`` and its thresholds from ``GOVERNOR_LOCAL_ROUTER_POLICY`` (ValueError names what is wrong).

    >>> policy_args("round_robin")
    ('--policy', 'round_robin')
    >>> policy_args("cache_aware,cache_threshold=0.5,balance_abs_threshold=4")
    ('--policy', 'cache_aware', '--cache-threshold', '0.5', '--balance-abs-threshold', '4')
    >>> policy_args("cache_aware,balance_rel_threshold=0.5")
    Traceback (most recent call last):
    ...
    ValueError: GOVERNOR_LOCAL_ROUTER_POLICY: balance_rel_threshold=0.5 must be >= 1.0
    """
    name, *rest = [p.strip() for p in spec.split(",")]
    if name not in POLICIES:
        raise ValueError(f"GOVERNOR_LOCAL_ROUTER_POLICY: policy {name!r} is not one of {', '.join(POLICIES)}")
    if rest and name != "cache_aware":
        raise ValueError(f"GOVERNOR_LOCAL_ROUTER_POLICY: {name} takes no thresholds, got {rest}")
    out = ["--policy", name]
    for item in rest:
        key, sep, raw = item.partition("=")
        if not sep or key not in _THRESHOLDS:
            raise ValueError(f"GOVERNOR_LOCAL_ROUTER_POLICY: {item!r} is not one of {', '.join(_THRESHOLDS)}=<value>")
        kind, lo, hi = _THRESHOLDS[key]
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(f"GOVERNOR_LOCAL_ROUTER_POLICY: {key}={raw!r} is not a {kind.__name__}") from None
        if value < lo or (hi is not None and value > hi):
            raise ValueError(
                f"GOVERNOR_LOCAL_ROUTER_POLICY: {key}={raw} must be >= {lo}"
                + (f" and <= {hi}" if hi is not None else "")
            )
        out += ["--" + key.replace("_", "-"), raw]
    return tuple(out)


log = logging.getLogger(__name__)


class RouterUnavailable(RuntimeError):
    """The router did not answer, or refused, within the retry bound; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RouterClient:
    """The router's run-time worker API (see the module docstring)."""

    def __init__(self, base_url: str, timeout_s: float = 5.0, *, attempts: int = 3, backoff_s: float = 0.25) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.base_url = base_url.rstrip("/")
        self.timeout_s, self.attempts, self.backoff_s = timeout_s, attempts, backoff_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _call(self, method: str, path: str, *, url: str | None = None, timeout_s: float | None = None) -> bytes:
        """The body of a 2xx answer to ``method path`` (``?url=`` when given), retried within the bound."""
        params = {"url": url} if url is not None else None
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                async with self._client().request(method, self.base_url + path, params=params, timeout=timeout) as resp:
                    body = await resp.read()
                    if 200 <= resp.status < 300:
                        return body
                    last = f"HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')}"
                    if 400 <= resp.status < 500:
                        break  # a refusal does not heal by asking again
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if attempt < self.attempts:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise RouterUnavailable(f"router {self.base_url}: {method} {path} failed after {attempt} attempts: {last}")

    async def health(self) -> bool:
        """True when the router answers ``/health`` with 2xx (one try, no retries)."""
        try:
            async with self._client().get(
                self.base_url + "/health", timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            ) as resp:
                return 200 <= resp.status < 300
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    async def list_workers(self) -> list[str]:
        """The worker URLs the router routes to."""
        body = await self._call("GET", "/list_workers")
        try:
            urls = orjson.loads(body).get("urls")
        except (orjson.JSONDecodeError, AttributeError):
            urls = None
        if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
            raise RouterUnavailable(f"router {self.base_url}: /list_workers answered {body[:200]!r}")
        return [u.rstrip("/") for u in urls]

    async def add_worker(self, url: str, timeout_s: float = 30.0) -> None:
        """Route to ``url`` (the router waits for its ``/health`` first, up to ``timeout_s``); confirmed."""
        url = url.rstrip("/")
        await self._call("POST", "/add_worker", url=url, timeout_s=timeout_s)
        if url not in await self.list_workers():
            raise RouterUnavailable(f"router {self.base_url}: {url} not in /list_workers after add_worker")

    async def remove_worker(self, url: str) -> None:
        """Stop routing to ``url``, confirmed with ``/list_workers`` (removal answers 200 for any URL)."""
        url = url.rstrip("/")
        for _ in range(self.attempts):
            await self._call("POST", "/remove_worker", url=url)
            if url not in await self.list_workers():
                return
            await asyncio.sleep(self.backoff_s)
        raise RouterUnavailable(f"router {self.base_url}: {url} still in /list_workers after remove_worker")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def router_binary() -> str:
    """The ``vllm-router`` script beside this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise FileNotFoundError("vllm-router is not installed beside governor: pip install 'governor[local]'")
    return found


class RouterProcess:
    """A ``vllm-router`` started by :func:`start_router`, in a process group of its own."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, metrics_port: int, log_path: Path) -> None:
        self.proc, self.port, self.metrics_port, self.log_path = proc, port, metrics_port, log_path
        self.url = f"http://127.0.0.1:{port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    async def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Return once ``/health`` answers; RouterUnavailable (with the log's tail) when it exits or times out."""
        client = RouterClient(self.url, timeout_s=2.0)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RouterUnavailable(f"vllm-router exited ({self.proc.returncode}): {self.tail()}")
                if await client.health():
                    return
                await asyncio.sleep(0.2)
        finally:
            await client.close()
        raise RouterUnavailable(f"vllm-router not healthy after {timeout_s:.0f} s: {self.tail()}")

    def tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-n:])[-1000:]

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM the router's group, SIGKILL after ``grace_s``."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start_router(
    port: int,
    metrics_port: int,
    log_path: Path,
    policy: str = "round_robin",
    extra_args: tuple[str, ...] = (),
) -> RouterProcess:
    """Start ``vllm-router`` on 127.0.0.1:``port`` (metrics on ``metrics_port``) with no workers, in its own
    process group, its output to ``log_path``; the pool adds the engines (:mod:`engines.pool`).

    ``policy``: a ``GOVERNOR_LOCAL_ROUTER_POLICY`` value (:func:`policy_args`)."""
    argv: list[Any] = [
        router_binary(),
        "--host", "127.0.0.1", "--port", str(port),
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        *policy_args(policy),
        "--worker-startup-check-interval", "1",
        *extra_args,
    ]  # fmt: skip
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    log.info("vllm-router started on 127.0.0.1:%d (pid %d, policy %s)", port, proc.pid, policy)
    return RouterProcess(proc, port, metrics_port, log_path)
