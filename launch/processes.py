"""Start governor's own processes (stream worker, zone executors) as children.

Each child is the same ``governor`` CLI a platform team would run, handed
the run's settings through its environment (``Settings.to_env``), with its
log in the run directory.  Children die with the parent (PR_SET_PDEATHSIG)
and are stopped with SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from core.settings import Settings
from launch.embedded import _die_with_parent


class ChildProcess:
    def __init__(
        self, name: str, argv: list[str], settings: Settings, log_path: Path, extra_env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_path
        env = {**os.environ, **settings.to_env(), **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "governor.cli", *argv],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_log(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.log_text():
                return
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}):\n{self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def stop(self, timeout_s: float = 10.0) -> int | None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(5)
        self._log.close()
        return self.proc.returncode


WORKER_READY = "governor worker ready"
EXECUTOR_READY = "executor ready"
INGEST_SCRAPE_READY = "ingest scrape ready"


def ready_log() -> logging.Logger:
    """The logger of the readiness lines a parent waits for (:meth:`ChildProcess.wait_for_log`).

    Always at INFO, whatever ``--log-level`` the child inherited (the demo's tests run
    with WARNING): a child that hides its readiness line is never seen ready.
    """
    logger = logging.getLogger("governor.ready")
    logger.setLevel(logging.INFO)
    return logger


def start_worker(settings: Settings, run_dir: Path, name: str = "worker") -> ChildProcess:
    """``governor worker``, its log ``<run_dir>/<name>.log``.

    Several workers may share the topics (they divide the partitions, :mod:`streams.ownership`);
    each one named other than ``worker`` gets its own data directory, ``<data_dir>/<name>``.
    """
    if name != "worker":
        settings = settings.replace(data_dir=str(Path(settings.data_dir) / name))
    return ChildProcess(name, ["worker"], settings, run_dir / f"{name}.log")


def start_executor(settings: Settings, zone: str, run_dir: Path, backend: str | None = "sim") -> ChildProcess:
    """Zone ``zone``'s executor; ``backend`` None: its chain comes from GOVERNOR_EXECUTOR_BACKENDS."""
    return ChildProcess(
        f"executor-{zone}",
        ["executor", "--zone", zone, *(["--backend", backend] if backend else [])],
        settings,
        run_dir / f"executor-{zone}.log",
    )
