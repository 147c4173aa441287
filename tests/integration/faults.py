"""Fault-injection helpers for the kill -9 tests (tests/integration/test_kill9.py).

Everything here is a real process or a real socket: a private ``redis-server``
that can be killed with SIGKILL, frozen with SIGSTOP and restarted on the same
port (with its append-only file or without), a local HTTP receiver for the
webhook backend, violating telemetry for the real worker, and the command
ledger over the run's topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

import orjson
from aiokafka import AIOKafkaProducer
from governor_telemetry.producer import TelemetryProducer

from bench.ledger import Ledger, read_ledger
from core.settings import Settings
from launch.embedded import _die_with_parent, free_port, redis_answers, redis_binary
from launch.processes import ChildProcess
from loop.commands import Command


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, step_s: float = 0.1) -> None:
    """Poll ``cond`` until it holds; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(step_s)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def kill9(child: ChildProcess) -> None:
    """SIGKILL a governor child (no handler, no cleanup, no ack) and reap it."""
    child.proc.send_signal(signal.SIGKILL)
    child.proc.wait(10)


def tails(*children: ChildProcess | RedisServer, n: int = 25) -> str:
    return "\n".join(f"--- {c.name} ({'alive' if c.alive() else 'dead'})\n{c.tail(n)}" for c in children)


