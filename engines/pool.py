"""A pool of vLLM engine processes on this machine, behind the vLLM router.

One :class:`EnginePool` owns the engines of one (model, zone): each engine is
``<python> -m vllm.entrypoints.openai.api_server`` of the engine venv (three
processes: API server, EngineCore, Worker) started in a session of its own
(its process group), pinned to one core (``VLLM_CPU_OMP_THREADS_BIND``,
the core of ``cores`` with the fewest engines), on a free loopback port.

* **Scale up** (:meth:`EnginePool.scale_to`): start the engines, write the
  registry at once, and wait up to ``start_wait_s`` for each to answer
  ``/health`` or to exit.  The watch (a background task) adds an engine to the
  router once ``/health`` answers (checked with the router's worker list).  An
  engine that exits or misses ``startup_timeout_s`` is a ``failed`` start
  with its reason (its log's last lines), removed from the pool: the pool's
  count stays what runs, and a failed start is not retried until the next
  scale.
* **Scale down**: the newest engines go first (starting ones before ready
  ones): each is removed from the router (confirmed), then waited on until
  its ``/metrics`` shows no running or waiting request (two readings in a
  row, bounded by ``drain_timeout_s``: the result says ``drained`` per
  engine), then its group gets SIGTERM and, after ``grace_s``, SIGKILL.
* **Router unreachable**: :meth:`scale_to` reads the router's worker list
  first (retried within the client's bound) and raises
  :class:`~engines.router.RouterUnavailable` before it changes anything.
* **Death watch**: an engine whose process exits, or whose ``/health`` fails
  ``HEALTH_FAILURES`` times in a row, is taken out of the router at once,
  its group stopped, and counted (``deaths``); a replacement starts when the
  pool is below its target.
* **Registry and adoption**: ``<state_dir>/engines.json`` holds each
  engine's pid, process group, port, core and token (written atomically).
  Every engine carries two variables in its environment:
  ``GOVERNOR_ENGINE_POOL`` = this pool's state directory and
  ``GOVERNOR_ENGINE_ID`` = its token.  :meth:`adopt` (after the owner's
  restart) scans ``/proc`` for this pool's processes and keeps each engine
  whose leader (pid = process group) carries the token the registry
  recorded and whose port answers (or that is still within its start-up
  time); it stops the rest of this pool's processes (orphans, or engines the
  registry lost).  The adopted engines are the new target.  Nothing is ever
  signalled unless ``/proc`` shows it carries this pool's variable: a
  corrupt or hostile registry (bad JSON, a pid of another program) can make
  the pool forget an engine, never kill a process it did not start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from engines.router import RouterClient, RouterUnavailable

__all__ = ["Engine", "EnginePool", "EngineSpec", "EngineSpecError", "free_port", "pool_processes"]

log = logging.getLogger(__name__)

POOL_VAR, ID_VAR = "GOVERNOR_ENGINE_POOL", "GOVERNOR_ENGINE_ID"
ENTRYPOINT = "vllm.entrypoints.openai.api_server"
REGISTRY_FILE = "engines.json"
HEALTH_FAILURES = 3  # /health failures in a row that make a ready engine dead
WATCH_INTERVAL_S = 1.0
DRAIN_POLL_S = 0.25
MAX_REGISTRY_BYTES = 1 << 20
#: How often an engine's span processor exports (OTEL_BSP_SCHEDULE_DELAY, ms; the SDK's default is
#: 5000).  A span reaches `governor ingest otlp` within this after its request ends: 5 s against a
#: window lateness of 2 s lost 223 of 1,293 records as late in a local demo; the environment's own
#: setting wins.
OTLP_EXPORT_DELAY_MS = 500
SCHEDULING_POLICIES = ("fcfs", "priority")  # vLLM's --scheduling-policy choices


class EngineSpecError(ValueError):
    """A bad :class:`EngineSpec` parameter (named in the message)."""


@dataclass(frozen=True)
class EngineSpec:
    """How the pool starts its engines (see the module docstring)."""

    python: str
    model_dir: str
    served_name: str
    model: str
    zone: str
    max_num_seqs: int = 4
    kv_cache_gib: int = 1
    cores: tuple[int, ...] = (0, 1)
    startup_timeout_s: float = 300.0
    drain_timeout_s: float = 60.0
    grace_s: float = 10.0
    otlp_endpoint: str | None = None
    # vLLM's --scheduling-policy: "fcfs" (vLLM's default, no flag given) or "priority" (a lower request
    # `priority` is served first; what a model whose classes configure priorities runs, executors.local)
    scheduling_policy: str = "fcfs"
    extra_args: tuple[str, ...] = ()
    start_wait_s: float = 0.0  # how long scale_to waits for a started engine to answer /health or fail
    # Every process of an engine on its core (its API server and EngineCore too, by CPU affinity, which
    # its children inherit), not only the compute thread VLLM_CPU_OMP_THREADS_BIND pins: unconfined, two
    # engines on two cores each ran their API server and EngineCore on the other's core, and the pool
    # served a tenth of what one engine did alone (docs/benchmarks.md, `governor bench engines`).
    confine: bool = True

    def __post_init__(self) -> None:
        for name in ("python", "model_dir", "served_name", "model", "zone"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise EngineSpecError(f"{name} must be a non-empty string")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise EngineSpecError(
                f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {self.scheduling_policy!r}"
            )
        if self.max_num_seqs < 1:
            raise EngineSpecError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.kv_cache_gib < 1:
            raise EngineSpecError(f"kv_cache_gib must be >= 1, got {self.kv_cache_gib}")
        if not self.cores or any(not isinstance(c, int) or c < 0 for c in self.cores):
            raise EngineSpecError(f"cores must be CPU numbers >= 0, got {self.cores!r}")
        for name in ("startup_timeout_s", "drain_timeout_s", "grace_s", "start_wait_s"):
            if not getattr(self, name) >= 0:
                raise EngineSpecError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass
class Engine:
    """One engine of the pool: its process group, port and life (``state``: starting, ready, stopping)."""

    port: int
    pid: int
    core: int
    token: str
    started_at: float
    state: str = "starting"
    ready_at: float | None = None
    in_router: bool = False
    health_failures: int = 0
    served: bool = False  # answered /health at least once (so it may have requests to drain)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    @property
    def pgid(self) -> int:
        return self.pid  # each engine leads a session of its own

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def startup_s(self) -> float | None:
        return None if self.ready_at is None else round(self.ready_at - self.started_at, 3)

    def record(self) -> dict[str, Any]:
        return {
            "port": self.port,
            "pid": self.pid,
            "pgid": self.pgid,
            "core": self.core,
            "token": self.token,
            "state": self.state,
            "started_at": self.started_at,
            "ready_at": self.ready_at,
        }


def _confine_to(core: int) -> Callable[[], None]:
    """A ``preexec_fn`` that puts the new process (and so every process it starts) on ``core`` alone."""

    def confine() -> None:
        os.sched_setaffinity(0, {core})

    return confine


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the engine may still lose it to a race: then it fails to start)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- /proc: who is whose -----------------------------------------------------------------------


def _environ(pid: int) -> dict[str, str]:
    """``pid``'s environment ({} when unreadable: gone, or not this user's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, eq, v = item.partition(b"=")
        if eq and k in (POOL_VAR.encode(), ID_VAR.encode()):
            out[k.decode()] = v.decode("utf-8", "replace")
    return out


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) of ``pid``, None when gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    try:
        return fields[0], int(fields[2])
    except (IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def pool_processes(pool_tag: str) -> dict[int, tuple[int, str]]:
    """Every live process of this machine that carries ``GOVERNOR_ENGINE_POOL=pool_tag``: pid -> (pgid, token)."""
    out: dict[int, tuple[int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if env.get(POOL_VAR) != pool_tag:
            continue
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            out[pid] = (st[1], env.get(ID_VAR, ""))
    return out


def _port_of(cmdline: Sequence[str]) -> int | None:
    for i, arg in enumerate(cmdline[:-1]):
        if arg == "--port" and cmdline[i + 1].isdigit():
            return int(cmdline[i + 1])
    return None


# -- the pool ------------------------------------------------------------------------------------


class EnginePool:
    """The engines of one (model, zone) (see the module docstring)."""

    def __init__(
        self,
        spec: EngineSpec,
        router: RouterClient,
        state_dir: Path,
        *,
        port_picker: Callable[[], int] = free_port,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec, self.router = spec, router
        self.state_dir = Path(state_dir).resolve()
        self.tag = str(self.state_dir)
        self.port_picker, self.clock = port_picker, clock
        self.target = 0
        self._engines: dict[int, Engine] = {}  # port -> engine
        self._startups: list[float] = []  # measured start-ups of this pool's engines (s)
        self.deaths = 0
        self.failed_starts: list[dict[str, Any]] = []  # the last failed starts (port, reason)
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None

    # -- reading ---------------------------------------------------------------------------------
    def replicas(self) -> dict[str, Any]:
        """``{"desired", "ready", "starting", "startup_s"}`` (startup_s: median measured start-up, None before one)."""
        live = list(self._engines.values())
        return {
            "desired": self.target,
            "ready": sum(e.state == "ready" for e in live),
            "starting": sum(e.state == "starting" for e in live),
            "startup_s": round(statistics.median(self._startups), 3) if self._startups else None,
        }

    def engines(self) -> list[dict[str, Any]]:
        return [
            {
                "port": e.port,
                "url": e.url,
                "pid": e.pid,
                "core": e.core,
                "state": e.state,
                "started_at": e.started_at,
                "ready_at": e.ready_at,
                "startup_s": e.startup_s,
                "in_router": e.in_router,
            }
            for e in sorted(self._engines.values(), key=lambda e: e.started_at)
        ]

    def sd_document(self) -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: one target group per engine (ready or starting)."""
        return [
            {
                "targets": [f"127.0.0.1:{e.port}"],
                "labels": {"zone": self.spec.zone, "node": f"127.0.0.1:{e.port}", "model_name": self.spec.model},
            }
            for e in sorted(self._engines.values(), key=lambda e: e.port)
            if e.state in ("starting", "ready")
        ]

    # -- the registry ----------------------------------------------------------------------------
    @property
    def registry_path(self) -> Path:
        return self.state_dir / REGISTRY_FILE

    def _save(self) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        doc = {"version": 1, "target": self.target, "engines": [e.record() for e in self._engines.values()]}
        tmp = self.registry_path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.registry_path)

    def _load(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """(target, token -> record) of the registry; a missing, corrupt or hostile file reads as empty."""
        try:
            raw = self.registry_path.read_bytes()[: MAX_REGISTRY_BYTES + 1]
        except OSError:
            return 0, {}
        try:
            if len(raw) > MAX_REGISTRY_BYTES:
                raise ValueError("too large")
            doc = orjson.loads(raw)
            target, records = doc["target"], doc["engines"]
            if not isinstance(target, int) or isinstance(target, bool) or not 0 <= target <= 64:
                raise ValueError(f"target {target!r}")
            if not isinstance(records, list):
                raise ValueError("engines is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("engine registry %s unreadable (%s): adopting from /proc alone", self.registry_path, exc)
            return 0, {}
        out: dict[str, dict[str, Any]] = {}
        for r in records:
            if isinstance(r, dict) and isinstance(r.get("token"), str) and r["token"]:
                out[r["token"]] = r
        return target, out

    # -- adoption --------------------------------------------------------------------------------
    async def adopt(self) -> list[Engine]:
        """Take over the engines this pool left running (see the module docstring); stop the rest of its
        processes; re-add the adopted ready ones to the router.  Returns the adopted engines."""
        async with self._lock:
            target, records = self._load()
            procs = await asyncio.to_thread(pool_processes, self.tag)
            leaders = {pid: token for pid, (pgid, token) in procs.items() if pid == pgid and token}
            adopted: list[Engine] = []
            for pid, token in leaders.items():
                rec = records.get(token)
                port = _port_of(await asyncio.to_thread(_cmdline, pid))
                if rec is None or port is None or rec.get("pid") != pid or rec.get("port") != port:
                    log.warning("engine pid %d of pool %s is not in its registry: stopped", pid, self.tag)
                    continue
                started_at = rec.get("started_at")
                ready_at = rec.get("ready_at")
                core = rec.get("core")
                e = Engine(
                    port=port,
                    pid=pid,
                    core=core if isinstance(core, int) and not isinstance(core, bool) else -1,
                    token=token,
                    started_at=float(started_at) if isinstance(started_at, int | float) else self.clock(),
                )
                if await self._healthy(e):
                    e.state, e.served = "ready", True
                    e.ready_at = float(ready_at) if isinstance(ready_at, int | float) else None
                elif self.clock() - e.started_at > self.spec.startup_timeout_s:
                    log.warning("engine %s of pool %s answers no /health: stopped", e.url, self.tag)
                    continue
                adopted.append(e)
                if e.startup_s is not None:
                    self._startups.append(e.startup_s)
            keep = {e.pid for e in adopted}
            strays = {pid for pid, (pgid, _) in procs.items() if pgid not in keep}
            if strays:
                await self._stop_pids(strays, self.spec.grace_s)
            self._engines = {e.port: e for e in adopted}
            # What runs is the target: a registry (maybe hostile) never makes the pool start engines by
            # itself; the next scale command sets the target again.
            self.target = len(adopted)
            if target != len(adopted):
                log.info("pool %s: registry target %d, %d engine(s) adopted", self.tag, target, len(adopted))
            self._save()
        try:
            routed = set(await self.router.list_workers())
            for e in adopted:
                e.in_router = e.url in routed
        except RouterUnavailable as exc:
            log.warning("pool %s: router not read after adoption (%s); the watch re-adds", self.tag, exc)
        log.info("pool %s adopted %d engine(s), stopped %d stray process(es)", self.tag, len(adopted), len(strays))
        return adopted

    # -- scaling ---------------------------------------------------------------------------------
    async def scale_to(self, target: int, *, wait_s: float | None = None) -> dict[str, Any]:
        """Start or stop engines until ``target`` run; the result detail (see the module docstring).
        RouterUnavailable before anything changes when the router does not answer."""
        if isinstance(target, bool) or not isinstance(target, int) or target < 0:
            raise EngineSpecError(f"target must be an int >= 0, got {target!r}")
        await self.router.list_workers()  # the router answers, or nothing changes
        wait = self.spec.start_wait_s if wait_s is None else wait_s
        async with self._lock:
            previous = len(self._live())
            self.target = target
            started: list[Engine] = []
            stopping: list[Engine] = []
            failed: list[dict[str, Any]] = []
            if target > previous:
                for _ in range(target - previous):
                    try:
                        started.append(self._start())
                    except OSError as exc:  # the interpreter is missing, the state dir unwritable, ...
                        failed.append({"port": None, "reason": f"{type(exc).__name__}: {exc}"})
            else:
                # starting engines first (they serve nothing yet), then the newest ready ones
                stopping = sorted(self._live(), key=lambda e: (e.state != "starting", -e.started_at))[
                    : previous - target
                ]
                for e in stopping:
                    e.state = "stopping"
            self._save()
        self.ensure_watch()
        stopped = await asyncio.gather(*(self._stop(e) for e in stopping))
        if started and wait > 0:
            await self._wait_started(started, wait)
        tokens = {e.token for e in started}
        failed += [{"port": f["port"], "reason": f["reason"]} for f in self.failed_starts if f["token"] in tokens]
        if failed:
            async with self._lock:
                self.target = min(self.target, len(self._live()))  # the count stays what runs
                self._save()
        return {
            "previous": previous,
            "desired": self.target,
            "started": [{"port": e.port, "pid": e.pid, "core": e.core, "state": e.state} for e in started
                        if e.port in self._engines],
            "stopped": list(stopped),
            "failed": failed,
        }  # fmt: skip

    def _pick_core(self) -> int:
        """The core of ``cores`` with the fewest live engines (the first such): engines never share a core
        while one is free."""
        used = [e.core for e in self._live()]
        return min(self.spec.cores, key=lambda c: (used.count(c), self.spec.cores.index(c)))

    def _live(self) -> list[Engine]:
        return [e for e in self._engines.values() if e.state in ("starting", "ready")]

    def _start(self) -> Engine:
        s = self.spec
        port = self.port_picker()
        core = self._pick_core()
        token = uuid.uuid4().hex
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        env.update(
            {
                POOL_VAR: self.tag,
                ID_VAR: token,
                "VLLM_CPU_OMP_THREADS_BIND": str(core),
                "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_gib),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        argv = [
            s.python, "-m", ENTRYPOINT,
            "--model", s.model_dir, "--served-model-name", s.served_name,
            "--host", "127.0.0.1", "--port", str(port),
            "--max-num-seqs", str(s.max_num_seqs),
        ]  # fmt: skip
        if s.otlp_endpoint:
            # vLLM 0.32 exports one `llm_request` span per finished request with its TTFT, e2e,
            # queue/prefill/decode times and token counts whatever `--collect-detailed-traces` says
            # (that flag adds model-forward timings governor does not read, at a cost per step); the
            # exporter speaks gRPC unless told http/protobuf, and the endpoint is the full URL
            # (.../v1/traces).  Its spans name no model: the resource attributes name model, zone,
            # node, as adapters.otlp.spans reads them (tests/fixtures/engines/vllm_otlp_*.pb).
            env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
            env.setdefault("OTEL_BSP_SCHEDULE_DELAY", str(OTLP_EXPORT_DELAY_MS))
            env["OTEL_RESOURCE_ATTRIBUTES"] = (
                f"governor.model={s.model},governor.zone={s.zone},governor.node=127.0.0.1:{port}"
            )
            argv += ["--otlp-traces-endpoint", s.otlp_endpoint]
        if s.scheduling_policy != "fcfs":
            argv += ["--scheduling-policy", s.scheduling_policy]
        argv += list(s.extra_args)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(port)
        confine = _confine_to(core) if s.confine else None
        with open(log_path, "wb") as out:
            proc = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=confine,
            )  # fmt: skip
        e = Engine(port=port, pid=proc.pid, core=core, token=token, started_at=self.clock(), proc=proc)
        self._engines[port] = e
        self._save()  # at once: a crash from here on leaves an engine the next adopt() finds
        log.info("pool %s: engine started on port %d (pid %d, core %d)", self.tag, port, proc.pid, core)
        return e

    def log_path(self, port: int) -> Path:
        return self.state_dir / f"engine-{port}.log"

    def log_tail(self, port: int, n: int = 8) -> str:
        """The engine log's last lines, the most telling first: its last error line, then the tail."""
        try:
            lines = [ln.strip() for ln in self.log_path(port).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return "no log"
        errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
        tail = " | ".join(lines[-n:])
        return ((errors[-1] + " || ") if errors and errors[-1] not in lines[-n:] else "") + tail[-1500:]

    async def _wait_started(self, started: Sequence[Engine], wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:  # the watch moves them on (ready, or failed and out of the pool)
            if all(e.state != "starting" or e.port not in self._engines for e in started):
                return
            await asyncio.sleep(0.25)

    async def _stop(self, e: Engine) -> dict[str, Any]:
        """Remove ``e`` from the router (confirmed), drain it within the bound, stop its group."""
        routed_out = True
        try:
            await self.router.remove_worker(e.url)
            e.in_router = False
        except RouterUnavailable as exc:
            routed_out = False
            log.warning("pool %s: %s not removed from the router (%s): not drained", self.tag, e.url, exc)
        # An engine that never answered /health served nothing: there is nothing to drain.
        drained = routed_out and (not e.served or await self._drain(e))
        await self._stop_pids(self._group(e), self.spec.grace_s)
        if e.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                e.proc.wait(1)
        async with self._lock:
            self._engines.pop(e.port, None)
            self._save()
        gone = not self._group(e)
        log.info("pool %s: engine %s stopped (drained %s, group gone %s)", self.tag, e.url, drained, gone)
        return {"port": e.port, "pid": e.pid, "drained": drained, "group_gone": gone}

    async def _drain(self, e: Engine) -> bool:
        """True once ``e`` shows no running or waiting request twice in a row, within ``drain_timeout_s``."""
        deadline = time.monotonic() + self.spec.drain_timeout_s
        zeros = 0
        while time.monotonic() < deadline:
            n = await self._in_flight(e)
            if n is None:  # no metrics: not serving anything any more
                return e.proc is not None and e.proc.poll() is not None
            zeros = zeros + 1 if n == 0 else 0
            if zeros >= 2:
                return True
            await asyncio.sleep(DRAIN_POLL_S)
        return False

    async def in_flight(self) -> int | None:
        """Requests running or waiting on the pool's live engines (their ``/metrics``); None when one does not answer."""
        counts = [await self._in_flight(e) for e in self._live()]
        return None if None in counts else sum(c or 0 for c in counts)

    async def _in_flight(self, e: Engine) -> int | None:
        """``vllm:num_requests_running + waiting`` of ``e``'s ``/metrics``; None when it does not answer."""
        try:
            async with self._client().get(e.url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status != 200:
                    return None
                text = await resp.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        total = 0.0
        for line in text.splitlines():
            if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                with contextlib.suppress(ValueError, IndexError):
                    total += float(line.rsplit(" ", 1)[1])
        return int(total)

    def _group(self, e: Engine) -> set[int]:
        """The live processes of ``e``'s group that carry its token (the only ones ever signalled)."""
        return {pid for pid, (pgid, token) in pool_processes(self.tag).items() if pgid == e.pgid and token == e.token}

    async def _stop_pids(self, pids: set[int], grace_s: float) -> None:
        """SIGTERM ``pids`` (this pool's processes, checked again here), SIGKILL what is left after ``grace_s``."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            ours = pool_processes(self.tag)  # live processes carrying this pool's variable, read now
            left = [p for p in pids if p in ours]
            if not left:
                return
            for p in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self._reap()
                if not any(_running(p) for p in left):
                    return
                await asyncio.sleep(0.1)

    def _reap(self) -> None:
        for e in list(self._engines.values()):
            if e.proc is not None:
                e.proc.poll()

    # -- the watch -------------------------------------------------------------------------------
    def ensure_watch(self) -> None:
        """Start the death watch (idempotent)."""
        if self._watch is None or self._watch.done():
            self._watch = asyncio.create_task(self._watch_loop())

    async def _watch_loop(self) -> None:
        while True:
            try:
                await self.check()
            except Exception:
                log.exception("pool %s: watch step failed", self.tag)
            await asyncio.sleep(WATCH_INTERVAL_S)

    def _exited(self, e: Engine) -> bool:
        if e.proc is not None:
            return e.proc.poll() is not None
        return not _running(e.pid) or _environ(e.pid).get(ID_VAR) != e.token

    async def check(self) -> None:
        """One watch step: readiness of starting engines, death of running ones, router membership,
        replacements below the target."""
        for e in list(self._engines.values()):
            if e.state not in ("starting", "ready"):
                continue
            if self._exited(e):
                await self._lost(e, f"exited ({e.proc.returncode if e.proc else 'not ours any more'})")
                continue
            healthy = await self._healthy(e)
            if e.state == "starting":
                if healthy:
                    e.state, e.ready_at, e.served = "ready", self.clock(), True
                    self._startups.append(e.startup_s or 0.0)
                    log.info("pool %s: engine %s ready after %.1f s", self.tag, e.url, e.startup_s or 0.0)
                    async with self._lock:
                        self._save()
                elif self.clock() - e.started_at > self.spec.startup_timeout_s:
                    await self._lost(e, f"no /health after {self.spec.startup_timeout_s:.0f} s")
                    continue
            elif healthy:
                e.health_failures = 0
            else:
                e.health_failures += 1
                if e.health_failures >= HEALTH_FAILURES:
                    await self._lost(e, f"/health failed {e.health_failures} times")
                    continue
            if e.state == "ready" and not e.in_router:
                try:
                    await self.router.add_worker(e.url)
                    e.in_router = True
                    log.info("pool %s: engine %s added to the router", self.tag, e.url)
                except RouterUnavailable as exc:
                    log.warning("pool %s: %s not added to the router yet (%s)", self.tag, e.url, exc)
        if self.target > len(self._live()) and not self._lock.locked():
            async with self._lock:
                while self.target > len(self._live()):
                    try:
                        self._start()
                    except OSError as exc:
                        log.warning("pool %s: replacement not started (%s)", self.tag, exc)
                        break

    async def _lost(self, e: Engine, why: str) -> None:
        """``e`` died or never started: out of the router at once, its group stopped, out of the pool."""
        if e.state not in ("starting", "ready"):
            return  # another step already took it out
        was_ready = e.state == "ready"
        e.state = "stopping"
        if e.in_router or was_ready:
            try:
                await self.router.remove_worker(e.url)
                e.in_router = False
            except RouterUnavailable as exc:
                log.warning("pool %s: dead engine %s not removed from the router (%s)", self.tag, e.url, exc)
        await self._stop_pids(self._group(e), 0.0)
        async with self._lock:
            self._engines.pop(e.port, None)
            if was_ready:
                self.deaths += 1  # replaced by the next watch step while below the target
            else:
                reason = f"engine on port {e.port} {why}: {self.log_tail(e.port)}"
                self.failed_starts = [*self.failed_starts[-9:], {"port": e.port, "token": e.token, "reason": reason}]
                self.target = min(self.target, len(self._live()))  # a failed start is not retried by itself
            self._save()
        log.warning("pool %s: engine %s %s (%s)", self.tag, e.url, why, "died" if was_ready else "failed to start")

    async def _healthy(self, e: Engine) -> bool:
        try:
            async with self._client().get(e.url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self, stop_engines: bool) -> None:
        """Stop the watch; with ``stop_engines`` stop every engine too (drained), else leave them for adopt()."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        if stop_engines:
            async with self._lock:
                live = list(self._engines.values())
                self.target = 0
                for e in live:
                    e.state = "stopping"
            await asyncio.gather(*(self._stop(e) for e in live))
        if self._http is not None:
            await self._http.close()
        await self.router.close()