class RedisServer:
    """A private redis-server on a fixed port that a test may kill, freeze and restart.

    ``persist``: append-only file with ``fsync`` on every write (``--appendonly yes
    --appendfsync always``), so a SIGKILL loses nothing acknowledged; otherwise no
    persistence at all.  :meth:`restart` starts it again on the same port, in the same
    directory (with its data) or in a fresh one (without).
    """

    def __init__(self, base: Path, *, persist: bool, name: str = "redis") -> None:
        self.name = name
        self.base = base
        self.persist = persist
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.generation = 0
        self.dir = base / f"{name}-0"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def log_path(self) -> Path:
        return self.base / f"{self.name}.log"

    def start(self, timeout_s: float = 20.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            if self.persist
            else ["--appendonly", "no", "--save", ""]
        )
        argv = [str(redis_binary()), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()/kill9()
        self.proc = subprocess.Popen(
            [*argv, *persistence],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout_s
        while not redis_answers(self.url, 0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not come up:\n{self.tail()}")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None and self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def freeze(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def restart(self, *, with_data: bool) -> None:
        """Start again on the same port: same directory (its AOF) or a fresh, empty one."""
        assert not self.alive(), "kill it first"
        if not with_data:
            self.generation += 1
            self.dir = self.base / f"{self.name}-{self.generation}"
        self.start()

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)  # a frozen server cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill9()
        if self._log is not None:
            self._log.close()
            self._log = None

    def tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Receiver:
    """A fleet API for the webhook backend: records every POST body; the first POST
    (or the first ``hang_first`` of them) is held ``hang_s`` before its 200, as a fleet
    API that applied the command and then went quiet."""

    def __init__(self, hang_s: float = 15.0, hang_first: int = 1) -> None:
        self.bodies: list[bytes] = []
        self.arrived = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with outer._lock:
                    outer.bodies.append(body)
                    n = len(outer.bodies)
                outer.arrived.set()
                if n <= hang_first:
                    outer.release.wait(hang_s)
                with contextlib.suppress(OSError):  # the client may be dead by now
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/commands"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def commands(self) -> list[dict[str, Any]]:
        with self._lock:
            return [orjson.loads(b) for b in self.bodies]


def start_webhook_executor(settings: Settings, zone: str, run_dir: Path, url: str, name: str) -> ChildProcess:
    """``governor executor --backend webhook --webhook-url url`` as a child, its log ``<name>.log``."""
    argv = ["executor", "--zone", zone, "--backend", "webhook", "--webhook-url", url]
    return ChildProcess(name, argv, settings, run_dir / f"{name}.log")


def violating(i: int, now: int, zone: str, model: str, nodes: Iterable[str]) -> list[dict[str, Any]]:
    """One tick of telemetry that violates the TTFT SLO: per node a GPU record (its replica)
    and four requests with TTFT 3 s."""
    out: list[dict[str, Any]] = []
    for node in nodes:
        out.append(
            {
                "kind": "gpu",
                "ts_ms": now,
                "model": model,
                "zone": zone,
                "node": node,
                "state": "ready",
                "gpu_util": 0.7,
                "mem_used_bytes": 60,
                "mem_total_bytes": 80,
                "queue_len": 3,
                "running": 8,
            }
        )
        for k in range(4):
            out.append(
                {
                    "kind": "request",
                    "request_id": f"{node}-{i}-{k}",
                    "ts_ms": now,
                    "model": model,
                    "zone": zone,
                    "node": node,
                    "ttft_ms": 3000.0,
                    "itl_ms": 30.0,
                    "e2e_ms": 6000.0,
                    "prompt_tokens": 1000,
                    "output_tokens": 100,
                    "status": "ok",
                }
            )
    return out


class Background:
    """Runs :meth:`_produce` on a daemon thread with its own event loop until :meth:`stop`
    (a context manager); what it raises lands in ``error`` for the test to report."""

    def __init__(self, name: str) -> None:
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(20)

    def _run(self) -> None:
        try:
            asyncio.run(self._produce())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    async def _produce(self) -> None:
        raise NotImplementedError


class Telemetry(Background):
    """Violating telemetry, 5 ticks a second, from a background thread (its own event loop),
    until :meth:`stop`: the test's main thread stays free to kill and start processes."""

    def __init__(self, settings: Settings, zone: str, model: str, nodes: tuple[str, ...] = ("n1", "n2")) -> None:
        self.settings, self.zone, self.model = settings, zone, model
        self.nodes = tuple(f"{zone}/{n}" for n in nodes)
        self.sent = 0
        self.requests: dict[int, int] = {}  # requests sent per 1 s event-time window (start ms)
        super().__init__("telemetry")

    async def _produce(self) -> None:
        s = self.settings
        async with TelemetryProducer(s.kafka_bootstrap, s.topic("telemetry"), source="kill9", linger_ms=20) as p:
            i = 0
            while not self._stop.is_set():
                now = int(time.time() * 1000)
                for rec in violating(i, now, self.zone, self.model, self.nodes):
                    await p.send(rec)
                    self.sent += 1
                    if rec["kind"] == "request":
                        start = now - now % 1000
                        self.requests[start] = self.requests.get(start, 0) + 1
                i += 1
                await asyncio.sleep(0.2)


async def publish_commands(settings: Settings, cmds: Iterable[Command]) -> None:
    """Put ``cmds`` on the commands topic as the worker does (signed, key = zone), for the ledger
    of a test that writes the zone stream itself (no worker, no bridge)."""
    ring = settings.keyring()
    assert ring is not None
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks=1)
    await producer.start()
    try:
        for c in cmds:
            await producer.send_and_wait(settings.topic("commands"), c.signed(ring).encode(), key=c.zone.encode())
    finally:
        await producer.stop()


def ledger(settings: Settings, idle_s: float = 2.0) -> Ledger:
    return asyncio.run(
        read_ledger(settings.kafka_bootstrap, settings.topic("commands"), settings.topic("results"), idle_s=idle_s)
    )


def ledger_settles(settings: Settings, timeout_s: float, idle_s: float = 1.5) -> dict[str, Any]:
    """Read the ledger until nothing is lost (commands still in flight get their outcome) or
    ``timeout_s`` passes; the last report."""
    deadline = time.monotonic() + timeout_s
    while True:
        report = ledger(settings, idle_s).report()
        if not report["lost"] or time.monotonic() > deadline:
            return report
        time.sleep(1.0)


def records(settings: Settings, topic: str, idle_s: float = 1.0, partition: bool = False) -> list[dict[str, Any]]:
    """Every record of ``<prefix>.<topic>`` so far: up to the topic's end offsets when called,
    then until none came for ``idle_s``; with ``partition`` each carries the partition it was on."""

    async def read() -> list[dict[str, Any]]:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(
            settings.topic(topic),
            bootstrap_servers=settings.kafka_bootstrap,
            group_id=None,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
        )
        await consumer.start()
        out: list[dict[str, Any]] = []
        try:
            # Up to the end offsets as of now, then until nothing new came for idle_s.
            deadline = time.monotonic() + 20
            while not consumer.assignment() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            parts = consumer.assignment()
            end = await consumer.end_offsets(list(parts)) if parts else {}
            last = time.monotonic()
            while time.monotonic() < deadline:
                for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                    last = time.monotonic()
                    extra = {"partition": tp.partition} if partition else {}
                    out += [{**orjson.loads(m.value), **extra} for m in msgs]
                caught_up = all([await consumer.position(tp) >= n for tp, n in end.items()])
                if caught_up and time.monotonic() - last >= idle_s:
                    break
        finally:
            await consumer.stop()
        return out

    return asyncio.run(read())


def results(settings: Settings, idle_s: float = 1.0) -> list[dict[str, Any]]:
    """The command results so far (timing probes and undecodable entries left out)."""
    return [r for r in records(settings, "results", idle_s) if r.get("outcome") != "timing" and r.get("command_id")]
